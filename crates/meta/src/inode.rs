//! An inode in memory. What every creator in a directory touches (its
//! entry count, link count, times) is atomic, so creators in one
//! directory share no lock; what changes rarely (owner, mode, extended
//! attributes) sits behind the inode's own small mutex.
//!
//! Size matters at 10M files: what few inodes have (extended attributes,
//! a symlink's target, a device number, the directory part) is boxed
//! apart, so a plain file's inode is 104 bytes (120 with its `Arc`, in
//! the allocator's 128-byte class as 112 was).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::sync::RwLock;

use crate::access::Owner;
use crate::types::{Attr, DIRENT_SIZE, FileType, Ino, Nanos};

pub(crate) struct Inode {
    pub ino: Ino,
    pub kind: FileType,
    pub meta: Mutex<Meta>,
    pub nlink: AtomicU32,
    pub size: AtomicU64,
    /// Its data file's blocks (see [`Attr::blocks`]): not recorded, the
    /// data file is their truth; set under the inode's lock after each
    /// change to the data, and from the data file when the store opens.
    pub blocks: AtomicU64,
    pub mtime: AtomicI64,
    pub ctime: AtomicI64,
    /// Open handles anywhere in the cluster: an inode with no links left
    /// lives on (an orphan) until the last is closed.
    pub opens: AtomicU32,
    /// It lost its last name while open: it lives until the last close,
    /// and across a restart until its holders' recovery ends.
    pub orphan: AtomicBool,
    pub dir: Option<Box<Dir>>,
}

/// At 10M files each byte here is 10 MB (the size `docs/namespace.md`
/// states).
const _: () = assert!(std::mem::size_of::<Inode>() == 104);

/// An extended attribute: name and value.
pub(crate) type Xattr = (Box<[u8]>, Box<[u8]>);

/// What changes rarely.
pub(crate) struct Meta {
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
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
    pub fn new(perm: u32, uid: u32, gid: u32, atime: Nanos, target: &[u8], rdev: u64) -> Meta {
        let extra = (!target.is_empty() || rdev != 0)
            .then(|| Box::new(Extra { xattrs: Vec::new(), target: target.into(), rdev }));
        Meta { perm, uid, gid, atime, extra }
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
}

/// What only a directory has.
pub(crate) struct Dir {
    /// The intention lock: every operation on an entry of the directory
    /// holds it shared (they do not exclude each other: names are locked
    /// one by one, see `locks`); removing or replacing the directory
    /// holds it exclusive, so nothing is created in a directory as it
    /// goes.
    pub intent: RwLock<()>,
    /// The directory it is in (itself for the root).
    pub parent: AtomicU64,
    /// Its entries, `.` and `..` not counted.
    pub entries: AtomicU64,
    /// It was removed: nothing may be created in it.
    pub dead: AtomicBool,
}

impl Inode {
    pub fn new(ino: Ino, kind: FileType, meta: Meta, time: Nanos, parent: Ino) -> Inode {
        let dir = (kind == FileType::Directory).then(|| {
            Box::new(Dir {
                intent: RwLock::new(()),
                parent: AtomicU64::new(parent),
                entries: AtomicU64::new(0),
                dead: AtomicBool::new(false),
            })
        });
        let size = if kind == FileType::Symlink { meta.target().len() as u64 } else { 0 };
        Inode {
            ino,
            kind,
            meta: Mutex::new(meta),
            nlink: AtomicU32::new(if dir.is_some() { 2 } else { 1 }),
            size: AtomicU64::new(size),
            blocks: AtomicU64::new(0),
            mtime: AtomicI64::new(time),
            ctime: AtomicI64::new(time),
            opens: AtomicU32::new(0),
            orphan: AtomicBool::new(false),
            dir,
        }
    }

    pub fn is_dir(&self) -> bool {
        self.dir.is_some()
    }

    /// The directory part (callers check [`Inode::is_dir`] first).
    pub fn dir(&self) -> &Dir {
        self.dir.as_ref().expect("a directory")
    }

    pub fn owner(&self) -> Owner {
        let m = self.meta.lock();
        Owner { kind: self.kind, perm: m.perm, uid: m.uid, gid: m.gid }
    }

    /// The contents changed at `time`: mtime and ctime move forward to it
    /// (never back: concurrent changes land in any order).
    pub fn modified(&self, time: Nanos) {
        self.mtime.fetch_max(time, Relaxed);
        self.ctime.fetch_max(time, Relaxed);
    }

    /// The inode itself changed at `time` (links, owner, mode).
    pub fn changed(&self, time: Nanos) {
        self.ctime.fetch_max(time, Relaxed);
    }

    pub fn attr(&self) -> Attr {
        let m = self.meta.lock();
        let size = match &self.dir {
            // As tmpfs: `.` and `..` count too.
            Some(d) => (d.entries.load(Relaxed) + 2) * DIRENT_SIZE,
            None => self.size.load(Relaxed),
        };
        Attr {
            ino: self.ino,
            kind: self.kind,
            perm: m.perm,
            nlink: self.nlink.load(Relaxed),
            uid: m.uid,
            gid: m.gid,
            rdev: m.rdev(),
            size,
            blocks: self.blocks.load(Relaxed),
            atime: m.atime,
            mtime: self.mtime.load(Relaxed),
            ctime: self.ctime.load(Relaxed),
        }
    }
}
