//! `bench rsb`: seed 004's shape. A DLM lock then unlock on each of R
//! distinct resources: the cost of resource lookup and creation as the table
//! grows to millions, and the memory a resource costs, from the allocator's
//! own count of live bytes: with its lock, and idle (unlocked, awaiting
//! reclaim). Then the incremental reclaim of the idle resources. The memory
//! of one more lock is measured once, as 1M locks on a single resource.

use interlock_core::{Config, LockKind, LockRequest, LockSpace, Mode, Outcome, Range};
use serde_json::json;

use super::{Report, base_row, median, parse_size, timed};
use crate::alloc::live_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// Resource counts to run (suffixes k and M allowed).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "1000,100000,1000000,10000000")]
    r: Vec<u64>,
    /// Runs per figure; the median is shown.
    #[arg(long, default_value_t = 3, value_parser = crate::args::count)]
    repeat: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

const COLUMNS: &[(&str, &str)] = &[
    ("r", "n"),
    ("seconds", "seconds"),
    ("ns/op", "ns_per_op"),
    ("ns/lock", "ns_per_lock"),
    ("ns/unlock", "ns_per_unlock"),
    ("B/res+lock", "bytes_per_locked_resource"),
    ("B/idle res", "bytes_per_resource"),
    ("B/lock", "bytes_per_lock"),
    ("reclaim s", "reclaim_seconds"),
];

pub fn run(args: Args) -> Result<(), String> {
    crate::alloc::count();
    let mut report = Report::new(args.json, COLUMNS);
    // Measured first, while no other lock space's memory is being freed.
    let per_lock = bytes_per_lock(1_000_000);
    for &r in &args.r {
        if !args.json && r >= 1_000_000 {
            eprint!("  (rsb r={r}...)\r");
        }
        // Small runs take microseconds: repeat them more for a steady median.
        let repeat = args.repeat.max((200_000 / r).min(101) as usize);
        let (seconds, row) = median(repeat, || once(r));
        let mut full = base_row("rsb", "dlm-ex", r, seconds, 2 * r);
        full.extend(row);
        full.insert("bytes_per_lock".into(), json!(per_lock));
        report.row(full);
    }
    Ok(())
}

/// One run; seconds for the locks and unlocks, and the row's other figures.
fn once(r: u64) -> (f64, serde_json::Map<String, serde_json::Value>) {
    let space = LockSpace::new(Config { grace_epochs: 1 });
    let mut handles: Vec<u64> = Vec::with_capacity(r as usize);
    let mem0 = live_bytes();
    let lock_s = timed(|| {
        for i in 0..r {
            let name = i.to_le_bytes();
            let req = LockRequest {
                resource: &name,
                owner: 1,
                kind: LockKind::Dlm,
                mode: Mode::EX,
                range: Range::WHOLE,
                wait: false,
            };
            match space.lock(&req).expect("valid request").outcome {
                Outcome::Granted(g) => handles.push(g.lock.expect("DLM grants carry a handle")),
                other => panic!("rsb lock refused: {other:?}"),
            }
        }
    });
    let mem1 = live_bytes();
    let unlock_s = timed(|| {
        for (i, &h) in handles.iter().enumerate() {
            space.dlm_unlock(&(i as u64).to_le_bytes(), 1, h, None).expect("held");
        }
    });
    let mem2 = live_bytes();
    assert_eq!(space.stats().locks, 0);
    let reclaim_s = timed(|| {
        while space.stats().resources > 0 {
            space.reclaim(4096);
        }
    });
    let per = |b: isize| b as f64 / r as f64;
    let mut m = serde_json::Map::new();
    m.insert("ns_per_lock".into(), json!(lock_s * 1e9 / r as f64));
    m.insert("ns_per_unlock".into(), json!(unlock_s * 1e9 / r as f64));
    m.insert("bytes_per_locked_resource".into(), json!(per(mem1 - mem0)));
    m.insert("bytes_per_resource".into(), json!(per(mem2 - mem0)));
    m.insert("reclaim_seconds".into(), json!(reclaim_s));
    (lock_s + unlock_s, m)
}

/// Live bytes per DLM lock among `n` PR locks on one resource (of a fresh
/// lock space, so that no table resize is counted).
fn bytes_per_lock(n: u64) -> f64 {
    let space = LockSpace::default();
    let first = LockRequest {
        resource: b"one",
        owner: 0,
        kind: LockKind::Dlm,
        mode: Mode::PR,
        range: Range::WHOLE,
        wait: false,
    };
    space.lock(&first).expect("valid request");
    let before = live_bytes();
    for owner in 1..=n {
        space.lock(&LockRequest { owner, ..first.clone() }).expect("valid request");
    }
    (live_bytes() - before) as f64 / n as f64
}
