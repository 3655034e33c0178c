//! The API server as `status` and `release` reach it: the client from the kubeconfig as
//! kubectl finds it (`--kubeconfig`, else `KUBECONFIG`, else `~/.kube/config`, else the
//! pod's service account; `--context`), every call bounded in time, and every failure as
//! one line saying what to do.

use super::report::StepPod;
use super::ClusterArgs;
use crate::limiter::Millis;
use crate::names::GATED_LABEL;
use crate::objects::statefulsets::{
    deleted_by, pod_progress, released_pod_name, update_revision, view, View,
};
use crate::policy::{Policy, DEFAULT_POLICY_YAML};
use crate::shared::now_millis;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

/// The policy ConfigMap of the install (manifests/base, the Helm chart), its key.
pub const POLICY_CONFIGMAP: &str = "churn-throttler-policy";
const POLICY_KEY: &str = "policy.yaml";
/// Held sets whose last step's pod is read at most (a GET each).
const MAX_STEP_READS: usize = 1_000;
/// GETs in flight at once.
const CONCURRENCY: usize = 8;
/// Where the rights `status` and `release` need are written down.
const RBAC_HINT: &str = "see manifests/rbac/churn-throttler-operator.yaml for the rights it needs";

/// Why a command could not do its work, in one line.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("no Kubernetes configuration: {0}")]
    NoConfig(String),
    #[error("cannot reach the API server at {server}: {why}")]
    Unreachable { server: String, why: String },
    #[error("no answer from the API server at {server} within {seconds}s ({what})")]
    Timeout {
        server: String,
        seconds: u64,
        what: String,
    },
    #[error("{0} ({RBAC_HINT})")]
    Forbidden(String),
    #[error("the API server refuses these credentials: {0}")]
    Unauthorized(String),
    #[error(
        "churn-throttler is not installed in this cluster: no ConfigMap {configmap} and no Lease \
         {lease} (--config FILE reads a policy from a file instead)"
    )]
    NotInstalled { configmap: String, lease: String },
    #[error("{0}")]
    NotFound(String),
    /// The object changed since it was read (409, or a failed test op: 422).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Other(String),
}

/// A message on one line: newlines and runs of spaces folded.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An error with its causes, on one line ("a: b: c"), each cause once.
fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    one_line(&parts.join(": "))
}

/// A connection to the API server, with what the kubeconfig says about the user.
pub struct Conn {
    pub client: Client,
    pub server: String,
    /// The context's namespace (kubectl's default for -n).
    pub default_namespace: String,
    /// The kubeconfig's user name of the context, when there is one.
    pub kubeconfig_user: Option<String>,
    timeout: Duration,
}

/// The user name of `context` (or the current context) in a kubeconfig.
fn user_of(kubeconfig: &Kubeconfig, context: Option<&str>) -> Option<String> {
    let name = context.or(kubeconfig.current_context.as_deref())?;
    kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == name)?
        .context
        .as_ref()?
        .user
        .clone()
}

pub async fn connect(args: &ClusterArgs) -> Result<Conn, CtlError> {
    let no_config = |e: &dyn std::error::Error| CtlError::NoConfig(chain(e));
    let explicit = args.kubeconfig.is_some() || args.context.is_some();
    let (mut config, kubeconfig_user) = if explicit {
        let kubeconfig = match &args.kubeconfig {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        }
        .map_err(|e| no_config(&e))?;
        let user = user_of(&kubeconfig, args.context.as_deref());
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..Default::default()
        };
        let config = Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| no_config(&e))?;
        (config, user)
    } else {
        let config = Config::infer().await.map_err(|e| no_config(&e))?;
        let user = Kubeconfig::read().ok().and_then(|k| user_of(&k, None));
        (config, user)
    };
    config.connect_timeout = Some(args.request_timeout.min(Duration::from_secs(10)));
    let server = config.cluster_url.to_string();
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| CtlError::NoConfig(chain(&e)))?;
    Ok(Conn {
        client,
        server: server.trim_end_matches('/').to_string(),
        default_namespace,
        kubeconfig_user,
        timeout: args.request_timeout,
    })
}

impl Conn {
    /// One API call, bounded by the request timeout, its failure classified.
    pub async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, CtlError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.classify(what, e)),
            Err(_) => Err(CtlError::Timeout {
                server: self.server.clone(),
                seconds: self.timeout.as_secs(),
                what: what.to_string(),
            }),
        }
    }

    pub fn classify(&self, what: &str, e: kube::Error) -> CtlError {
        match e {
            kube::Error::Api(status) => {
                let message = one_line(&status.message);
                match status.code {
                    401 => CtlError::Unauthorized(message),
                    403 => CtlError::Forbidden(message),
                    404 => CtlError::NotFound(format!("{what}: {message}")),
                    409 | 422 => CtlError::Conflict(format!("{what}: {message}")),
                    code => CtlError::Other(format!("{what}: {message} (HTTP {code})")),
                }
            }
            kube::Error::Auth(e) => CtlError::Unauthorized(chain(&e)),
            other => CtlError::Unreachable {
                server: self.server.clone(),
                why: chain(&other),
            },
        }
    }

    /// Who the API server says this user is (a SelfSubjectReview, which every
    /// authenticated user may create), else the kubeconfig's user name.
    pub async fn who_am_i(&self) -> String {
        let api: Api<SelfSubjectReview> = Api::all(self.client.clone());
        let review = SelfSubjectReview::default();
        let asked = self
            .call(
                "selfsubjectreview",
                api.create(&PostParams::default(), &review),
            )
            .await;
        asked
            .ok()
            .and_then(|r| r.status?.user_info?.username)
            .filter(|u| !u.is_empty())
            .or_else(|| self.kubeconfig_user.clone())
            .unwrap_or_else(|| "an unknown user".to_string())
    }
}

/// Everything `status` reads, once.
pub struct Read {
    pub policy: Policy,
    pub policy_source: String,
    pub lease: Option<Lease>,
    pub pods: Vec<Pod>,
    pub sets: Vec<StatefulSet>,
    pub steps: HashMap<String, StepPod>,
    /// The PacingOverride objects (pauses, overrides) in churn-throttler's namespace.
    pub overrides: Vec<DynamicObject>,
    /// Why they could not be read (no CRD, no rights), if so.
    pub overrides_note: Option<String>,
    pub now: Millis,
}

/// The policy from `--config`, else from the install's ConfigMap; without either, the
/// built-in one when the releaser's Lease shows churn-throttler runs (`serve` without
/// --config), else "not installed".
pub async fn policy(
    conn: &Conn,
    args: &ClusterArgs,
    config: Option<&Path>,
    lease: Option<&Lease>,
) -> Result<(Policy, String), CtlError> {
    if let Some(path) = config {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CtlError::Other(format!("{}: cannot read: {e}", path.display())))?;
        let policy = Policy::from_yaml(&text, &path.display().to_string())
            .map_err(|e| CtlError::Other(one_line(&e.to_string())))?;
        return Ok((policy, format!("file {}", path.display())));
    }
    let namespace = &args.lease_namespace;
    let configmap = format!("{namespace}/{POLICY_CONFIGMAP}");
    let api: Api<ConfigMap> = Api::namespaced(conn.client.clone(), namespace);
    let found = conn
        .call(
            &format!("get configmap {configmap}"),
            api.get_opt(POLICY_CONFIGMAP),
        )
        .await?;
    let Some(found) = found else {
        if lease.is_none() {
            return Err(CtlError::NotInstalled {
                configmap,
                lease: format!("{namespace}/{}", args.lease_name),
            });
        }
        let policy = Policy::from_yaml(DEFAULT_POLICY_YAML, "built-in")
            .map_err(|e| CtlError::Other(one_line(&e.to_string())))?;
        return Ok((
            policy,
            format!("built-in (no ConfigMap {configmap}; the releaser's Lease exists)"),
        ));
    };
    let data = found.data.unwrap_or_default();
    let text = data
        .get(POLICY_KEY)
        .or_else(|| (data.len() == 1).then(|| data.values().next()).flatten())
        .ok_or_else(|| CtlError::Other(format!("ConfigMap {configmap} has no key {POLICY_KEY}")))?;
    let source = format!("ConfigMap {configmap}");
    let policy =
        Policy::from_yaml(text, &source).map_err(|e| CtlError::Other(one_line(&e.to_string())))?;
    Ok((policy, source))
}

/// The Lease, the policy, the labelled pods, every StatefulSet, and the pod of each held
/// set's last step: what the releaser itself rebuilds its windows from.
pub async fn read(
    conn: &Conn,
    args: &ClusterArgs,
    config: Option<&Path>,
) -> Result<Read, CtlError> {
    let leases: Api<Lease> = Api::namespaced(conn.client.clone(), &args.lease_namespace);
    let lease_name = format!("{}/{}", args.lease_namespace, args.lease_name);
    let lease = conn
        .call(
            &format!("get lease {lease_name}"),
            leases.get_opt(&args.lease_name),
        )
        .await?;
    let (policy, policy_source) = policy(conn, args, config, lease.as_ref()).await?;
    let pods: Api<Pod> = Api::all(conn.client.clone());
    let sets: Api<StatefulSet> = Api::all(conn.client.clone());
    let labelled = ListParams::default().labels(GATED_LABEL);
    let every = ListParams::default();
    let (pods, sets) = futures::try_join!(
        conn.call(
            "list pods labelled churn-throttler.io/gated",
            pods.list(&labelled)
        ),
        conn.call("list statefulsets", sets.list(&every)),
    )?;
    let steps = step_pods(conn, &sets.items).await?;
    let (overrides, overrides_note) = match list_overrides(conn, &args.lease_namespace).await {
        Ok(list) => (list, None),
        Err(e) => (
            Vec::new(),
            Some(format!(
                "pauses and overrides not read (PacingOverride objects in {}): {e}",
                args.lease_namespace
            )),
        ),
    };
    Ok(Read {
        policy,
        policy_source,
        lease,
        pods: pods.items,
        sets: sets.items,
        steps,
        overrides,
        overrides_note,
        now: now_millis(),
    })
}

/// The PacingOverride objects of `namespace`.
pub async fn list_overrides(conn: &Conn, namespace: &str) -> Result<Vec<DynamicObject>, CtlError> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        conn.client.clone(),
        namespace,
        &crate::objects::overrides::api_resource(),
    );
    let list = conn
        .call(
            &format!("list pacingoverrides in {namespace}"),
            api.list(&ListParams::default()),
        )
        .await?;
    Ok(list.items)
}

/// What the pod each held set's last step released shows (the partition releaser reads
/// the same pod before each round).
async fn step_pods(
    conn: &Conn,
    sets: &[StatefulSet],
) -> Result<HashMap<String, StepPod>, CtlError> {
    let mut todo = Vec::new();
    for sts in sets {
        let View::Held(set) = view(sts) else { continue };
        if set.partition >= set.replicas {
            continue;
        }
        let Some(revision) = update_revision(sts) else {
            continue;
        };
        todo.push((
            set.uid.clone(),
            set.namespace.clone(),
            released_pod_name(sts, set.partition),
            revision.to_string(),
        ));
    }
    todo.truncate(MAX_STEP_READS);
    let looked: Vec<Result<(String, StepPod), CtlError>> = futures::stream::iter(todo)
        .map(|(uid, namespace, pod, revision)| async move {
            let api: Api<Pod> = Api::namespaced(conn.client.clone(), &namespace);
            let found = conn
                .call(&format!("get pod {namespace}/{pod}"), api.get_opt(&pod))
                .await?;
            let at = now_millis();
            Ok((
                uid,
                StepPod {
                    progress: pod_progress(found.as_ref(), &revision),
                    deleted_by: deleted_by(found.as_ref(), at),
                },
            ))
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    looked.into_iter().collect()
}
