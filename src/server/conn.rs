//! Accepting and serving connections on both ports, so that no client can keep a
//! connection, a file descriptor or a slot of the server for longer than a timeout:
//! the TLS handshake, the request headers, the request body (in the handler) and an idle
//! connection each have one; HTTP/2 connections are pinged. Open connections are capped
//! per port and per source address; at a cap a newcomer makes room by closing the
//! connection [`evict::choose`] picks (a flood's, which never completed a request, before
//! an idle one; never one with a request in flight), so a flood of idle connections can
//! neither lock the API server out nor starve the probes of the other port.

use super::evict::{self, Candidate, Caps, Choice};
use crate::metrics::Metrics;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
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
    /// Open connections at most; a newcomer beyond it evicts one (or is refused when
    /// every open one has a request in flight).
    pub max_connections: usize,
    /// Open connections from one source address at most; a newcomer beyond it evicts
    /// one of that source's.
    pub max_per_source: usize,
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
            max_per_source: per_source_default(1000),
        }
    }
}

/// The per-source cap when none is given: a quarter of the port's, so that one address
/// can take at most a quarter of the table and the API server's connections (a handful,
/// from one to a few addresses) always find room.
pub fn per_source_default(max_connections: usize) -> usize {
    (max_connections / 4).max(1)
}

/// How long an evicted connection with nothing in flight is given to write its GOAWAY
/// (HTTP/2) before it is closed; a request that raced in is served to its end.
const EVICTION_GRACE: Duration = Duration::from_millis(250);

/// One summary log line per this interval for the evictions and refusals within it,
/// instead of a line per connection (a flood would write thousands).
const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

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
    let port = if acceptor.is_some() {
        "admission"
    } else {
        "metrics"
    };
    let caps = Caps {
        total: limits.max_connections.max(1),
        per_source: limits.max_per_source.max(1),
    };
    let table = Arc::new(Mutex::new(Table::new()));
    let mut tasks = JoinSet::new();
    let mut summary = Summary::default();
    let mut summary_tick = tokio::time::interval(SUMMARY_INTERVAL);
    summary_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Finished connections' tasks, so the set holds only open ones.
        while tasks.try_join_next().is_some() {}
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    summary.accept_errors += 1;
                    summary.last_accept_error = e.to_string();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = summary_tick.tick() => {
                summary.log(port);
                // Also lowered here when connections closed without a newcomer.
                let open = lock(&table).open.len();
                metrics.server.open_connections.with_label_values(&[port]).set(open as i64);
                continue;
            }
            _ = crate::shared::stopped(&mut shutdown) => break,
        };
        let source = canonical(peer.ip());
        let admitted = lock(&table).admit(source, caps);
        let (slot, activity, evicted) = match admitted {
            Admitted::Yes {
                slot,
                activity,
                evicted,
                made_room,
            } => {
                if let Some((cap, kind)) = made_room {
                    metrics
                        .server
                        .connections_evicted
                        .with_label_values(&[port, cap.label(), kind.label()])
                        .inc();
                    summary.evicted += 1;
                }
                (
                    Slot {
                        table: table.clone(),
                        id: slot,
                    },
                    activity,
                    evicted,
                )
            }
            Admitted::No(cap) => {
                metrics
                    .server
                    .connections_refused
                    .with_label_values(&[port, cap.label()])
                    .inc();
                summary.refused += 1;
                drop(tcp);
                continue;
            }
        };
        let open = lock(&table).open.len();
        metrics
            .server
            .open_connections
            .with_label_values(&[port])
            .set(open as i64);
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let builder = builder.clone();
        let metrics = metrics.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            let _slot = slot;
            let mut stop = shutdown.clone();
            let conn = Conn {
                activity,
                evicted,
                shutdown,
                idle: limits.idle,
                first: limits.header_read,
            };
            match acceptor {
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(limits.handshake, acceptor.accept(tcp));
                    let tls = tokio::select! {
                        done = handshake => match done {
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
                        },
                        // Evicted or shut down mid-handshake: nothing was asked,
                        // nothing to finish.
                        _ = conn.evicted.notified() => return,
                        _ = crate::shared::stopped(&mut stop) => return,
                    };
                    serve_one(tls, router, &builder, conn).await;
                }
                None => serve_one(tcp, router, &builder, conn).await,
            }
        });
    }
    drop(listener);
    summary.log(port);
    // Every connection task has seen `shutdown` and is closing gracefully (HTTP/2
    // GOAWAY, HTTP/1.1 after its request); those still open after `drain` are dropped
    // with the set.
    let drained =
        tokio::time::timeout(drain, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("drain took longer than {drain:?}; closing the remaining connections");
    }
}

/// IPv4 clients of a dual-stack listener appear as `::ffff:a.b.c.d`; counted as the
/// IPv4 address, so one client is one source whichever way it came in.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn lock(table: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    // The table holds no invariant a panicking holder could break halfway (each method
    // finishes its one insert or remove), so a poisoned lock is still usable.
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The open connections of one port.
struct Table {
    origin: Instant,
    next_id: u64,
    open: HashMap<u64, Entry>,
}

struct Entry {
    source: IpAddr,
    activity: Arc<Activity>,
    evicted: Arc<Notify>,
}

enum Admitted {
    Yes {
        slot: u64,
        activity: Arc<Activity>,
        evicted: Arc<Notify>,
        /// The cap that was full and the kind of the connection closed for room.
        made_room: Option<(evict::Cap, evict::Kind)>,
    },
    No(evict::Cap),
}

impl Table {
    fn new() -> Table {
        Table {
            origin: Instant::now(),
            next_id: 0,
            open: HashMap::new(),
        }
    }

    /// Takes a slot for a newcomer from `source`, evicting one connection if a cap is full.
    fn admit(&mut self, source: IpAddr, caps: Caps) -> Admitted {
        let mut made_room = None;
        // Only at a cap is the snapshot built: below both, admission is O(sources).
        let full = self.open.len() >= caps.total
            || self.open.values().filter(|e| e.source == source).count() >= caps.per_source;
        if full {
            let snapshot: Vec<Candidate> =
                self.open.iter().map(|(id, e)| e.candidate(*id)).collect();
            match evict::choose(&snapshot, source, caps) {
                Choice::Room => {}
                Choice::Evict { id, cap, kind } => {
                    if let Some(victim) = self.open.remove(&id) {
                        victim.evicted.notify_one();
                    }
                    made_room = Some((cap, kind));
                }
                Choice::Refuse { cap } => return Admitted::No(cap),
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let opened = self.origin.elapsed().as_millis() as u64;
        let activity = Arc::new(Activity {
            origin: self.origin,
            opened,
            started: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_end: AtomicU64::new(opened),
        });
        let evicted = Arc::new(Notify::new());
        self.open.insert(
            id,
            Entry {
                source,
                activity: activity.clone(),
                evicted: evicted.clone(),
            },
        );
        Admitted::Yes {
            slot: id,
            activity,
            evicted,
            made_room,
        }
    }
}

impl Entry {
    fn candidate(&self, id: u64) -> Candidate {
        let a = &self.activity;
        Candidate {
            id,
            source: self.source,
            opened: Duration::from_millis(a.opened),
            completed: a.completed.load(Ordering::SeqCst) > 0,
            in_flight: a.in_flight.load(Ordering::SeqCst),
            last_active: Duration::from_millis(a.last_end.load(Ordering::SeqCst)),
        }
    }
}

/// A connection's place in the table, given back when its task ends (unless an eviction
/// took it already).
struct Slot {
    table: Arc<Mutex<Table>>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.table).open.remove(&self.id);
    }
}

/// Evictions, refusals and accept errors since the last summary line.
#[derive(Default)]
struct Summary {
    evicted: u64,
    refused: u64,
    accept_errors: u64,
    last_accept_error: String,
}

impl Summary {
    fn log(&mut self, port: &str) {
        if self.evicted > 0 || self.refused > 0 {
            tracing::warn!(
                evicted = self.evicted,
                refused = self.refused,
                "the {port} port was at its connection caps in the last 10 s: connections closed to make room (evicted) and newcomers refused (every candidate had a request in flight)"
            );
        }
        if self.accept_errors > 0 {
            tracing::warn!(
                errors = self.accept_errors,
                "accept failed on the {port} port: {}",
                self.last_accept_error
            );
        }
        *self = Summary::default();
    }
}

/// Requests in flight on one connection and when the last one ended.
struct Activity {
    origin: Instant,
    /// Milliseconds after `origin` the connection was accepted.
    opened: u64,
    /// Requests begun on this connection.
    started: AtomicU64,
    /// Requests ended on this connection.
    completed: AtomicU64,
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
        self.0.completed.fetch_add(1, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one connection's task watches besides its I/O.
struct Conn {
    activity: Arc<Activity>,
    /// Notified when an eviction took this connection's slot.
    evicted: Arc<Notify>,
    shutdown: watch::Receiver<bool>,
    idle: Duration,
    first: Duration,
}

/// One connection: served until it ends, or has had no request in flight for `idle`, or
/// has not completed its first request's head within `first` (hyper's HTTP/1.1 header
/// timer only starts once the protocol is known, after 24 bytes; a client that trickles
/// them, or speaks HTTP/2 and sends no request, is closed by this deadline). Evicted or
/// shut down: closed gracefully (HTTP/2 GOAWAY; HTTP/1.1 after the request it serves).
async fn serve_one<I>(io: I, router: Router, builder: &auto::Builder<TokioExecutor>, conn: Conn)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Conn {
        activity,
        evicted,
        mut shutdown,
        idle,
        first,
    } = conn;
    // The first request's deadline counts from here: the handshake had its own timeout.
    // (Eviction ranks a connection that never completed a request by `opened`, so this
    // moves nothing there.)
    let now = activity.origin.elapsed().as_millis() as u64;
    activity.last_end.store(now, Ordering::SeqCst);
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
    tokio::pin!(connection);
    // Checked a few times per idle period: closed at most a quarter late.
    let tick = (idle.min(first) / 4).max(Duration::from_millis(50));
    // When an eviction asked this connection to go.
    let mut evicted_at: Option<Instant> = None;
    let mut stopping = false;
    loop {
        let grace = if evicted_at.is_some() {
            EVICTION_GRACE
        } else {
            tick
        };
        tokio::select! {
            ended = &mut connection => {
                if let Err(e) = ended {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = evicted.notified(), if evicted_at.is_none() => {
                connection.as_mut().graceful_shutdown();
                evicted_at = Some(Instant::now());
            }
            _ = crate::shared::stopped(&mut shutdown), if !stopping => {
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
            _ = tokio::time::sleep(grace) => {
                if let Some(at) = evicted_at {
                    // The GOAWAY had its time to be written; a request that raced in is
                    // served to its end (bounded by the body and hold deadlines).
                    if at.elapsed() >= EVICTION_GRACE && activity.idle_for().is_some() {
                        return;
                    }
                    continue;
                }
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
