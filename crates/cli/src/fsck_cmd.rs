//! `interlock fsck DIR`: the offline check of a namespace store (see
//! `interlock_meta::fsck`). Changes nothing unless `--repair`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use interlock_meta::fsck::{self, Report};
use interlock_meta::{Store, StoreOptions};

use crate::exit;
use interlock_server::now;

#[derive(clap::Args)]
pub struct FsckArgs {
    /// The store: a server's data directory (its `meta/` is checked) or
    /// the namespace directory itself (the one holding `meta.ckpt`).
    dir: PathBuf,
    /// Repair what is found: dangling entries and a directory's extra
    /// names removed, leaked inodes freed, directories cut off by a cycle
    /// moved to /lost+found. Each repair is journaled (and shown in the
    /// changelog), then a checkpoint is written.
    #[arg(long)]
    repair: bool,
    /// One JSON object instead of lines.
    #[arg(long)]
    json: bool,
}

/// Where the store is: `DIR/meta` if that holds one, else `DIR`.
fn store_dir(dir: &Path) -> PathBuf {
    let meta = dir.join("meta");
    if meta.join("meta.ckpt").is_file() { meta } else { dir.to_path_buf() }
}

/// Exit statuses (as e2fsck's): 0 clean; 1 damage found (repaired with
/// `--repair`); 4 the store cannot be read (a damaged checkpoint or
/// journal, which fsck does not repair); 8 a running server has it open;
/// 2 usage (`DIR` missing or not a directory).
pub fn fsck(args: FsckArgs) -> ExitCode {
    if !args.dir.is_dir() {
        let what = if args.dir.exists() { "is not a directory" } else { "does not exist" };
        eprintln!("interlock fsck: {} {what}: DIR names a server's --data directory", args.dir.display());
        return ExitCode::from(exit::USAGE);
    }
    let dir = store_dir(&args.dir);
    match interlock_journal::in_use(&dir) {
        Ok(false) => {}
        Ok(true) => {
            eprintln!(
                "interlock fsck: {} is in use by a running server (its journal is open); fsck checks a store offline: stop the server first",
                dir.display()
            );
            return ExitCode::from(exit::IN_USE);
        }
        Err(e) => {
            eprintln!("interlock fsck: {e}");
            return ExitCode::from(exit::UNREADABLE);
        }
    }
    let report = match fsck::check_dir(&dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("interlock fsck: {e}");
            return ExitCode::from(exit::UNREADABLE);
        }
    };
    show(&report, args.json);
    if report.damage.is_empty() {
        return ExitCode::SUCCESS;
    }
    if args.repair {
        let repaired = Store::open(&dir, StoreOptions::default(), now())
            .and_then(|(store, _)| store.repair(&report.damage, now()));
        match repaired {
            Ok(n) => eprintln!("interlock fsck: repaired: {n} records written, checkpoint taken"),
            Err(e) => {
                eprintln!("interlock fsck: repair failed: {e}");
                return ExitCode::from(exit::UNREADABLE);
            }
        }
    }
    ExitCode::from(exit::DAMAGED)
}

fn show(r: &Report, json: bool) {
    if json {
        let damage: Vec<String> = r.damage.iter().map(ToString::to_string).collect();
        let v = serde_json::json!({
            "inodes": r.inodes, "directories": r.directories, "entries": r.entries,
            "orphans": r.orphans, "replay_start": r.start, "replayed": r.replayed,
            "damage": damage,
        });
        println!("{v}");
        return;
    }
    println!(
        "{} inodes ({} directories, {} orphans), {} entries; replayed {} records from {}",
        r.inodes, r.directories, r.orphans, r.entries, r.replayed, r.start
    );
    for d in &r.damage {
        println!("DAMAGE: {d}");
    }
    println!("{}", if r.damage.is_empty() { "clean".to_string() } else { format!("{} problems", r.damage.len()) });
}
