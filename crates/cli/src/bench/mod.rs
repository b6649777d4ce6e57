//! `interlock bench`: the seed scenarios, measured in-process, with the
//! Linux kernel's own locks beside ours where the kernel finishes in
//! reasonable time. A table by default; `--json` prints one JSON object per
//! line. Each figure is the median of `--repeat` runs (the kernel's are
//! run once: they are the slow side).

mod du;
mod flocks;
mod floor;
mod handover;
mod journal;
mod kernel;
mod machine;
mod mdtest;
mod mount;
mod netbench;
mod redis;
mod resp_floor;
mod restart;
mod rsb;

use std::time::Instant;

use clap::Subcommand;
use serde_json::{Map, Value, json};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Seed 000 (LU-17276): N locks on one file. Variants `plain`, `split`,
    /// `merge`, `same-range`; the kernel's fcntl on tmpfs beside each.
    Flocks(flocks::Args),
    /// Seed 002 in the engine alone: K owners queued on one byte, the
    /// holder unlocks and asks again: ns per hand-over as K grows.
    Handover(handover::Args),
    /// Seed 004 (DLM): lock then unlock over R distinct resources: ns/op
    /// and bytes per live resource and per lock.
    Rsb(rsb::Args),
    /// Seed 001 (changelog semaphore): T threads appending to the journal
    /// against a one-mutex baseline; group commit against fsync per record.
    Journal(journal::Args),
    /// Seed 002 over the network: P owners over C connections loop on a
    /// blocking lock of one resource (hold H, sleep H): grants against the
    /// ideal and per-owner fairness, the kernel's own fcntl beside.
    Blocking(netbench::BlockingArgs),
    /// Lock then unlock on distinct resources over loopback: requests/s and
    /// latency percentiles.
    Net(netbench::NetArgs),
    /// Seeds 001 and 003: T creators create, stat and unlink N files in
    /// one shared directory, in the namespace engine (durable, changelog
    /// on and off) and on the kernel's tmpfs.
    Mdtest(mdtest::Args),
    /// The namespace at N files: heap and resident bytes per file, the
    /// checkpoint's time (idle and under load), and a restart's time
    /// (load, replay, recount).
    Restart(restart::Args),
    /// Seed 004: a tree of N files built through a server, then walked as
    /// `du -s` does (readdirplus, a page per round trip).
    Du(du::Args),
    /// Issue 12: through `interlock mount` beside bindfs over tmpfs (the
    /// FUSE floor) and tmpfs: mdtest create/stat/unlink, ctdb ping_pong
    /// with 1 and 2 processes (2 mounts), du on a cold mount, sequential
    /// write, read and copy. Needs root and /dev/fuse.
    Mount(mount::Args),
}

pub fn run(cmd: BenchCommand) -> Result<(), String> {
    match cmd {
        BenchCommand::Flocks(args) => flocks::run(args),
        BenchCommand::Handover(args) => handover::run(args),
        BenchCommand::Rsb(args) => rsb::run(args),
        BenchCommand::Journal(args) => journal::run(args),
        BenchCommand::Blocking(args) => netbench::blocking(args),
        BenchCommand::Net(args) => netbench::net(args),
        BenchCommand::Mdtest(args) => mdtest::run(args),
        BenchCommand::Restart(args) => restart::run(args),
        BenchCommand::Du(args) => du::run(args),
        BenchCommand::Mount(args) => mount::run(args),
    }
}

/// A fresh directory for a benchmark's files: under `dir` if given, else
/// in the current directory (the project's disk: on tmpfs an fsync costs
/// nothing). Removed when dropped.
pub fn scratch_dir(dir: &Option<std::path::PathBuf>, prefix: &str) -> Result<tempfile::TempDir, String> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            tempfile::tempdir_in(d)
        }
        None => tempfile::Builder::new().prefix(prefix).tempdir_in("."),
    }
    .map_err(|e| format!("cannot make a directory for the benchmark: {e}"))
}

/// Parses a size such as `1000`, `25k` or `1M`.
pub fn parse_size(w: &str) -> Result<u64, String> {
    let w = w.trim();
    let (num, mult) = match w.char_indices().last() {
        Some((i, 'k' | 'K')) => (&w[..i], 1_000),
        Some((i, 'm' | 'M')) => (&w[..i], 1_000_000),
        _ => (w, 1),
    };
    match num.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n * mult),
        _ => Err(format!("{w:?} is not a positive size (examples: 1000, 25k, 1M)")),
    }
}

/// Runs `f` `repeat` times and returns the median of what it reports (its
/// seconds and any figures it adds).
pub fn median<T>(repeat: usize, mut f: impl FnMut() -> (f64, T)) -> (f64, T) {
    let mut runs: Vec<(f64, T)> = (0..repeat.max(1)).map(|_| f()).collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs.swap_remove(runs.len() / 2)
}

/// Seconds taken by `f`.
pub fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Rows of one benchmark and how to show them.
pub struct Report {
    json: bool,
    /// (header, key) of each table column.
    columns: &'static [(&'static str, &'static str)],
    printed_header: bool,
}

impl Report {
    pub fn new(json: bool, columns: &'static [(&'static str, &'static str)]) -> Report {
        Report { json, columns, printed_header: false }
    }

    /// Prints one row as soon as it is measured, so long runs show progress.
    pub fn row(&mut self, row: Map<String, Value>) {
        if self.json {
            println!("{}", Value::Object(row));
            return;
        }
        // A space between columns, so that a header or a cell as wide as
        // its column still stands apart ("flusher ns/rec" is 14).
        if !self.printed_header {
            let head: Vec<String> = self.columns.iter().map(|(h, _)| format!("{h:>13}")).collect();
            println!(" {}", head.join(" "));
            self.printed_header = true;
        }
        let cells: Vec<String> = self.columns.iter().map(|(_, k)| format!("{:>13}", cell(row.get(*k)))).collect();
        println!(" {}", cells.join(" "));
    }
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => u.to_string(),
            (None, Some(f)) if f.abs() >= 100.0 => format!("{f:.0}"),
            (None, Some(f)) if f.abs() >= 1.0 => format!("{f:.2}"),
            (None, Some(f)) => format!("{f:.4}"),
            _ => n.to_string(),
        },
        Some(other) => other.to_string(),
    }
}

/// The common fields of every row.
pub fn base_row(scenario: &str, variant: &str, n: u64, seconds: f64, ops: u64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("scenario".into(), json!(scenario));
    m.insert("variant".into(), json!(variant));
    m.insert("n".into(), json!(n));
    m.insert("seconds".into(), json!(seconds));
    m.insert("ops".into(), json!(ops));
    m.insert("ops_per_sec".into(), json!(ops as f64 / seconds.max(1e-9)));
    m.insert("ns_per_op".into(), json!(seconds * 1e9 / ops.max(1) as f64));
    m
}
