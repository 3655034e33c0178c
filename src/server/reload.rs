//! Polls the certificate and policy files and swaps in changes.
//! Polling content rather than watching events: a mounted Secret or ConfigMap is
//! updated by an atomic symlink swap that file watches miss.

use super::state::AppState;
use super::tls::{certified_key, read_pair, PemPair, SwappableCert};
use crate::policy::Policy;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub target: Arc<SwappableCert>,
}

/// One check of the certificate files: Ok(true) when a new pair was loaded.
pub fn reload_cert(
    files: &CertFiles,
    last: &mut Option<PemPair>,
    state: &AppState,
) -> Result<bool, String> {
    let pair = read_pair(&files.cert, &files.key).map_err(|e| e.to_string())?;
    if last.as_ref() == Some(&pair) {
        return Ok(false);
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    match certified_key(&pair, &files.cert, &files.key, now) {
        Ok(key) => {
            files.target.swap(key);
            *last = Some(pair);
            state
                .metrics
                .server
                .reloads
                .with_label_values(&["certificate", "success"])
                .inc();
            Ok(true)
        }
        Err(e) => {
            // Remember the bad content too, so it is reported once, not every poll.
            *last = Some(pair);
            state
                .metrics
                .server
                .reloads
                .with_label_values(&["certificate", "error"])
                .inc();
            Err(e.to_string())
        }
    }
}

/// One check of the policy file: Ok(true) when a new policy is in force.
pub fn reload_policy(
    path: &PathBuf,
    last: &mut Option<Vec<u8>>,
    state: &AppState,
) -> Result<bool, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if last.as_ref() == Some(&bytes) {
        return Ok(false);
    }
    *last = Some(bytes.clone());
    let text = String::from_utf8_lossy(&bytes);
    let checked = Policy::from_yaml(&text, &path.display().to_string())
        .map_err(|e| e.to_string())
        .and_then(|policy| state.check_hold_bound(&policy).map(|()| policy));
    match checked {
        Ok(policy) => {
            state.set_policy(policy);
            state
                .metrics
                .server
                .reloads
                .with_label_values(&["policy", "success"])
                .inc();
            Ok(true)
        }
        Err(e) => {
            state
                .metrics
                .server
                .reloads
                .with_label_values(&["policy", "error"])
                .inc();
            Err(e)
        }
    }
}

/// Polls both until shutdown; a bad file keeps the last good one and is logged.
pub async fn poll(
    state: Arc<AppState>,
    cert: Option<(CertFiles, PemPair)>,
    policy: Option<(PathBuf, Vec<u8>)>,
    interval: Duration,
    reload_now: Arc<tokio::sync::Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (cert_files, mut last_cert) = match cert {
        Some((files, pair)) => (Some(files), Some(pair)),
        None => (None, None),
    };
    let (policy_path, mut last_policy) = match policy {
        Some((path, bytes)) => (Some(path), Some(bytes)),
        None => (None, None),
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            // SIGHUP: check both files now rather than at the next tick.
            _ = reload_now.notified() => {}
            _ = crate::shared::stopped(&mut shutdown) => return,
        }
        if let Some(files) = &cert_files {
            match reload_cert(files, &mut last_cert, &state) {
                Ok(true) => tracing::info!(cert = %files.cert.display(), "certificate reloaded"),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!("certificate not reloaded, keeping the last good one: {e}")
                }
            }
        }
        if let Some(path) = &policy_path {
            match reload_policy(path, &mut last_policy, &state) {
                Ok(true) => tracing::info!(policy = %path.display(), "policy reloaded"),
                Ok(false) => {}
                Err(e) => tracing::error!("policy not reloaded, keeping the last good one: {e}"),
            }
        }
    }
}
