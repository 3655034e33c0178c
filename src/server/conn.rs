//! Accepting and serving connections on both ports, so that no client can keep a
//! connection, a file descriptor or a slot of the server for longer than a timeout:
//! the TLS handshake, the request headers, the request body (in the handler) and an idle
//! connection each have one; HTTP/2 connections are pinged; open connections are capped
//! per port, and a connection beyond the cap is closed at once (shed), so the probes on
//! the other port always find a file descriptor.

use crate::metrics::Metrics;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// The per-connection limits of one port.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From accept to a finished TLS handshake.
    pub handshake: Duration,
    /// HTTP/1.1: from the first wait for a request's head to its last header line. hyper
    /// starts this timer whenever the connection waits for a head, so it also bounds an
    /// idle HTTP/1.1 keep-alive connection.
    pub header_read: Duration,
    /// No request in flight for this long: the connection is closed (HTTP/1.1 and HTTP/2).
    pub idle: Duration,
    /// HTTP/2 PING every interval; no answer within it closes the connection.
    pub http2_ping: Duration,
    /// Open connections at most; more are closed as they are accepted.
    pub max_connections: usize,
}

impl Default for Limits {
    /// Defaults a kube-apiserver never trips: it sends a review's head and body at once,
    /// keeps idle connections for 90 s (Go's IdleConnTimeout in its transport) and speaks
    /// HTTP/2, where the idle timeout, not the header timeout, applies between requests.
    fn default() -> Limits {
        Limits {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(120),
            http2_ping: Duration::from_secs(30),
            max_connections: 1000,
        }
    }
}

/// Serves `router` on `listener` (over TLS when `acceptor` is given) until `shutdown`
/// turns true, then lets open requests finish for at most `drain`.
pub async fn serve(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    router: Router,
    metrics: Arc<Metrics>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_ping)
        .keep_alive_timeout(limits.http2_ping);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let port = if acceptor.is_some() {
        "admission"
    } else {
        "metrics"
    };
    loop {
        let (tcp, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!("accept failed on the {port} port: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::shared::stopped(&mut shutdown) => break,
        };
        // Beyond the cap: closed at once, which frees its descriptor for the probes.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics
                .server
                .bad_requests
                .with_label_values(&["connection-limit"])
                .inc();
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match acceptor {
                Some(acceptor) => {
                    let tls =
                        match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                metrics
                                    .server
                                    .bad_requests
                                    .with_label_values(&["tls-handshake"])
                                    .inc();
                                tracing::debug!("TLS handshake failed: {e}");
                                return;
                            }
                            Err(_) => {
                                metrics
                                    .server
                                    .bad_requests
                                    .with_label_values(&["tls-handshake"])
                                    .inc();
                                return;
                            }
                        };
                    serve_one(
                        tls,
                        router,
                        &builder,
                        watcher,
                        limits.idle,
                        limits.header_read,
                    )
                    .await;
                }
                None => {
                    serve_one(
                        tcp,
                        router,
                        &builder,
                        watcher,
                        limits.idle,
                        limits.header_read,
                    )
                    .await
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain took longer than {drain:?}; closing the remaining connections");
    }
}

/// Requests in flight on one connection and when the last one ended.
struct Activity {
    origin: Instant,
    /// Requests begun on this connection.
    started: AtomicU64,
    in_flight: AtomicUsize,
    /// Milliseconds after `origin`.
    last_end: AtomicU64,
}

impl Activity {
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_end.load(Ordering::SeqCst));
        Some(self.origin.elapsed().saturating_sub(last))
    }
}

struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        activity.started.fetch_add(1, Ordering::SeqCst);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let at = self.0.origin.elapsed().as_millis() as u64;
        self.0.last_end.store(at, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection: served until it ends, or has had no request in flight for `idle`, or
/// has not completed its first request's head within `first` (hyper's HTTP/1.1 header
/// timer only starts once the protocol is known, after 24 bytes; a client that trickles
/// them, or speaks HTTP/2 and sends no request, is closed by this deadline).
async fn serve_one<I>(
    io: I,
    router: Router,
    builder: &auto::Builder<TokioExecutor>,
    watcher: hyper_util::server::graceful::Watcher,
    idle: Duration,
    first: Duration,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity {
        origin: Instant::now(),
        started: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        last_end: AtomicU64::new(0),
    });
    let inner = TowerToHyperService::new(router);
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |request| {
        let guard = InFlight::new(&tracked);
        let call = hyper::service::Service::call(&inner, request);
        async move {
            let response = call.await;
            drop(guard);
            response
        }
    });
    let connection = builder
        .serve_connection(TokioIo::new(io), service)
        .into_owned();
    let connection = watcher.watch(connection);
    tokio::pin!(connection);
    // Checked a few times per idle period: closed at most a quarter late.
    let tick = (idle.min(first) / 4).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            ended = &mut connection => {
                if let Err(e) = ended {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = tokio::time::sleep(tick) => {
                let limit = if activity.started.load(Ordering::SeqCst) == 0 {
                    idle.min(first)
                } else {
                    idle
                };
                if activity.idle_for().is_some_and(|d| d >= limit) {
                    tracing::debug!("closing a connection with no request for {limit:?}");
                    return;
                }
            }
        }
    }
}

/// The soft limit on open files of this process (Linux), to keep the admission port's cap
/// below it with room for the other port, the API clients and the files it reads.
pub fn open_file_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
