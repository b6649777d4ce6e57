//! An inode in memory. What every creator in a directory touches (its
//! entry count, link count, times, owner and mode) is atomic, so
//! creators in one directory share no lock, and what they only read
//! (owner and mode) takes none; what changes rarely (atime, extended
//! attributes) sits behind the inode's own small mutex.
//!
//! Size matters at 10M files: what few inodes have (extended attributes,
//! a symlink's target, a device number, the directory part) is boxed
//! apart, so a plain file's inode is 96 bytes (112 with its `Arc`, a
//! size class of mimalloc's: 8 bytes more would take 128).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::access::{self, Owner};
use crate::acl;
use crate::errno::{Errno, Result};
use crate::spread::Intent;
use crate::types::{
    Attr, Cred, DIRENT_SIZE, FLAG_IMMUTABLE, FLAG_NOATIME, FLAG_NODUMP, FileType, Ino, KEPT_FLAGS, Nanos,
};
use crate::usage;

pub(crate) struct Inode {
    pub ino: Ino,
    pub kind: FileType,
    /// Owner and mode: atomics, so that a permission check takes no lock
    /// (every creator in a directory checks the directory's). Changed
    /// only by a change that holds the inode's name lock; a check that
    /// races a chown or chmod may see one field changed and not yet the
    /// other, as Linux's `generic_permission`, which reads `i_mode` and
    /// `i_uid` without a lock, may.
    /// The mode's bits, and above them [`ACCESS_ACL`] and
    /// [`DEFAULT_ACL`]: whether its extended attributes hold those ACLs,
    /// read with the mode by a permission check or a create at no cost
    /// (only an inode with an ACL takes its `meta` lock for it); and
    /// [`HAS_DATA`]. Each writer of some of its bits keeps the others
    /// (a compare-and-swap): they hold different locks.
    perm: AtomicU32,
    uid: AtomicU32,
    gid: AtomicU32,
    pub meta: Mutex<Meta>,
    pub nlink: AtomicU32,
    pub size: AtomicU64,
    /// Its data file's blocks (see [`Attr::blocks`]): not recorded, the
    /// data file is their truth; set under the inode's lock after each
    /// change to the data, and from the data file when the store opens.
    pub blocks: AtomicU64,
    /// A directory's are the latest of these and its spread lines' (see
    /// [`Inode::times`]).
    mtime: AtomicI64,
    ctime: AtomicI64,
    /// Open handles anywhere in the cluster: an inode with no links left
    /// lives on (an orphan) until the last is closed.
    pub opens: AtomicU32,
    /// It lost its last name while open (or never had one: an
    /// `O_TMPFILE`): it lives until the last close, and across a restart
    /// until its holders' recovery ends.
    pub orphan: AtomicBool,
    /// An orphan that a link may name: an `O_TMPFILE` made without
    /// `O_EXCL` (Linux's `I_LINKABLE`); any other orphan's link is
    /// `ENOENT`.
    pub linkable: AtomicBool,
    pub dir: Option<Box<Dir>>,
}

/// In an inode's `perm` word: it has an access ACL (`acl::ACCESS`).
const ACCESS_ACL: u32 = 1 << 16;
/// In an inode's `perm` word: it has a default ACL (`acl::DEFAULT`).
const DEFAULT_ACL: u32 = 1 << 17;
/// In an inode's `perm` word: a data file may have been made for it
/// (a write, `fallocate` or copy into it since the store opened, or a
/// data file found then). Without it, freeing the inode removes no data
/// file: no path made and no `unlink(2)` that finds nothing, which took
/// the collecting thread 0.6-1.1 µs per freed empty file (session 56).
const HAS_DATA: u32 = 1 << 18;
/// Where an inode's `perm` word keeps its attribute flags
/// ([`KEPT_FLAGS`], the bits `0xF0`, at bits 19 to 22): read by every
/// permission check and change at no cost.
const FLAGS_SHIFT: u32 = 15;
/// The mode's bits of the `perm` word.
const MODE_BITS: u32 = 0o7777;
/// The flags a new inode takes from its directory's, as tmpfs's do
/// (`SHMEM_FL_INHERITED`).
const INHERITED_FLAGS: u32 = FLAG_NODUMP | FLAG_NOATIME;

/// Permission bits `perm` with attribute flags `flags` above them, where
/// an inode's `perm` word keeps them: how a record that makes an inode,
/// and a checkpoint's image of one, carry its flags ([`Inode::new`]
/// takes them from its owner's `perm`). Records and images older than
/// the flags have none there. O(1).
pub(crate) fn with_flags(perm: u32, flags: u32) -> u32 {
    perm & MODE_BITS | (flags & KEPT_FLAGS) << FLAGS_SHIFT
}

/// The `perm` word's ACL bits for these extended attributes. O(xattrs).
fn acl_bits(xattrs: &[Xattr]) -> u32 {
    xattrs.iter().fold(0, |bits, (n, _)| match &**n {
        acl::ACCESS => bits | ACCESS_ACL,
        acl::DEFAULT => bits | DEFAULT_ACL,
        _ => bits,
    })
}

/// At 10M files each byte here is 10 MB (the size `docs/namespace.md`
/// states).
const _: () = assert!(std::mem::size_of::<Inode>() == 96);

/// An extended attribute: name and value.
pub(crate) type Xattr = (Box<[u8]>, Box<[u8]>);

/// What changes rarely, and what few inodes have.
pub(crate) struct Meta {
    pub atime: Nanos,
    /// What few inodes have; `None` for most.
    extra: Option<Box<Extra>>,
}

#[derive(Default)]
struct Extra {
    /// Extended attributes, in the order set.
    xattrs: Vec<Xattr>,
    /// A symlink's target.
    target: Box<[u8]>,
    /// A device node's device.
    rdev: u64,
}

impl Meta {
    pub fn new(atime: Nanos, target: &[u8], rdev: u64) -> Meta {
        let extra = (!target.is_empty() || rdev != 0)
            .then(|| Box::new(Extra { xattrs: Vec::new(), target: target.into(), rdev }));
        Meta { atime, extra }
    }

    pub fn xattrs(&self) -> &[Xattr] {
        self.extra.as_ref().map_or(&[], |e| &e.xattrs)
    }

    pub fn xattrs_mut(&mut self) -> &mut Vec<Xattr> {
        &mut self.extra.get_or_insert_default().xattrs
    }

    pub fn target(&self) -> &[u8] {
        self.extra.as_ref().map_or(&[], |e| &e.target)
    }

    pub fn rdev(&self) -> u64 {
        self.extra.as_ref().map_or(0, |e| e.rdev)
    }

    /// Drops the box of what few inodes have once it holds nothing (its
    /// last extended attribute removed): the memory goes, and the inode
    /// is as a checkpoint's load makes it.
    pub fn shed(&mut self) {
        if self.extra.as_ref().is_some_and(|e| e.xattrs.is_empty() && e.target.is_empty() && e.rdev == 0) {
            self.extra = None;
        }
    }

    /// What this part is charged (see `usage`): nothing for most inodes.
    /// O(extended attributes).
    pub fn bytes(&self) -> i64 {
        self.extra.as_ref().map_or(0, |e| {
            let xattrs: usize = e.xattrs.iter().map(|(n, v)| n.len() + v.len()).sum();
            usage::EXTRA + e.target.len() as i64 + usage::XATTR * e.xattrs.len() as i64 + xattrs as i64
        })
    }
}

/// What only a directory has.
pub(crate) struct Dir {
    /// The intention lock: every operation on an entry of the directory
    /// holds it shared (they do not exclude each other: names are locked
    /// one by one, see `locks`); removing or replacing the directory
    /// holds it exclusive, so nothing is created in a directory as it
    /// goes. Beside it, the entry count (`.` and `..` not counted) and,
    /// once the directory is busy, the times its entry operations move:
    /// all spread over lines per thread then (see `spread`).
    pub intent: Intent,
    /// The directory it is in (itself for the root).
    pub parent: AtomicU64,
    /// It was removed: nothing may be created in it.
    pub dead: AtomicBool,
}

impl Inode {
    /// Inode `ino` of `owner`'s kind, owner and mode (and the attribute
    /// flags above the mode's bits: see [`with_flags`]).
    pub fn new(ino: Ino, owner: Owner, meta: Meta, time: Nanos, parent: Ino) -> Inode {
        let kind = owner.kind;
        let dir = (kind == FileType::Directory).then(|| {
            Box::new(Dir { intent: Intent::default(), parent: AtomicU64::new(parent), dead: AtomicBool::new(false) })
        });
        let size = if kind == FileType::Symlink { meta.target().len() as u64 } else { 0 };
        let perm = owner.perm & (MODE_BITS | KEPT_FLAGS << FLAGS_SHIFT) | acl_bits(meta.xattrs());
        Inode {
            ino,
            kind,
            perm: AtomicU32::new(perm),
            uid: AtomicU32::new(owner.uid),
            gid: AtomicU32::new(owner.gid),
            meta: Mutex::new(meta),
            nlink: AtomicU32::new(if dir.is_some() { 2 } else { 1 }),
            size: AtomicU64::new(size),
            blocks: AtomicU64::new(0),
            mtime: AtomicI64::new(time),
            ctime: AtomicI64::new(time),
            opens: AtomicU32::new(0),
            orphan: AtomicBool::new(false),
            linkable: AtomicBool::new(false),
            dir,
        }
    }

    pub fn is_dir(&self) -> bool {
        self.dir.is_some()
    }

    /// What the inode is charged (see `usage`), its names apart. Takes
    /// its `meta` lock; O(extended attributes).
    pub fn bytes(&self) -> i64 {
        usage::INODE + if self.is_dir() { usage::DIRECTORY } else { 0 } + self.meta.lock().bytes()
    }

    /// The directory part (callers check [`Inode::is_dir`] first).
    pub fn dir(&self) -> &Dir {
        self.dir.as_ref().expect("a directory")
    }

    /// Its attribute flags ([`KEPT_FLAGS`]). O(1).
    pub fn flags(&self) -> u32 {
        self.perm.load(Relaxed) >> FLAGS_SHIFT & KEPT_FLAGS
    }

    /// The flags an inode made in this directory takes. O(1).
    pub fn inherited_flags(&self) -> u32 {
        self.flags() & INHERITED_FLAGS
    }

    /// Sets its attribute flags (by a change that holds the inode's name
    /// lock). O(1).
    pub fn set_flags(&self, flags: u32) {
        let bits = (flags & KEPT_FLAGS) << FLAGS_SHIFT;
        self.update_perm(|word| word & !(KEPT_FLAGS << FLAGS_SHIFT) | bits);
    }

    /// `EPERM` if it has any of `flags` (immutable, append-only): the
    /// change the caller is about to make is one they forbid. O(1).
    pub fn refuse_if(&self, flags: u32) -> Result<()> {
        if self.flags() & flags != 0 { Err(Errno::EPERM) } else { Ok(()) }
    }

    /// Kind, owner and mode, read without a lock. O(1).
    pub fn owner(&self) -> Owner {
        Owner {
            kind: self.kind,
            perm: self.perm.load(Relaxed) & MODE_BITS,
            uid: self.uid.load(Relaxed),
            gid: self.gid.load(Relaxed),
        }
    }

    /// A chmod (by a change that holds the inode's name lock): the
    /// ACL bits stay.
    pub fn set_perm(&self, perm: u32) {
        self.update_perm(|word| word & !MODE_BITS | perm & MODE_BITS);
    }

    /// Changes the `perm` word as `f` says, keeping what other writers
    /// set meanwhile. O(1) expected.
    fn update_perm(&self, f: impl Fn(u32) -> u32) {
        let _ = self.perm.fetch_update(Relaxed, Relaxed, |word| Some(f(word)));
    }

    /// Notes that a data file may now exist for it: before one is made
    /// (under the inode's lock), or when one is found at open. O(1).
    pub fn note_data(&self) {
        self.perm.fetch_or(HAS_DATA, Relaxed);
    }

    /// Whether a data file may exist for it (see [`HAS_DATA`]). O(1).
    pub fn has_data(&self) -> bool {
        self.perm.load(Relaxed) & HAS_DATA != 0
    }

    /// Notes which ACLs its extended attributes now hold (by a change
    /// that holds the inode's name lock, and its `meta` lock, after
    /// changing them). O(xattrs).
    pub fn note_acls(&self, xattrs: &[Xattr]) {
        let acls = acl_bits(xattrs);
        self.update_perm(|word| word & !(ACCESS_ACL | DEFAULT_ACL) | acls);
    }

    /// Whether it has a default ACL (a directory). O(1).
    pub fn has_default_acl(&self) -> bool {
        self.perm.load(Relaxed) & DEFAULT_ACL != 0
    }

    /// Whether `cred` may do `want` to it (owned and moded as `o`, read
    /// by the caller), as [`access::permits`] decides, or for an inode
    /// with an access ACL, as the ACL does for anyone but its owner and
    /// root (see [`acl::permits`]). O(1) without an ACL; with one, its
    /// `meta` lock and O(entries).
    pub fn permits(&self, cred: &Cred, o: &Owner, want: u32) -> bool {
        if self.perm.load(Relaxed) & ACCESS_ACL == 0 || cred.is_root() || cred.uid == o.uid {
            return access::permits(cred, o, want);
        }
        let m = self.meta.lock();
        match m.xattrs().iter().find(|(n, _)| **n == *acl::ACCESS) {
            Some((_, a)) => acl::permits(a, cred, o, want),
            None => access::permits(cred, o, want),
        }
    }

    /// [`permits`](Inode::permits), as an error: `EACCES`; and first, as
    /// Linux's `inode_permission`, `EPERM` for a write to an immutable
    /// inode, whoever asks (root too): a write to a file, a change to a
    /// directory's entries.
    pub fn check(&self, cred: &Cred, o: &Owner, want: u32) -> Result<()> {
        if want & access::WRITE != 0 {
            self.refuse_if(FLAG_IMMUTABLE)?;
        }
        if self.permits(cred, o, want) { Ok(()) } else { Err(Errno::EACCES) }
    }

    /// A chown of what is `Some` (by a change that holds the inode's name
    /// lock).
    pub fn set_ids(&self, uid: Option<u32>, gid: Option<u32>) {
        if let Some(u) = uid {
            self.uid.store(u, Relaxed);
        }
        if let Some(g) = gid {
            self.gid.store(g, Relaxed);
        }
    }

    /// The contents changed at `time`: mtime and ctime move forward to it
    /// (never back: concurrent changes land in any order).
    pub fn modified(&self, time: Nanos) {
        let (m, c) = self.own_times();
        forward(m, time);
        forward(c, time);
    }

    /// The inode itself changed at `time` (links, owner, mode).
    pub fn changed(&self, time: Nanos) {
        forward(self.own_times().1, time);
    }

    /// The mtime and ctime this thread's changes move: a spread
    /// directory's line's, else the inode's.
    fn own_times(&self) -> (&AtomicI64, &AtomicI64) {
        self.dir.as_ref().and_then(|d| d.intent.times()).unwrap_or((&self.mtime, &self.ctime))
    }

    /// mtime and ctime. O(1), a spread directory's O(`spread::LINES`).
    pub fn times(&self) -> (Nanos, Nanos) {
        let (m, c) = (self.mtime.load(Relaxed), self.ctime.load(Relaxed));
        match &self.dir {
            Some(d) => {
                let (lm, lc) = d.intent.latest();
                (m.max(lm), c.max(lc))
            }
            None => (m, c),
        }
    }

    /// Sets the ctime, and the mtime if given (a setattr, a write, a
    /// checkpoint's load): set, not moved forward.
    pub fn set_times(&self, mtime: Option<Nanos>, ctime: Nanos) {
        if let Some(t) = mtime {
            self.mtime.store(t, Relaxed);
        }
        self.ctime.store(ctime, Relaxed);
        if let Some(d) = &self.dir {
            d.intent.forget_times(mtime.is_some());
        }
    }

    pub fn attr(&self) -> Attr {
        let o = self.owner();
        let (mtime, ctime) = self.times();
        let m = self.meta.lock();
        let size = match &self.dir {
            // As tmpfs: `.` and `..` count too.
            Some(d) => (d.intent.entries() + 2) * DIRENT_SIZE,
            None => self.size.load(Relaxed),
        };
        Attr {
            ino: self.ino,
            kind: self.kind,
            perm: o.perm,
            nlink: self.nlink.load(Relaxed),
            uid: o.uid,
            gid: o.gid,
            rdev: m.rdev(),
            size,
            blocks: self.blocks.load(Relaxed),
            atime: m.atime,
            mtime,
            ctime,
            acl: self.perm.load(Relaxed) & (ACCESS_ACL | DEFAULT_ACL) != 0,
        }
    }
}

/// Moves a time forward to `time`, writing it only if it is later: a
/// read leaves the line shared, where a `fetch_max` would take it even
/// to write nothing.
fn forward(t: &AtomicI64, time: Nanos) {
    if t.load(Relaxed) < time {
        t.fetch_max(time, Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::spread::BUSY;

    /// A busy directory's times, moved on many threads' lines, are the
    /// latest of all; set (even back) they are what was set, until the
    /// next change moves them on; its size counts the entries on every
    /// line.
    #[test]
    fn a_spread_directorys_times_and_size_are_its_lines_and_its_own() {
        let owner = Owner { kind: FileType::Directory, perm: 0o755, uid: 0, gid: 0 };
        let d = Inode::new(2, owner, Meta::new(0, b"", 0), 100, 1);
        for _ in 0..BUSY {
            d.dir().intent.add();
        }
        drop(d.dir().intent.share());
        assert!(d.dir().intent.times().is_some(), "spread");
        std::thread::scope(|s| {
            for t in 0..4 {
                let d = &d;
                s.spawn(move || {
                    d.dir().intent.add();
                    d.modified(1_000 + t);
                    d.changed(2_000 + t);
                });
            }
        });
        assert_eq!(d.times(), (1_003, 2_003));
        assert_eq!(d.attr().size, (BUSY + 4 + 2) * DIRENT_SIZE);
        d.set_times(Some(500), 600);
        assert_eq!(d.times(), (500, 600), "set back, the lines' later times dropped");
        d.set_times(None, 700);
        assert_eq!(d.times(), (500, 700));
        std::thread::scope(|s| {
            s.spawn(|| d.modified(800));
        });
        assert_eq!(d.times(), (800, 800));
    }
}
