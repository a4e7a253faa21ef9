//! What `GET /metrics` reports, in the Prometheus text format.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `route` and `status` of a finished request.
type RouteStatus = Vec<(&'static str, String)>;
type Route = Vec<(&'static str, &'static str)>;

/// Every metric of the server; cheap to update from any thread.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RouteStatus, Counter>,
    pub request_seconds: Family<Route, Histogram>,
    /// Texts waiting for the batcher.
    pub queue_depth: Gauge,
    /// Requests admitted and not yet answered.
    pub in_flight: Gauge,
    pub batch_texts: Histogram,
    pub batch_tokens: Histogram,
    pub batch_seconds: Histogram,
    /// Seconds a text waited in the queue before its batch started.
    pub queue_seconds: Histogram,
    pub texts: Counter,
    pub tokens: Counter,
    /// Real tokens per second of the last batch (the counter `tokens_total` gives the rate
    /// over any window).
    pub last_batch_tokens_per_second: Gauge<f64, std::sync::atomic::AtomicU64>,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 33 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("encore");
        let requests = Family::<RouteStatus, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered, by route and status",
            requests.clone(),
        );
        let request_seconds =
            Family::<Route, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its response, by route",
            request_seconds.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Texts waiting for a batch",
            queue_depth.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "requests_in_flight",
            "Requests admitted and not yet answered",
            in_flight.clone(),
        );
        let batch_texts = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        registry.register("batch_size", "Texts per batch", batch_texts.clone());
        let batch_tokens = Histogram::new(exponential_buckets(16.0, 2.0, 12));
        registry.register(
            "batch_tokens",
            "Real tokens per batch",
            batch_tokens.clone(),
        );
        let batch_seconds = latency_histogram();
        registry.register(
            "batch_duration_seconds",
            "Time to run one batch (session and pooling)",
            batch_seconds.clone(),
        );
        let queue_seconds = latency_histogram();
        registry.register(
            "queue_duration_seconds",
            "Time a text waited in the queue",
            queue_seconds.clone(),
        );
        let texts = Counter::default();
        registry.register("texts", "Texts run through the model", texts.clone());
        let tokens = Counter::default();
        registry.register(
            "tokens",
            "Real tokens run through the model",
            tokens.clone(),
        );
        let last_batch_tokens_per_second = Gauge::default();
        registry.register(
            "last_batch_tokens_per_second",
            "Real tokens per second of the last batch",
            last_batch_tokens_per_second.clone(),
        );
        Metrics {
            registry,
            requests,
            request_seconds,
            queue_depth,
            in_flight,
            batch_texts,
            batch_tokens,
            batch_seconds,
            queue_seconds,
            texts,
            tokens,
            last_batch_tokens_per_second,
        }
    }

    /// Counts a finished request.
    pub fn observe_request(&self, route: &'static str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&vec![
                ("route", route.to_string()),
                ("status", status.to_string()),
            ])
            .inc();
        self.request_seconds
            .get_or_create(&vec![("route", route)])
            .observe(seconds);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
