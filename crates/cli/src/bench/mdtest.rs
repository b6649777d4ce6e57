//! `bench mdtest`: mdtest's single-shared-directory shape (seeds 001 and
//! 003). T creators make N empty files in all (N/T each) in one
//! directory, then stat them, then unlink them.
//!
//! - `engine`: the namespace library in-process, its journal on the
//!   project's disk with group commit (fsync on). `--ack each`: every
//!   creator waits until its change is durable before the next (a
//!   synchronous client: on this disk an fsync is ~150 µs, which caps one
//!   creator near 6,500 changes/s whatever the namespace does); `--ack
//!   end`: creators go on at once and the phase ends when every record is
//!   durable (a server with many requests in flight): what the namespace
//!   and the journal can do, core for core. With `--changelog on` a
//!   consumer follows the changelog during the run, reading as records
//!   come and clearing every 10,000 records or every second; the records
//!   written are the same either way (the journal's record is the
//!   changelog's). Its rows also give what the consumer cost:
//!   `consumer_ns_per_record`, the CPU time its thread took over the
//!   whole run (the three phases) per record it read. On two cores that
//!   time is taken from the creators, so it is the floor under the
//!   rate's gap between `on` and `off` when they keep both cores busy
//!   (`--ack end`), and unlike the rates it does not swing with a shared
//!   machine's neighbours. `flusher_ns_per_record` is the same for the
//!   journal's flusher thread (every store's, `engine-apart`), per
//!   record it wrote: what a creator's record costs beside the creator,
//!   on a core that two creators need.
//! - `memory`: the namespace alone, no journal (not durable): how it
//!   scales with no disk and no flusher thread beside it.
//! - `engine-apart`, `memory-apart`: each of the T creators makes N files
//!   in a store (or namespace) of its own, T×N in all, so that each grows
//!   as one creator's does: nothing of ours is shared between them, only
//!   the process and the machine. Beside `engine` and `memory` at one
//!   creator, they are the most T creators could make here whatever the
//!   namespace shares: the ceiling for the shared directory's scaling.
//! - `net`: through a server over loopback (started by the benchmark,
//!   its journal in `--dir` as the engine's, unless `--server`):
//!   T creators, each waiting for its answer (durable) before its next
//!   request, each on its own connection as `redis-benchmark -c T` does,
//!   or (`--connections`) sharing fewer, as the processes of one mount
//!   share its session: a connection's answers that one sync covers then
//!   leave in one write. With `--changelog on` a consumer follows over a
//!   connection of its own, as `interlock changelog read --follow` does
//!   (as many records a request as the server gives, clearing as the
//!   engine's does), on a thread and a runtime of its own as a program
//!   of its own would be; its cost to the server shows in
//!   `server_cpu_us_per_op`, its own (the protocol's records decoded) in
//!   `consumer_ns_per_record`.
//! - `net-nofsync`: `net` with its own server in the unsafe mode
//!   (`--unsafe-no-fsync`): answers once the record is written, not
//!   durable. Not a way to run: beside `net` and `redis`, it shows what
//!   the durability costs.
//! - `redis`, `redis-aof`: the anchor for `net` (see `redis`): SET and
//!   GET rows as `create` and `stat`.
//! - `floor`: the floor under `net`'s durable creates (see `resp_floor`):
//!   a durable server with no work of its own, its SETs and GETs driven
//!   by `redis-benchmark` as Redis's are.
//! - `kernel`: the same shape on tmpfs (`/dev/shm`): open(O_CREAT|O_EXCL)
//!   and close, stat, unlink. Not durable; the directory's `i_rwsem`
//!   serializes its creators.
//!
//! Each row also gives the machine's CPU time per operation over the
//! phase (`cpu_us_per_op`, every process and the kernel: see `machine`):
//! for `net` and `redis` the server and its clients together. Their rate
//! swings with a shared machine's neighbours far more than this does, and
//! with the cores saturated, it is what sets the rate. For `net` (its own
//! server, clients on one thread) and `redis`, `server_cpu_us_per_op` is
//! the server's part of it: `redis-server`'s process, or every thread of
//! ours but the clients' (the kernel's work on a server's behalf counts
//! when done on its threads, as a `send`'s loopback delivery is).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use interlock_client::{Client, ClientOptions};
use interlock_journal::FLUSHER_THREAD;
use interlock_journal::changelog::Mask;
use interlock_meta::{Cred, Errno, FileType, Ino, Namespace, NewInode, ROOT, Seq, Store, StoreOptions};
use serde_json::{Map, Value, json};

use super::machine::{Server, Span, Took, measured, named_threads_cpu_ns, thread_cpu_ns};
use super::{Report, scratch_dir};
use interlock_server::now;

#[derive(clap::Args)]
pub struct Args {
    /// Creator thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,64", value_parser = crate::args::count)]
    threads: Vec<usize>,
    /// Files in all, per run (split over the threads); e.g. 100k.
    #[arg(long, default_value = "200k", value_parser = super::parse_size)]
    files: u64,
    /// Changelog consumer following the run: on, off or both (`engine`:
    /// a thread reading the store; `net`, `net-nofsync`: a client over
    /// the protocol).
    #[arg(long, value_delimiter = ',', default_value = "off,on", value_parser = on_off)]
    changelog: Vec<bool>,
    /// When a creator counts a change as done: `each` (it waits for that
    /// change to be durable before the next), `end` (the phase waits
    /// for all to be durable), or both.
    #[arg(long, value_delimiter = ',', default_value = "each,end", value_parser = ["each", "end"])]
    ack: Vec<String>,
    /// Variants: engine, engine-apart, memory, memory-apart, net,
    /// net-nofsync, kernel, redis, floor. `-apart`: each creator makes N
    /// files in a store of its own (T×N in all; nothing shared but the
    /// process; no changelog consumer), the ceiling for `engine`'s and
    /// `memory`'s scaling.
    /// `redis`: `redis-benchmark` SET and GET with T clients beside `net`'s
    /// creates and stats, in memory and durable with `appendfsync always`
    /// (skipped if Redis is not installed). `net-nofsync` is
    /// `net` with its own server in the unsafe mode (`--unsafe-no-fsync`:
    /// answered once written, not durable): beside `net` and `redis`, it
    /// shows what the durability costs. `floor` is a durable server that
    /// does nothing but read, write one 64-byte record per SET, one
    /// `fdatasync` per batch, and answer, driven by `redis-benchmark`
    /// as Redis is (skipped with it): the most any durable create over
    /// loopback can reach here.
    #[arg(long, value_delimiter = ',', default_value = "engine,memory,net,kernel,redis", value_parser = ["engine", "engine-apart", "memory", "memory-apart", "net", "net-nofsync", "kernel", "redis", "floor"])]
    variant: Vec<String>,
    /// For `net`: measure this server (HOST:PORT) instead of starting one.
    #[arg(long, value_parser = crate::args::server)]
    server: Option<String>,
    /// Where the engine's journal goes, and that of `net`'s own server
    /// (default: the current directory; a fresh subdirectory per run,
    /// removed after). On tmpfs an fsync costs nothing: durable figures
    /// need a real disk.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// For `net` and `net-nofsync`: the worker threads of the server the
    /// benchmark starts (`serve --threads`) [default: the cores the
    /// clients leave, at least 1: on 2 cores, 1, as Redis beside
    /// redis-benchmark. A server that shares its cores with its clients
    /// serves them faster with fewer workers than cores (see
    /// `serve --threads`)].
    #[arg(long, conflicts_with = "server", value_parser = crate::args::threads)]
    server_threads: Option<usize>,
    /// For `net`: threads the clients run on. 1, as redis-benchmark's
    /// run: a reply wakes its client on the thread that read it, and the
    /// cores are left to the server.
    #[arg(long, default_value = "1", value_parser = clap::value_parser!(u32).range(1..))]
    client_threads: u32,
    /// For `net` and `net-nofsync`: the connections the T creators share,
    /// dealt out in turn: `each` (one per creator, as `redis-benchmark -c
    /// T` opens), or a number (1: the shape of T processes on one mount,
    /// which is one session); several to compare them in the same rounds.
    #[arg(long, value_delimiter = ',', default_value = "each", value_parser = connections)]
    connections: Vec<Option<usize>>,
    /// Rounds of every thread count and variant, interleaved (each once
    /// a round, so a noisy spell of a shared machine falls on all of them
    /// alike); each row is then the median of its rounds.
    #[arg(long, default_value = "1", value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// `each` (`None`: one per creator) or a count of at least 1.
fn connections(s: &str) -> Result<Option<usize>, String> {
    match s {
        "each" => Ok(None),
        _ => match s.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(format!("{s:?}: expected each or a number of connections from 1")),
        },
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: expected on or off")),
    }
}

const COLUMNS: &[(&str, &str)] = &[
    ("variant", "variant"),
    ("phase", "phase"),
    ("threads", "threads"),
    ("files", "files"),
    ("changelog", "changelog"),
    ("ack", "ack"),
    ("conns", "connections"),
    ("seconds", "seconds"),
    ("ops/s", "ops_per_sec"),
    ("cpu µs/op", "cpu_us_per_op"),
    ("server µs/op", "server_cpu_us_per_op"),
    ("reader ns/rec", "consumer_ns_per_record"),
    ("flusher ns/rec", "flusher_ns_per_record"),
];

pub(super) const PHASES: [&str; 3] = ["create", "stat", "unlink"];

pub fn run(args: Args) -> Result<(), String> {
    if args.server.is_some() && args.variant.iter().any(|v| v == "net-nofsync") {
        return Err(
            "--variant net-nofsync runs a server of its own in the unsafe mode; it cannot measure --server".into()
        );
    }
    if args.variant.iter().any(|v| v == "redis" || v == "floor") && !super::redis::installed() {
        eprintln!(
            "interlock bench: redis and floor skipped: redis-server and redis-benchmark are not installed (Debian package redis-server)"
        );
    }
    // Each thread count's files: a multiple of it.
    let mut sizes = Vec::new();
    for &t in &args.threads {
        let files = args.files / t as u64 * t as u64;
        if files == 0 {
            return Err(format!("--files {} is fewer than {t} threads", args.files));
        }
        sizes.push((t, files));
    }
    let mut report = Report::new(args.json, COLUMNS);
    if args.repeat == 1 {
        for &(t, files) in &sizes {
            round(&args, t, files, &mut |run| {
                let per = |s: Option<Spent>| s.and_then(Spent::ns_per_record);
                run.rows(t, files, |p| run.took[p], (per(run.consumer), per(run.flusher)), &mut report)
            })?;
        }
        return Ok(());
    }
    // Round after round of every thread count and variant, so that a
    // ratio between any two rows compares runs made close together.
    let mut rounds: Vec<Vec<Vec<Run>>> = Vec::new();
    for r in 0..args.repeat {
        if !args.json {
            eprintln!("mdtest: round {} of {}", r + 1, args.repeat);
        }
        let mut by_threads = Vec::new();
        for &(t, files) in &sizes {
            let mut runs = Vec::new();
            round(&args, t, files, &mut |run| runs.push(run))?;
            by_threads.push(runs);
        }
        rounds.push(by_threads);
    }
    for (k, &(t, files)) in sizes.iter().enumerate() {
        for (i, run) in rounds[0][k].iter().enumerate() {
            let per = |s: fn(&Run) -> Option<Spent>| {
                middle(rounds.iter().filter_map(|r| s(&r[k][i])?.ns_per_record()).collect())
            };
            let spent = (per(|r| r.consumer), per(|r| r.flusher));
            run.rows(t, files, |p| median(rounds.iter().map(|r| r[k][i].took[p]).collect()), spent, &mut report);
        }
    }
    Ok(())
}

/// One variant measured once: its name, the fields beside it, and what
/// each phase it ran took (Redis runs two: SET and GET).
struct Run {
    variant: &'static str,
    fields: Vec<(&'static str, Value)>,
    took: Vec<Took>,
    /// The files made, where known to differ from the run's N (the
    /// `-apart` variants make T×N).
    files: Option<u64>,
    /// What the changelog consumer read and cost, if one followed.
    consumer: Option<Spent>,
    /// What the journals' flushers wrote and cost (`engine` only).
    flusher: Option<Spent>,
}

/// What a thread of a run went through (a changelog consumer's records
/// read, see [`follow`]; a journal flusher's records written), and the
/// CPU time it took for them (`None` where a thread's time could not be
/// read).
#[derive(Clone, Copy, Debug)]
struct Spent {
    records: u64,
    cpu_ns: Option<u64>,
}

impl Spent {
    fn ns_per_record(self) -> Option<f64> {
        Some(self.cpu_ns? as f64 / self.records.max(1) as f64)
    }
}

impl Run {
    fn new(variant: &'static str, changelog: bool, ack: Option<&str>, took: &[Took]) -> Run {
        let mut fields = vec![("changelog", json!(changelog))];
        fields.extend(ack.map(|a| ("ack", json!(a))));
        Run { variant, fields, took: took.to_vec(), files: None, consumer: None, flusher: None }
    }

    /// Made `files` files.
    fn made(mut self, files: u64) -> Run {
        self.files = Some(files);
        self
    }

    /// Driven by `redis-benchmark -c T`: one connection per client.
    fn on_connections(mut self, t: usize) -> Run {
        self.fields.push(("connections", json!(t)));
        self
    }

    /// A row per phase, with what `took` gives for each, and the
    /// consumer's and the flushers' CPU per record over the run (the same
    /// in each).
    fn rows(
        &self,
        threads: usize,
        files: u64,
        took: impl Fn(usize) -> Took,
        (consumer, flusher): (Option<f64>, Option<f64>),
        report: &mut Report,
    ) {
        let files = self.files.unwrap_or(files);
        for (p, phase) in PHASES.iter().enumerate().take(self.took.len()) {
            let mut r = row(self.variant, phase, threads, files, took(p));
            r.insert("consumer_ns_per_record".into(), json!(consumer));
            r.insert("flusher_ns_per_record".into(), json!(flusher));
            r.extend(self.fields.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
            report.row(r);
        }
    }
}

/// The workers of the benchmark's own server: the cores its clients'
/// `client_threads` leave, at least one.
fn own_threads(client_threads: u32) -> usize {
    interlock_server::default_threads().saturating_sub(client_threads as usize).max(1)
}

/// The median of some runs' seconds, and the medians of their CPU times
/// (each on its own: the slowest run need not be the costliest).
fn median(runs: Vec<Took>) -> Took {
    let mid = |f: fn(&Took) -> Option<f64>| middle(runs.iter().map(f).collect::<Option<_>>()?);
    Took {
        secs: mid(|t| Some(t.secs)).unwrap_or(0.0),
        cpu_secs: mid(|t| t.cpu_secs),
        server_cpu_secs: mid(|t| t.server_cpu_secs),
    }
}

/// The median of some figures (the upper of the two middle ones of an
/// even count), if there are any.
fn middle(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Every chosen variant once, with `t` creators: each measurement goes
/// to `out` as it is made.
fn round(args: &Args, t: usize, files: u64, out: &mut dyn FnMut(Run)) -> Result<(), String> {
    let chosen = |name: &str| args.variant.iter().any(|v| v == name);
    // `-apart`: each creator makes N files in a store of its own, T×N in
    // all, so that each namespace grows as one creator's does; no
    // changelog consumer.
    let apart = files * t as u64;
    for (variant, is_apart) in [("engine", false), ("engine-apart", true)] {
        if !chosen(variant) {
            continue;
        }
        let parent = scratch_dir(&args.dir, "interlock-bench-mdtest")?;
        let (made, changelogs) = if is_apart { (apart, &[false][..]) } else { (files, &args.changelog[..]) };
        for ack in &args.ack {
            for &changelog in changelogs {
                let dir = parent.path().join(format!("t{t}-{ack}-{changelog}"));
                let e = engine(&dir, t, made, changelog, ack == "each", is_apart)?;
                let _ = std::fs::remove_dir_all(&dir);
                out(Run {
                    consumer: e.consumer,
                    flusher: e.flusher,
                    ..Run::new(variant, changelog, Some(ack), &e.took).made(made)
                });
            }
        }
    }
    for (variant, is_apart) in [("memory", false), ("memory-apart", true)] {
        if chosen(variant) {
            let made = if is_apart { apart } else { files };
            out(Run::new(variant, false, None, &memory(t, made, is_apart)?).made(made));
        }
    }
    let shapes = [("net", false), ("net-nofsync", true)]
        .into_iter()
        .filter(|(variant, _)| args.variant.iter().any(|v| v == variant))
        .flat_map(|shape| args.connections.iter().map(move |c| (shape, c.unwrap_or(t).min(t))));
    for ((variant, no_fsync), conns) in shapes {
        // Our own server keeps its journal where the engine's goes: the
        // system's temporary directory may be a tmpfs, where an fsync
        // costs nothing.
        let data = if args.server.is_none() { Some(scratch_dir(&args.dir, "interlock-bench-mdtest")?) } else { None };
        let (addr, options, own) = super::netbench::server_addr(
            &args.server,
            super::netbench::Own {
                no_fsync,
                threads: Some(args.server_threads.unwrap_or_else(|| own_threads(args.client_threads))),
                data: data.as_ref().map(|d| d.path()),
                ..Default::default()
            },
        )?;
        // It runs in this process; its time is that of every thread but
        // the one its clients run on (when they run on one) and the
        // changelog consumer's.
        let server = match (&args.server, args.client_threads) {
            (None, 1) => Server::OtherThreadsBut(FOLLOWER),
            _ => Server::None,
        };
        for &changelog in &args.changelog {
            let shape = (t, conns);
            let (took, durable, consumer) =
                net(&addr, &options, args.client_threads as usize, server, shape, files, changelog)?;
            let mut run = Run::new(variant, changelog, Some("each"), &took);
            run.consumer = consumer;
            run.fields.push(("connections", json!(conns)));
            // As the server measured reports itself, not as asked of it.
            run.fields.push(("durable", json!(durable)));
            // Our own server's workers; unknown for someone else's.
            run.fields.push(("server_threads", json!(own.as_ref().map(|o| o.threads))));
            out(run);
        }
    }
    if args.variant.iter().any(|v| v == "redis") && super::redis::installed() {
        for (variant, durable) in [("redis", false), ("redis-aof", true)] {
            let secs = super::redis::run(durable, &args.dir, t, files)?;
            out(Run::new(variant, false, Some("each"), &secs).on_connections(t));
        }
    }
    if args.variant.iter().any(|v| v == "floor") && super::redis::installed() {
        out(Run::new("floor", false, Some("each"), &super::resp_floor::run(&args.dir, t, files)?).on_connections(t));
    }
    if args.variant.iter().any(|v| v == "kernel") {
        let shm = tempfile::Builder::new()
            .prefix("interlock-mdtest")
            .tempdir_in("/dev/shm")
            .map_err(|e| format!("the kernel variant needs a tmpfs at /dev/shm: {e}"))?;
        out(Run::new("kernel", false, None, &on_dir(shm.path(), t, files, false)?));
    }
    Ok(())
}

fn row(variant: &str, phase: &str, threads: usize, files: u64, took: Took) -> Map<String, Value> {
    let seconds = took.secs;
    let mut m = Map::new();
    m.insert("scenario".into(), json!("mdtest"));
    m.insert("variant".into(), json!(variant));
    m.insert("phase".into(), json!(phase));
    m.insert("threads".into(), json!(threads));
    m.insert("files".into(), json!(files));
    m.insert("seconds".into(), json!(seconds));
    m.insert("ops_per_sec".into(), json!(files as f64 / seconds.max(1e-9)));
    m.insert("cpu_us_per_op".into(), json!(took.cpu_us_per(files)));
    m.insert("server_cpu_us_per_op".into(), json!(took.server_cpu_us_per(files)));
    m
}

/// File `i`'s name, written into `buf`.
fn name(buf: &mut Vec<u8>, i: u64) -> &[u8] {
    use std::io::Write;
    buf.clear();
    write!(buf, "file.{i}").expect("to a Vec");
    buf
}

/// Runs `op` on files `t, t + T, t + 2T, …` from each of `threads`
/// threads; what it took until all are done, or the first error (each
/// thread stops at its own).
fn phase(threads: usize, files: u64, op: impl Fn(u64) -> Result<(), String> + Sync) -> Result<Took, String> {
    let mut result = Ok(());
    let took = measured(|| {
        result = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads as u64)
                .map(|t| {
                    let op = &op;
                    s.spawn(move || {
                        let mut i = t;
                        while i < files {
                            op(i)?;
                            i += threads as u64;
                        }
                        Ok::<(), String>(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|_| Err("a worker panicked".into())))
        })
    });
    result.map(|()| took)
}

/// What an [`engine`] run took: each phase, and what its changelog
/// consumer (if one followed) and its journals' flushers cost.
struct EngineRun {
    took: [Took; 3],
    consumer: Option<Spent>,
    flusher: Option<Spent>,
}

/// The engine: what create, stat and unlink took, and what the changelog
/// consumer read and cost if `changelog`, and the flushers. With `apart`, each
/// creator has a store of its own (journal, flusher and namespace, in
/// `dir/K`) and a directory in it: nothing of ours is shared between the
/// creators, only the process and the machine. Its scaling is the most
/// `engine`'s could reach here.
fn engine(
    dir: &Path,
    threads: usize,
    files: u64,
    changelog: bool,
    each: bool,
    apart: bool,
) -> Result<EngineRun, String> {
    let mut stores = Vec::new();
    for k in 0..if apart { threads } else { 1 } {
        let at = if apart { dir.join(k.to_string()) } else { dir.to_path_buf() };
        let (store, _) = Store::open(&at, StoreOptions::default(), now()).map_err(|e| e.to_string())?;
        stores.push(Arc::new(store));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let follower = changelog.then(|| follow(stores[0].clone(), stop.clone())).transpose()?;
    let failed = |e: Errno| format!("the journal in {}: {e}", dir.display());
    let done = |k: usize, seq: Seq| if each { stores[k].wait(seq).map_err(failed) } else { Ok(()) };
    let all_durable = || {
        stores.iter().try_for_each(|s| s.wait(s.changelog().journal().next_index().saturating_sub(1)).map_err(failed))
    };
    let nss: Vec<&Namespace> = stores.iter().map(|s| s.ns()).collect();
    let appended = || stores.iter().map(|s| s.changelog().journal().next_index()).sum::<u64>();
    let (flushing, before) = (named_threads_cpu_ns(FLUSHER_THREAD), appended());
    let took = shape(&nss, threads, files, done, all_durable);
    let (flushed, records) = (named_threads_cpu_ns(FLUSHER_THREAD), appended() - before);
    stop.store(true, Ordering::Relaxed);
    let consumer = match follower {
        Some(f) => Some(f.join().map_err(|_| "the changelog follower failed".to_string())??),
        None => None,
    };
    // Every flusher of the process: the run's stores' alone, as no other
    // store is open meanwhile.
    let cpu_ns = (!flushed.is_empty())
        .then(|| flushed.iter().map(|(tid, ns)| ns.saturating_sub(flushing.get(tid).copied().unwrap_or(0))).sum());
    Ok(EngineRun { took: took?, consumer, flusher: Some(Spent { records, cpu_ns }) })
}

/// The namespace alone, with no journal (not durable): how it scales
/// with no disk and no flusher beside it. With `apart`, a namespace per
/// creator (see [`engine`]).
fn memory(threads: usize, files: u64, apart: bool) -> Result<[Took; 3], String> {
    let owned: Vec<Namespace> = (0..if apart { threads } else { 1 }).map(|_| Namespace::new(1, now())).collect();
    let nss: Vec<&Namespace> = owned.iter().collect();
    shape(&nss, threads, files, |_, _| Ok(()), || Ok(()))
}

/// mdtest's shape: a shared directory in each of `nss`, then the three
/// phases, file `i` in namespace `i % nss.len()` (made by creator `i %
/// threads`); `done` is called on each change's record (with its
/// namespace's place in `nss`), `phase_end` when a changing phase's
/// threads are through (both inside the timing). An error of either ends
/// the run.
fn shape(
    nss: &[&Namespace],
    threads: usize,
    files: u64,
    done: impl Fn(usize, Seq) -> Result<(), String> + Sync,
    phase_end: impl Fn() -> Result<(), String>,
) -> Result<[Took; 3], String> {
    let root = Cred::root();
    let mkdir = || NewInode { kind: FileType::Directory, perm: 0o777, rdev: 0, umask: 0 };
    let mut dirs: Vec<Ino> = Vec::new();
    for (k, ns) in nss.iter().enumerate() {
        let (shared, seq) = ns.create(&root, ROOT, b"shared", mkdir(), b"", now()).map_err(|e| e.to_string())?;
        done(k, seq)?;
        dirs.push(shared.ino);
    }
    let at = |i: u64| (i % nss.len() as u64) as usize;
    let file = || NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
    let failed = |what: &str, i: u64, e: Errno| format!("{what} file.{i}: {e}");
    // A changing phase: its threads, then `phase_end`, both timed.
    let changing = |op: &(dyn Fn(u64) -> Result<(), String> + Sync)| {
        let mut result = Ok(());
        let took = measured(|| {
            result = phase(threads, files, op).and_then(|_| phase_end());
        });
        result.map(|()| took)
    };
    let create = changing(&|i| {
        let mut buf = Vec::with_capacity(24);
        let k = at(i);
        let (_, seq) =
            nss[k].create(&root, dirs[k], name(&mut buf, i), file(), b"", now()).map_err(|e| failed("create", i, e))?;
        done(k, seq)
    })?;
    let stat = phase(threads, files, |i| {
        let mut buf = Vec::with_capacity(24);
        let k = at(i);
        nss[k].lookup(&root, dirs[k], name(&mut buf, i)).map(drop).map_err(|e| failed("stat", i, e))
    })?;
    let unlink = changing(&|i| {
        let mut buf = Vec::with_capacity(24);
        let k = at(i);
        done(k, nss[k].unlink(&root, dirs[k], name(&mut buf, i), now()).map_err(|e| failed("unlink", i, e))?)
    })?;
    Ok([create, stat, unlink])
}

/// The name of a changelog consumer's thread, in-process or over the
/// protocol.
const FOLLOWER: &str = "changelog-follower";

/// A changelog consumer on a thread of its own that reads records as
/// they come, until `stop`, and clears them as [`Following`] says (a
/// reader that cleared each record would put an fsync beside every
/// change).
/// Registered before it returns, so it sees every record the run makes;
/// once `stop` is set (when every record is durable) it reads to the
/// journal's end and reports what it read, and the CPU time its thread
/// took from its start.
fn follow(store: Arc<Store>, stop: Arc<AtomicBool>) -> Result<std::thread::JoinHandle<Result<Spent, String>>, String> {
    let me = store.changelog().register(Some("bench"), Mask::default_mask(), 0).map_err(|e| e.to_string())?.id;
    // Named, so that a profile tells its time from the creators'.
    let named = std::thread::Builder::new().name(FOLLOWER.into());
    let spawned = named.spawn(move || consume(&store, &me, &stop));
    spawned.map_err(|e| format!("cannot start the changelog follower: {e}"))
}

/// [`follow`]'s loop, on the calling thread: reads consumer `me`'s
/// records as they come until `stop`, then to the journal's end; what it
/// read, and the CPU time the thread took.
fn consume(store: &Store, me: &str, stop: &AtomicBool) -> Result<Spent, String> {
    let started = thread_cpu_ns();
    let cl = store.changelog();
    let mut place = Following::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        // Each record as it is read, as a consumer that handles them one
        // by one would (see `read_each`).
        let mut last = None;
        let wait = Some(Following::wait(stopping));
        let read = cl.read_each(me, place.from, 8192, wait, |e| last = Some(e.index)).map_err(|e| e.to_string())?;
        let Some(last) = last else {
            if stopping {
                break;
            }
            continue;
        };
        if let Some(upto) = place.read(read as u64, last) {
            cl.clear(me, upto, 0).map_err(|e| e.to_string())?;
        }
    }
    let cpu_ns = started.zip(thread_cpu_ns()).map(|(a, b)| b.saturating_sub(a));
    Ok(Spent { records: place.seen, cpu_ns })
}

/// Where a benchmark's changelog consumer stands, the engine's
/// ([`follow`]) or the protocol's ([`follow_net`]): both read and clear
/// alike, as a Lustre changelog reader (robinhood, a replicator) does.
struct Following {
    /// Records read.
    seen: u64,
    /// Where the next read begins (after the cursor, at first).
    from: Option<u64>,
    /// `seen` at the last clear, and when that was.
    cleared: (u64, std::time::Instant),
}

impl Following {
    fn new() -> Following {
        Following { seen: 0, from: None, cleared: (0, std::time::Instant::now()) }
    }

    /// How long the next read waits for records: 20 ms while the run
    /// goes on, not at all once it has stopped (the consumer then reads
    /// to the end).
    fn wait(stopping: bool) -> Duration {
        if stopping { Duration::ZERO } else { Duration::from_millis(20) }
    }

    /// After a read of `n` records, the last `last`: where to clear up
    /// to, if a clear is due (every 10,000 records or every second; a
    /// clear is durable, an fsync of the consumers' state).
    fn read(&mut self, n: u64, last: u64) -> Option<u64> {
        self.seen += n;
        self.from = Some(last + 1);
        let due = self.seen - self.cleared.0 >= 10_000 || self.cleared.1.elapsed() >= Duration::from_secs(1);
        due.then(|| {
            self.cleared = (self.seen, std::time::Instant::now());
            last
        })
    }
}

/// A changelog consumer over the protocol, as `interlock changelog read
/// --follow` is one: on a thread and a runtime of its own, as a program
/// of its own would be (a task among the creators', on their one thread,
/// held their answers up while it decoded a batch); registered before it
/// returns; reads as many records as a request may ask for, waiting for
/// them, and clears as [`follow`]'s does; once `stop` is set, reads to
/// the end and deregisters (a consumer left behind would keep the
/// journal of a server the benchmark does not own). What it read, and
/// the CPU time its thread took.
fn follow_net(
    addr: &str,
    options: &ClientOptions,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Result<Spent, String>>, String> {
    let (addr, options) = (addr.to_string(), options.clone());
    let (registered, is_registered) = std::sync::mpsc::channel();
    let named = std::thread::Builder::new().name(FOLLOWER.into());
    let spawned = named.spawn(move || {
        let started = thread_cpu_ns();
        let err = |e: interlock_client::ClientError| format!("changelog: {e}");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let seen = rt.block_on(async {
            let c = Client::connect(&addr, options).await.map_err(|e| e.to_string());
            let me = match c {
                Ok(c) => c.changelog_register(None, Mask::default_mask().0).await.map_err(err).map(|r| (c, r.id)),
                Err(e) => Err(e),
            };
            let _ = registered.send(me.as_ref().map(drop).map_err(String::clone));
            let (c, me) = me?;
            let mut place = Following::new();
            let read = loop {
                let stopping = stop.load(Ordering::Relaxed);
                let batch = match c.changelog_read(&me, place.from, u32::MAX, Following::wait(stopping)).await {
                    Ok(b) => b,
                    Err(e) => break Err(err(e)),
                };
                let Some(last) = batch.last().map(|r| r.index) else {
                    if stopping {
                        break Ok(place.seen);
                    }
                    continue;
                };
                if let Some(upto) = place.read(batch.len() as u64, last)
                    && let Err(e) = c.changelog_clear(&me, upto).await
                {
                    break Err(err(e));
                }
            };
            let gone = c.changelog_deregister(&me).await.map_err(err);
            let _ = c.bye().await;
            let seen = read?;
            gone?;
            Ok::<u64, String>(seen)
        })?;
        let cpu_ns = started.zip(thread_cpu_ns()).map(|(a, b)| b.saturating_sub(a));
        Ok(Spent { records: seen, cpu_ns })
    });
    let spawned = spawned.map_err(|e| format!("cannot start the changelog follower: {e}"))?;
    is_registered.recv().map_err(|_| "the changelog follower ended before it registered".to_string())??;
    Ok(spawned)
}

/// Through a server: `threads` creators on `conns` connections (dealt
/// out in turn), each waiting for each answer. What create, stat and
/// unlink took (and `server`, what of it was the server's), whether the
/// server said it answers changes only once durable, and what the
/// changelog consumer read and cost. With `changelog`, a consumer
/// follows over a connection of its own, on a thread of its own (see
/// [`follow_net`]): the server's CPU per operation then includes what
/// serving it cost, and the consumer's own time is not the server's.
fn net(
    addr: &str,
    options: &ClientOptions,
    client_threads: usize,
    server: Server,
    (threads, conns): (usize, usize),
    files: u64,
    changelog: bool,
) -> Result<([Took; 3], bool, Option<Spent>), String> {
    let rt = match client_threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    }
    .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..conns {
            clients.push(Client::connect(addr, options.clone()).await.map_err(|e| e.to_string())?);
        }
        let durable = clients[0].status().await.map_err(|e| e.to_string())?.durable;
        let stop = Arc::new(AtomicBool::new(false));
        let follower = changelog.then(|| follow_net(addr, options, stop.clone())).transpose()?;
        let root = Cred::root();
        // A fresh directory per run, so runs against one server do not meet.
        let dir = format!("mdtest.{}.{threads}", now());
        let d = clients[0]
            .create(&root, ROOT, dir.as_bytes(), FileType::Directory, 0o777, b"")
            .await
            .map_err(|e| e.to_string())?;
        let mut took = [Took::default(); 3];
        for (p, &phase) in PHASES.iter().enumerate() {
            let span = Span::with_server(server);
            let tasks: Vec<_> = (0..threads)
                .map(|t| {
                    let (c, root) = (clients[t % conns].clone(), root.clone());
                    tokio::spawn(async move {
                        let mut buf = Vec::with_capacity(24);
                        let mut i = t as u64;
                        while i < files {
                            let n = name(&mut buf, i).to_vec();
                            let r = match p {
                                0 => c.create(&root, d.ino, &n, FileType::Regular, 0o644, b"").await.map(drop),
                                1 => c.lookup(&root, d.ino, &n).await.map(drop),
                                _ => c.unlink(&root, d.ino, &n).await,
                            };
                            r.map_err(|e| format!("{phase}: {e}"))?;
                            i += threads as u64;
                        }
                        Ok::<(), String>(())
                    })
                })
                .collect();
            for t in tasks {
                t.await.map_err(|e| e.to_string())??;
            }
            took[p] = span.stop();
        }
        stop.store(true, Ordering::Relaxed);
        let consumer = match follower {
            Some(f) => Some(f.join().map_err(|_| "the changelog follower panicked".to_string())??),
            None => None,
        };
        // The directory's record, then a create and an unlink a file.
        if let Some(seen) = consumer.map(|c| c.records)
            && seen < 1 + 2 * files
        {
            return Err(format!("the changelog consumer read {seen} records of the run's {}", 1 + 2 * files));
        }
        let _ = clients[0].rmdir(&root, ROOT, dir.as_bytes()).await;
        for c in clients {
            let _ = c.bye().await;
        }
        Ok((took, durable, consumer))
    })
}

/// The shape on a directory of a mounted file system (tmpfs for the
/// `kernel` variant; `bench mount` uses it on FUSE mounts): what create,
/// stat and unlink took.
///
/// `unique`: each thread works in a directory of its own under `dir`
/// (mdtest's `-u`), out of the way of the kernel's per-directory lock.
pub(super) fn on_dir(dir: &Path, threads: usize, files: u64, unique: bool) -> Result<[Took; 3], String> {
    let at = |k: u64| if unique { dir.join(format!("t{k}")) } else { dir.to_path_buf() };
    if unique {
        for k in 0..threads as u64 {
            std::fs::create_dir(at(k)).map_err(|e| format!("{}: {e}", at(k).display()))?;
        }
    }
    let path = |i: u64| at(i % threads as u64).join(format!("file.{i}"));
    let failed = |what: &str, i: u64, e: std::io::Error| format!("{what} {}: {e}", path(i).display());
    let create =
        phase(threads, files, |i| std::fs::File::create_new(path(i)).map(drop).map_err(|e| failed("create", i, e)))?;
    let stat = phase(threads, files, |i| std::fs::metadata(path(i)).map(drop).map_err(|e| failed("stat", i, e)))?;
    let unlink = phase(threads, files, |i| std::fs::remove_file(path(i)).map_err(|e| failed("unlink", i, e)))?;
    Ok([create, stat, unlink])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_dir_with_unique_dirs_works_in_one_directory_per_thread() {
        let dir = tempfile::tempdir().unwrap();
        // In the shared directory this name would make the first create
        // fail (EEXIST); in a directory per thread nobody meets it.
        std::fs::write(dir.path().join("file.0"), b"kept").unwrap();
        on_dir(dir.path(), 3, 30, true).unwrap();
        let mut made: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        made.sort();
        assert_eq!(made, ["file.0", "t0", "t1", "t2"], "one directory per thread, the shared one untouched");
        made.remove(0);
        for d in made {
            assert_eq!(std::fs::read_dir(dir.path().join(d)).unwrap().count(), 0, "every file unlinked again");
        }
    }

    #[test]
    fn apart_each_creator_has_a_store_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        assert!(engine(dir.path(), 3, 30, false, true, true).unwrap().consumer.is_none());
        let mut stores: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        stores.sort();
        assert_eq!(stores, ["0", "1", "2"], "a store per creator");
        for s in stores {
            let (store, _) = Store::open(&dir.path().join(s), StoreOptions::default(), now()).unwrap();
            // Its directory, and 10 files made and unlinked again: its
            // journal holds the directory's record and 20 more.
            assert_eq!(store.changelog().journal().next_index(), 1 + 1 + 20);
        }
    }

    #[test]
    fn the_changelog_consumer_reads_every_record_of_the_run_and_says_what_it_cost() {
        let dir = tempfile::tempdir().unwrap();
        let run = engine(dir.path(), 2, 40, true, false, false).unwrap();
        let c = run.consumer.expect("a consumer followed");
        // The shared directory's MKDIR, then 40 CREATs and 40 UNLNKs.
        assert_eq!(c.records, 1 + 2 * 40);
        assert!(c.ns_per_record().is_some_and(|ns| ns > 0.0), "{c:?}");
        // The flusher wrote the same records, and its thread was found.
        let f = run.flusher.expect("the engine's flusher");
        assert_eq!(f.records, 1 + 2 * 40);
        assert!(f.ns_per_record().is_some_and(|ns| ns > 0.0), "{f:?}");
        let off = dir.path().join("off");
        assert!(engine(&off, 2, 40, false, false, false).unwrap().consumer.is_none(), "none followed");
    }

    /// Told to stop with records still unread, the consumer reads them
    /// all before it stops, and clears as it goes.
    #[test]
    fn a_stopped_consumer_reads_to_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), StoreOptions::default(), now()).unwrap();
        let me = store.changelog().register(None, Mask::default_mask(), 0).unwrap().id;
        let file = || NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
        let mut last = 0;
        for i in 0..20_000u64 {
            let (_, seq) =
                store.ns().create(&Cred::root(), ROOT, format!("f{i}").as_bytes(), file(), b"", now()).unwrap();
            last = seq;
        }
        store.wait(last).unwrap();
        let c = consume(&store, &me, &AtomicBool::new(true)).unwrap();
        assert_eq!(c.records, 20_000);
        let cleared = store.changelog().consumers().into_iter().find(|k| k.id == me).unwrap().cleared;
        assert!(cleared >= 10_000, "a clear every 10,000 records: cleared to {cleared}");
    }

    #[test]
    fn a_failing_phase_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("missing");
        let err = on_dir(&gone, 2, 10, false).unwrap_err();
        assert!(err.starts_with("create ") && err.contains("missing/file."), "{err}");
    }
}
