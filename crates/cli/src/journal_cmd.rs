//! `interlock journal check|dump`: look at a log directory offline, without
//! changing it.

use std::path::PathBuf;

use clap::Subcommand;
use interlock_journal::changelog::{self, Mask, Record};

#[derive(Subcommand)]
pub enum JournalCommand {
    /// Verify a log directory: every record's checksum and index. Prints
    /// the segments, the first and last index, the consumers and their
    /// cursors. Exit status 1 if the log is corrupt. Changes nothing (a torn
    /// tail is reported, and cut when the server next opens the log).
    Check {
        /// The log directory.
        dir: PathBuf,
    },
    /// Print records readably, one per line, in Lustre's changelog format
    /// (a namespace store's journal, such as DATA/meta, through the
    /// changelog's view of its records).
    Dump {
        /// The log directory.
        dir: PathBuf,
        /// First index to print.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Only these record types (e.g. CREAT,UNLNK).
        #[arg(long = "type", value_parser = Mask::parse)]
        types: Option<Mask>,
    },
}

pub fn run(cmd: JournalCommand) -> Result<(), String> {
    match cmd {
        JournalCommand::Check { dir } => check(&dir),
        JournalCommand::Dump { dir, from, types } => dump(&dir, from, types.unwrap_or(Mask::ALL)),
    }
}

fn exists(dir: &std::path::Path) -> Result<(), String> {
    if dir.is_dir() { Ok(()) } else { Err(format!("{}: no such log directory", dir.display())) }
}

fn check(dir: &std::path::Path) -> Result<(), String> {
    exists(dir)?;
    let (segments, torn) = interlock_journal::check(dir).map_err(|e| format!("CORRUPT: {e}"))?;
    println!("{:<28} {:>12} {:>12} {:>12}", "segment", "first", "last", "bytes");
    for s in &segments {
        let name = s.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let last = if s.end > s.first { (s.end - 1).to_string() } else { "-".into() };
        println!("{name:<28} {:>12} {last:>12} {:>12}", s.first, s.bytes);
    }
    match (segments.first(), segments.last()) {
        (Some(f), Some(l)) if l.end > f.first => println!("records {}..={} ({})", f.first, l.end - 1, l.end - f.first),
        _ => println!("records: none"),
    }
    if let Some(at) = torn {
        println!("torn tail at offset {at} of the last segment (unacknowledged; cut when the log is next opened)");
    }
    let (consumers, checkpoint) = changelog::consumers_of(dir).map_err(|e| e.to_string())?;
    println!("checkpoint {checkpoint}");
    if consumers.is_empty() {
        println!("consumers: none");
    }
    for c in consumers {
        let name = c.name.as_deref().unwrap_or("-");
        println!("consumer {} name {name} cleared {} mask {:#x}", c.id, c.cleared, c.mask.0);
    }
    println!("ok");
    Ok(())
}

fn dump(dir: &std::path::Path, from: u64, types: Mask) -> Result<(), String> {
    exists(dir)?;
    // A namespace store's journal holds its own records, which the
    // changelog shows projected; any other log holds changelog records.
    let project: changelog::Projection =
        if dir.join("meta.ckpt").is_file() { interlock_meta::project } else { |bytes| Record::decode(bytes).map(Some) };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut err = None;
    interlock_journal::read_dir(dir, from, |index, bytes| {
        use std::io::Write;
        if err.is_some() {
            return;
        }
        match project(bytes) {
            Ok(Some(r)) if types.contains(r.rtype) => {
                if let Err(e) = writeln!(out, "{}", line(index, &r)) {
                    err = Some(e);
                }
            }
            Ok(_) => {}
            Err(_) => {
                let _ = writeln!(out, "{index} (not a changelog record: {} bytes)", bytes.len());
            }
        }
    })
    .map_err(|e| e.to_string())?;
    // A reader that went away (`| head`) ends the process by `SIGPIPE`
    // before an error reaches here (see `main`'s `die_of_closed_pipes`).
    err.map_or_else(|| std::io::Write::flush(&mut out), Err).map_err(|e| e.to_string())
}

/// `INDEX NNTYPE TIME DATE FLAGS t=TARGET p=PARENT NAME [s=… sp=… SOURCE] u=UID:GID [j=JOB]`
pub fn line(index: u64, r: &Record) -> String {
    let (date, time) = utc(r.time_ns);
    let mut s = format!(
        "{index} {:02}{} {time} {date} {:#x} t={} p={} {}",
        r.rtype as u32,
        r.rtype.name(),
        r.flags,
        r.target,
        r.parent,
        String::from_utf8_lossy(&r.name)
    );
    if let Some(src) = &r.source {
        s += &format!(" s={} sp={} {}", src.target, src.parent, String::from_utf8_lossy(&src.name));
    }
    s += &format!(" u={}:{}", r.uid, r.gid);
    if let Some(j) = &r.jobid {
        s += &format!(" j={j}");
    }
    s
}

/// ("YYYY.MM.DD", "HH:MM:SS.nnnnnnnnn") in UTC.
fn utc(ns: u64) -> (String, String) {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}.{m:02}.{d:02}");
    let time = format!("{:02}:{:02}:{:02}.{:09}", rem / 3600, rem % 3600 / 60, rem % 60, ns % 1_000_000_000);
    (date, time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc(0), ("1970.01.01".into(), "00:00:00.000000000".into()));
        // 2026-11-21 23:22:09 UTC
        assert_eq!(utc(1_795_303_329_000_000_005).0, "2026.11.21");
        assert_eq!(utc(1_795_303_329_000_000_005).1, "23:22:09.000000005");
        assert_eq!(utc(951_782_400 * 1_000_000_000).0, "2000.02.29");
    }
}
