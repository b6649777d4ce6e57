//! `bench flocks`: seed 000's shapes on one file, ours against the kernel.
//!
//! - `plain`: one owner sets N non-overlapping write locks (`[3i, 3i]`);
//! - `split`: a read lock on 10 bytes, then a write lock on 2 bytes inside
//!   it, N times (each splits a lock in three);
//! - `merge`: N write locks with gaps, then one write lock over the whole
//!   span that merges them all;
//! - `same-range`: N owners each take a read lock on one range, a write
//!   request from another owner is tested against them, then each releases.
//!
//! Every run also checks its outcomes, so a benchmark of a wrong engine
//! fails instead of printing a fast number.

use clap::ValueEnum;
use interlock_core::{LockKind, LockRequest, LockSpace, Mode, Outcome, Range};
use serde_json::json;

use super::{Report, base_row, kernel, median, parse_size, timed};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Variant {
    Plain,
    Split,
    Merge,
    SameRange,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Split => "split",
            Variant::Merge => "merge",
            Variant::SameRange => "same-range",
        }
    }

    /// Lock operations one run performs.
    fn ops(self, n: u64) -> u64 {
        match self {
            Variant::Plain => n,
            Variant::Split => 2 * n,
            Variant::Merge => n + 1,
            Variant::SameRange => 2 * n + 1,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Lock counts to run (suffixes k and M allowed).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "1000,10000,25000,100000,1000000")]
    n: Vec<u64>,
    /// Variants to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    variant: Vec<Variant>,
    /// Largest N at which to run the kernel beside us (it grows as N²:
    /// 25,000 plain locks take the kernel about 7 s here).
    #[arg(long, default_value_t = 25_000)]
    kernel_max: u64,
    /// Skip the kernel runs.
    #[arg(long)]
    no_kernel: bool,
    /// Runs per figure; the median is shown.
    #[arg(long, default_value_t = 3, value_parser = crate::args::count)]
    repeat: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

const COLUMNS: &[(&str, &str)] = &[
    ("variant", "variant"),
    ("n", "n"),
    ("seconds", "seconds"),
    ("ops/s", "ops_per_sec"),
    ("ns/op", "ns_per_op"),
    ("kernel s", "kernel_seconds"),
    ("kernel/ours", "kernel_ratio"),
];

pub fn run(args: Args) -> Result<(), String> {
    let variants = if args.variant.is_empty() { Variant::value_variants().to_vec() } else { args.variant.clone() };
    let mut report = Report::new(args.json, COLUMNS);
    for &variant in &variants {
        for &n in &args.n {
            // Small runs take microseconds: repeat them more for a steady median.
            let repeat = args.repeat.max((200_000 / n).min(101) as usize);
            let seconds = median(repeat, || (engine(variant, n), ())).0;
            let mut row = base_row("flocks", variant.name(), n, seconds, variant.ops(n));
            let kernel = if args.no_kernel {
                Err("--no-kernel".to_string())
            } else if n > args.kernel_max {
                Err(format!("n > --kernel-max {}", args.kernel_max))
            } else {
                if !args.json {
                    eprint!("  (kernel {} n={n}...)\r", variant.name());
                }
                kernel::flocks(variant, n)
            };
            match kernel {
                Ok(k) => {
                    row.insert("kernel_seconds".into(), json!(k));
                    row.insert("kernel_ratio".into(), json!(k / seconds.max(1e-9)));
                }
                Err(why) => {
                    if n <= args.kernel_max && !args.no_kernel {
                        eprintln!("note: kernel run skipped: {why}");
                    }
                    row.insert("kernel_seconds".into(), json!(null));
                    row.insert("kernel_skipped".into(), json!(why));
                    row.insert("kernel_ratio".into(), json!("skipped"));
                }
            }
            report.row(row);
        }
    }
    Ok(())
}

fn expect_granted(space: &LockSpace, req: &LockRequest<'_>) {
    let outcome = space.lock(req).expect("valid request").outcome;
    assert!(matches!(outcome, Outcome::Granted(_)), "benchmark lock refused: {outcome:?}");
}

/// One run of `variant` with `n` on a fresh engine; seconds.
fn engine(variant: Variant, n: u64) -> f64 {
    const FILE: &[u8] = b"flocks";
    let space = LockSpace::default();
    let lock = |owner, kind, mode, start, end| LockRequest {
        resource: FILE,
        owner,
        kind,
        mode,
        range: Range::new(start, end).expect("valid"),
        wait: false,
    };
    let posix = LockKind::Posix;
    let seconds = match variant {
        Variant::Plain => timed(|| {
            for i in 0..n {
                expect_granted(&space, &lock(1, posix, Mode::EX, 3 * i, 3 * i));
            }
        }),
        Variant::Split => timed(|| {
            for i in 0..n {
                expect_granted(&space, &lock(1, posix, Mode::PR, 10 * i, 10 * i + 9));
                expect_granted(&space, &lock(1, posix, Mode::EX, 10 * i + 4, 10 * i + 5));
            }
        }),
        Variant::Merge => timed(|| {
            for i in 0..n {
                expect_granted(&space, &lock(1, posix, Mode::EX, 2 * i, 2 * i));
            }
            expect_granted(&space, &lock(1, posix, Mode::EX, 0, 2 * n - 1));
        }),
        Variant::SameRange => timed(|| {
            let ofd = LockKind::Ofd;
            for o in 0..n {
                expect_granted(&space, &lock(o, ofd, Mode::PR, 0, 99));
            }
            let range = Range::new(0, 99).expect("valid");
            let c = space.test(FILE, n, ofd, Mode::EX, range).expect("valid");
            assert!(c.is_some(), "a writer must see the readers");
            for o in 0..n {
                space.unlock(FILE, o, ofd, range).expect("valid");
            }
        }),
    };
    let held = space.stats().locks as u64;
    let want = match variant {
        Variant::Plain => n,
        // Each read remainder touches the next read lock and merges with it.
        Variant::Split => 2 * n + 1,
        Variant::Merge => 1,
        Variant::SameRange => 0,
    };
    assert_eq!(held, want, "{} left {held} locks, expected {want}", variant.name());
    seconds
}
