//! The segment being written: its file, kept ahead of its records by zeros.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

#[cfg(doc)]
use super::Journal;
use super::Shared;
use crate::Error;
use crate::segment::Segment;

/// How far ahead of its records a segment's file is extended: one
/// slower sync per this many bytes of records.
pub const PREALLOCATE: u64 = 1 << 20;

/// Zeros a segment keeps ahead of its records (the file is extended
/// whenever fewer would be left). When the disk is full they are what
/// records are written into, so a full disk fails no record until this
/// much of them has gone by with no room found meanwhile: thousands of
/// removals, the changes that make room ([`Journal::space_low`]). Without
/// it a full disk failed the journal at the next extension, and with it
/// every later change, the removals that would have made room too
/// (session 32).
pub const RESERVE: u64 = PREALLOCATE / 2;

/// The segment being written. Its file reaches past the records by
/// [`RESERVE`] to [`RESERVE`] + [`PREALLOCATE`] bytes of zeros (fewer
/// while the disk is full), which recovery reads as the end of the
/// records (`segment::scan`). The zeros are written, not a hole: a
/// group's write then lands inside the file's size on blocks it already
/// has, so its `fdatasync` writes the data and neither the inode's size
/// nor a new block's allocation, and needs no room the disk may not
/// have. The zeros themselves go out with the next group's sync, one
/// [`PREALLOCATE`] per that many bytes of records.
pub(super) struct Tail {
    pub(super) file: File,
    /// The file's size: records, then zeros.
    pub(super) size: u64,
}

impl Tail {
    /// Opens a segment that recovery found, to write after its records.
    pub(super) fn open(seg: &Segment) -> Result<Tail, Error> {
        let file = File::options().write(true).open(&seg.path).map_err(|e| Error::io(&seg.path, e))?;
        let size = file.metadata().map_err(|e| Error::io(&seg.path, e))?.len();
        Ok(Tail { file, size })
    }

    /// Writes `bytes` at `at`, first extending the file with zeros if
    /// fewer than [`RESERVE`] would be left after them. O(bytes), plus
    /// O([`PREALLOCATE`]) once per that many bytes (and one failing
    /// `write` a call while the disk is full). Returns whether the disk
    /// is full (`Some(true)`: the extension found no room, and `bytes`
    /// went into the zeros already there), or `None` if no extension was
    /// due. Fails with the disk's `ENOSPC` only when `bytes` do not fit
    /// in the zeros left.
    pub(super) fn write_at(&mut self, path: &Path, bytes: &[u8], at: u64) -> Result<Option<bool>, Error> {
        let end = at + bytes.len() as u64;
        let mut full = None;
        if end + RESERVE > self.size {
            let size = (end + RESERVE).next_multiple_of(PREALLOCATE);
            full = Some(match self.extend(size) {
                Ok(()) => false,
                Err(e) if crate::no_space(&e) && end <= self.size => true,
                Err(e) => return Err(Error::io(path, e)),
            });
        }
        self.file.write_all_at(bytes, at).map_err(|e| Error::io(path, e))?;
        Ok(full)
    }

    /// Writes zeros from the file's size to `size`; on an error, the size
    /// is as far as they went.
    pub(super) fn extend(&mut self, size: u64) -> std::io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        while self.size < size {
            let n = (size - self.size).min(ZEROS.len() as u64);
            self.file.write_all_at(&ZEROS[..n as usize], self.size)?;
            self.size += n;
        }
        Ok(())
    }

    /// Makes what was written durable (`fdatasync`, unless in the unsafe
    /// mode), if anything written is not yet (`unsynced`, then cleared).
    pub(super) fn sync_written(&self, s: &Shared, unsynced: &mut bool, path: &Path) -> Result<(), Error> {
        if *unsynced && s.options.fsync {
            self.file.sync_data().map_err(|e| Error::io(path, e))?;
        }
        *unsynced = false;
        Ok(())
    }

    /// Cuts the zeros after the records off a segment that will not be
    /// written again (a rotated or closed one), so it ends where its
    /// records do. Unsynced: a crash that loses the cut leaves zeros,
    /// which recovery reads as the end anyway.
    pub(super) fn trim(&self, seg: &Segment) {
        if self.size > seg.len
            && let Err(e) = self.file.set_len(seg.len)
        {
            tracing::warn!(path = %seg.path.display(), error = %e, "cutting the preallocated end off a segment");
        }
    }
}
