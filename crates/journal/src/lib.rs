//! interlock's journal: a segmented append-only log with a lock-free append
//! path, group commit, checksummed records and crash recovery; and the
//! changelog, which is the same log read through consumers.
//!
//! Seed 001: with changelogs on, every metadata thread queued on one
//! semaphore to append a record, and file creation fell from 155k/s to
//! 62k/s. Here appenders never take a lock (see `ring` and
//! [`Journal::append`]), the metadata journal and the changelog are one log
//! (a changelog record costs no second write), and one fsync covers every
//! record published before it.
//!
//! # Layout
//!
//! - `ring`: the bounded multi-producer ring of the append path (checked
//!   with `loom`).
//! - `frame`: the on-disk record and segment-header format.
//! - `segment`: segment files, scanning, torn-tail versus corruption.
//! - `held`: one writer per directory (its `lock` file).
//! - [`Journal`] (`log`): appends, durability waits, reads, purge; its
//!   `flusher` (gathering groups, writing and syncing them, on its own
//!   thread or a waiting caller's) and `tail` (the segment being written,
//!   kept ahead of its records by zeros).
//! - [`changelog`]: typed records, masks, durable consumers, follow,
//!   clear, purge below the slowest consumer, idle-consumer GC.

pub mod changelog;
pub mod frame;
mod held;
mod log;
mod ring;
mod segment;
mod sync;

use std::path::{Path, PathBuf};

pub use frame::MAX_PAYLOAD;
pub use held::in_use;
pub use log::{DurableHook, FLUSHER_THREAD, Journal, Options, RESERVE, Recovery, sync_wanted_everywhere};

/// What went wrong, with the file it went wrong in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Damage that is not a torn tail: records that had been durable are
    /// unreadable. Never skipped.
    #[error("{path}: corrupt at offset {offset}: {what}")]
    Corrupt { path: PathBuf, offset: u64, what: String },
    #[error("record of {0} bytes is over the limit of {MAX_PAYLOAD}")]
    TooLarge(usize),
    #[error("index {index} has been purged; the log starts at {first}")]
    Purged { index: u64, first: u64 },
    /// The flusher hit an I/O error; the journal accepts no more appends.
    #[error("journal failed: {0}")]
    Failed(String),
    #[error("{0}")]
    Invalid(String),
    /// Another journal has the directory open (see [`in_use`]).
    #[error("{0} is in use: another process (a running server?) has its journal open")]
    InUse(PathBuf),
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), source }
    }

    /// Whether this is the disk's lack of room (`ENOSPC`, or `EDQUOT`
    /// over a quota).
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::Io { source, .. } if no_space(source))
    }
}

/// Whether an I/O error is the disk's lack of room.
pub(crate) fn no_space(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

/// One segment, as `interlock journal check` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentReport {
    pub path: PathBuf,
    pub first: u64,
    /// Index after its last record.
    pub end: u64,
    pub bytes: u64,
}

impl From<&segment::Segment> for SegmentReport {
    fn from(s: &segment::Segment) -> Self {
        SegmentReport { path: s.path.clone(), first: s.first, end: s.end, bytes: s.len }
    }
}

/// Verifies a log directory without changing it (no tail is cut): every
/// segment's records and checksums. Returns the segments and, if the last
/// one ends in a torn tail, the offset where it begins.
pub fn check(dir: &Path) -> Result<(Vec<SegmentReport>, Option<u64>), Error> {
    let (segments, torn) = log::recover(dir, false)?;
    Ok((segments.iter().map(SegmentReport::from).collect(), torn.map(|(_, at)| at)))
}

/// Reads the records of a log directory offline, without changing it, from
/// index `from` (a torn tail is not read). Calls `f` on each, in order.
pub fn read_dir(dir: &Path, from: u64, mut f: impl FnMut(u64, &[u8])) -> Result<usize, Error> {
    let (segments, _) = log::recover(dir, false)?;
    let mut done = 0;
    for seg in segments.iter().filter(|s| s.end > from) {
        done += segment::read(seg, from.max(seg.first), seg.end, usize::MAX, &mut f)?;
    }
    Ok(done)
}
