//! `churn-throttler pause`, `resume` and `override`: each pause or override is one
//! PacingOverride object in churn-throttler's namespace, written with the user's own
//! credentials (so the audit log names them) and their name from a SelfSubjectReview.
//! `pause` and `override` return once the releasers' leader records the object's uid on
//! its Lease (it applies it from then on). The specs and the choice of what `resume`
//! deletes are pure; the rest talks to the API server.

use super::cluster::{connect, list_overrides, Conn, CtlError};
use super::{exit, ClusterArgs};
use crate::limiter::Millis;
use crate::names::{format_time, millis, PACING_NOTE_ANNOTATION};
use crate::objects::overrides::{
    api_resource, parse_go_duration, read, OverrideSpec, Read, Spec, GROUP, KIND, VERSION,
};
use crate::shared::now_millis;
use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use std::time::Duration;

/// The role whose rights the commands need (manifests/base/rbac-pacing.yaml).
pub const OPERATOR_ROLE: &str = "churn-throttler-pacing-operator";

#[derive(Args, Debug, Clone)]
pub struct PauseArgs {
    /// The rules to pause (names in the policy); or --all.
    pub rules: Vec<String>,
    /// Every rule.
    #[arg(long, conflicts_with = "rules")]
    pub all: bool,
    /// How long (30m, 2h, 1h30m); the pause ends by itself then.
    #[arg(long = "for", value_name = "DURATION", conflicts_with = "indefinitely")]
    pub duration: Option<String>,
    /// No end: until `churn-throttler resume`. Required, on purpose, when --for is not given.
    #[arg(long)]
    pub indefinitely: bool,
    /// Why, for the others (shown by `status`, kept on the object).
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ResumeArgs {
    /// The rules to resume (deletes the pauses that name only these); or --all.
    pub rules: Vec<String>,
    /// Every pause.
    #[arg(long, conflicts_with = "rules")]
    pub all: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args, Debug, Clone)]
pub struct OverrideArgs {
    /// The rule whose limits to override.
    pub rule: String,
    /// Events per window of every limit of the rule (its window and scope stay).
    #[arg(long)]
    pub events: u32,
    #[arg(long)]
    pub burst: Option<u32>,
    #[arg(long)]
    pub max_not_ready: Option<u32>,
    /// How long (30m, 2h); then the policy's limits again.
    #[arg(long = "for", value_name = "DURATION")]
    pub duration: String,
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args, Debug, Clone)]
pub struct WaitArgs {
    /// Longest wait for the leader to take the object up (0: do not wait).
    #[arg(long = "wait-timeout", default_value = "60s", value_parser = super::parse_duration)]
    pub wait_timeout: Duration,
}

/// Why a command line is refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("name the rules to pause, or --all")]
    NoRules,
    #[error(
        "a pause needs an end: --for DURATION (e.g. --for 30m), or --indefinitely to pause until \
         `churn-throttler resume` on purpose"
    )]
    NoEnd,
    #[error("{0}")]
    BadDuration(String),
    #[error(
        "a pause or override limited to one namespace (--namespace) is not supported yet: they \
         apply to the whole cluster; leave --namespace out"
    )]
    Namespaced,
    #[error("-A/--all-namespaces does not apply here: pauses and overrides are cluster-wide")]
    AllNamespaces,
}

/// The spec `pause` writes.
pub fn pause_spec(args: &PauseArgs, author: &str) -> Result<Spec, Refused> {
    scope_check(&args.cluster)?;
    if !args.all && args.rules.is_empty() {
        return Err(Refused::NoRules);
    }
    if args.duration.is_none() && !args.indefinitely {
        return Err(Refused::NoEnd);
    }
    if let Some(d) = &args.duration {
        parse_go_duration(d).map_err(Refused::BadDuration)?;
    }
    Ok(Spec {
        rules: args.rules.clone(),
        all: args.all,
        pause: true,
        duration: args.duration.clone(),
        indefinitely: args.indefinitely,
        reason: args.reason.clone(),
        author: author.to_string(),
        ..Spec::default()
    })
}

/// The spec `override` writes.
pub fn override_spec(args: &OverrideArgs, author: &str) -> Result<Spec, Refused> {
    scope_check(&args.cluster)?;
    parse_go_duration(&args.duration).map_err(Refused::BadDuration)?;
    Ok(Spec {
        rules: vec![args.rule.clone()],
        r#override: Some(OverrideSpec {
            events: i64::from(args.events),
            burst: args.burst.map(i64::from),
            max_not_ready: args.max_not_ready.map(i64::from),
        }),
        duration: Some(args.duration.clone()),
        reason: args.reason.clone(),
        author: author.to_string(),
        ..Spec::default()
    })
}

fn scope_check(cluster: &ClusterArgs) -> Result<(), Refused> {
    if cluster.namespace.is_some() {
        return Err(Refused::Namespaced);
    }
    if cluster.all_namespaces {
        return Err(Refused::AllNamespaces);
    }
    Ok(())
}

/// What `resume` does with the pauses in force: the names to delete, and the pauses it
/// leaves that still pause one of `rules` (they name other rules too, or every rule).
pub fn to_resume(
    pauses: &[(String, Spec)],
    rules: &[String],
    all: bool,
) -> (Vec<String>, Vec<String>) {
    let mut delete = Vec::new();
    let mut left = Vec::new();
    for (name, spec) in pauses.iter().filter(|(_, s)| s.pause) {
        if all || (!spec.all && spec.rules.iter().all(|r| rules.contains(r))) {
            delete.push(name.clone());
        } else if spec.all || spec.rules.iter().any(|r| rules.contains(r)) {
            left.push(name.clone());
        }
    }
    (delete, left)
}

/// The named rules the policy does not have, in words; None: all known.
pub fn unknown_rules(named: &[String], known: &[&str]) -> Option<String> {
    let unknown: Vec<&str> = named
        .iter()
        .map(String::as_str)
        .filter(|r| !known.contains(r))
        .collect();
    match unknown.as_slice() {
        [] => None,
        [one] => Some(format!("rule {one:?} is")),
        many => Some(format!("rules {many:?} are")),
    }
}

/// Whether the Lease's note lists `uid` (the leader applies that object).
pub fn taken_up(lease: &Lease, uid: &str) -> bool {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PACING_NOTE_ANNOTATION))
        .is_some_and(|note| note.split(',').any(|u| u == uid))
}

/// A 403 on PacingOverrides said as what to ask for.
fn forbidden(e: CtlError, namespace: &str) -> CtlError {
    match e {
        CtlError::Forbidden(message) => CtlError::Other(format!(
            "you need the {OPERATOR_ROLE} role in the namespace {namespace} to pause, resume or \
             override (ask an administrator: kubectl -n {namespace} create rolebinding ... \
             --clusterrole={OPERATOR_ROLE} --user=YOU); the API server said: {message}"
        )),
        CtlError::NotFound(message) => CtlError::Other(format!(
            "the PacingOverride CRD (pacingoverrides.{GROUP}) is not installed: apply \
             manifests/base (or upgrade the Helm chart); {message}"
        )),
        other => other,
    }
}

fn object(spec: &Spec, prefix: &str, namespace: &str) -> Result<DynamicObject, CtlError> {
    let mut object = DynamicObject::new("", &api_resource()).within(namespace);
    object.metadata.name = None;
    object.metadata.generate_name = Some(prefix.to_string());
    object.data = serde_json::json!({
        "spec": serde_json::to_value(spec).map_err(|e| CtlError::Other(e.to_string()))?,
    });
    Ok(object)
}

pub fn pause_main(args: &PauseArgs) -> std::process::ExitCode {
    create_main(
        "pause",
        pause_spec(args, ""),
        &args.cluster,
        args.wait.wait_timeout,
    )
}

pub fn override_main(args: &OverrideArgs) -> std::process::ExitCode {
    create_main(
        "override",
        override_spec(args, ""),
        &args.cluster,
        args.wait.wait_timeout,
    )
}

/// `pause` and `override`: a spec refused before anything is read or written, else
/// created with the author's name and waited for until the leader takes it up.
fn create_main<E: std::fmt::Display>(
    command: &'static str,
    spec: Result<Spec, E>,
    cluster: &ClusterArgs,
    wait_timeout: Duration,
) -> std::process::ExitCode {
    let result = super::runtime().and_then(|rt| {
        rt.block_on(async {
            let mut spec = spec.map_err(|e| CtlError::Other(e.to_string()))?;
            let conn = connect(cluster).await?;
            spec.author = conn.who_am_i().await;
            let prefix = format!("{command}-");
            create(&conn, cluster, &spec, &prefix, wait_timeout).await
        })
    });
    super::finish(command, result)
}

pub fn resume_main(args: &ResumeArgs) -> std::process::ExitCode {
    let result = super::runtime().and_then(|rt| rt.block_on(resume(args)));
    super::finish("resume", result)
}

/// Creates the object, then waits until the leader records it on its Lease.
async fn create(
    conn: &Conn,
    cluster: &ClusterArgs,
    spec: &Spec,
    prefix: &str,
    wait: Duration,
) -> Result<u8, CtlError> {
    let namespace = &cluster.lease_namespace;
    // A misspelt rule would pause nothing: the names are checked against the policy in
    // force when it can be read.
    let checked = if spec.rules.is_empty() {
        None
    } else {
        Some(super::cluster::policy(conn, cluster, None, None).await)
    };
    match checked {
        None => {}
        Some(Ok((policy, source))) => {
            let known: Vec<&str> = policy.rules.iter().map(|r| &*r.name).collect();
            if let Some(unknown) = unknown_rules(&spec.rules, &known) {
                return Err(CtlError::Other(format!(
                    "{unknown} not in the policy ({source}; its rules: {})",
                    known.join(", ")
                )));
            }
        }
        Some(Err(e)) => eprintln!(
            "churn-throttler: the rule names are not checked (cannot read the policy: {e})"
        ),
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(conn.client.clone(), namespace, &api_resource());
    let made = conn
        .call(
            &format!("create pacingoverride in {namespace}"),
            api.create(&PostParams::default(), &object(spec, prefix, namespace)?),
        )
        .await
        .map_err(|e| forbidden(e, namespace))?;
    let name = made.metadata.name.clone().unwrap_or_default();
    let uid = made.metadata.uid.clone().unwrap_or_default();
    let created = made
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(now_millis, |t| millis(t.0));
    let what = if spec.pause { "paused" } else { "overridden" };
    let rules = if spec.all {
        "every rule".to_string()
    } else {
        spec.rules.join(", ")
    };
    let end = match read(&made, created) {
        Read::Live(l) => crate::objects::overrides::until(&l)
            .map_or("until `churn-throttler resume`".to_string(), |u| {
                format!("until {}", format_time(u))
            }),
        Read::Expired { .. } | Read::Ignored { .. } => {
            "(the object does not read back as valid)".into()
        }
    };
    println!(
        "{what} {rules} from {} {end}: {KIND} {namespace}/{name} ({GROUP}/{VERSION})",
        format_time(created)
    );
    if wait.is_zero() {
        return Ok(exit::OK);
    }
    let leases: Api<Lease> = Api::namespaced(conn.client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let lease = conn
            .call(
                &format!("get lease {namespace}/{}", cluster.lease_name),
                leases.get_opt(&cluster.lease_name),
            )
            .await;
        match lease {
            Ok(Some(lease)) if taken_up(&lease, &uid) => {
                let holder = lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_else(|| "the leader".into());
                println!(
                    "taken up by the leader {holder} at {}",
                    format_time(now_millis())
                );
                return Ok(exit::OK);
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!(
                    "churn-throttler: cannot read the releaser's Lease to see the leader take it up ({e}); \
                     the {KIND} is in place"
                );
                return Ok(exit::ERROR);
            }
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!(
                "churn-throttler: the leader has not taken it up within {}s (is a releaser running?); \
                 the {KIND} is in place and applies once it does",
                wait.as_secs()
            );
            return Ok(exit::ERROR);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn resume(args: &ResumeArgs) -> Result<u8, CtlError> {
    scope_check(&args.cluster).map_err(|e| CtlError::Other(e.to_string()))?;
    if !args.all && args.rules.is_empty() {
        return Err(CtlError::Other("name the rules to resume, or --all".into()));
    }
    let conn = connect(&args.cluster).await?;
    let namespace = &args.cluster.lease_namespace;
    let objects = list_overrides(&conn, namespace)
        .await
        .map_err(|e| forbidden(e, namespace))?;
    let now: Millis = now_millis();
    let pauses: Vec<(String, Spec)> = objects
        .iter()
        .filter(|o| !matches!(read(o, now), Read::Expired { .. }))
        .filter_map(|o| {
            let spec = serde_json::from_value::<Spec>(o.data.get("spec")?.clone()).ok()?;
            Some((o.metadata.name.clone()?, spec))
        })
        .collect();
    let (delete, left) = to_resume(&pauses, &args.rules, args.all);
    let api: Api<DynamicObject> =
        Api::namespaced_with(conn.client.clone(), namespace, &api_resource());
    for name in &delete {
        conn.call(
            &format!("delete pacingoverride {namespace}/{name}"),
            api.delete(name, &DeleteParams::default()),
        )
        .await
        .map_err(|e| forbidden(e, namespace))?;
        println!("resumed: deleted {KIND} {namespace}/{name}");
    }
    if delete.is_empty() {
        println!("no pause to resume");
    }
    for name in &left {
        println!(
            "still paused by {KIND} {namespace}/{name} (it pauses other rules too, or every rule: \
             resume them all, or --all)"
        );
    }
    Ok(if left.is_empty() {
        exit::OK
    } else {
        exit::ERROR
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterArgs {
        ClusterArgs {
            kubeconfig: None,
            context: None,
            namespace: None,
            all_namespaces: false,
            lease_namespace: "churn-throttler".into(),
            lease_name: "churn-throttler-releaser".into(),
            request_timeout: Duration::from_secs(20),
        }
    }

    fn pause(rules: &[&str], all: bool, duration: Option<&str>, indefinitely: bool) -> PauseArgs {
        PauseArgs {
            rules: rules.iter().map(|r| r.to_string()).collect(),
            all,
            duration: duration.map(str::to_string),
            indefinitely,
            reason: "incident 42".into(),
            wait: WaitArgs {
                wait_timeout: Duration::from_secs(60),
            },
            cluster: cluster(),
        }
    }

    #[test]
    fn table_of_pause_command_lines() {
        assert_eq!(
            pause(&[], false, Some("30m"), false).pipe(),
            Err(Refused::NoRules)
        );
        assert_eq!(pause(&[], true, None, false).pipe(), Err(Refused::NoEnd));
        assert!(matches!(
            pause(&[], true, Some("30 min"), false).pipe(),
            Err(Refused::BadDuration(_))
        ));
        let mut namespaced = pause(&[], true, Some("30m"), false);
        namespaced.cluster.namespace = Some("team-a".into());
        assert_eq!(namespaced.pipe(), Err(Refused::Namespaced));
        let spec = pause(&["a", "b"], false, Some("30m"), false)
            .pipe()
            .expect("spec");
        assert_eq!(spec.rules, vec!["a", "b"]);
        assert!(spec.pause && !spec.all && spec.r#override.is_none());
        assert_eq!(spec.author, "alice");
        let forever = pause(&[], true, None, true).pipe().expect("spec");
        assert!(forever.all && forever.indefinitely && forever.duration.is_none());
        // What is written reads back as a live pause (the CRD's and the reader's rules agree).
        for spec in [spec, forever] {
            assert!(matches!(
                crate::objects::overrides::read_spec("p", &spec, 0, 1),
                Read::Live(_)
            ));
        }
    }

    #[test]
    fn an_override_reads_back_as_one() {
        let args = OverrideArgs {
            rule: "pods".into(),
            events: 50,
            burst: Some(5),
            max_not_ready: None,
            duration: "2h".into(),
            reason: String::new(),
            wait: WaitArgs {
                wait_timeout: Duration::ZERO,
            },
            cluster: cluster(),
        };
        let spec = override_spec(&args, "bob").expect("spec");
        let Read::Live(live) = crate::objects::overrides::read_spec("o", &spec, 0, 1) else {
            panic!("not live");
        };
        assert_eq!(
            live.scoped.adjustment,
            crate::pacing::schedule::Adjustment::Override {
                from: 0,
                until: 7_200_000,
                events: 50,
                burst: Some(5),
                max_not_ready: None
            }
        );
    }

    #[test]
    fn resume_deletes_only_pauses_of_the_named_rules() {
        let spec = |rules: &[&str], all: bool, pause: bool| Spec {
            rules: rules.iter().map(|r| r.to_string()).collect(),
            all,
            pause,
            ..Spec::default()
        };
        let objects = vec![
            ("only-a".to_string(), spec(&["a"], false, true)),
            ("a-and-b".to_string(), spec(&["a", "b"], false, true)),
            ("every".to_string(), spec(&[], true, true)),
            ("override-a".to_string(), spec(&["a"], false, false)),
            ("only-c".to_string(), spec(&["c"], false, true)),
        ];
        let a = vec!["a".to_string()];
        assert_eq!(
            to_resume(&objects, &a, false),
            (
                vec!["only-a".to_string()],
                vec!["a-and-b".to_string(), "every".to_string()]
            )
        );
        let (all, left) = to_resume(&objects, &[], true);
        assert_eq!(all, vec!["only-a", "a-and-b", "every", "only-c"]);
        assert!(left.is_empty());
    }

    #[test]
    fn the_lease_note_names_the_uids_taken_up() {
        let mut lease = Lease::default();
        assert!(!taken_up(&lease, "u1"));
        lease.metadata.annotations = Some(
            [(PACING_NOTE_ANNOTATION.to_string(), "u0,u1".to_string())]
                .into_iter()
                .collect(),
        );
        assert!(taken_up(&lease, "u1"));
        assert!(!taken_up(&lease, "u"));
    }

    #[test]
    fn misspelt_rules_are_named() {
        let known = ["a", "b"];
        assert_eq!(unknown_rules(&["a".into()], &known), None);
        assert_eq!(unknown_rules(&[], &known), None);
        assert_eq!(
            unknown_rules(&["a".into(), "c".into()], &known).as_deref(),
            Some("rule \"c\" is")
        );
        assert_eq!(
            unknown_rules(&["c".into(), "d".into()], &known).as_deref(),
            Some("rules [\"c\", \"d\"] are")
        );
    }

    #[test]
    fn a_403_names_the_role() {
        let text = forbidden(CtlError::Forbidden("no".into()), "churn-throttler").to_string();
        assert!(text.contains(OPERATOR_ROLE), "{text}");
    }

    trait Pipe {
        fn pipe(&self) -> Result<Spec, Refused>;
    }
    impl Pipe for PauseArgs {
        fn pipe(&self) -> Result<Spec, Refused> {
            pause_spec(self, "alice")
        }
    }
}
