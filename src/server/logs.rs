//! The server's log setup: the default filter, which keeps the per-connection warnings of
//! the HTTP/2 and TLS libraries out of the log, and a layer that counts h2's in a metric.
//!
//! A client can make h2 write a WARN line per frame (an HTTP/2 rapid-reset flood wrote
//! 2,624 lines in 10 s); the log would then grow at the attacker's pace, so those lines
//! are counted (`churn_throttler_h2_warnings_total`) instead of written.

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The filter without `RUST_LOG`: info, but only errors from the libraries whose warnings
/// a client can trigger once per connection or frame.
pub const DEFAULT_FILTER: &str = "info,h2=error,rustls=error";

/// Installs the global subscriber (JSON lines with `json`, else text): the `RUST_LOG` filter (else [`DEFAULT_FILTER`]) on the
/// lines written to stderr, and the h2 warning counter beside it, whatever the filter.
pub fn init(json: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let counter = CountH2Warnings.with_filter(Targets::new().with_target("h2", Level::WARN));
    let registry = tracing_subscriber::registry().with(counter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if json {
        registry.with(fmt.json().with_filter(filter)).init();
    } else {
        registry.with(fmt.with_filter(filter)).init();
    }
}

/// Counts the warnings (and errors) of the h2 crate.
struct CountH2Warnings;

impl<S: Subscriber> Layer<S> for CountH2Warnings {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if *event.metadata().level() <= Level::WARN {
            crate::metrics::h2_warnings().inc();
        }
    }
}
