//! `bench journal`: seed 001's shape. T threads append records of 64–256
//! bytes.
//!
//! - `append`: our journal (lock-free reservation, parallel copy and CRC),
//!   without fsync, timed until every record is written to its segment;
//! - `append-mutex`: the seed's design in the same run, as the baseline:
//!   reservation, framing and copy under one mutex, the same flusher
//!   writing the same format;
//! - `durable-group`: every append waits until durable, group commit;
//! - `durable-each`: the same with one fsync per record (the baseline for
//!   group commit).

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use interlock_journal::{Journal, Options, frame};
use serde_json::json;

use super::{Report, base_row};

#[derive(clap::Args)]
pub struct Args {
    /// Appender thread counts for the append variants.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,64", value_parser = crate::args::count)]
    threads: Vec<usize>,
    /// Appender thread counts for the durable variants.
    #[arg(long, value_delimiter = ',', default_value = "1,64", value_parser = crate::args::count)]
    durable_threads: Vec<usize>,
    /// Records per append run (split over the threads); e.g. 1M.
    #[arg(long, default_value = "1M", value_parser = super::parse_size)]
    records: u64,
    /// Seconds per durable run.
    #[arg(long, default_value_t = 2.0, value_parser = crate::args::positive_seconds)]
    seconds: f64,
    /// Where to put the logs (default: the current directory). Each run
    /// uses a fresh subdirectory, removed after. On tmpfs fsync costs
    /// nothing, so durable figures need a real disk.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Runs per append figure (baseline and ours alternate); medians are
    /// shown.
    #[arg(long, default_value_t = 5, value_parser = crate::args::count)]
    repeat: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

const COLUMNS: &[(&str, &str)] = &[
    ("variant", "variant"),
    ("threads", "threads"),
    ("records", "records"),
    ("seconds", "seconds"),
    ("ops/s", "ops_per_sec"),
    ("ours/baseline", "ratio"),
];

/// The payload of the i-th record: 64–256 bytes.
fn payload(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; 64 + (i.wrapping_mul(2_654_435_761) % 193) as usize]
}

pub fn run(args: Args) -> Result<(), String> {
    let parent = super::scratch_dir(&args.dir, "interlock-bench-journal")?;
    let mut report = Report::new(args.json, COLUMNS);
    let mut run_no = 0;
    let mut fresh = || {
        run_no += 1;
        parent.path().join(format!("run{run_no}"))
    };
    for &t in &args.threads {
        let per = (args.records / t as u64).max(1);
        // Baseline and ours alternate, and the ratio is the median of the
        // pairs' ratios: on a shared machine, load drifts between runs.
        let mut pairs: Vec<(f64, f64)> =
            (0..args.repeat).map(|_| (mutex_appends(&fresh(), t, per), appends(&fresh(), t, per))).collect();
        let mid = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let ratio = mid(&mut pairs.iter().map(|(b, o)| b / o).collect());
        let base = mid(&mut pairs.iter().map(|p| p.0).collect());
        let ours = mid(&mut pairs.iter_mut().map(|p| p.1).collect());
        let n = per * t as u64;
        let mut row = journal_row("append", t, n, ours);
        row.insert("ratio".into(), json!(ratio));
        report.row(row);
        report.row(journal_row("append-mutex", t, n, base));
    }
    for &t in &args.durable_threads {
        let each = durable(&fresh(), t, args.seconds, true);
        let group = durable(&fresh(), t, args.seconds, false);
        let (g_rate, e_rate) = (group.0 as f64 / group.1, each.0 as f64 / each.1);
        let mut row = journal_row("durable-group", t, group.0, group.1);
        row.insert("ratio".into(), json!(g_rate / e_rate));
        report.row(row);
        report.row(journal_row("durable-each", t, each.0, each.1));
    }
    Ok(())
}

fn journal_row(
    variant: &str,
    threads: usize,
    records: u64,
    seconds: f64,
) -> serde_json::Map<String, serde_json::Value> {
    let mut row = base_row("journal", variant, records, seconds, records);
    row.insert("threads".into(), json!(threads));
    row.insert("records".into(), json!(records));
    row
}

fn unsafe_options() -> Options {
    Options { fsync: false, ..Options::default() }
}

/// Seconds for `threads` threads to append `per` records each to our
/// journal, until all are written.
fn appends(dir: &std::path::Path, threads: usize, per: u64) -> f64 {
    let (j, _) = Journal::open(dir, unsafe_options()).expect("open journal");
    let j = Arc::new(j);
    let start = Instant::now();
    let appender = j.clone();
    run_appenders(threads, per, move |p| {
        appender.append(p).expect("append");
    });
    j.wait_durable(threads as u64 * per).expect("flushed");
    let s = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(dir);
    s
}

/// `threads` threads each append `per` records of 64–256 bytes with
/// `append`; returns when all are done.
fn run_appenders(threads: usize, per: u64, append: impl Fn(&[u8]) + Send + Sync + 'static) {
    let payloads: Arc<Vec<Vec<u8>>> = Arc::new((0..256).map(payload).collect());
    let append = Arc::new(append);
    let handles: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (append, p) = (append.clone(), payloads.clone());
            std::thread::spawn(move || {
                for i in 0..per {
                    append(&p[((t * per + i) % 256) as usize]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("appender");
    }
}

/// The seed's design: one lock around reservation, framing and copy; a
/// flusher thread writing the same format.
struct MutexLog {
    state: Mutex<(u64, Vec<u8>)>,
    ready: Condvar,
    written: AtomicU64,
    stop: AtomicBool,
}

fn mutex_appends(dir: &std::path::Path, threads: usize, per: u64) -> f64 {
    std::fs::create_dir_all(dir).expect("dir");
    let mut file = File::create(dir.join("baseline.seg")).expect("baseline file");
    let log = Arc::new(MutexLog {
        state: Mutex::new((1, Vec::new())),
        ready: Condvar::new(),
        written: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let flusher = {
        let log = log.clone();
        std::thread::spawn(move || {
            let mut spare = Vec::new();
            loop {
                let next = {
                    let mut g = log.state.lock().expect("lock");
                    while g.1.is_empty() && !log.stop.load(Ordering::Acquire) {
                        g = log.ready.wait_timeout(g, Duration::from_millis(100)).expect("lock").0;
                    }
                    if g.1.is_empty() {
                        return;
                    }
                    std::mem::swap(&mut g.1, &mut spare);
                    g.0
                };
                file.write_all(&spare).expect("write");
                spare.clear();
                log.written.store(next - 1, Ordering::Release);
            }
        })
    };
    let start = Instant::now();
    let appender = log.clone();
    run_appenders(threads, per, move |p| {
        let mut g = appender.state.lock().expect("lock");
        let index = g.0;
        g.0 += 1;
        frame::encode(&mut g.1, index, 0, p);
        let wake = g.1.len() > 1 << 16;
        drop(g);
        if wake {
            appender.ready.notify_one();
        }
    });
    let total = threads as u64 * per;
    while log.written.load(Ordering::Acquire) < total {
        log.ready.notify_one();
        std::thread::yield_now();
    }
    let s = start.elapsed().as_secs_f64();
    log.stop.store(true, Ordering::Release);
    log.ready.notify_one();
    flusher.join().expect("flusher");
    let _ = std::fs::remove_dir_all(dir);
    s
}

/// (records made durable, seconds) for `threads` threads each appending
/// and waiting for durability in a loop for `seconds`.
fn durable(dir: &std::path::Path, threads: usize, seconds: f64, each: bool) -> (u64, f64) {
    let options = Options { fsync: true, fsync_each: each, ..Options::default() };
    let (j, _) = Journal::open(dir, options).expect("open journal");
    let j = Arc::new(j);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (j, stop) = (j.clone(), stop.clone());
            std::thread::spawn(move || {
                let p = payload(t as u64);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    j.append_durable(&p).expect("append");
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let n: u64 = handles.into_iter().map(|h| h.join().expect("appender")).sum();
    let s = start.elapsed().as_secs_f64();
    drop(j);
    let _ = std::fs::remove_dir_all(dir);
    (n, s)
}
