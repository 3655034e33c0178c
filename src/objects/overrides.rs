//! What a PacingOverride object (a pause or a temporary override, made by `churn-throttler
//! pause` / `override`) means for the limits in force. Pure: the object and `now` in, the
//! adjustment it makes (or why it makes none) out.
//!
//! The CRD's CEL rules refuse a malformed object at the door; one that slipped past them
//! (an older CRD, a hand edit) is `Ignored` with a reason, which the shell logs, counts
//! and tells in an Event: never a crash, and never a rule left unpaced without a word.

use crate::limiter::Millis;
use crate::names::millis;
use crate::pacing::schedule::{Adjustment, Scoped};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "churn-throttler.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "PacingOverride";
pub const PLURAL: &str = "pacingoverrides";

/// The API resource, for dynamic clients.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The spec as the CRD describes it (manifests/base/crd-pacingoverride.yaml).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub all: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub pause: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#override: Option<OverrideSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub indefinitely: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub author: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OverrideSpec {
    pub events: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_not_ready: Option<i64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One PacingOverride in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    pub name: String,
    pub scoped: Scoped,
    pub author: String,
    pub reason: String,
    pub created: Millis,
}

/// What one object means at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Live(Live),
    /// Its duration has run out: ignored even if nobody deletes it.
    Expired {
        name: String,
        until: Millis,
    },
    /// Malformed: ignored, with why.
    Ignored {
        name: String,
        reason: String,
    },
}

/// Go-style durations as the CRD accepts them: one or more `<integer><unit>`, units h, m,
/// s, ms ("30m", "1h30m"); above zero.
pub fn parse_go_duration(text: &str) -> Result<Millis, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("an empty duration".to_string());
    }
    let mut total: Millis = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "duration {text:?}: a number must come before each unit"
            ));
        }
        let value: Millis = rest[..digits]
            .parse()
            .map_err(|_| format!("duration {text:?} is out of range"))?;
        rest = &rest[digits..];
        let (unit, scale) = if let Some(r) = rest.strip_prefix("ms") {
            (r, 1)
        } else if let Some(r) = rest.strip_prefix('h') {
            (r, 3_600_000)
        } else if let Some(r) = rest.strip_prefix('m') {
            (r, 60_000)
        } else if let Some(r) = rest.strip_prefix('s') {
            (r, 1_000)
        } else {
            return Err(format!(
                "duration {text:?}: unknown or missing unit (use h, m, s or ms, e.g. 30m)"
            ));
        };
        rest = unit;
        total = value
            .checked_mul(scale)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration {text:?} is out of range"))?;
    }
    if total == 0 {
        return Err(format!("duration {text:?} is zero"));
    }
    Ok(total)
}

fn to_u32(value: i64, what: &str) -> Result<u32, String> {
    u32::try_from(value).map_err(|_| format!("{what} {value} is out of range (0..=4294967295)"))
}

/// What `spec`, created at `created`, means at `now`.
pub fn read_spec(name: &str, spec: &Spec, created: Millis, now: Millis) -> Read {
    let ignored = |reason: String| Read::Ignored {
        name: name.to_string(),
        reason,
    };
    if spec.all != spec.rules.is_empty() {
        return ignored("name the rules or set all: true, not both and not neither".into());
    }
    if spec.namespace.is_some() {
        return ignored(
            "spec.namespace is not supported yet (pauses and overrides are cluster-wide)".into(),
        );
    }
    let until = match (&spec.duration, spec.indefinitely) {
        (Some(d), false) => match parse_go_duration(d) {
            Ok(ms) => Some(created.saturating_add(ms)),
            Err(e) => return ignored(e),
        },
        (None, true) => None,
        _ => return ignored("exactly one of duration or indefinitely: true".into()),
    };
    let adjustment = match (spec.pause, &spec.r#override) {
        (true, None) => Adjustment::Pause {
            from: created,
            until,
        },
        (false, Some(o)) => {
            let Some(until) = until else {
                return ignored("an override needs a duration".into());
            };
            let figures = (|| -> Result<Adjustment, String> {
                Ok(Adjustment::Override {
                    from: created,
                    until,
                    events: to_u32(o.events, "events")?,
                    burst: match o.burst {
                        Some(b) if b < 1 => return Err(format!("burst {b} is below 1")),
                        b => b.map(|b| to_u32(b, "burst")).transpose()?,
                    },
                    max_not_ready: o
                        .max_not_ready
                        .map(|m| to_u32(m, "maxNotReady"))
                        .transpose()?,
                })
            })();
            match figures {
                Ok(a) => a,
                Err(e) => return ignored(e),
            }
        }
        _ => return ignored("exactly one of pause: true or override".into()),
    };
    if let Some(until) = until.filter(|&u| u <= now) {
        return Read::Expired {
            name: name.to_string(),
            until,
        };
    }
    Read::Live(Live {
        name: name.to_string(),
        scoped: Scoped {
            rules: (!spec.all).then(|| spec.rules.clone()),
            adjustment,
        },
        author: spec.author.clone(),
        reason: spec.reason.clone(),
        created,
    })
}

/// What one stored object means at `now`.
pub fn read(object: &DynamicObject, now: Millis) -> Read {
    let name = object.metadata.name.clone().unwrap_or_default();
    let Some(created) = object
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| millis(t.0))
    else {
        return Read::Ignored {
            name,
            reason: "no creationTimestamp".into(),
        };
    };
    let spec = match object.data.get("spec") {
        Some(value) => match Spec::deserialize(value) {
            Ok(spec) => spec,
            Err(e) => {
                return Read::Ignored {
                    name,
                    reason: format!("spec does not parse: {e}"),
                }
            }
        },
        None => {
            return Read::Ignored {
                name,
                reason: "no spec".into(),
            }
        }
    };
    read_spec(&name, &spec, created, now)
}

/// The end of a live one (None: until resumed).
pub fn until(live: &Live) -> Option<Millis> {
    match live.scoped.adjustment {
        Adjustment::Pause { until, .. } => until,
        Adjustment::Override { until, .. } => Some(until),
    }
}

/// A change to tell in an Event: the object's name, the Event's reason and note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    pub name: String,
    pub reason: &'static str,
    pub note: String,
}

/// What changed between two reads of the objects: those in force now and not before
/// (Paused, Overridden), and those in force before and not now that expired
/// (PauseExpired, OverrideExpired) or are gone (Resumed, OverrideRemoved). One that is
/// still there but now malformed is told by its own Event (`Read::Ignored`).
pub fn changes(before: &[Live], now: &[Live], expired: &[String], present: &[String]) -> Vec<Told> {
    let mut out = Vec::new();
    for l in now
        .iter()
        .filter(|l| !before.iter().any(|b| b.name == l.name))
    {
        let (reason, what) = match l.scoped.adjustment {
            Adjustment::Pause { .. } => ("Paused", "paused".to_string()),
            Adjustment::Override { events, .. } => (
                "Overridden",
                format!("overridden to {events} events per window"),
            ),
        };
        let end = until(l).map_or("until resumed".to_string(), |u| {
            format!("until {}", crate::names::format_time(u))
        });
        out.push(Told {
            name: l.name.clone(),
            reason,
            note: format!(
                "{} {what} {end} by {} ({})",
                rules_words(l),
                or_dash(&l.author),
                or_dash(&l.reason)
            ),
        });
    }
    for l in before
        .iter()
        .filter(|b| !now.iter().any(|l| l.name == b.name))
    {
        let pause = matches!(l.scoped.adjustment, Adjustment::Pause { .. });
        let what = if pause { "pause" } else { "override" };
        let (reason, how) = if expired.contains(&l.name) {
            (
                if pause {
                    "PauseExpired"
                } else {
                    "OverrideExpired"
                },
                "expired",
            )
        } else if !present.contains(&l.name) {
            (
                if pause { "Resumed" } else { "OverrideRemoved" },
                "was deleted",
            )
        } else {
            continue;
        };
        out.push(Told {
            name: l.name.clone(),
            reason,
            note: format!(
                "{}: the {what} {how}; the policy's limits apply again",
                rules_words(l)
            ),
        });
    }
    out
}

fn rules_words(l: &Live) -> String {
    match &l.scoped.rules {
        None => "every rule".to_string(),
        Some(rules) => format!("rule(s) {}", rules.join(", ")),
    }
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pause(rules: &[&str], duration: Option<&str>) -> Spec {
        Spec {
            rules: rules.iter().map(|r| r.to_string()).collect(),
            all: rules.is_empty(),
            pause: true,
            duration: duration.map(str::to_string),
            indefinitely: duration.is_none(),
            reason: "incident".into(),
            author: "alice".into(),
            ..Spec::default()
        }
    }

    #[test]
    fn table_of_durations() {
        let cases: &[(&str, Result<Millis, ()>)] = &[
            ("30m", Ok(1_800_000)),
            ("2h", Ok(7_200_000)),
            ("1h30m", Ok(5_400_000)),
            ("90s", Ok(90_000)),
            ("1500ms", Ok(1_500)),
            ("1m30s500ms", Ok(90_500)),
            ("0s", Err(())),
            ("", Err(())),
            ("30", Err(())),
            ("m30", Err(())),
            ("1d", Err(())),
            ("1.5h", Err(())),
            ("-1h", Err(())),
            ("99999999999999999999h", Err(())),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text).map_err(|_| ()), *want, "{text:?}");
        }
    }

    #[test]
    fn table_of_objects() {
        let created = 1_000_000;
        let now = created + 60_000;
        let live_pause = |rules: Option<Vec<String>>, until| {
            Some(Scoped {
                rules,
                adjustment: Adjustment::Pause {
                    from: created,
                    until,
                },
            })
        };
        let mut over = Spec {
            rules: vec!["pods".into()],
            r#override: Some(OverrideSpec {
                events: 50,
                burst: Some(10),
                max_not_ready: None,
            }),
            duration: Some("2h".into()),
            ..Spec::default()
        };
        let mut zero_burst = over.clone();
        if let Some(o) = zero_burst.r#override.as_mut() {
            o.burst = Some(0);
        }
        let mut negative = over.clone();
        if let Some(o) = negative.r#override.as_mut() {
            o.events = -1;
        }
        let mut forever_override = over.clone();
        forever_override.duration = None;
        forever_override.indefinitely = true;
        let mut both = pause(&["pods"], Some("30m"));
        both.all = true;
        let mut neither = pause(&["pods"], Some("30m"));
        neither.pause = false;
        let mut ns = pause(&[], Some("30m"));
        ns.namespace = Some("team-a".into());
        let mut two_ends = pause(&[], Some("30m"));
        two_ends.indefinitely = true;
        let mut bad_duration = pause(&[], Some("30 minutes"));
        bad_duration.duration = Some("30 minutes".into());

        // (spec, Some(live) | None = ignored, expired?)
        let cases: Vec<(&str, Spec, Option<Scoped>, bool)> = vec![
            (
                "all, 30m",
                pause(&[], Some("30m")),
                live_pause(None, Some(created + 1_800_000)),
                false,
            ),
            (
                "two rules, indefinitely",
                pause(&["pods", "sts"], None),
                live_pause(Some(vec!["pods".into(), "sts".into()]), None),
                false,
            ),
            ("expired", pause(&[], Some("30s")), None, true),
            ("expires exactly now", pause(&[], Some("1m")), None, true),
            (
                "override",
                over.clone(),
                Some(Scoped {
                    rules: Some(vec!["pods".into()]),
                    adjustment: Adjustment::Override {
                        from: created,
                        until: created + 7_200_000,
                        events: 50,
                        burst: Some(10),
                        max_not_ready: None,
                    },
                }),
                false,
            ),
            ("override with burst 0", zero_burst, None, false),
            ("override with events -1", negative, None, false),
            ("override without an end", forever_override, None, false),
            ("rules and all", both, None, false),
            ("neither pause nor override", neither, None, false),
            ("namespace scope", ns, None, false),
            ("duration and indefinitely", two_ends, None, false),
            ("malformed duration", bad_duration, None, false),
        ];
        for (what, spec, want, expired) in cases {
            let got = read_spec("x", &spec, created, now);
            match (&got, &want) {
                (Read::Live(l), Some(w)) => assert_eq!(&l.scoped, w, "{what}"),
                (Read::Expired { .. }, None) if expired => {}
                (Read::Ignored { reason, .. }, None) if !expired => {
                    assert!(!reason.is_empty(), "{what}")
                }
                _ => panic!("{what}: got {got:?}, want {want:?} (expired {expired})"),
            }
        }
        over.r#override = None;
        assert!(matches!(
            read_spec("x", &over, created, now),
            Read::Ignored { .. }
        ));
    }

    #[test]
    fn a_stored_object_is_read_and_a_broken_one_ignored() {
        let mut object = DynamicObject::new("p", &api_resource()).within("churn-throttler");
        object.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-12-07T22:00:00Z".parse().expect("time"),
            ));
        let created = crate::names::parse_time("2026-12-07T22:00:00Z").expect("time");
        object.data = serde_json::json!({"spec": {"all": true, "pause": true, "duration": "1h"}});
        assert!(matches!(read(&object, created + 1), Read::Live(_)));
        object.data = serde_json::json!({"spec": {"all": "yes", "pause": true}});
        assert!(matches!(read(&object, created + 1), Read::Ignored { .. }));
        object.data = serde_json::json!({});
        assert!(matches!(read(&object, created + 1), Read::Ignored { .. }));
        object.metadata.creation_timestamp = None;
        assert!(matches!(read(&object, created + 1), Read::Ignored { .. }));
    }

    #[test]
    fn table_of_changes_told() {
        let live = |name: &str, pause: bool| Live {
            name: name.to_string(),
            scoped: Scoped {
                rules: if pause {
                    None
                } else {
                    Some(vec!["pods".into()])
                },
                adjustment: if pause {
                    Adjustment::Pause {
                        from: 0,
                        until: None,
                    }
                } else {
                    Adjustment::Override {
                        from: 0,
                        until: 60_000,
                        events: 50,
                        burst: None,
                        max_not_ready: None,
                    }
                },
            },
            author: "alice".into(),
            reason: String::new(),
            created: 0,
        };
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let before = vec![
            live("kept", true),
            live("resumed", true),
            live("expired", true),
            live("removed", false),
            live("broken", true),
        ];
        let now = vec![live("kept", true), live("new", true), live("over", false)];
        let told = changes(
            &before,
            &now,
            &names(&["expired"]),
            &names(&["kept", "expired", "broken", "new", "over"]),
        );
        let got: Vec<(&str, &str)> = told.iter().map(|t| (t.name.as_str(), t.reason)).collect();
        assert_eq!(
            got,
            vec![
                ("new", "Paused"),
                ("over", "Overridden"),
                ("resumed", "Resumed"),
                ("expired", "PauseExpired"),
                ("removed", "OverrideRemoved"),
            ]
        );
        assert_eq!(told[0].note, "every rule paused until resumed by alice (-)");
        assert!(
            told[1].note.starts_with(
                "rule(s) pods overridden to 50 events per window until 1970-01-01T00:01:00.000Z"
            ),
            "{}",
            told[1].note
        );
        // Nothing changed: nothing told.
        assert!(changes(&now, &now, &[], &names(&["kept", "new", "over"])).is_empty());
    }
}
