//! Benchmarks over the network: `blocking` (seed 002) and `net`.
//!
//! Each starts its own server on a free loopback port (in this process, on
//! its own runtime threads) unless given `--server`.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use interlock_client::{Client, ClientOptions, LockSpec};
use interlock_core::{Mode, Range};
use interlock_proto::Kind;
use serde_json::json;

use super::{Report, base_row};
use crate::remote::runtime;

#[derive(clap::Args)]
pub struct BlockingArgs {
    /// Client connections the owners are spread over.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Owners (processes) contending for one lock.
    #[arg(long, default_value_t = 200)]
    procs: usize,
    /// Milliseconds each owner holds the lock, and then sleeps.
    #[arg(long, default_value_t = 10)]
    hold: u64,
    /// Seconds of the run phase.
    #[arg(long, default_value_t = 5.0, value_parser = crate::args::positive_seconds)]
    duration: f64,
    /// Use this server instead of starting one.
    #[arg(long)]
    server: Option<String>,
    /// Skip the runs beside ours: the kernel's `fcntl`, and the loopback
    /// floor (a bare round trip after an idle hold: what a server doing
    /// no work at all would reach).
    #[arg(long)]
    no_kernel: bool,
    /// Send every request to the server (no local-first table), to see
    /// what the local table saves.
    #[arg(long)]
    no_local: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct NetArgs {
    /// Concurrent owners, each on its own resources.
    #[arg(long, default_value_t = 50)]
    owners: usize,
    /// Requests each owner keeps in flight.
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// Client connections the owners share.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Resource names each requester cycles through: 1 locks one name
    /// over and over (as `redis-benchmark` sets one key by default); more
    /// spreads the work over owners × pipeline × names resources (compare
    /// with `redis-benchmark -r`).
    #[arg(long, default_value_t = 1024)]
    names: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 3.0, value_parser = crate::args::positive_seconds)]
    duration: f64,
    /// Use this server instead of starting one.
    #[arg(long)]
    server: Option<String>,
    /// Speak TLS to our own server (with a certificate made for the run),
    /// to see what TLS costs.
    #[arg(long, conflicts_with = "server")]
    tls: bool,
    /// The worker threads of the server the benchmark starts (`serve
    /// --threads`) [default: serve's, the number of cores].
    #[arg(long, conflicts_with = "server", value_parser = crate::args::threads)]
    server_threads: Option<usize>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// A server of our own on a free loopback port, for the benchmark's life.
pub(super) struct OwnServer {
    addr: String,
    /// What clients trust, if it speaks TLS.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Its worker threads.
    pub threads: usize,
    _dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

/// How the benchmark's own server runs (when it is not given one).
#[derive(Clone, Copy, Default)]
pub(super) struct Own<'a> {
    /// It speaks TLS, with a certificate made for the run.
    pub tls: bool,
    /// In the unsafe mode (`--unsafe-no-fsync`).
    pub no_fsync: bool,
    /// Its worker threads (`--threads`); `serve`'s default if `None`.
    pub threads: Option<usize>,
    /// Its data goes in a fresh directory inside this one (the system's
    /// temporary directory if `None`).
    pub data: Option<&'a Path>,
}

/// Starts a server on a free loopback port, as `interlock serve` runs
/// one, set as `own` says.
fn own_server(own: Own) -> Result<OwnServer, String> {
    let dir = match own.data {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .map_err(|e| format!("a data directory for the benchmark's server: {e}"))?;
    let (server_tls, client_tls) = if own.tls {
        let files = crate::tls_init::generate(&dir.path().join("tls"), vec!["127.0.0.1".into()])?;
        let client = interlock_proto::tls::client_config(&files.ca).map_err(|e| e.to_string())?;
        (Some(interlock_server::TlsFiles { cert: files.cert, key: files.key }), Some(client))
    } else {
        (None, None)
    };
    let defaults = interlock_server::Config::default();
    let config = interlock_server::Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        data: dir.path().to_path_buf(),
        lease: Duration::from_secs(10),
        recovery: Duration::ZERO,
        tls: server_tls,
        unsafe_no_fsync: own.no_fsync,
        threads: own.threads.unwrap_or(defaults.threads),
        ..defaults
    };
    let threads = config.threads;
    let rt = interlock_server::runtime(&config).map_err(|e| format!("the benchmark's server: {e}"))?;
    let server = rt.block_on(interlock_server::Server::bind(config)).map_err(|e| e.to_string())?;
    let addr = server.local_addr().to_string();
    rt.spawn(server.serve(std::future::pending()));
    Ok(OwnServer { addr, tls: client_tls, threads, _dir: dir, _rt: rt })
}

/// The server to measure (`given`, else one of our own, set as `own`
/// says: see [`own_server`]) and the options to reach it with.
pub(super) fn server_addr(
    given: &Option<String>,
    own: Own,
) -> Result<(String, ClientOptions, Option<OwnServer>), String> {
    match given {
        Some(a) => Ok((a.clone(), ClientOptions::default(), None)),
        None => {
            let s = own_server(own)?;
            Ok((s.addr.clone(), ClientOptions { tls: s.tls.clone(), ..ClientOptions::default() }, Some(s)))
        }
    }
}

const BLOCKING_COLUMNS: &[(&str, &str)] = &[
    ("variant", "variant"),
    ("procs", "procs"),
    ("seconds", "seconds"),
    ("ideal s", "ideal_seconds"),
    ("grants", "grants"),
    ("ideal", "ideal_grants"),
    ("efficiency", "efficiency"),
    ("min", "min_grants"),
    ("max", "max_grants"),
    ("hand-over p50", "handover_p50_us"),
    ("hand-over p99", "handover_p99_us"),
];

/// P owners over C connections loop: blocking write lock on byte 0 of one
/// resource, hold H, unlock, sleep H, for D seconds; then each finishes
/// its cycle. Ideal: the lock always held, so (D + P·H) / H grants.
pub fn blocking(args: BlockingArgs) -> Result<(), String> {
    let (addr, base, _own) = server_addr(&args.server, Own::default())?;
    let hold = Duration::from_millis(args.hold.max(1));
    let (p, d) = (args.procs.max(1), args.duration);
    // The owners run on one thread, as in a client process: a grant then
    // wakes its owner on the thread that read it, with no second wake-up.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    // When the last unlock was sent (ns since start): the next grant's
    // arrival minus this is one hand-over as an owner sees it.
    let unlocked_at = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let (counts, secs, gaps) = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..args.clients.max(1) {
            let options = ClientOptions { no_local: args.no_local, ..base.clone() };
            clients.push(Client::connect(&addr, options).await.map_err(|e| e.to_string())?);
        }
        let start = Instant::now();
        let tasks: Vec<_> = (0..p)
            .map(|i| {
                let client = clients[i % clients.len()].clone();
                let unlocked_at = unlocked_at.clone();
                tokio::spawn(async move {
                    let mut gaps = micros();
                    let spec = LockSpec {
                        resource: b"bench-blocking".to_vec(),
                        kind: Kind::Posix,
                        owner: i as u32,
                        mode: Mode::EX,
                        range: Range::new(0, 0).expect("valid"),
                    };
                    let mut n = 0u64;
                    while start.elapsed().as_secs_f64() < d {
                        client.lock(&spec).await.map_err(|e| e.to_string())?;
                        let at = unlocked_at.swap(u64::MAX, Relaxed);
                        if let Some(gap) = (start.elapsed().as_nanos() as u64).checked_sub(at) {
                            gaps.saturating_record(gap / 1000);
                        }
                        n += 1;
                        precise_sleep(hold).await;
                        unlocked_at.store(start.elapsed().as_nanos() as u64, Relaxed);
                        client.unlock(&spec).await.map_err(|e| e.to_string())?;
                        tokio::time::sleep(hold).await;
                    }
                    Ok::<_, String>((n, gaps))
                })
            })
            .collect();
        let mut counts = Vec::new();
        let mut gaps = micros();
        for t in tasks {
            let (n, g) = t.await.map_err(|e| e.to_string())??;
            counts.push(n);
            gaps.add(g).map_err(|e| e.to_string())?;
        }
        Ok::<_, String>((counts, start.elapsed().as_secs_f64(), gaps))
    })?;
    let mut report = Report::new(args.json, BLOCKING_COLUMNS);
    let mut row = blocking_row("interlock", p, hold, d, secs, &counts);
    row.insert("handover_p50_us".into(), json!(gaps.value_at_quantile(0.5)));
    row.insert("handover_p99_us".into(), json!(gaps.value_at_quantile(0.99)));
    report.row(row);
    if !args.no_kernel {
        match super::kernel::blocking(p, hold, d) {
            Ok((counts, secs)) => report.row(blocking_row("kernel", p, hold, d, secs, &counts)),
            Err(e) => eprintln!("note: kernel run skipped: {e}"),
        }
        let samples = ((d / hold.as_secs_f64()) as usize).clamp(20, 200);
        let t = Instant::now();
        match super::floor::round_trips(hold, samples) {
            Ok(rtt) => report.row(floor_row(hold, samples, t.elapsed().as_secs_f64(), &rtt)),
            Err(e) => eprintln!("note: floor run skipped: {e}"),
        }
    }
    Ok(())
}

/// A histogram of microseconds up to a minute (longer values count as a
/// minute) to two significant digits, sized once. Every requester keeps
/// its own, so it must be small: 800 histograms of an hour to three
/// digits (188 KB each) made recording 12% of the client's CPU in
/// `bench net --pipeline 16`, and an auto-resizing one costs more still.
fn micros() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds")
}

/// A requester's latencies: gathered in a small buffer and recorded into
/// its histogram a batch at a time. Recorded one by one, each sample
/// missed the cache (800 requesters, 800 histograms), and recording was
/// a tenth of the client's CPU in `bench net --pipeline 16`, a cost no
/// real client has.
struct Latencies {
    hist: hdrhistogram::Histogram<u64>,
    batch: Vec<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies { hist: micros(), batch: Vec::with_capacity(1024) }
    }
}

impl Latencies {
    /// Records the time since `t`; returns now, the start of the next.
    fn record_since(&mut self, t: Instant) -> Instant {
        let now = Instant::now();
        self.batch.push(now.duration_since(t).as_micros() as u64);
        if self.batch.len() == self.batch.capacity() {
            self.flush();
        }
        now
    }

    fn flush(&mut self) {
        for v in self.batch.drain(..) {
            self.hist.saturating_record(v);
        }
    }

    fn finish(mut self) -> hdrhistogram::Histogram<u64> {
        self.flush();
        self.hist
    }
}

/// Holds for `d` as exactly as the kernel anchor's `usleep`: tokio's timer
/// rounds up to whole milliseconds, which would count as lost lock time,
/// so the last 2 ms are waited out by yielding (only the one holder does
/// this at a time).
async fn precise_sleep(d: Duration) {
    let deadline = Instant::now() + d;
    if let Some(coarse) = d.checked_sub(Duration::from_millis(2)) {
        tokio::time::sleep(coarse).await;
    }
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

fn blocking_row(
    variant: &str,
    p: usize,
    hold: Duration,
    d: f64,
    secs: f64,
    counts: &[u64],
) -> serde_json::Map<String, serde_json::Value> {
    let h = hold.as_secs_f64();
    let grants: u64 = counts.iter().sum();
    let ideal_seconds = d + p as f64 * h;
    let mut row = base_row("blocking", variant, p as u64, secs, grants);
    row.insert("procs".into(), json!(p));
    row.insert("hold_ms".into(), json!(hold.as_millis() as u64));
    row.insert("duration".into(), json!(d));
    row.insert("ideal_seconds".into(), json!(ideal_seconds));
    row.insert("grants".into(), json!(grants));
    row.insert("ideal_grants".into(), json!((ideal_seconds / h).round() as u64));
    row.insert("efficiency".into(), json!(grants as f64 * h / secs));
    row.insert("min_grants".into(), json!(counts.iter().min().copied().unwrap_or(0)));
    row.insert("max_grants".into(), json!(counts.iter().max().copied().unwrap_or(0)));
    row
}

/// The loopback floor's row: `efficiency` is the bound `H / (H + p50
/// round trip)`; the hand-over columns are the round trips.
fn floor_row(
    hold: Duration,
    samples: usize,
    secs: f64,
    rtt: &hdrhistogram::Histogram<u64>,
) -> serde_json::Map<String, serde_json::Value> {
    let h = hold.as_secs_f64();
    let p50 = rtt.value_at_quantile(0.5);
    let mut row = base_row("blocking", "loopback floor", samples as u64, secs, samples as u64);
    row.insert("hold_ms".into(), json!(hold.as_millis() as u64));
    row.insert("efficiency".into(), json!(h / (h + p50 as f64 / 1e6)));
    row.insert("handover_p50_us".into(), json!(p50));
    row.insert("handover_p99_us".into(), json!(rtt.value_at_quantile(0.99)));
    row
}

const NET_COLUMNS: &[(&str, &str)] = &[
    ("owners", "owners"),
    ("pipeline", "pipeline"),
    ("names", "names"),
    ("seconds", "seconds"),
    ("ops/s", "ops_per_sec"),
    ("p50 us", "p50_us"),
    ("p99 us", "p99_us"),
];

/// Lock then unlock on distinct resources: each request is one op.
pub fn net(args: NetArgs) -> Result<(), String> {
    let own = Own { tls: args.tls, threads: args.server_threads, ..Own::default() };
    let (addr, base, _own) = server_addr(&args.server, own)?;
    let rt = runtime();
    let d = Duration::from_secs_f64(args.duration);
    let names = args.names.max(1);
    let (ops, secs, hist) = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..args.clients.max(1) {
            let options = ClientOptions { no_local: true, ..base.clone() };
            clients.push(Client::connect(&addr, options).await.map_err(|e| e.to_string())?);
        }
        let start = Instant::now();
        let tasks: Vec<_> = (0..args.owners.max(1) * args.pipeline.max(1))
            .map(|i| {
                let client = clients[i % clients.len()].clone();
                tokio::spawn(async move {
                    let mut hist = Latencies::default();
                    let mut ops = 0u64;
                    let mut spec = LockSpec {
                        resource: Vec::new(),
                        kind: Kind::Posix,
                        owner: i as u32,
                        mode: Mode::EX,
                        range: Range::WHOLE,
                    };
                    let mut now = Instant::now();
                    for n in 0.. {
                        if now.duration_since(start) >= d {
                            break;
                        }
                        spec.resource.clear();
                        write!(spec.resource, "net-{i}-{}", n % names).expect("writes to a Vec");
                        client.lock(&spec).await.map_err(|e| e.to_string())?;
                        let t = hist.record_since(now);
                        client.unlock(&spec).await.map_err(|e| e.to_string())?;
                        now = hist.record_since(t);
                        ops += 2;
                    }
                    Ok::<_, String>((ops, hist.finish()))
                })
            })
            .collect();
        let mut total = 0;
        let mut hist = micros();
        for t in tasks {
            let (o, h) = t.await.map_err(|e| e.to_string())??;
            total += o;
            hist.add(h).map_err(|e| e.to_string())?;
        }
        Ok::<_, String>((total, start.elapsed().as_secs_f64(), hist))
    })?;
    let mut report = Report::new(args.json, NET_COLUMNS);
    let variant = if args.tls { "lock-unlock tls" } else { "lock-unlock" };
    let mut row = base_row("net", variant, args.owners as u64, secs, ops);
    row.insert("owners".into(), json!(args.owners));
    row.insert("pipeline".into(), json!(args.pipeline));
    row.insert("names".into(), json!(names));
    row.insert("p50_us".into(), json!(hist.value_at_quantile(0.5)));
    row.insert("p99_us".into(), json!(hist.value_at_quantile(0.99)));
    report.row(row);
    Ok(())
}
