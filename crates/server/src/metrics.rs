//! Prometheus metrics (`serve --metrics ADDR`): counters kept in atomics
//! on the request path, and the rest (sessions, connections, locks,
//! waiters) read at each scrape, encoded with `prometheus-client` and
//! served as OpenMetrics text at `http://ADDR/metrics`.
//!
//! Counting costs a few relaxed atomic adds and two clock reads per
//! request, and only when metrics are on: a server without `--metrics`
//! has no [`Metrics`] and pays one branch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use interlock_proto::Op;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Inner;

/// Requests by kind, in [`op_index`] order.
const OPS: [&str; 14] = [
    "lock",
    "unlock",
    "test",
    "close",
    "cancel",
    "dlm_unlock",
    "dlm_convert",
    "renew",
    "status",
    "bye",
    "inspect",
    "evict",
    "meta",
    "changelog",
];

/// Upper bounds of the latency buckets, in microseconds (the last is
/// +Inf).
const BUCKETS_US: [u64; 14] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000];

/// The index of `op`'s kind among [`OPS`].
pub(crate) fn op_index(op: &Op) -> usize {
    match op {
        Op::Lock { .. } => 0,
        Op::Unlock { .. } => 1,
        Op::Test { .. } => 2,
        Op::Close { .. } => 3,
        Op::Cancel { .. } => 4,
        Op::DlmUnlock { .. } => 5,
        Op::DlmConvert { .. } => 6,
        Op::Renew { .. } => 7,
        Op::Status => 8,
        Op::Bye => 9,
        Op::Inspect { .. } => 10,
        Op::Evict { .. } => 11,
        Op::Meta { .. } => 12,
        Op::Changelog(_) => 13,
    }
}

/// What the server counts as it runs.
#[derive(Default)]
pub(crate) struct Metrics {
    requests: [AtomicU64; OPS.len()],
    grants: AtomicU64,
    evictions: AtomicU64,
    expiries: AtomicU64,
    /// Request service time: counts per bucket (the last past every
    /// bound), and the sum in nanoseconds.
    latency: [AtomicU64; BUCKETS_US.len() + 1],
    latency_ns: AtomicU64,
}

impl Metrics {
    /// Runs `serve` as a request of kind `op` (see [`op_index`]) and
    /// counts it with its time.
    pub fn request<R>(&self, op: usize, serve: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        self.requests[op].fetch_add(1, Relaxed);
        let r = serve();
        let took = start.elapsed();
        let us = took.as_micros() as u64;
        let bucket = BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(BUCKETS_US.len());
        self.latency[bucket].fetch_add(1, Relaxed);
        self.latency_ns.fetch_add(took.as_nanos() as u64, Relaxed);
        r
    }

    pub fn granted(&self) {
        self.grants.fetch_add(1, Relaxed);
    }

    pub fn evicted(&self) {
        self.evictions.fetch_add(1, Relaxed);
    }

    pub fn expired(&self) {
        self.expiries.fetch_add(1, Relaxed);
    }
}

/// A histogram read from the atomics at a scrape.
#[derive(Debug)]
struct Snapshot {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for Snapshot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The metrics as OpenMetrics text.
fn render(inner: &Inner, m: &Metrics) -> String {
    let s = inner.status();
    let mut r = Registry::with_prefix("interlock");
    let gauge = |v: u64| ConstGauge::new(v as i64);
    r.register("sessions", "Live sessions", gauge(s.sessions));
    r.register("connections", "Open connections", gauge(s.connections));
    r.register("max_connections", "The most connections the server takes", gauge(s.max_connections));
    r.register("resources", "Resources in the lock table", gauge(s.resources));
    r.register("locks", "Locks held", gauge(s.locks));
    r.register("waiters", "Requests queued", gauge(s.waiters));
    r.register("inodes", "Inodes in the namespace, orphans included", gauge(s.inodes));
    r.register_with_unit(
        "namespace_memory",
        "Memory the namespace is charged (an estimate: inodes, names, extended attributes)",
        Unit::Bytes,
        gauge(s.namespace_bytes),
    );
    r.register_with_unit(
        "namespace_memory_budget",
        "The namespace's memory budget: past it, new files, names and extended attributes get ENOSPC",
        Unit::Bytes,
        gauge(s.namespace_budget),
    );
    r.register_with_unit(
        "output",
        "Memory the sessions' streams keep: answers not yet acknowledged or on their way, requests held back",
        Unit::Bytes,
        gauge(s.output_bytes),
    );
    r.register(
        "replay_clients",
        "Clients with changes in the replay cache (they may ask about them again after a crash)",
        gauge(s.replay_clients),
    );
    r.register_with_unit(
        "disk",
        "Size of the file system holding the data directory",
        Unit::Bytes,
        gauge(s.disk_bytes),
    );
    r.register_with_unit(
        "disk_available",
        "Space on the data directory's file system free to the server",
        Unit::Bytes,
        gauge(s.disk_available_bytes),
    );
    r.register(
        "disk_full",
        "1 while the journal's disk is full: changes that need room are refused with ENOSPC",
        gauge(u64::from(s.disk_full)),
    );
    r.register(
        "recovering_seconds",
        "Seconds left in the recovery window after a restart",
        ConstGauge::new(s.recovering_ms as f64 / 1000.0),
    );
    r.register_with_unit(
        "uptime",
        "Time since the server started",
        Unit::Seconds,
        ConstGauge::new(s.uptime_ms as f64 / 1000.0),
    );
    let requests = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
    for (name, n) in OPS.iter().zip(&m.requests) {
        requests.get_or_create(&vec![("op", *name)]).inc_by(n.load(Relaxed));
    }
    r.register("requests", "Requests served, by operation", requests);
    r.register("grants", "Locks granted, at once or after waiting", ConstCounter::new(m.grants.load(Relaxed)));
    r.register(
        "evictions",
        "Sessions ended by an operator (interlock evict)",
        ConstCounter::new(m.evictions.load(Relaxed)),
    );
    r.register(
        "lease_expiries",
        "Sessions ended because their lease ran out",
        ConstCounter::new(m.expiries.load(Relaxed)),
    );
    let counts: Vec<u64> = m.latency.iter().map(|c| c.load(Relaxed)).collect();
    let bounds = BUCKETS_US.iter().map(|&us| us as f64 / 1e6).chain([f64::MAX]);
    let latency = Snapshot {
        sum: m.latency_ns.load(Relaxed) as f64 / 1e9,
        count: counts.iter().sum(),
        buckets: bounds.zip(counts).collect(),
    };
    r.register_with_unit(
        "request_duration",
        "Time the server spent serving each request (engine and session table; the network not included)",
        Unit::Seconds,
        latency,
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).expect("writing to a String");
    out
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, inner: Arc<Inner>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), answer(stream, &inner)).await;
        });
    }
}

/// One HTTP/1.1 exchange: `GET /metrics` gets the text, anything else 404
/// (or 405); the connection closes after it.
async fn answer(mut stream: TcpStream, inner: &Inner) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > 16 << 10 || stream.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
    }
    let line = String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == b'\r').unwrap_or(0)]).into_owned();
    let mut parts = line.split(' ');
    let (status, body) = match (parts.next(), parts.next().map(|p| p.split('?').next().unwrap_or(p))) {
        (Some("GET"), Some("/metrics")) => match &inner.metrics {
            Some(m) => ("200 OK", render(inner, m)),
            None => ("404 Not Found", String::new()),
        },
        (Some("GET"), _) => ("404 Not Found", "metrics are at /metrics\n".into()),
        _ => ("405 Method Not Allowed", String::new()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
