//! The budget's shell: renews this replica's Lease, lists the others', and hands the
//! count to the budget cell it shares with the server. The share itself is computed
//! where it is used (`AppState::decision_policy`), so a stuck loop still falls back on time.

use super::{lease_name, PeerLease, Peers};
use crate::election::{within, Failure};
use crate::metrics::BudgetMetrics;
use crate::names::LEASE_LABEL;
use crate::shared::{BudgetCell, KubeClient, PolicyCell};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct Config {
    pub namespace: String,
    pub identity: String,
    /// How long a replica that stopped renewing still counts; also how long the last
    /// count is trusted without reaching the API server.
    pub duration: Duration,
    pub renew_every: Duration,
    pub call_timeout: Duration,
    /// The Pod this replica runs in ($POD_NAME, $POD_UID): the Lease is owned by it, so
    /// the garbage collector deletes the Lease with the Pod.
    pub owner: Option<(String, String)>,
    /// `--replica-budget` given explicitly: keep trying to find a cluster (fallback share
    /// meanwhile) instead of turning the budget off.
    pub required: bool,
    /// Replicas assumed while the API server cannot be reached for longer than a lease.
    pub max_replicas: u32,
}

impl Config {
    pub fn new(namespace: String, identity: String) -> Config {
        Config {
            namespace,
            identity,
            duration: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            call_timeout: Duration::from_secs(2),
            owner: None,
            required: false,
            max_replicas: 3,
        }
    }
}

/// What the budget lease uses of the process, built by `serve`: the count it writes, and
/// the policy and metrics it publishes the resulting share with.
pub struct Context {
    pub budget: Arc<BudgetCell>,
    pub policy: Arc<PolicyCell>,
    pub metrics: BudgetMetrics,
    /// The process's Kubernetes client, shared with the other shells.
    pub kube: Arc<KubeClient>,
}

impl Context {
    fn publish_budget(&self) {
        self.budget.publish(&self.policy.get(), &self.metrics);
    }
}

/// Runs until `shutdown`; then gives the Lease up so the others widen their share at once.
pub async fn run(config: Config, state: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let client = match connect(&config, &state.kube, &mut shutdown).await {
        Connected::Client(client) => client,
        Connected::NoCluster => {
            state.budget.set_off();
            state.publish_budget();
            return;
        }
        Connected::Stopped => return,
    };
    let name = lease_name(&config.identity);
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    tracing::info!(lease = %format!("{}/{name}", config.namespace), "global budget: counting replicas");
    let origin = Instant::now();
    let ms = |at: Instant| at.saturating_duration_since(origin).as_millis() as u64;
    let mut peers = Peers::default();
    let mut mine: Option<Lease> = None;
    let mut failures: u32 = 0;
    let mut last_count = 0;
    loop {
        let started = Instant::now();
        let result = match renew(&api, &config, &name, &mut mine).await {
            Ok(()) => list(&api, &config).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(listing) => {
                peers.observe(&listing, ms(started));
                let count = peers.live(&name, ms(Instant::now()));
                state.budget.set_contact(started, count);
                if count != last_count || failures > 0 {
                    tracing::info!(
                        replicas = count,
                        "global budget: each replica enforces 1/{count} of every limit"
                    );
                }
                last_count = count;
                failures = 0;
            }
            Err(why) => {
                failures += 1;
                state
                    .metrics
                    .budget_api_errors
                    .with_label_values(&["lease"])
                    .inc();
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(error = %why, failures,
                        "global budget: cannot renew or list the replica Leases; the last count holds for one lease period, then the fallback share");
                }
            }
        }
        state.publish_budget();
        tokio::select! {
            _ = tokio::time::sleep_until(started + config.renew_every) => {}
            _ = crate::shared::stopped(&mut shutdown) => {
                give_up(&api, &config, mine).await;
                return;
            }
        }
    }
}

enum Connected {
    Client(Client),
    NoCluster,
    Stopped,
}

async fn connect(
    config: &Config,
    kube: &KubeClient,
    shutdown: &mut watch::Receiver<bool>,
) -> Connected {
    if !config.required {
        return match kube.try_get().await {
            Ok(client) => Connected::Client(client),
            Err(why) => {
                tracing::warn!(error = %why,
                    "global budget off: no Kubernetes configuration (in-cluster service account, KUBECONFIG \
                     or ~/.kube/config), so this replica enforces the whole of every limit. With several \
                     replicas, give --replica-budget=true to insist");
                Connected::NoCluster
            }
        };
    }
    let missing =
        "global budget: no usable Kubernetes configuration; enforcing the fallback share meanwhile";
    match kube.get(shutdown, missing).await {
        Some(client) => Connected::Client(client),
        None => Connected::Stopped,
    }
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "churn-throttler".to_string(),
        ),
        (LEASE_LABEL.to_string(), "true".to_string()),
    ])
}

/// Creates or renews this replica's Lease; `mine` keeps the last written object, so a
/// renewal is one update guarded by its resourceVersion.
async fn renew(
    api: &Api<Lease>,
    config: &Config,
    name: &str,
    mine: &mut Option<Lease>,
) -> Result<(), Failure> {
    let limit = config.call_timeout;
    let seconds = i32::try_from(config.duration.as_secs())
        .unwrap_or(10)
        .max(1);
    let now = MicroTime(Timestamp::now());
    if mine.is_none() {
        *mine = within(limit, api.get_opt(name)).await?;
    }
    let written = match mine.take() {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(config.identity.clone());
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(now);
            within(limit, api.replace(name, &PostParams::default(), &lease)).await
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(config.namespace.clone()),
                    labels: Some(labels()),
                    owner_references: config.owner.as_ref().map(|(pod, uid)| {
                        vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Pod".into(),
                            name: pod.clone(),
                            uid: uid.clone(),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(config.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            within(limit, api.create(&PostParams::default(), &lease)).await
        }
    };
    // On any failure `mine` stays empty: the next round reads the Lease afresh.
    *mine = Some(written?);
    Ok(())
}

async fn list(api: &Api<Lease>, config: &Config) -> Result<Vec<PeerLease>, Failure> {
    let params = ListParams::default().labels(&format!("{LEASE_LABEL}=true"));
    let leases = within(config.call_timeout, api.list(&params)).await?;
    Ok(leases
        .items
        .into_iter()
        .map(|lease| {
            let spec = lease.spec.unwrap_or_default();
            PeerLease {
                name: lease.metadata.name.unwrap_or_default(),
                holder: spec.holder_identity,
                resource_version: lease.metadata.resource_version.unwrap_or_default(),
                duration_seconds: spec.lease_duration_seconds,
            }
        })
        .collect())
}

/// Clears the holder (best effort), so the others stop counting this replica at their
/// next listing instead of after a lease period.
async fn give_up(api: &Api<Lease>, config: &Config, mine: Option<Lease>) {
    let Some(mut lease) = mine else {
        return;
    };
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
    }
    let name = lease.metadata.name.clone().unwrap_or_default();
    match within(
        config.call_timeout,
        api.replace(&name, &PostParams::default(), &lease),
    )
    .await
    {
        Ok(_) => tracing::info!("global budget: gave this replica's Lease up"),
        Err(e) => {
            tracing::warn!(error = %e, "global budget: could not give the Lease up; it expires by itself")
        }
    }
}
