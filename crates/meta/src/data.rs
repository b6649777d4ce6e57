//! File data: one sparse local file per inode, under the store's
//! `data/` (fanned out over 256 subdirectories by the inode number's low
//! byte). Sparse files, files of many GiB and truncation up and down are
//! the local file system's; the kernel's page cache serves reads. The
//! namespace's record of a file's size is the truth: a read stops at it
//! (bytes past the end of the data file read as zeros: a file truncated
//! up, or a hole), and when the store opens, data past a file's size is
//! cut off and data files of inodes that no longer exist are removed (a
//! crash between a record and the data file's change leaves one of
//! those, never anything else).
//!
//! Costs: a read or write is an `open` and one `preadv2`/`pwrite`,
//! O(bytes) (a read from the cache only, `RWF_NOWAIT`, fails fast
//! instead of waiting for the disk);
//! a `fallocate` an `open` and one `fallocate`; a copy two `open`s, and
//! `lseek`s and `copy_file_range`s, O(bytes of data) in the kernel, none
//! through user space; a seek for data or a hole an `open` and one
//! `lseek`; `fsync` is the data file's `fdatasync`; the space one
//! `statvfs`. Each change to a file's data returns the blocks its data
//! file then takes (one `fstat` more), which the namespace shows as
//! `st_blocks`.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::io::IoSliceMut;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use nix::fcntl::{FallocateFlags, copy_file_range, fallocate};
use nix::sys::statvfs::statvfs;
use nix::unistd::{Whence, lseek};
use rustix::io::{ReadWriteFlags, preadv2};

use crate::errno::{Errno, Result};
use crate::namespace::Namespace;
use crate::types::{Fallocate, Ino, ReadFrom, SeekTo};

pub(crate) struct Data {
    dir: PathBuf,
    /// Whether the local file system takes `RWF_NOWAIT` reads (ext4, XFS
    /// and btrfs do; tmpfs here answers `EOPNOTSUPP`). Once it is seen
    /// not to, a read from the cache only is not tried: the caller reads
    /// as from the disk.
    nowait: AtomicBool,
}

/// A position or length as the system calls take it (every range was
/// checked against `FILE_SIZE_MAX` before).
fn offset(at: u64) -> Result<i64> {
    i64::try_from(at).map_err(|_| Errno::EFBIG)
}

/// Makes `len` bytes of `f` from `at` read as zeros: a hole where the
/// local file system punches them, written zeros where it cannot.
fn zero(f: &File, at: u64, len: u64) -> Result<()> {
    let punch = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    match fallocate(f, punch, offset(at)?, offset(len)?) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EOPNOTSUPP) => {
            let zeros = vec![0u8; len.min(1 << 20) as usize];
            let mut done = 0;
            while done < len {
                let k = (len - done).min(zeros.len() as u64) as usize;
                f.write_all_at(&zeros[..k], at + done).map_err(errno)?;
                done += k as u64;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Copies up to `len` bytes of `from` at `at` to `to` at `to_at`;
/// fewer only where `from` ends. How many.
fn copy_range(from: &File, at: u64, to: &File, to_at: u64, len: u64) -> Result<u64> {
    let mut done = 0u64;
    while done < len {
        let (mut a, mut b) = (offset(at + done)?, offset(to_at + done)?);
        let want = usize::try_from(len - done).unwrap_or(usize::MAX).min(1 << 30);
        match copy_file_range(from, Some(&mut a), to, Some(&mut b), want) {
            Ok(0) => break,
            Ok(k) => done += k as u64,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Makes `len` bytes of `f` from `at` read as zeros, as far as `f`
/// reaches (past its end they read as zeros already).
fn zero_within(f: &File, at: u64, len: u64) -> Result<()> {
    let reach = f.metadata().map_err(errno)?.len();
    let to = (at + len).min(reach);
    if at < to { zero(f, at, to - at) } else { Ok(()) }
}

/// Appends the low `digits` hex digits of `n` to `out`, lower case,
/// with leading zeros.
fn hex(out: &mut Vec<u8>, n: u64, digits: u32) {
    out.extend((0..digits).rev().map(|d| b"0123456789abcdef"[(n >> (4 * d) & 0xf) as usize]));
}

/// The 512-byte blocks `f` takes on the local file system.
fn blocks(f: &File) -> Result<u64> {
    f.metadata().map(|m| m.blocks()).map_err(errno)
}

/// An I/O error as the errno a file system returns.
fn errno(e: std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Data {
    pub fn open(store: &Path) -> std::io::Result<Data> {
        let dir = store.join("data");
        std::fs::create_dir_all(&dir)?;
        Ok(Data { dir, nowait: AtomicBool::new(true) })
    }

    /// Where `ino`'s data file is: `data/LL/NNNNNNNNNNNNNNNN`, its low
    /// byte and its number in lower-case hex. Written digit by digit
    /// into one buffer, one allocation: with `format!` and two joins
    /// (~2.4k instructions in callgrind, four allocations) a path took
    /// 270-350 ns here, this way 25-115 (session 56), and every data
    /// call and every freed data file's removal makes one. O(1).
    fn path(&self, ino: Ino) -> PathBuf {
        let dir = self.dir.as_os_str().as_bytes();
        let mut p = Vec::with_capacity(dir.len() + 20);
        p.extend_from_slice(dir);
        p.push(b'/');
        hex(&mut p, ino & 0xff, 2);
        p.push(b'/');
        hex(&mut p, ino, 16);
        PathBuf::from(OsString::from_vec(p))
    }

    fn file(&self, ino: Ino) -> Result<Option<File>> {
        match File::open(self.path(ino)) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// `len` bytes from `offset` of a file of `size` bytes: fewer at its
    /// end, zeros where no data was written. With `from`
    /// [`ReadFrom::Cache`], `EAGAIN` if any of them is not in the page
    /// cache (`RWF_NOWAIT`): the read would wait for the disk; and
    /// `EAGAIN` too where the local file system cannot say (no
    /// `RWF_NOWAIT`): until session 32 such a store (its data on tmpfs)
    /// answered every read through a server with `EOPNOTSUPP`.
    pub fn read(&self, ino: Ino, offset: u64, len: usize, size: u64, from: ReadFrom) -> Result<Vec<u8>> {
        if from == ReadFrom::Cache && !self.nowait.load(Relaxed) {
            return Err(Errno::EAGAIN);
        }
        let len = size.saturating_sub(offset).min(len as u64) as usize;
        let mut buf = vec![0u8; len];
        let Some(f) = self.file(ino)? else { return Ok(buf) };
        let flags = match from {
            ReadFrom::Cache => ReadWriteFlags::NOWAIT,
            ReadFrom::Disk => ReadWriteFlags::empty(),
        };
        let mut done = 0;
        while done < len {
            match preadv2(&f, &mut [IoSliceMut::new(&mut buf[done..])], offset + done as u64, flags) {
                Ok(0) => break, // past the data file's end: zeros
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::NOTSUP) if from == ReadFrom::Cache => {
                    self.nowait.store(false, Relaxed);
                    return Err(Errno::EAGAIN);
                }
                Err(e) => return Err(Errno(e.raw_os_error())),
            }
        }
        Ok(buf)
    }

    /// The data file, made (empty) if the file has none yet, to write.
    fn writable(&self, ino: Ino) -> Result<File> {
        let path = self.path(ino);
        let open = |p: &Path| OpenOptions::new().write(true).create(true).truncate(false).open(p);
        match open(&path) {
            Ok(f) => Ok(f),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::fs::create_dir_all(path.parent().expect("a fan-out directory")).map_err(errno)?;
                open(&path).map_err(errno)
            }
            Err(e) => Err(errno(e)),
        }
    }

    /// Writes `bytes` at `offset`; the blocks the data file then takes.
    pub fn write(&self, ino: Ino, offset: u64, bytes: &[u8]) -> Result<u64> {
        let f = self.writable(ino)?;
        f.write_all_at(bytes, offset).map_err(errno)?;
        blocks(&f)
    }

    /// `fallocate(2)` on the data file's range, as `how` says: the space
    /// is the local file system's to reserve, and its errors (`ENOSPC`;
    /// `EOPNOTSUPP` for a mode it lacks) are the caller's. The range is
    /// within [`FILE_SIZE_MAX`](crate::FILE_SIZE_MAX), checked before.
    /// The blocks the data file then takes.
    pub fn fallocate(&self, ino: Ino, how: Fallocate, offset: u64, len: u64) -> Result<u64> {
        let f = self.writable(ino)?;
        let flags = FallocateFlags::from_bits_retain(how.mode() as i32);
        fallocate(&f, flags, self::offset(offset)?, self::offset(len)?)?;
        blocks(&f)
    }

    /// `n` bytes of `src`'s data from `src_off` into `dst`'s at `dst_off`,
    /// copied by the local file system (`copy_file_range`: a reflink or
    /// an in-kernel copy, no byte through this process). Only the
    /// source's data is copied: its holes (found with `SEEK_DATA` and
    /// `SEEK_HOLE`), and whatever lies past its data file's end, read as
    /// zeros, so they become zeros in `dst`'s range where its data file
    /// reaches (a punched hole, or written zeros where the local file
    /// system has no holes) and stay unallocated: a sparse file copies
    /// sparse. `src` may be `dst` (ranges apart). O(bytes of data and
    /// extents) in the kernel. The blocks `dst`'s data file then takes.
    pub fn copy(&self, (src, src_off): (Ino, u64), (dst, dst_off): (Ino, u64), n: u64) -> Result<u64> {
        let out = self.writable(dst)?;
        let end = src_off + n;
        let to_dst = |at: u64| dst_off + (at - src_off);
        // The source up to `at` is done.
        let mut at = src_off;
        if let Some(from) = self.file(src)? {
            while at < end {
                // Where the next data starts and ends; ENXIO: none before
                // the data file's end (which a truncate may move meanwhile).
                let seek = |at: u64, whence| -> Result<Option<u64>> {
                    match lseek(&from, offset(at)?, whence) {
                        Ok(p) => Ok(Some(p as u64)),
                        Err(nix::errno::Errno::ENXIO) => Ok(None),
                        Err(e) => Err(e.into()),
                    }
                };
                let Some(data) = seek(at, Whence::SeekData)?.filter(|&d| d < end) else { break };
                let Some(hole) = seek(data, Whence::SeekHole)? else { break };
                let hole = hole.min(end);
                zero_within(&out, to_dst(at), data - at)?;
                let copied = copy_range(&from, data, &out, to_dst(data), hole - data)?;
                at = data + copied;
                if at < hole {
                    break; // the source's data file ended meanwhile
                }
            }
        }
        zero_within(&out, to_dst(at), end - at)?;
        blocks(&out)
    }

    /// Where the next data (or hole) of a file of `size` bytes starts at
    /// or after `at`, as its data file's holes say; past the data file's
    /// end, up to `size`, is a hole. `ENXIO` at or past `size`, and when
    /// no data follows `at`, as Linux's `lseek` answers. Never a hole
    /// where a byte reads other than zero: the local file system reports
    /// only blocks it never wrote (or wrote off) as holes. One `lseek`.
    pub fn seek(&self, ino: Ino, at: u64, to: SeekTo, size: u64) -> Result<u64> {
        if at >= size {
            return Err(Errno::ENXIO);
        }
        let Some(f) = self.file(ino)? else {
            return if to == SeekTo::Data { Err(Errno::ENXIO) } else { Ok(at) };
        };
        let whence = if to == SeekTo::Data { Whence::SeekData } else { Whence::SeekHole };
        match (lseek(&f, offset(at)?, whence), to) {
            (Ok(p), SeekTo::Data) if (p as u64) < size => Ok(p as u64),
            (Ok(_), SeekTo::Data) => Err(Errno::ENXIO),
            (Ok(p), SeekTo::Hole) => Ok((p as u64).min(size)),
            // Past the data file's end.
            (Err(nix::errno::Errno::ENXIO), SeekTo::Data) => Err(Errno::ENXIO),
            (Err(nix::errno::Errno::ENXIO), SeekTo::Hole) => Ok(at),
            (Err(e), _) => Err(e.into()),
        }
    }

    /// The space of the file system holding the data, in blocks of
    /// `block`: (total, free, free to unprivileged users). One `statvfs`.
    pub fn space(&self, block: u32) -> Result<(u64, u64, u64)> {
        let v = statvfs(&self.dir).map_err(Errno::from)?;
        let unit = |n: u64| (u128::from(n) * u128::from(v.fragment_size()) / u128::from(block)) as u64;
        Ok((unit(v.blocks()), unit(v.blocks_free()), unit(v.blocks_available())))
    }

    /// Cuts or extends (sparsely) the data file to `size`, if it has one;
    /// the blocks it then takes.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<u64> {
        match OpenOptions::new().write(true).open(self.path(ino)) {
            Ok(f) => {
                f.set_len(size).map_err(errno)?;
                blocks(&f)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
            Err(e) => Err(errno(e)),
        }
    }

    /// The data is on disk (what `fsync` promises).
    pub fn sync(&self, ino: Ino) -> Result<()> {
        match self.file(ino)? {
            Some(f) => f.sync_data().map_err(errno),
            None => Ok(()),
        }
    }

    pub fn remove(&self, ino: Ino) {
        if let Err(e) = std::fs::remove_file(self.path(ino))
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(ino, error = %e, "removing a freed file's data");
        }
    }

    /// After replay: removes the data of inodes that do not exist, cuts
    /// data past each file's size, and gives each inode its data file's
    /// blocks. O(data files). Returns (removed, cut).
    pub fn reconcile(&self, ns: &Namespace) -> std::io::Result<(u64, u64)> {
        let (mut removed, mut cut) = (0, 0);
        for fan in std::fs::read_dir(&self.dir)? {
            for entry in std::fs::read_dir(fan?.path())? {
                let entry = entry?;
                let Some(ino) = entry.file_name().to_str().and_then(|n| Ino::from_str_radix(n, 16).ok()) else {
                    continue;
                };
                let Ok(i) = ns.inode(ino) else {
                    std::fs::remove_file(entry.path())?;
                    removed += 1;
                    continue;
                };
                let mut held = entry.metadata()?;
                let size = i.size.load(Relaxed);
                if held.len() > size {
                    let f = OpenOptions::new().write(true).open(entry.path())?;
                    f.set_len(size)?;
                    held = f.metadata()?;
                    cut += 1;
                }
                i.blocks.store(held.blocks(), Relaxed);
                i.note_data();
            }
        }
        Ok((removed, cut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data files' layout is on disk (`docs/namespace.md`): the path
    /// built digit by digit must be the one the formatted form gives.
    #[test]
    fn a_data_files_path_is_its_low_byte_then_its_number_in_hex() {
        let data = Data { dir: PathBuf::from("/srv/store/data"), nowait: AtomicBool::new(true) };
        for ino in [0, 1, 0xff, 0x100, 0xabc_def, 0x0123_4567_89ab_cdef, u64::MAX] {
            let formatted = data.dir.join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"));
            assert_eq!(data.path(ino), formatted, "{ino:#x}");
        }
    }
}
