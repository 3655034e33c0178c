//! `status sts/NAME --wait`: a watch on one StatefulSet until its hold has ended and its
//! rollout is complete (`sets::rollout_state`), or it is let go, deleted, or the timeout
//! passes. One line each time what it waits for changes.

use super::cluster::{Conn, CtlError};
use super::sets::{rollout_state, Rollout};
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use std::time::Duration;

/// How a wait ended (the exit codes are in `super::exit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitEnd {
    Complete,
    LetGo {
        partition: u32,
        target: Option<u32>,
    },
    Deleted,
    /// The timeout passed; the last thing it waited for.
    TimedOut(String),
}

/// The line for a state, and the end it means (None: keep waiting).
fn describe(sts: &StatefulSet, state: &Rollout) -> (String, Option<WaitEnd>) {
    let status = sts.status.as_ref();
    let count = |v: Option<i32>| v.unwrap_or(0).max(0);
    let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let updated = count(status.and_then(|s| s.updated_replicas));
    let ready = count(status.and_then(|s| s.ready_replicas));
    match state {
        Rollout::Held { partition, target } => (
            format!(
                "held by churn-throttler at partition {partition} (target {}): {updated}/{replicas} \
                 updated, {ready}/{replicas} Ready",
                target.map_or("unreadable".to_string(), |t| t.to_string())
            ),
            None,
        ),
        Rollout::Rolling(why) => (format!("hold ended; rolling: {why}"), None),
        Rollout::Complete => (
            format!("rollout complete: {updated}/{replicas} updated, {ready}/{replicas} Ready"),
            Some(WaitEnd::Complete),
        ),
        Rollout::LetGo { partition, target } => (
            format!(
                "let go by churn-throttler at partition {partition}{}: someone else set the \
                 partition or the strategy (see the PacingStopped Event)",
                target.map_or(String::new(), |t| format!(", not its target {t}"))
            ),
            Some(WaitEnd::LetGo {
                partition: *partition,
                target: *target,
            }),
        ),
    }
}

/// Follows one StatefulSet; `timeout` zero: no timeout.
pub async fn wait(
    conn: &Conn,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<WaitEnd, CtlError> {
    let api: Api<StatefulSet> = Api::namespaced(conn.client.clone(), namespace);
    let what = format!("statefulset {namespace}/{name}");
    let first = conn
        .call(&format!("get {what}"), api.get_opt(name))
        .await?
        .ok_or_else(|| CtlError::NotFound(format!("{what} not found")))?;
    let deadline = (!timeout.is_zero()).then(|| tokio::time::Instant::now() + timeout);
    let mut seen_target: Option<u32> = None;
    let mut last = String::new();
    let mut look = |sts: &StatefulSet| -> Option<WaitEnd> {
        let state = rollout_state(sts, seen_target);
        if let Rollout::Held {
            target: Some(target),
            ..
        } = state
        {
            seen_target = Some(target);
        }
        let (line, end) = describe(sts, &state);
        if line != last {
            println!("sts/{name}: {line}");
            last = line;
        }
        end
    };
    if let Some(end) = look(&first) {
        return Ok(end);
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut failures = 0u32;
    loop {
        let next = async {
            match deadline {
                Some(at) => tokio::time::timeout_at(at, stream.try_next()).await.ok(),
                None => Some(stream.try_next().await),
            }
        };
        let Some(item) = next.await else {
            return Ok(WaitEnd::TimedOut(last));
        };
        match item {
            Ok(Some(watcher::Event::Apply(sts) | watcher::Event::InitApply(sts))) => {
                failures = 0;
                if let Some(end) = look(&sts) {
                    return Ok(end);
                }
            }
            Ok(Some(watcher::Event::Delete(_))) => return Ok(WaitEnd::Deleted),
            Ok(Some(watcher::Event::Init | watcher::Event::InitDone)) => {}
            Ok(None) => return Err(CtlError::Other(format!("the watch of {what} ended"))),
            Err(e) => {
                if let Some(status) = refusal(&e) {
                    let refused = kube::Error::Api(Box::new(status));
                    return Err(conn.classify(&format!("watch {what}"), refused));
                }
                // Anything else is retried with back-off by the watcher; said once.
                failures += 1;
                if failures == 1 {
                    eprintln!("sts/{name}: the watch failed, retrying: {e}");
                }
            }
        }
    }
}

/// A watch error that retrying cannot fix: the API server refuses these credentials.
fn refusal(e: &watcher::Error) -> Option<kube::core::Status> {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => s,
        _ => return None,
    };
    (status.code == 401 || status.code == 403).then(|| (**status).clone())
}
