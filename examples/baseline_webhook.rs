//! Benchmark baseline: the same TLS and hyper serving code as churn-throttler (the crate's
//! own `server::serve_tls` and `server::tls`), with a handler that only decodes the
//! AdmissionReview into the same kube types and answers allowed. The ceiling for this stack.
//!
//!   cargo run --release --example baseline_webhook -- --tls-cert tls.crt --tls-key tls.key \
//!       --listen 127.0.0.1:8445

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use churn_throttler::metrics::Metrics;
use churn_throttler::server::{self, tls};
use clap::Parser;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsAcceptor;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long)]
    tls_cert: PathBuf,
    #[arg(long)]
    tls_key: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8445")]
    listen: SocketAddr,
}

async fn allow(body: Bytes) -> Response {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(_) => return (StatusCode::BAD_REQUEST, "no request").into_response(),
    };
    Json(AdmissionResponse::from(&request).into_review()).into_response()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pair = tls::read_pair(&args.tls_cert, &args.tls_key)?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let key = tls::certified_key(&pair, &args.tls_cert, &args.tls_key, now)?;
    let config = tls::server_config(tls::SwappableCert::new(key), None)?;
    let listener = server::bind(args.listen, "baseline (HTTPS)").await?;
    let router = Router::new()
        .route("/validate", post(allow))
        .route("/mutate", post(allow));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(server::serve_tls(
        listener,
        TlsAcceptor::from(config),
        router,
        Arc::new(Metrics::new()),
        stop_rx,
        Duration::from_secs(1),
    ));
    eprintln!("baseline_webhook listening on https://{}", args.listen);
    tokio::signal::ctrl_c().await?;
    let _ = stop.send(true);
    let _ = serving.await;
    Ok(())
}
