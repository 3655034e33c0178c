//! `demo`: the pacing, seen in the first minute without a cluster. It starts the webhook
//! in this process on 127.0.0.1 (the same `serve --dev` code, an ephemeral port, the
//! built-in policy) and plays a ReplicaSet controller deleting `--count` distinct pods,
//! one every `--interval`, retrying each 429 after its Retry-After as client-go does. One
//! line per answer, then a summary measured from the answers.
//!
//! In-process rather than against a running `serve --dev`: nothing else to start, no
//! port to agree on, and a fresh limiter every run, so what it prints is the policy's
//! pacing and not what an earlier run left in the window.

use crate::policy::{Limit, Policy, DEFAULT_POLICY_YAML};
use anyhow::{bail, Context};
use clap::Args;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

/// The default policy's rule that paces these deletions.
const RULE: &str = "controller-deletes";

/// Tries of one pod beyond `--count`, so the demo ends whatever the answers: every retry
/// waits at least 1 s, and the last pod's slot is about `count` spacings away (a pod
/// whose namespace holds its share of future slots is told 1 s until one frees).
const EXTRA_ATTEMPTS: u32 = 20;

/// How late an answer may reach the client after its slot and still count as on time
/// when the summary checks the spacing (the answer's trip over loopback).
pub const ANSWER_ALLOWANCE: Duration = Duration::from_millis(50);

/// One request's longest time on the wire (a hold is at most half the webhook timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Pods deleted, each a new pod (a repeat of an admitted deletion is not charged again).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub count: u32,
    /// Time between two deletions sent (a controller deleting faster than the limit).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub interval: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::policy::parse_duration(text)
}

/// How one request was answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Answer {
    /// Admitted at once.
    Allowed,
    /// Admitted after being held this long (measured at the client).
    Held(Duration),
    /// 429 with this Retry-After, in seconds.
    RetryAfter(u32),
}

/// One answer: when it arrived (since the demo began), for which pod, which try.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub at: Duration,
    pub pod: String,
    pub attempt: u32,
    pub answer: Answer,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:>8.3}s  {}  ", self.at.as_secs_f64(), self.pod)?;
        match self.answer {
            Answer::Allowed => write!(f, "allowed")?,
            Answer::Held(d) => write!(f, "held {:.3}s, allowed", d.as_secs_f64())?,
            Answer::RetryAfter(s) => write!(f, "429, Retry-After {s} s")?,
        }
        if self.attempt > 1 {
            write!(f, " (try {})", self.attempt)?;
        }
        Ok(())
    }
}

/// What the answers show, against the rule's limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub admitted: usize,
    pub held: usize,
    pub longest_hold: Duration,
    pub too_many: usize,
    /// The most admissions seen at once beyond the spacing: over every run of consecutive
    /// admissions, its length minus the spacings that fit between its first and last
    /// answer (with [`ANSWER_ALLOWANCE`]). The policy keeps this at its burst; an idle
    /// spell earns the burst back, so two admissions may be closer than the spacing again.
    pub burst_seen: usize,
    /// Most admissions answered in any interval of the rule's window length.
    pub most_in_a_window: usize,
    pub last: Duration,
}

/// The summary of a run's answers (pure: the demo prints it, the tests check it).
pub fn summarize(events: &[Event], limit: &Limit) -> Summary {
    let mut admitted: Vec<Duration> = events
        .iter()
        .filter(|e| !matches!(e.answer, Answer::RetryAfter(_)))
        .map(|e| e.at)
        .collect();
    admitted.sort();
    let burst_seen = match limit.spacing_ms() {
        Some(spacing) => (0..admitted.len())
            .flat_map(|i| (i..admitted.len()).map(move |j| (i, j)))
            .map(|(i, j)| {
                let span = admitted[j].saturating_sub(admitted[i]) + ANSWER_ALLOWANCE;
                (j - i + 1).saturating_sub((span.as_millis() as u64 / spacing) as usize)
            })
            .max()
            .unwrap_or(0),
        None => 0,
    };
    let most_in_a_window = admitted
        .iter()
        .enumerate()
        .map(|(i, start)| {
            admitted[i..]
                .iter()
                .take_while(|t| t.saturating_sub(*start) < limit.window)
                .count()
        })
        .max()
        .unwrap_or(0);
    Summary {
        admitted: admitted.len(),
        held: events
            .iter()
            .filter(|e| matches!(e.answer, Answer::Held(_)))
            .count(),
        longest_hold: events
            .iter()
            .filter_map(|e| match e.answer {
                Answer::Held(d) => Some(d),
                _ => None,
            })
            .max()
            .unwrap_or_default(),
        too_many: events
            .iter()
            .filter(|e| matches!(e.answer, Answer::RetryAfter(_)))
            .count(),
        burst_seen,
        most_in_a_window,
        last: events.iter().map(|e| e.at).max().unwrap_or_default(),
    }
}

/// The summary line: what was seen, beside what the policy promises.
pub fn summary_line(s: &Summary, limit: &Limit) -> String {
    let window = crate::policy::format_duration(limit.window);
    let spacing = match limit.spacing_ms() {
        Some(ms) => format!(
            "at most {} at once, else one per {:.3}s (policy: burst {}, spacing {:.3}s); ",
            s.burst_seen,
            ms as f64 / 1000.0,
            limit.burst,
            ms as f64 / 1000.0
        ),
        None => String::new(),
    };
    format!(
        "summary: {} pods admitted in {:.1}s, {} of them after a hold (longest {:.3}s), {} answers 429; \
         {spacing}at most {} admitted in any {window} (limit {} per {window})",
        s.admitted,
        s.last.as_secs_f64(),
        s.held,
        s.longest_hold.as_secs_f64(),
        s.too_many,
        s.most_in_a_window,
        limit.events,
    )
}

pub fn main(args: &DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let policy = Policy::from_yaml(DEFAULT_POLICY_YAML, "<built-in>")?;
    let Some(limit) = policy
        .rules
        .iter()
        .find(|r| &*r.name == RULE)
        .and_then(|r| r.limits.first().cloned())
    else {
        bail!("the built-in policy has no rule {RULE:?} with a limit");
    };
    let dir = std::env::temp_dir().join(format!("churn-throttler-demo-{}", std::process::id()));
    let result = play(args, &limit, dir.clone()).await;
    // The throw-away CA and key; a failure to remove them changes nothing of the run.
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn play(args: &DemoArgs, limit: &Limit, dir: PathBuf) -> anyhow::Result<()> {
    let running = crate::serve::start(serve_config(dir.clone())).await?;
    let addr = running.tls_addr;
    let connector = connector(&std::fs::read(dir.join("ca.crt"))?)?;
    let sample = crate::sample::pod_delete_review();
    println!(
        "churn-throttler demo: webhook on https://{addr} with the built-in policy; a ReplicaSet controller \
         deletes {} pods, one every {:.3}s, retrying each 429 after its Retry-After. Rule {RULE:?}: {limit}, \
         burst {}{}.",
        args.count,
        args.interval.as_secs_f64(),
        limit.burst,
        limit
            .spacing_ms()
            .map(|ms| format!(", then one every {:.3}s", ms as f64 / 1000.0))
            .unwrap_or_default(),
    );
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<anyhow::Result<Event>>();
    for i in 0..args.count {
        let tx = tx.clone();
        let connector = connector.clone();
        let review = review_for(&sample, i)?;
        let pod = pod_name(i);
        let send_at = start + args.interval * i;
        let max_attempts = args.count + EXTRA_ATTEMPTS;
        tokio::spawn(async move {
            tokio::time::sleep_until(send_at.into()).await;
            for attempt in 1..=max_attempts {
                let sent = Instant::now();
                let answer = match send(addr, &connector, &review).await {
                    Ok(answer) => answer,
                    Err(e) => {
                        let _ = tx.send(Err(e.context(format!("{pod}, try {attempt}"))));
                        return;
                    }
                };
                let answer = match answer {
                    Answer::Held(_) => Answer::Held(sent.elapsed()),
                    other => other,
                };
                let event = Event {
                    at: start.elapsed(),
                    pod: pod.clone(),
                    attempt,
                    answer,
                };
                let _ = tx.send(Ok(event));
                match answer {
                    Answer::RetryAfter(s) => {
                        tokio::time::sleep(Duration::from_secs(u64::from(s))).await
                    }
                    _ => return,
                }
            }
            let _ = tx.send(Err(anyhow::anyhow!(
                "{pod}: still 429 after {max_attempts} tries"
            )));
        });
    }
    drop(tx);
    let mut events = Vec::new();
    let mut failure = None;
    while let Some(event) = rx.recv().await {
        match event {
            Ok(event) => {
                println!("{event}");
                events.push(event);
            }
            Err(e) => {
                eprintln!("churn-throttler demo: {e:#}");
                failure.get_or_insert(e);
            }
        }
    }
    running.shutdown().await;
    if let Some(e) = failure {
        return Err(e);
    }
    println!("{}", summary_line(&summarize(&events, limit), limit));
    Ok(())
}

/// `serve --dev` as the demo needs it: loopback, ephemeral ports, the built-in policy,
/// nothing that looks for a cluster.
fn serve_config(dev_dir: PathBuf) -> crate::serve::Config {
    crate::serve::Config {
        dev: true,
        dev_dir,
        shutdown_delay: Duration::ZERO,
        ..crate::serve::Config::loopback()
    }
}

fn pod_name(i: u32) -> String {
    format!("web-5d9c7b8f6d-demo{:03}", i + 1)
}

/// The sample review for pod `i`: its own name and uids, so each is a distinct deletion.
fn review_for(sample: &serde_json::Value, i: u32) -> anyhow::Result<Vec<u8>> {
    let mut review = sample.clone();
    let name = pod_name(i);
    let set = |review: &mut serde_json::Value, pointer: &str, value: String| {
        review
            .pointer_mut(pointer)
            .map(|v| *v = serde_json::Value::String(value))
            .with_context(|| format!("the sample review has no {pointer}"))
    };
    set(&mut review, "/request/uid", format!("demo-request-{i:06}"))?;
    set(&mut review, "/request/name", name.clone())?;
    set(&mut review, "/request/oldObject/metadata/name", name)?;
    set(
        &mut review,
        "/request/oldObject/metadata/uid",
        format!("00000000-0000-4000-8000-{i:012}"),
    )?;
    Ok(serde_json::to_vec(&review)?)
}

fn connector(ca_pem: &[u8]) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// One POST /validate over its own HTTPS connection (HTTP/1.1, closed after the answer).
async fn send(addr: SocketAddr, connector: &TlsConnector, body: &[u8]) -> anyhow::Result<Answer> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let mut tls = connector
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let head = format!(
            "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await?;
        tls.write_all(body).await?;
        tls.flush().await?;
        let mut raw = Vec::new();
        match tls.read_to_end(&mut raw).await {
            Ok(_) => {}
            // A peer that closes without TLS close_notify after a complete answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(anyhow::Error::from(e)),
        }
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .context("no answer in time")??;
    parse_answer(&raw)
}

/// The answer's kind from an HTTP/1.1 response carrying an AdmissionReview.
fn parse_answer(raw: &[u8]) -> anyhow::Result<Answer> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no complete HTTP response")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    if !head.starts_with("HTTP/1.1 200") {
        bail!("HTTP answer {:?}", head.lines().next().unwrap_or_default());
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        bail!("unexpected chunked answer");
    }
    let review: serde_json::Value =
        serde_json::from_slice(&raw[split + 4..]).context("the answer is not JSON")?;
    let response = review
        .get("response")
        .context("the answer has no response")?;
    if response.get("allowed").and_then(|a| a.as_bool()) == Some(true) {
        let action = response
            .pointer("/auditAnnotations/action")
            .and_then(|a| a.as_str());
        return Ok(match action {
            Some("hold") => Answer::Held(Duration::ZERO),
            _ => Answer::Allowed,
        });
    }
    let code = response.pointer("/status/code").and_then(|c| c.as_u64());
    let retry = response
        .pointer("/status/details/retryAfterSeconds")
        .and_then(|s| s.as_u64());
    match (code, retry) {
        (Some(429), Some(s)) => Ok(Answer::RetryAfter(u32::try_from(s).unwrap_or(u32::MAX))),
        _ => bail!("denied without a Retry-After: {response}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ms: u64, answer: Answer) -> Event {
        Event {
            at: Duration::from_millis(ms),
            pod: "p".into(),
            attempt: 1,
            answer,
        }
    }

    fn limit() -> Limit {
        let policy =
            Policy::from_yaml(DEFAULT_POLICY_YAML, "<built-in>").unwrap_or_else(|e| panic!("{e}"));
        policy
            .rules
            .iter()
            .find(|r| &*r.name == RULE)
            .and_then(|r| r.limits.first().cloned())
            .unwrap_or_else(|| panic!("no rule"))
    }

    #[test]
    fn summary_counts_kinds_gaps_after_the_burst_and_the_fullest_window() {
        let limit = limit();
        let events = [
            ev(1, Answer::Allowed),
            ev(2, Answer::Allowed),
            ev(530, Answer::Held(Duration::from_millis(330))),
            ev(700, Answer::RetryAfter(2)),
            ev(1060, Answer::Held(Duration::from_millis(700))),
            ev(10_600, Answer::Allowed),
            // After an idle spell the burst is earned back: two at once again.
            ev(10_610, Answer::Allowed),
        ];
        let s = summarize(&events, &limit);
        assert_eq!(s.admitted, 6);
        assert_eq!(s.held, 2);
        assert_eq!(s.too_many, 1);
        assert_eq!(s.longest_hold, Duration::from_millis(700));
        assert_eq!(s.burst_seen, 2);
        assert_eq!(s.most_in_a_window, 4);
        let line = summary_line(&s, &limit);
        assert!(
            line.contains(
                "at most 2 at once, else one per 0.525s (policy: burst 2, spacing 0.525s)"
            ),
            "{line}"
        );
        // Three answers within a spacing: more than the burst, and the summary says so.
        let three = [
            ev(0, Answer::Allowed),
            ev(100, Answer::Allowed),
            ev(200, Answer::Allowed),
            ev(700, Answer::Allowed),
        ];
        assert_eq!(summarize(&three, &limit).burst_seen, 3);
        // A held answer a few milliseconds early is on time (the answer's trip).
        let paced = [
            ev(0, Answer::Allowed),
            ev(0, Answer::Allowed),
            ev(520, Answer::Allowed),
            ev(1_040, Answer::Allowed),
        ];
        assert_eq!(summarize(&paced, &limit).burst_seen, 2);
        assert!(
            line.contains("at most 4 admitted in any 10s (limit 20 per 10s)"),
            "{line}"
        );
    }

    #[test]
    fn answers_are_read_from_the_review() {
        let ok = |body: &str| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        let cases = [
            (
                r#"{"response":{"allowed":true,"auditAnnotations":{"action":"allow"}}}"#,
                Some(Answer::Allowed),
            ),
            (
                r#"{"response":{"allowed":true,"auditAnnotations":{"action":"hold"}}}"#,
                Some(Answer::Held(Duration::ZERO)),
            ),
            (
                r#"{"response":{"allowed":false,"status":{"code":429,"details":{"retryAfterSeconds":3}}}}"#,
                Some(Answer::RetryAfter(3)),
            ),
            (
                r#"{"response":{"allowed":false,"status":{"code":429}}}"#,
                None,
            ),
            ("not json", None),
        ];
        for (body, want) in cases {
            let got = parse_answer(ok(body).as_bytes()).ok();
            assert_eq!(got, want, "{body}");
        }
        assert!(parse_answer(b"HTTP/1.1 413 Payload Too Large\r\n\r\n").is_err());
    }

    #[test]
    fn every_review_names_a_new_pod() {
        let sample = crate::sample::pod_delete_review();
        let a: serde_json::Value =
            serde_json::from_slice(&review_for(&sample, 0).unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|e| panic!("{e}"));
        let b: serde_json::Value =
            serde_json::from_slice(&review_for(&sample, 1).unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|e| panic!("{e}"));
        for pointer in [
            "/request/uid",
            "/request/name",
            "/request/oldObject/metadata/uid",
        ] {
            assert_ne!(a.pointer(pointer), b.pointer(pointer), "{pointer}");
        }
        assert_eq!(
            a.pointer("/request/name"),
            a.pointer("/request/oldObject/metadata/name")
        );
    }
}
