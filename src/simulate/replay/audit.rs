//! One audit line -> what the replay reads from it: a disruptive pod or StatefulSet
//! request, a line that is not one, or a line skipped with a reason. Pure: bytes in.

use crate::limiter::Millis;
use serde::Deserialize;
use std::borrow::Cow;

/// The only audit API version read; others are skipped (counted, never guessed at).
pub const AUDIT_API_VERSION: &str = "audit.k8s.io/v1";

/// The fields of an `audit.k8s.io/v1` Event the replay uses; the rest is skipped
/// unparsed. Strings borrow from the line where they have no escapes.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event<'a> {
    #[serde(borrow, default)]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    level: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    stage: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    verb: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    user: Option<User<'a>>,
    #[serde(borrow, default)]
    object_ref: Option<ObjectRef<'a>>,
    #[serde(default)]
    response_status: Option<Status>,
    #[serde(default)]
    request_object: Option<serde_json::Value>,
    #[serde(borrow, default)]
    request_received_timestamp: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    stage_timestamp: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct User<'a> {
    #[serde(borrow, default)]
    username: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    groups: Vec<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct ObjectRef<'a> {
    #[serde(borrow, default)]
    resource: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    subresource: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct Status {
    #[serde(default)]
    code: Option<u32>,
}

/// The audit level a line was written at (what it can show).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Metadata,
    Request,
    RequestResponse,
}

/// A disruptive request as the log recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub what: What,
    pub namespace: String,
    /// Empty for a pod created with `generateName` (Metadata and Request levels).
    pub name: String,
    pub user: String,
    /// The user is a node (`system:node:*` or group `system:nodes`).
    pub from_node: bool,
    pub received: Millis,
    pub stage: Millis,
    pub level: Level,
    /// The owner's kind from the body's ownerReferences (Request level and up).
    pub owner_kind: Option<String>,
    /// The body's generateName (Request level and up).
    pub generate_name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    PodCreate,
    Binding,
    PodDelete,
    Eviction,
    /// An update or patch of a StatefulSet; the partition written when the body has it.
    StatefulSetWrite {
        partition: Option<u32>,
    },
}

/// Why a line that is not replayed was set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Skip {
    /// Not JSON, or not an audit Event's shape.
    Malformed,
    /// `apiVersion` other than audit.k8s.io/v1 (or missing).
    UnknownApiVersion,
    /// A pod or StatefulSet request without a readable `requestReceivedTimestamp`.
    NoTimestamp,
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Malformed => "malformed (not an audit Event in JSON)",
            Skip::UnknownApiVersion => "unknown apiVersion (not audit.k8s.io/v1)",
            Skip::NoTimestamp => "no readable requestReceivedTimestamp",
        }
    }
}

/// Lines read that are not disruptive requests, by why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NotDisruptive {
    /// Another resource or verb (most of a real log); includes lines that never mention
    /// pods or statefulsets, which are not parsed at all.
    Other,
    /// A stage other than ResponseComplete (the same request's ResponseComplete counts).
    OtherStage,
    /// Refused or failed (not 2xx): nothing happened.
    NotSuccessful,
}

impl NotDisruptive {
    pub fn as_str(self) -> &'static str {
        match self {
            NotDisruptive::Other => "other resources and verbs",
            NotDisruptive::OtherStage => "stage other than ResponseComplete",
            NotDisruptive::NotSuccessful => "pod/StatefulSet request not answered 2xx",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Request(Request),
    NotDisruptive(NotDisruptive),
    Skipped(Skip),
}

/// Can this line be a pod or StatefulSet event at all? A byte search, so the lines about
/// other resources (most of a log) are never parsed.
pub fn may_matter(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"pods\"").is_some()
        || memchr::memmem::find(line, b"\"statefulsets\"").is_some()
}

/// Reads one line (without its newline).
pub fn read_line(line: &[u8]) -> Line {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return Line::Skipped(Skip::Malformed);
    }
    if !may_matter(trimmed) {
        // Still refuse what is plainly not JSON, so a wrong file is not "all other".
        return match trimmed.first() {
            Some(b'{') => Line::NotDisruptive(NotDisruptive::Other),
            _ => Line::Skipped(Skip::Malformed),
        };
    }
    let Ok(ev) = serde_json::from_slice::<Event<'_>>(trimmed) else {
        return Line::Skipped(Skip::Malformed);
    };
    classify(ev)
}

fn classify(ev: Event<'_>) -> Line {
    if ev.api_version.as_deref() != Some(AUDIT_API_VERSION) {
        return Line::Skipped(Skip::UnknownApiVersion);
    }
    if ev.kind.as_deref().is_some_and(|k| k != "Event") {
        return Line::Skipped(Skip::Malformed);
    }
    let Some(obj) = ev.object_ref else {
        return Line::NotDisruptive(NotDisruptive::Other);
    };
    let resource = obj.resource.as_deref().unwrap_or_default();
    let sub = obj.subresource.as_deref().unwrap_or_default();
    let verb = ev.verb.as_deref().unwrap_or_default();
    let what = match (resource, sub, verb) {
        ("pods", "", "create") => What::PodCreate,
        ("pods", "binding", "create") => What::Binding,
        ("pods", "", "delete") => What::PodDelete,
        ("pods", "eviction", "create") => What::Eviction,
        ("statefulsets", "", "update" | "patch") => What::StatefulSetWrite {
            partition: ev.request_object.as_ref().and_then(partition_of),
        },
        _ => return Line::NotDisruptive(NotDisruptive::Other),
    };
    if ev.stage.as_deref().is_some_and(|s| s != "ResponseComplete") {
        return Line::NotDisruptive(NotDisruptive::OtherStage);
    }
    let code = ev.response_status.and_then(|s| s.code).unwrap_or(0);
    if !(200..300).contains(&code) {
        return Line::NotDisruptive(NotDisruptive::NotSuccessful);
    }
    let Some(received) = ev
        .request_received_timestamp
        .as_deref()
        .and_then(parse_rfc3339_ms)
    else {
        return Line::Skipped(Skip::NoTimestamp);
    };
    let stage = ev
        .stage_timestamp
        .as_deref()
        .and_then(parse_rfc3339_ms)
        .unwrap_or(received);
    let (user, groups) = match ev.user {
        Some(u) => (u.username.unwrap_or_default().into_owned(), u.groups),
        None => (String::new(), Vec::new()),
    };
    let from_node = user.starts_with("system:node:") || groups.iter().any(|g| g == "system:nodes");
    let level = match ev.level.as_deref() {
        Some("Request") => Level::Request,
        Some("RequestResponse") => Level::RequestResponse,
        _ => Level::Metadata,
    };
    let body = ev.request_object.as_ref();
    let meta = body.and_then(|b| b.get("metadata"));
    Line::Request(Request {
        what,
        namespace: obj.namespace.unwrap_or_default().into_owned(),
        name: obj.name.unwrap_or_default().into_owned(),
        user,
        from_node,
        received,
        stage,
        level,
        owner_kind: meta
            .and_then(|m| m.get("ownerReferences"))
            .and_then(|o| o.as_array())
            .and_then(|refs| {
                refs.iter()
                    .find(|r| r.get("controller").and_then(|c| c.as_bool()) == Some(true))
                    .or(refs.first())
            })
            .and_then(|r| r.get("kind"))
            .and_then(|k| k.as_str())
            .map(str::to_string),
        generate_name: meta
            .and_then(|m| m.get("generateName"))
            .and_then(|g| g.as_str())
            .map(str::to_string),
    })
}

/// The partition a StatefulSet body (an update's object or a patch) writes.
fn partition_of(body: &serde_json::Value) -> Option<u32> {
    body.pointer("/spec/updateStrategy/rollingUpdate/partition")
        .and_then(|p| p.as_u64())
        .map(|p| p.min(u32::MAX as u64) as u32)
}

/// RFC 3339 (`2024-05-01T10:00:00.123456Z`, or with an offset) -> Unix milliseconds.
/// Hand-written: the replay parses one or two per pod event, and the `time` crate's
/// parser is not enabled in this build.
pub fn parse_rfc3339_ms(s: &str) -> Option<Millis> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let mut v = 0i64;
        for &c in b.get(r)? {
            if !c.is_ascii_digit() {
                return None;
            }
            v = v * 10 + i64::from(c - b'0');
        }
        Some(v)
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let mut digits = 0;
        while let Some(c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            if digits < 3 {
                millis = millis * 10 + i64::from(c - b'0');
            }
            digits += 1;
            i += 1;
        }
        if digits == 0 {
            return None;
        }
        for _ in digits..3 {
            millis *= 10;
        }
    }
    let offset_s = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let o = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_s;
    let ms = secs.checked_mul(1000)?.checked_add(millis)?;
    Millis::try_from(ms).ok()
}
