//! `bench restart`: the namespace at scale. Builds N files (10,000 per
//! directory, two creator threads, durable), then reports the heap bytes
//! per file (the allocator's own ledger: inode, entry, index nodes, name),
//! what the namespace charges itself per file against its memory budget
//! (its estimate of the same: `charge B/file`) and the resident memory
//! per file; writes a checkpoint while nothing
//! else runs and while creators go on (its pause and its time); makes
//! `--after` more files behind it, as a journal to replay; drops the
//! store as a `kill -9` after the last acknowledgement would; and times
//! the restart (load the checkpoint, replay, recount links). A
//! checkpoint row shows how long changes were held back (`pause us`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use interlock_meta::{Cred, FileType, Ino, NewInode, ROOT, Store, StoreOptions};
use serde_json::{Map, Value, json};

use super::{Report, scratch_dir, timed};
use crate::alloc::live_bytes;
use interlock_server::now;

#[derive(clap::Args)]
pub struct Args {
    /// Files to build, e.g. 10M.
    #[arg(long, default_value = "1M", value_parser = super::parse_size)]
    files: u64,
    /// Files made after the checkpoint: the journal the restart replays.
    #[arg(long, default_value = "100k", value_parser = super::parse_size)]
    after: u64,
    /// Where the store goes (default: the current directory; removed
    /// after).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

const COLUMNS: &[(&str, &str)] = &[
    ("phase", "phase"),
    ("files", "files"),
    ("seconds", "seconds"),
    ("ops/s", "ops_per_sec"),
    ("heap B/file", "heap_bytes_per_file"),
    ("charge B/file", "charged_bytes_per_file"),
    ("rss B/file", "rss_bytes_per_file"),
    ("MB", "megabytes"),
    ("pause us", "pause_us"),
    ("replayed", "replayed"),
];

const PER_DIR: u64 = 10_000;

fn row(phase: &str, files: u64, seconds: f64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("scenario".into(), json!("restart"));
    m.insert("phase".into(), json!(phase));
    m.insert("files".into(), json!(files));
    m.insert("seconds".into(), json!(seconds));
    m.insert("ops_per_sec".into(), json!(files as f64 / seconds.max(1e-9)));
    m
}

/// Resident bytes of this process.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// Makes files `from..to` (directory `i / PER_DIR`, made as needed) from
/// two threads, each waiting only for its last change to be durable;
/// shows progress on stderr.
fn build(store: &Store, dirs: &[Ino], from: u64, to: u64, progress: bool) {
    let done = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    std::thread::scope(|s| {
        if progress {
            s.spawn(|| {
                while !finished.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(500));
                    eprint!("\r  built {} of {} files ", from + done.load(Ordering::Relaxed), to);
                }
                eprintln!();
            });
        }
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let done = &done;
                s.spawn(move || {
                    let root = Cred::root();
                    let mut buf = Vec::with_capacity(24);
                    let (mut last, mut made) = (0, 0u64);
                    let mut i = from + t;
                    while i < to {
                        use std::io::Write;
                        buf.clear();
                        write!(buf, "file.{i}").expect("to a Vec");
                        let new = NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
                        last = store
                            .ns()
                            .create(&root, dirs[(i / PER_DIR) as usize], &buf, new, b"", now())
                            .expect("create")
                            .1;
                        i += 2;
                        made += 1;
                        if made.is_multiple_of(4096) {
                            done.fetch_add(4096, Ordering::Relaxed);
                        }
                    }
                    store.wait(last).expect("journal");
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a creator");
        }
        finished.store(true, Ordering::Relaxed);
    });
}

pub fn run(args: Args) -> Result<(), String> {
    crate::alloc::count();
    let progress = !args.json;
    let mut report = Report::new(args.json, COLUMNS);
    let parent = scratch_dir(&args.dir, "interlock-bench-restart")?;
    let dir = parent.path().join("meta");
    let total = args.files + args.after;
    let (heap0, rss0) = (live_bytes(), rss());
    let (store, _) = Store::open(&dir, StoreOptions::default(), now()).map_err(|e| e.to_string())?;
    let store = Arc::new(store);
    let charged0 = store.ns().memory().0;
    let root = Cred::root();
    let mkdir = || NewInode { kind: FileType::Directory, perm: 0o755, rdev: 0, umask: 0 };
    let mut dirs = Vec::new();
    for d in 0..total.div_ceil(PER_DIR) {
        let (a, s) = store
            .ns()
            .create(&root, ROOT, format!("d{d}").as_bytes(), mkdir(), b"", now())
            .map_err(|e| e.to_string())?;
        store.wait(s).map_err(|e| e.to_string())?;
        dirs.push(a.ino);
    }
    let secs = timed(|| build(&store, &dirs, 0, args.files, progress));
    let mut r = row("build", args.files, secs);
    let heap = (live_bytes() - heap0) as f64 / args.files as f64;
    r.insert("heap_bytes_per_file".into(), json!(heap));
    let charged = (store.ns().memory().0 - charged0) as f64 / args.files as f64;
    r.insert("charged_bytes_per_file".into(), json!(charged));
    r.insert("rss_bytes_per_file".into(), json!(rss().saturating_sub(rss0) as f64 / args.files as f64));
    report.row(r);

    let t = Instant::now();
    let written = store.checkpoint().map_err(|e| e.to_string())?;
    let mut r = row("checkpoint", written.inodes, t.elapsed().as_secs_f64());
    r.insert("megabytes".into(), json!(written.bytes as f64 / 1e6));
    r.insert("pause_us".into(), json!(written.pause.as_micros() as u64));
    report.row(r);

    // A checkpoint while creators go on: how long it takes, and what they
    // made meanwhile.
    let t = Instant::now();
    let busy = std::thread::scope(|s| {
        let c = s.spawn(|| store.checkpoint().map_err(|e| e.to_string()));
        build(&store, &dirs, args.files, args.files + args.after, false);
        c.join().expect("the checkpoint thread")
    })?;
    let mut r = row("checkpoint-under-load", busy.inodes, t.elapsed().as_secs_f64());
    r.insert("megabytes".into(), json!(busy.bytes as f64 / 1e6));
    r.insert("pause_us".into(), json!(busy.pause.as_micros() as u64));
    report.row(r);

    drop(store);
    crate::alloc::release();
    let (heap1, rss1) = (live_bytes(), rss());
    let t = Instant::now();
    let (again, opened) = Store::open(&dir, StoreOptions::default(), now()).map_err(|e| e.to_string())?;
    let mut r = row("restart", again.ns().inode_count(), t.elapsed().as_secs_f64());
    r.insert("replayed".into(), json!(opened.replayed));
    r.insert("heap_bytes_per_file".into(), json!((live_bytes() - heap1) as f64 / total as f64));
    r.insert("charged_bytes_per_file".into(), json!(again.ns().memory().0 as f64 / total as f64));
    r.insert("rss_bytes_per_file".into(), json!(rss().saturating_sub(rss1) as f64 / total as f64));
    report.row(r);
    if !opened.dangling.is_empty() {
        return Err(format!("after the restart {} entries name no inode", opened.dangling.len()));
    }
    Ok(())
}
