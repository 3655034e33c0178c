//! A small open-loop load client for churn-throttler: sends AdmissionReviews at a fixed
//! rate to one or more webhook replicas (weighted), each review made distinct (its own
//! uid and object name), and writes one CSV line per request. Used by
//! tests/e2e/budget.sh (global budget) and tests/soak/soak.sh (soak); see
//! docs/global-budget.md and docs/soak.md.
//!
//!   cargo run --example review_load -- --ca CA.crt --target https://127.0.0.1:8443/validate=8 \
//!       --fixture tests/fixtures/pod-eviction.json --rate 100 --seconds 60 --out events.csv
//!
//! CSV columns: send_ms,recv_ms,target,status,allowed,code,gated (wall-clock Unix ms;
//! status is the HTTP status or 0 for a transport error; allowed is 1/0, empty when not
//! decoded; code is response.status.code, e.g. 429; gated is 1 when the answer puts the pod
//! behind the scheduling gate, by its audit annotation `action: gate`: a pod admitted at
//! once carries a patch too, the seeding mark). The summary goes to stderr; the exit code is 2 when a
//! request failed or was dropped.

use clap::Parser;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex, Semaphore};

#[derive(Parser, Debug)]
struct Args {
    /// PEM CA that signed the webhooks' serving certificate.
    #[arg(long)]
    ca: std::path::PathBuf,
    /// URL=WEIGHT (weight defaults to 1); repeat for several replicas.
    #[arg(long = "target", required = true)]
    targets: Vec<String>,
    /// AdmissionReview JSON files; requests cycle through them (mixed load).
    #[arg(long = "fixture", required = true)]
    fixtures: Vec<std::path::PathBuf>,
    /// Requests per second, all targets together.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Requests in flight at most; beyond that a request is counted as dropped.
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
    /// Per-request timeout.
    #[arg(long, default_value = "15")]
    timeout_seconds: u64,
    /// CSV output (one line per request); none when absent.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Prefix of the generated object names and uids (distinct per run).
    #[arg(long, default_value = "load")]
    prefix: String,
    /// Spread the requests over this many namespaces (ns-0, ns-1, ...); 0 keeps the fixtures'.
    #[arg(long, default_value_t = 0)]
    namespaces: u64,
}

struct Record {
    send_ms: u128,
    recv_ms: u128,
    target: usize,
    status: u16,
    allowed: Option<bool>,
    code: Option<i64>,
    gated: bool,
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// The review for request `n`: its own uid, and its own object name where the fixture
/// has one, so that no two requests share a limiter identity.
fn distinct(template: &Value, prefix: &str, n: u64, namespaces: u64) -> Value {
    let mut review = template.clone();
    let name = format!("{prefix}-{n}");
    let namespace = (namespaces > 0).then(|| format!("ns-{}", n % namespaces));
    review["request"]["uid"] = json!(format!("{prefix}-uid-{n}"));
    if review["request"].get("name").is_some() {
        review["request"]["name"] = json!(name);
    }
    if let Some(ns) = &namespace {
        review["request"]["namespace"] = json!(ns);
    }
    for field in ["object", "oldObject"] {
        // get_mut, not indexing: indexing a missing key would add it as null.
        let Some(meta) = review
            .get_mut("request")
            .and_then(|r| r.get_mut(field))
            .and_then(|o| o.get_mut("metadata"))
        else {
            continue;
        };
        if meta.is_object() {
            if meta.get("name").is_some() {
                meta["name"] = json!(name);
            }
            if meta.get("uid").is_some() {
                meta["uid"] = json!(format!("{prefix}-obj-{n}"));
            }
            if meta.get("generateName").is_some() {
                meta["generateName"] = json!(format!("{name}-"));
            }
            if let (Some(ns), true) = (&namespace, meta.get("namespace").is_some()) {
                meta["namespace"] = json!(ns);
            }
        }
    }
    review
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ca = std::fs::read(&args.ca)?;
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .timeout(Duration::from_secs(args.timeout_seconds))
        .build()?;
    let mut targets = Vec::new();
    for spec in &args.targets {
        let (url, weight) = match spec.rsplit_once('=') {
            Some((url, w)) if !url.ends_with('/') && w.parse::<u32>().is_ok() => {
                (url.to_string(), w.parse::<u32>()?)
            }
            _ => (spec.clone(), 1),
        };
        targets.push((url, weight));
    }
    // A fixed, interleaved schedule of targets by weight (8,1,1 -> 0,0,0,0,0,0,0,0,1,2).
    let schedule: Vec<usize> = targets
        .iter()
        .enumerate()
        .flat_map(|(i, (_, w))| std::iter::repeat_n(i, *w as usize))
        .collect();
    anyhow::ensure!(!schedule.is_empty(), "every target has weight 0");
    let mut templates = Vec::new();
    for path in &args.fixtures {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        templates.push(serde_json::from_str::<Value>(&text)?);
    }
    let total = (args.rate * args.seconds).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    let records = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let in_flight = Arc::new(Semaphore::new(args.max_in_flight));
    let targets = Arc::new(targets);
    let started = Instant::now();
    let mut dropped = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..total {
        tokio::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            dropped += 1;
            continue;
        };
        let target = schedule[(n as usize) % schedule.len()];
        let body = distinct(
            &templates[(n as usize) % templates.len()],
            &args.prefix,
            n,
            args.namespaces,
        )
        .to_string();
        let client = client.clone();
        let targets = targets.clone();
        let records = records.clone();
        tasks.spawn(async move {
            let send_ms = unix_ms();
            let sent = client
                .post(&targets[target].0)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await;
            let (status, allowed, code, gated) = match sent {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let value: Value = response.json().await.unwrap_or(Value::Null);
                    let r = &value["response"];
                    (
                        status,
                        r["allowed"].as_bool(),
                        r["status"]["code"].as_i64(),
                        r["auditAnnotations"]["action"] == "gate",
                    )
                }
                Err(_) => (0, None, None, false),
            };
            let record = Record {
                send_ms,
                recv_ms: unix_ms(),
                target,
                status,
                allowed,
                code,
                gated,
            };
            records.lock().await.push(record);
            drop(permit);
        });
        // Reap finished tasks as we go, so the set stays small at high rates.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let records = records.lock().await;
    if let Some(path) = &args.out {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(out, "send_ms,recv_ms,target,status,allowed,code,gated")?;
        for r in records.iter() {
            let allowed = r.allowed.map(|a| if a { "1" } else { "0" }).unwrap_or("");
            let code = r.code.map(|c| c.to_string()).unwrap_or_default();
            writeln!(
                out,
                "{},{},{},{},{},{},{}",
                r.send_ms,
                r.recv_ms,
                r.target,
                r.status,
                allowed,
                code,
                u8::from(r.gated)
            )?;
        }
    }
    let mut latencies: Vec<u128> = records.iter().map(|r| r.recv_ms - r.send_ms).collect();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let errors = records.iter().filter(|r| r.status != 200).count();
    let allowed = records.iter().filter(|r| r.allowed == Some(true)).count();
    eprintln!(
        "review_load: {} sent in {elapsed:.1}s ({:.0}/s), {dropped} dropped (over {} in flight), \
         {errors} errors (not HTTP 200), {allowed} allowed, latency p50 {} ms p99 {} ms max {} ms",
        records.len(),
        records.len() as f64 / elapsed.max(0.001),
        args.max_in_flight,
        pct(0.5),
        pct(0.99),
        latencies.last().copied().unwrap_or(0),
    );
    for (i, (url, _)) in targets.iter().enumerate() {
        let mine: Vec<&Record> = records.iter().filter(|r| r.target == i).collect();
        eprintln!(
            "review_load:   target {i} {url}: {} sent, {} allowed, {} errors",
            mine.len(),
            mine.iter().filter(|r| r.allowed == Some(true)).count(),
            mine.iter().filter(|r| r.status != 200).count()
        );
    }
    if errors > 0 || dropped > 0 {
        std::process::exit(2);
    }
    Ok(())
}
