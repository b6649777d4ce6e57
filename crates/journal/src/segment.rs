//! Segment files: naming, scanning and recovery.
//!
//! A log directory holds `NNNNNNNNNNNNNNNNNNNN.seg` files, the number being
//! the index of the segment's first record. Records are contiguous across
//! segments. Invariants that recovery relies on:
//!
//! 1. A segment other than the last was fully written and fsynced before
//!    the next one was created (the flusher rotates only at a group
//!    boundary, after that group's fsync). So any damage there is
//!    corruption: an error naming the file and offset, never skipped.
//! 2. In the last segment, a record that fails its checksum is either a
//!    torn tail (part of the last group, whose fsync never completed, so no
//!    record from it was acknowledged) or corruption of an acknowledged
//!    record. The records behind a tear were written in the same group, so
//!    their `durable_before` is below the first bad index; a valid record
//!    further on whose `durable_before` reaches the bad index proves the
//!    bad record had been durable: corruption.
//!
//! A torn tail is cut off (the file is truncated and synced), never
//! silently kept or skipped over.
//!
//! 3. A segment's file may reach past its records with zeros: the writer
//!    extends it ahead of them (so that a sync need not write the file's
//!    size) and cuts the rest off only when it closes the segment (after
//!    the next one is made, and unsynced: a crash may leave them on any
//!    segment). Zeros from a record's start to the end of the file are
//!    the end of the records, not a tear, and reads stop there. Zeros
//!    followed by anything else are not: a group's later page that
//!    reached the disk before an earlier one did is a torn tail (or
//!    corruption, by invariant 2), as before.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::Error;
use crate::frame::{self, Bad, RECORD_HEADER, SEGMENT_HEADER};

/// Every this many records a segment remembers an (index, offset) pair, so
/// a read from index i scans at most this many records to find it.
pub const SPARSE_EVERY: u64 = 256;

/// What is known of one segment file.
#[derive(Debug, Clone)]
pub struct Segment {
    pub path: PathBuf,
    /// Index of its first record (the one in its name and header).
    pub first: u64,
    /// Index after its last record (`first` when empty).
    pub end: u64,
    /// Bytes in the file.
    pub len: u64,
    /// (index, offset) every [`SPARSE_EVERY`] records, from `first`.
    pub sparse: Vec<(u64, u64)>,
}

impl Segment {
    /// The offset from which to scan for `index`: at most `SPARSE_EVERY`
    /// records before it. O(log s) for s sparse entries.
    pub fn seek_hint(&self, index: u64) -> u64 {
        let at = self.sparse.partition_point(|&(i, _)| i <= index);
        if at == 0 { SEGMENT_HEADER as u64 } else { self.sparse[at - 1].1 }
    }

    /// Records that it holds an entry for a record at `offset`.
    pub fn note(&mut self, index: u64, offset: u64) {
        if (index - self.first).is_multiple_of(SPARSE_EVERY) {
            self.sparse.push((index, offset));
        }
    }
}

/// The file name of the segment starting at `first`.
pub fn file_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// The segment files of `dir` as (first index, path), sorted.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, Error> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(num) = name.strip_suffix(".seg") else { continue };
        if num.len() == 20
            && let Ok(first) = num.parse::<u64>()
        {
            out.push((first, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Creates a new empty segment starting at `first` and syncs it and the
/// directory, so the segment survives a crash once it is used.
pub fn create(dir: &Path, first: u64, sync: bool) -> Result<(File, Segment), Error> {
    let path = dir.join(file_name(first));
    let mut f = OpenOptions::new().create_new(true).write(true).open(&path).map_err(|e| Error::io(&path, e))?;
    let header = f.write_all(&frame::segment_header(first)).and_then(|()| if sync { f.sync_all() } else { Ok(()) });
    if let Err(e) = header {
        // Not left behind as a last segment without its header (a full
        // disk, mostly: the writer goes on in the segment before).
        let _ = std::fs::remove_file(&path);
        return Err(Error::io(&path, e));
    }
    if sync {
        sync_dir(dir)?;
    }
    let seg = Segment { path, first, end: first, len: SEGMENT_HEADER as u64, sparse: Vec::new() };
    Ok((f, seg))
}

/// Syncs a directory so that creations and removals in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))
}

/// Reads a whole segment file.
fn read_all(path: &Path) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// How a segment ended when scanned.
#[derive(Debug)]
pub struct Scanned {
    pub segment: Segment,
    /// Where a torn tail began, if there was one (already cut off when
    /// `repair` was asked).
    pub torn_at: Option<u64>,
}

/// Scans the segment at `path`, checking every record. `expect_first` is
/// the index the previous segment ended at; `last` whether this is the
/// final segment (the only one that may have a torn tail); `repair` whether
/// to cut a torn tail off the file. O(bytes of the segment).
pub fn scan(path: &Path, expect_first: Option<u64>, last: bool, repair: bool) -> Result<Scanned, Error> {
    let bytes = read_all(path)?;
    let corrupt = |offset: u64, what: String| Error::Corrupt { path: path.to_path_buf(), offset, what };
    let Some(first) = frame::parse_segment_header(&bytes) else {
        return Err(corrupt(0, "bad segment header".into()));
    };
    let named = path.file_name().and_then(|n| n.to_str()).map(|n| n == file_name(first)).unwrap_or(false);
    if !named {
        return Err(corrupt(0, format!("header names first index {first}, the file name does not")));
    }
    if let Some(e) = expect_first
        && e != first
    {
        return Err(corrupt(0, format!("segment starts at index {first}, the previous one ended before {e}")));
    }
    let mut seg = Segment { path: path.to_path_buf(), first, end: first, len: bytes.len() as u64, sparse: Vec::new() };
    let mut off = SEGMENT_HEADER;
    while off < bytes.len() {
        match frame::decode(&bytes[off..]) {
            Ok((f, n)) => {
                if f.index != seg.end {
                    return Err(corrupt(
                        off as u64,
                        format!("record index {} where {} was expected", f.index, seg.end),
                    ));
                }
                seg.note(f.index, off as u64);
                seg.end += 1;
                off += n;
            }
            Err(_) if bytes[off..].iter().all(|&b| b == 0) => {
                // Space set aside ahead of the records and never written
                // (see the journal's `Tail`): the records end here.
                seg.len = off as u64;
                break;
            }
            Err(bad) => {
                if !last {
                    return Err(corrupt(off as u64, describe(bad, seg.end)));
                }
                if let Some(later) = acknowledged_after(&bytes, off, seg.end) {
                    return Err(corrupt(
                        off as u64,
                        format!("{}; record {later} further on shows it had been durable", describe(bad, seg.end)),
                    ));
                }
                if repair {
                    let f = OpenOptions::new().write(true).open(path).map_err(|e| Error::io(path, e))?;
                    f.set_len(off as u64).map_err(|e| Error::io(path, e))?;
                    f.sync_all().map_err(|e| Error::io(path, e))?;
                }
                seg.len = off as u64;
                return Ok(Scanned { segment: seg, torn_at: Some(off as u64) });
            }
        }
    }
    Ok(Scanned { segment: seg, torn_at: None })
}

fn describe(bad: Bad, index: u64) -> String {
    match bad {
        Bad::Short => format!("record {index} is cut short"),
        Bad::Zero => format!("record {index} was never written"),
        Bad::Checksum => format!("record {index} fails its checksum"),
    }
}

/// A valid record after `from` (where record `bad` should have been) whose
/// `durable_before` shows record `bad` had been durable, if any: proof that
/// the damage is corruption, not a torn tail. O(bytes after `from`).
fn acknowledged_after(bytes: &[u8], from: usize, bad: u64) -> Option<u64> {
    (from + 1..bytes.len().saturating_sub(RECORD_HEADER - 1)).find_map(|off| {
        let index = u64::from_le_bytes(bytes[off + 8..off + 16].try_into().ok()?);
        if index <= bad || index - bad > 1 << 40 {
            return None;
        }
        let (f, _) = frame::decode(&bytes[off..]).ok()?;
        (f.durable_before >= bad).then_some(f.index)
    })
}

/// Reads the records of `seg` from `from` (at least `seg.first`) up to but
/// not including `until`, at most `max`, calling `f` on each. Scans at most
/// `SPARSE_EVERY` records before `from`. Never reads a byte of record
/// `until` or later: the flusher may be writing it at this moment.
pub fn read(seg: &Segment, from: u64, until: u64, max: usize, f: impl FnMut(u64, &[u8])) -> Result<usize, Error> {
    read_at(&seg.path, (seg.seek_hint(from), seg.len), from, until, max, f)
}

/// [`read`] from the record boundary `start` of the segment file at
/// `path` (at or before record `from`) to offset `end` (where its records
/// end: a segment's file may go on with zeros, see invariant 3), without
/// its sparse index. O(records from `start` to the last one given).
pub fn read_at(
    path: &Path,
    (start, end): (u64, u64),
    from: u64,
    until: u64,
    max: usize,
    mut f: impl FnMut(u64, &[u8]),
) -> Result<usize, Error> {
    if from >= until {
        return Ok(0);
    }
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    file.seek(SeekFrom::Start(start)).map_err(|e| Error::io(path, e))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    let mut header = [0u8; RECORD_HEADER];
    let mut payload = Vec::new();
    let mut offset = start;
    let mut count = 0;
    while count < max && offset < end {
        if reader.read_exact(&mut header).is_err() {
            break;
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        if len > frame::MAX_PAYLOAD {
            return Err(Error::Corrupt { path: path.to_path_buf(), offset, what: "impossible record length".into() });
        }
        payload.resize(RECORD_HEADER + len, 0);
        payload[..RECORD_HEADER].copy_from_slice(&header);
        reader.read_exact(&mut payload[RECORD_HEADER..]).map_err(|e| Error::io(path, e))?;
        let (frame, n) = frame::decode(&payload).map_err(|bad| Error::Corrupt {
            path: path.to_path_buf(),
            offset,
            what: describe(bad, from),
        })?;
        offset += n as u64;
        if frame.index >= from {
            f(frame.index, frame.payload);
            count += 1;
        }
        if frame.index + 1 >= until {
            break;
        }
    }
    Ok(count)
}
