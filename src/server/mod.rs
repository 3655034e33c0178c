//! The shells around the pure core: HTTPS admission server, plain metrics/probe server,
//! file reloaders and graceful shutdown.

pub mod admission;
pub mod certgen;
pub mod conn;
pub mod evict;
pub mod logs;
pub mod pod_watch;
pub mod pods;
pub mod reload;
pub mod state;
pub mod tls;

use crate::metrics::Metrics;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use state::AppState;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower_http::catch_panic::CatchPanicLayer;

/// The admission router (served over TLS only).
pub fn admission_router(state: Arc<AppState>) -> Router {
    let limit = state.max_body_bytes;
    guarded(
        Router::new()
            .route("/validate", post(admission::validate))
            .route("/mutate", post(admission::mutate)),
        limit,
    )
    .with_state(state)
}

/// The guards around the admission routes: the body limit (413) and panics caught and
/// answered 500, so a bug in one decision never takes the connection or the server down.
fn guarded<S: Clone + Send + Sync + 'static>(router: Router<S>, max_body: usize) -> Router<S> {
    router
        .layer(DefaultBodyLimit::max(max_body))
        .layer(CatchPanicLayer::custom(panic_response))
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    admission::error_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "churn-throttler: internal error while deciding; the webhook's failurePolicy applies"
            .into(),
    )
}

/// Metrics and probes, on their own plain-HTTP port.
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// Serves the admission router over TLS with the default connection limits (see
/// [`conn::serve`] for the limits `serve` sets from its flags).
pub async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    conn::serve(
        listener,
        Some(acceptor),
        router,
        metrics,
        conn::Limits::default(),
        shutdown,
        drain,
    )
    .await
}

pub async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_panic_in_a_handler_is_answered_500_and_the_router_keeps_serving() {
        let router = guarded(
            Router::new()
                .route(
                    "/boom",
                    post(|| async {
                        if std::hint::black_box(true) {
                            panic!("a bug in a decision");
                        }
                        "unreachable"
                    }),
                )
                .route("/fine", post(|| async { "fine" })),
            1024,
        );
        let call = |path: &'static str| {
            let router = router.clone();
            async move {
                let response = router
                    .oneshot(
                        Request::post(path)
                            .body(Body::from("{}"))
                            .unwrap_or_else(|e| panic!("{e}")),
                    )
                    .await
                    .unwrap_or_else(|e| match e {});
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 4096)
                    .await
                    .unwrap_or_default();
                (status, String::from_utf8_lossy(&body).to_string())
            }
        };
        let (status, body) = call("/boom").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            body.contains("internal error") && body.contains("failurePolicy"),
            "{body}"
        );
        assert_eq!(call("/fine").await, (StatusCode::OK, "fine".to_string()));
    }
}
