//! Benchmark load generator for admission webhooks: POSTs distinct AdmissionReviews over
//! TLS keep-alive (h2 or HTTP/1.1, as kube-apiserver does) and prints latency and throughput.
//!
//! Open loop (`--rate R`): request n is due at start + n/R whatever happened before, and its
//! latency is measured from that due time, so a stalled server is charged for the requests
//! that queued behind the stall (no coordinated omission). Closed loop (`--rate 0`):
//! `--concurrency` workers send back to back; throughput is what the server sustains.
//!
//!   cargo run --release --example loadgen -- --url https://127.0.0.1:8443/validate \
//!       --ca ca.crt --fixture tests/fixtures/pod-delete-running.json --rate 2000 --seconds 10
//!
//! Every request gets its own uid and object name (and namespace, with --namespaces N), so
//! no two are the same request to a limiter. Only loopback addresses are accepted. One
//! result line goes to stdout (key=value, for bench/run.sh), a readable one to stderr.

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::ServerName;
use serde_json::Value;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Mutex};
use tokio_rustls::TlsConnector;

#[derive(Parser, Debug, Clone)]
#[command(about = "Load generator for admission webhooks (open and closed loop, over TLS)")]
struct Args {
    /// https://127.0.0.1:PORT/PATH or https://localhost:PORT/PATH (loopback only).
    #[arg(long)]
    url: String,
    /// PEM CA that signed the server's certificate.
    #[arg(long)]
    ca: PathBuf,
    /// TLS server name to verify [default: the URL's host].
    #[arg(long)]
    server_name: Option<String>,
    /// AdmissionReview JSON files; requests cycle through them.
    #[arg(long = "fixture", required = true)]
    fixtures: Vec<PathBuf>,
    /// h2 (one or more multiplexed connections, like kube-apiserver) or h1 (HTTP/1.1,
    /// one connection per worker).
    #[arg(long, default_value = "h2", value_parser = ["h1", "h2"])]
    proto: String,
    /// Requests per second; 0 = closed loop (as fast as the workers go).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Measured duration, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Warm-up before measuring (requests sent, not counted).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Stop after this many requests (warm-up included) even if time is left.
    #[arg(long)]
    max_requests: Option<u64>,
    /// Workers, i.e. requests in flight at most. Open loop: requests beyond it wait
    /// (and that wait counts in their latency).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// h2 connections the workers share (h1 always uses one per worker).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Give request n the namespace PREFIX-ns-(n mod N); 0 keeps the fixture's.
    #[arg(long, default_value_t = 0)]
    namespaces: u64,
    /// Prefix of generated names, uids and namespaces.
    #[arg(long, default_value = "lg")]
    prefix: String,
    /// Per-request timeout in milliseconds (counted as an error).
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Tokio worker threads of the generator.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Name of this run in the result line.
    #[arg(long, default_value = "run")]
    label: String,
}

/// A fixture with placeholders, rendered per request by concatenation (no JSON work per request).
struct Template {
    parts: Vec<Part>,
}

enum Part {
    Text(Vec<u8>),
    Uid,
    Name,
    ObjectUid,
    Namespace,
}

const MARK: &str = "@@LOADGEN-";

impl Template {
    fn new(review: &Value, vary_namespace: bool) -> anyhow::Result<Template> {
        let mut review = review.clone();
        let request = review
            .get_mut("request")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| anyhow::anyhow!("the fixture has no request"))?;
        request.insert("uid".into(), Value::String(format!("{MARK}UID@@")));
        if request.get("name").is_some_and(|n| !n.is_null()) {
            request.insert("name".into(), Value::String(format!("{MARK}NAME@@")));
        }
        if vary_namespace && request.contains_key("namespace") {
            request.insert("namespace".into(), Value::String(format!("{MARK}NS@@")));
        }
        for field in ["object", "oldObject"] {
            let Some(meta) = request
                .get_mut(field)
                .and_then(|o| o.get_mut("metadata"))
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            for (key, mark) in [("name", "NAME"), ("uid", "OUID")] {
                if meta.contains_key(key) {
                    meta.insert(key.into(), Value::String(format!("{MARK}{mark}@@")));
                }
            }
            if vary_namespace && meta.contains_key("namespace") {
                meta.insert("namespace".into(), Value::String(format!("{MARK}NS@@")));
            }
        }
        let text = serde_json::to_string(&review)?;
        let mut parts = Vec::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(MARK) {
            parts.push(Part::Text(rest.as_bytes()[..at].to_vec()));
            let after = &rest[at + MARK.len()..];
            let end = after
                .find("@@")
                .ok_or_else(|| anyhow::anyhow!("unterminated placeholder"))?;
            parts.push(match &after[..end] {
                "UID" => Part::Uid,
                "NAME" => Part::Name,
                "OUID" => Part::ObjectUid,
                _ => Part::Namespace,
            });
            rest = &after[end + 2..];
        }
        parts.push(Part::Text(rest.as_bytes().to_vec()));
        Ok(Template { parts })
    }

    /// The body of request `n`, and the uid the response must echo.
    fn render(&self, prefix: &str, run: u32, n: u64, namespaces: u64) -> (Vec<u8>, String) {
        // UUID-shaped, like the API server's, and unique per run and request.
        let uid = format!("{run:08x}-0000-4000-8000-{n:012x}");
        let name = format!("{prefix}-{n}");
        let object_uid = format!("{run:08x}-0001-4000-8000-{n:012x}");
        let namespace = format!("{prefix}-ns-{}", n % namespaces.max(1));
        let mut out = Vec::with_capacity(8192);
        for part in &self.parts {
            match part {
                Part::Text(t) => out.extend_from_slice(t),
                Part::Uid => out.extend_from_slice(uid.as_bytes()),
                Part::Name => out.extend_from_slice(name.as_bytes()),
                Part::ObjectUid => out.extend_from_slice(object_uid.as_bytes()),
                Part::Namespace => out.extend_from_slice(namespace.as_bytes()),
            }
        }
        (out, uid)
    }
}

/// One HTTP connection's request side.
enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

struct Target {
    addr: SocketAddr,
    server_name: ServerName<'static>,
    authority: String,
    path: String,
    tls: TlsConnector,
    h2: bool,
}

impl Target {
    async fn connect(&self) -> anyhow::Result<Sender> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.server_name.clone(), tcp).await?;
        let io = TokioIo::new(tls);
        if self.h2 {
            let (send, conn) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Ok(Sender::H2(send))
        } else {
            let (send, conn) = http1::handshake(io).await?;
            tokio::spawn(conn);
            Ok(Sender::H1(send))
        }
    }

    fn request(&self, body: Vec<u8>) -> anyhow::Result<Request<Full<Bytes>>> {
        // h2 takes :scheme and :authority from an absolute URI; HTTP/1.1 wants the path
        // and a Host header.
        let uri = if self.h2 {
            format!("https://{}{}", self.authority, self.path)
        } else {
            self.path.clone()
        };
        Ok(Request::post(uri)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json, */*")
            .body(Full::new(Bytes::from(body)))?)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Denied,
    Error,
}

async fn send(
    sender: &mut Sender,
    request: Request<Full<Bytes>>,
    uid: &str,
) -> anyhow::Result<Outcome> {
    let response = match sender {
        Sender::H1(s) => {
            s.ready().await?;
            s.send_request(request).await?
        }
        Sender::H2(s) => {
            s.ready().await?;
            s.send_request(request).await?
        }
    };
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if status != hyper::StatusCode::OK || !contains(&body, uid.as_bytes()) {
        return Ok(Outcome::Error);
    }
    // Compact JSON from every server measured; good enough without decoding.
    Ok(
        if contains(&body, b"\"allowed\":true") || contains(&body, b"\"allowed\": true") {
            Outcome::Allowed
        } else {
            Outcome::Denied
        },
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A request due at `due`.
struct Job {
    n: u64,
    due: Instant,
}

#[derive(Default)]
struct Tally {
    /// Latency from the due time, microseconds, measured requests only.
    latency_us: Vec<u32>,
    /// From the actual send to the answer (what a closed-loop tool would report).
    service_us: Vec<u32>,
    allowed: u64,
    denied: u64,
    errors: u64,
    timeouts: u64,
    reconnects: u64,
    /// Every request that got an outcome, warm-up included (for CPU per request).
    sent: u64,
    last_done: Option<Instant>,
}

struct Shared {
    args: Args,
    target: Target,
    templates: Vec<Template>,
    run: u32,
    measure_from: Instant,
    stop_at: Instant,
    next: AtomicU64,
    max_requests: u64,
}

async fn worker(
    shared: Arc<Shared>,
    mut sender: Option<Sender>,
    queue: Option<Arc<Mutex<mpsc::UnboundedReceiver<Job>>>>,
) -> Tally {
    let mut tally = Tally::default();
    let timeout = Duration::from_millis(shared.args.timeout_ms);
    loop {
        let job = match &queue {
            Some(queue) => match queue.lock().await.recv().await {
                Some(job) => job,
                None => break,
            },
            None => {
                let now = Instant::now();
                if now >= shared.stop_at {
                    break;
                }
                let n = shared.next.fetch_add(1, Ordering::Relaxed);
                if n >= shared.max_requests {
                    break;
                }
                Job { n, due: now }
            }
        };
        let template = &shared.templates[(job.n as usize) % shared.templates.len()];
        let (body, uid) = template.render(
            &shared.args.prefix,
            shared.run,
            job.n,
            shared.args.namespaces,
        );
        let sent_at = Instant::now();
        let outcome = match shared.target.request(body) {
            Err(_) => Err(()),
            Ok(request) => {
                if sender.is_none() {
                    tally.reconnects += 1;
                    sender = shared.target.connect().await.ok();
                }
                match sender.as_mut() {
                    None => Err(()),
                    Some(s) => match tokio::time::timeout(timeout, send(s, request, &uid)).await {
                        Ok(Ok(outcome)) => Ok(outcome),
                        Ok(Err(_)) => Err(()),
                        Err(_) => {
                            tally.timeouts += 1;
                            Err(())
                        }
                    },
                }
            }
        };
        let done = Instant::now();
        let outcome = outcome.unwrap_or_else(|()| {
            // A broken connection is replaced before the next request.
            sender = None;
            Outcome::Error
        });
        tally.sent += 1;
        if job.due < shared.measure_from {
            continue;
        }
        tally.last_done = Some(done);
        match outcome {
            Outcome::Allowed => tally.allowed += 1,
            Outcome::Denied => tally.denied += 1,
            Outcome::Error => tally.errors += 1,
        }
        let micros = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
        tally.latency_us.push(micros(done - job.due));
        tally.service_us.push(micros(done - sent_at));
    }
    tally
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank: the smallest value with at least p of the samples at or below it.
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

fn loopback_target(args: &Args) -> anyhow::Result<Target> {
    let uri: hyper::Uri = args.url.parse()?;
    anyhow::ensure!(uri.scheme_str() == Some("https"), "--url must be https://");
    let host = uri
        .host()
        .ok_or_else(|| anyhow::anyhow!("--url has no host"))?
        .trim_matches(|c| c == '[' || c == ']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let ip: IpAddr = if host == "localhost" {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse()
            .map_err(|_| anyhow::anyhow!("--url host must be localhost or a loopback IP"))?
    };
    anyhow::ensure!(ip.is_loopback(), "refusing {ip}: loopback addresses only");
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(&args.ca)
        .map_err(|e| anyhow::anyhow!("cannot read --ca {}: {e}", args.ca.display()))?;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let h2 = args.proto == "h2";
    config.alpn_protocols = vec![if h2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    let name = args.server_name.clone().unwrap_or_else(|| host.clone());
    Ok(Target {
        addr: SocketAddr::new(ip, port),
        server_name: ServerName::try_from(name)?,
        authority: uri.authority().map(|a| a.to_string()).unwrap_or_default(),
        path: uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "/".into()),
        tls: TlsConnector::from(Arc::new(config)),
        h2,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let target = loopback_target(&args)?;
    let mut templates = Vec::new();
    for path in &args.fixtures {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        templates.push(Template::new(
            &serde_json::from_str(&text)?,
            args.namespaces > 0,
        )?);
    }
    let open_loop = args.rate > 0.0;
    let total_secs = args.warmup + args.seconds;
    let max_requests = match (args.max_requests, open_loop) {
        (Some(n), _) => n,
        (None, true) => (args.rate * total_secs).ceil() as u64,
        (None, false) => u64::MAX,
    };
    // Connections first, so handshakes are not measured.
    let connections = if target.h2 {
        args.connections.clamp(1, args.concurrency)
    } else {
        args.concurrency
    };
    let mut senders = Vec::new();
    for _ in 0..connections {
        senders.push(target.connect().await?);
    }
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u32)
        .unwrap_or(0);
    let start = Instant::now() + Duration::from_millis(50);
    let shared = Arc::new(Shared {
        target,
        templates,
        run: run_id,
        measure_from: start + Duration::from_secs_f64(args.warmup),
        stop_at: start + Duration::from_secs_f64(total_secs),
        next: AtomicU64::new(0),
        max_requests,
        args: args.clone(),
    });

    let (queue, dispatcher) = if open_loop {
        let (tx, rx) = mpsc::unbounded_channel();
        let interval = Duration::from_secs_f64(1.0 / args.rate);
        // A thread of its own: tokio's timer ticks in whole milliseconds, which would
        // bunch requests and add up to a millisecond to every measured latency.
        let dispatcher = std::thread::spawn(move || {
            for n in 0..max_requests {
                let due = start + interval.mul_f64(n as f64);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if tx.send(Job { n, due }).is_err() {
                    break;
                }
            }
        });
        (Some(Arc::new(Mutex::new(rx))), Some(dispatcher))
    } else {
        tokio::time::sleep_until(start.into()).await;
        (None, None)
    };

    let mut workers = tokio::task::JoinSet::new();
    for i in 0..args.concurrency {
        let sender = if shared.target.h2 {
            match &senders[i % connections] {
                Sender::H2(s) => Some(Sender::H2(s.clone())),
                Sender::H1(_) => None,
            }
        } else {
            senders.pop()
        };
        workers.spawn(worker(shared.clone(), sender, queue.clone()));
    }
    drop(queue);
    let mut tally = Tally::default();
    // Bounded in time whatever the server does: the run, then one timeout to finish.
    let hard_stop = shared.stop_at + Duration::from_millis(args.timeout_ms + 1000);
    loop {
        match tokio::time::timeout_at(hard_stop.into(), workers.join_next()).await {
            Ok(Some(Ok(t))) => {
                tally.latency_us.extend(t.latency_us);
                tally.service_us.extend(t.service_us);
                tally.allowed += t.allowed;
                tally.denied += t.denied;
                tally.errors += t.errors;
                tally.timeouts += t.timeouts;
                tally.reconnects += t.reconnects;
                tally.sent += t.sent;
                tally.last_done = tally.last_done.max(t.last_done);
            }
            Ok(Some(Err(e))) => anyhow::bail!("a worker failed: {e}"),
            Ok(None) => break,
            Err(_) => {
                eprintln!("loadgen: hard stop; abandoning requests still in flight");
                workers.abort_all();
                break;
            }
        }
    }
    if let Some(d) = dispatcher {
        let _ = d.join();
    }
    let measured_end = if open_loop {
        // Achieved rate: requests answered over the span they were due in.
        tally
            .last_done
            .unwrap_or(shared.stop_at)
            .max(shared.stop_at)
    } else {
        tally.last_done.unwrap_or(shared.stop_at)
    };
    let span = (measured_end - shared.measure_from).as_secs_f64().max(1e-6);
    let answered = tally.allowed + tally.denied;
    let done = answered + tally.errors;
    tally.latency_us.sort_unstable();
    tally.service_us.sort_unstable();
    let l = &tally.latency_us;
    let s = &tally.service_us;
    let mode = if open_loop {
        format!("open@{}", args.rate)
    } else {
        format!("closed@{}", args.concurrency)
    };
    println!(
        "label={} mode={} proto={} requests={} throughput={:.0} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} max_ms={:.3} service_p99_ms={:.3} allowed={} denied={} errors={} timeouts={} reconnects={} sent={}",
        args.label,
        mode,
        args.proto,
        done,
        answered as f64 / span,
        percentile(l, 0.50),
        percentile(l, 0.99),
        percentile(l, 0.999),
        percentile(l, 1.0),
        percentile(s, 0.99),
        tally.allowed,
        tally.denied,
        tally.errors,
        tally.timeouts,
        tally.reconnects,
        tally.sent,
    );
    eprintln!(
        "loadgen {} {mode} {}: {done} measured in {span:.1}s = {:.0}/s; latency p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms; {} allowed, {} denied, {} errors ({} timeouts)",
        args.label,
        args.proto,
        answered as f64 / span,
        percentile(l, 0.50),
        percentile(l, 0.99),
        percentile(l, 0.999),
        percentile(l, 1.0),
        tally.allowed,
        tally.denied,
        tally.errors,
        tally.timeouts,
    );
    if tally.errors > 0 {
        std::process::exit(2);
    }
    Ok(())
}
