//! The namespace's operations on the wire (protocol 15): each request
//! carries the caller's credentials, which the server checks permissions
//! with, as a local file system checks a process's; each answer is a
//! [`MetaReply`] or the errno the operation failed with, which the mount
//! hands to the kernel verbatim. A change is answered only once its
//! journal record is durable (a `Write` excepted: like `write(2)`, it is
//! durable at the next `Fsync`). A change that may not be made twice
//! carries [`Once`], so that a client may ask a restarted server whether
//! it was made.
//!
//! And the changelog: register, deregister, list, read (with a wait:
//! follow) and clear, as Lustre's `lfs changelog` does them.

use interlock_meta::{Attr, Fallocate, FileType, Ino, Nanos, RenameFlags, SeekTo, SetAttr, StatFs, XattrMode};
use serde::{Deserialize, Serialize};

/// A namespace operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    Lookup {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Getattr {
        ino: Ino,
    },
    Setattr {
        ino: Ino,
        set: SetAttr,
    },
    /// create, mkdir, mknod, symlink (`target` for a symlink).
    Create {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        kind: FileType,
        /// Permission bits, as asked for.
        perm: u32,
        rdev: u64,
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
        /// The caller's umask, applied unless the directory has a
        /// default ACL (version 21; before, `perm` came with it applied,
        /// as it still may, with 0 here).
        umask: u32,
    },
    Link {
        ino: Ino,
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Unlink {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Rmdir {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Rename {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        new_parent: Ino,
        #[serde(with = "serde_bytes")]
        new_name: Vec<u8>,
        flags: RenameFlags,
    },
    Readlink {
        ino: Ino,
    },
    /// Entries after `cookie` (0: from the start), as many as fit one
    /// reply and at most `max`; with `plus`, each with its attributes.
    Readdir {
        ino: Ino,
        cookie: u64,
        max: u32,
        plus: bool,
        /// A listing through a directory handle, going on from a page
        /// already checked (version 11): not checked again, as Linux
        /// checks a directory's access at `opendir`.
        opened: bool,
    },
    Getxattr {
        ino: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Setxattr {
        ino: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        mode: XattrMode,
    },
    Listxattr {
        ino: Ino,
    },
    Removexattr {
        ino: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    Statfs,
    /// An open handle of `ino`, held by the session: an inode unlinked
    /// while open lives until its last handle is released (or its session
    /// ends). Checked for `want`, `access(2)`'s bits (read 4, write 2,
    /// execute 1; version 11), as Linux checks an open, and
    /// [`WANT_APPEND`](interlock_meta::WANT_APPEND) for an `O_APPEND`
    /// open (version 25: an append-only file opens for writing only so):
    /// the data calls made through the handle (`opened`) are not checked
    /// again.
    Open {
        ino: Ino,
        want: u32,
    },
    Release {
        ino: Ino,
    },
    /// Up to `size` bytes of a regular file from `offset` (at most
    /// [`MAX_DATA`]): [`MetaReply::Bytes`], short at the end of the file.
    Read {
        ino: Ino,
        offset: u64,
        size: u32,
        /// Through a handle this session opened for reading (version
        /// 11): not checked again. Otherwise checked as an open would be.
        opened: bool,
    },
    /// Writes `data` (at most [`MAX_WRITE`] bytes) at `offset`:
    /// [`MetaReply::Attr`] with the new size. The whole write is made at
    /// once under the file's lock, so it is atomic with respect to every
    /// other write, from any client. Answered before it is
    /// durable, as `write(2)` is: [`MetaOp::Fsync`] makes it so.
    Write {
        ino: Ino,
        offset: u64,
        /// Write at the end of the file instead of `offset` (`O_APPEND`),
        /// atomically: appends from any number of clients never overlap.
        append: bool,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Through a handle this session opened for writing (version
        /// 11): not checked again (as `Read`'s). The privileges a write
        /// drops are the request's caller's to decide either way.
        opened: bool,
    },
    /// `fallocate(2)` of `len` bytes at `offset` (version 9):
    /// [`MetaReply::Attr`] with the size after it. Answered before it is
    /// durable, as a `Write` is.
    Fallocate {
        ino: Ino,
        how: Fallocate,
        offset: u64,
        len: u64,
        /// As `Write`'s.
        opened: bool,
    },
    /// `copy_file_range(2)` (version 9): up to `len` bytes of `src` from
    /// `src_off` into `dst` at `dst_off`, copied on the server, no byte
    /// over the wire: [`MetaReply::Copied`]. Answered before it is
    /// durable, as a `Write` is.
    CopyRange {
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
        /// Both through handles this session opened, `src` for reading
        /// and `dst` for writing (as `Write`'s).
        opened: bool,
    },
    /// `lseek(2)`'s `SEEK_DATA` or `SEEK_HOLE` from `offset` (version 9):
    /// [`MetaReply::Offset`], or `ENXIO`.
    Seek {
        ino: Ino,
        offset: u64,
        to: SeekTo,
        /// As `Read`'s.
        opened: bool,
    },
    /// Makes the file's data and every change made so far durable.
    Fsync {
        ino: Ino,
    },
    /// Creates regular file `name` and opens it, as `Create` then `Open`
    /// would but in one round trip and atomically (`open(O_CREAT)`;
    /// version 7): [`MetaReply::Attr`]; close it with `Release`.
    CreateOpen {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        /// Permission bits and umask, as `Create`'s.
        perm: u32,
        umask: u32,
    },
    /// `open(O_TMPFILE)` in directory `parent` (version 11): a regular
    /// file with no name, opened as `CreateOpen` opens (close it with
    /// `Release`), freed at its last close unless a `Link` names it first,
    /// which it may only if `linkable` (made without `O_EXCL`):
    /// [`MetaReply::Attr`], `nlink` 0.
    Tmpfile {
        parent: Ino,
        /// Permission bits and umask, as `Create`'s.
        perm: u32,
        linkable: bool,
        umask: u32,
    },
    /// The attribute flags of regular file or directory `ino`
    /// (`lsattr`), and with `set` first sets them to it (`chattr`;
    /// version 25): [`MetaReply::Flags`]. See `interlock_meta`'s
    /// [`KEPT_FLAGS`](interlock_meta::KEPT_FLAGS) for the flags kept and
    /// what immutable and append-only refuse.
    Flags {
        ino: Ino,
        set: Option<u32>,
    },
}

impl MetaOp {
    /// Whether the operation is a change that may not be made twice: made
    /// again after it took effect, a create would fail with `EEXIST`, an
    /// unlink or a rename with `ENOENT`, an append would append twice.
    /// Such a request carries [`Once`]. (A write at an offset, a setattr,
    /// an open are made again harmlessly.)
    pub fn once(&self) -> bool {
        use MetaOp::*;
        match self {
            Create { .. }
            | CreateOpen { .. }
            | Tmpfile { .. }
            | Link { .. }
            | Unlink { .. }
            | Rmdir { .. }
            | Rename { .. }
            | Setxattr { .. }
            | Removexattr { .. } => true,
            Write { append, .. } => *append,
            _ => false,
        }
    }

    /// The inodes the request works on, named by number: at most two, and
    /// never the directory a name is looked up, made or removed in. When
    /// one of them no longer exists, the request fails with `ESTALE`, as
    /// an NFS server answers a stale handle, and not `ENOENT`: a mount
    /// whose kernel still holds the old inode under a name (another mount
    /// removed it, or removed it and made it again) then looks the path up
    /// afresh and retries, where `ENOENT` would fail an `open(O_CREAT)` of
    /// a name that may be made. A directory that is gone stays `ENOENT`
    /// for the names in it, and for itself while the server remembers it
    /// (`interlock_meta`'s `freed_dir`): a call relative to a directory
    /// descriptor (`unlinkat`, `openat`) cannot be retried from further
    /// up, and two mounts' `rm -rf` of one tree, racing, must meet
    /// `ENOENT`, which `rm -f` passes over.
    pub fn inodes(&self) -> [Option<Ino>; 2] {
        use MetaOp::*;
        match *self {
            CopyRange { src, dst, .. } => [Some(src), Some(dst)],
            Link { ino, .. }
            | Getattr { ino }
            | Setattr { ino, .. }
            | Readlink { ino }
            | Getxattr { ino, .. }
            | Setxattr { ino, .. }
            | Listxattr { ino }
            | Removexattr { ino, .. }
            | Open { ino, .. }
            | Release { ino, .. }
            | Read { ino, .. }
            | Write { ino, .. }
            | Fallocate { ino, .. }
            | Seek { ino, .. }
            | Fsync { ino }
            | Flags { ino, .. } => [Some(ino), None],
            // A listing names a directory: one that is gone is `ENOENT`,
            // as Linux's `getdents` answers on a removed directory (which
            // the C library's `readdir` takes for the end of the listing).
            Readdir { .. }
            | Lookup { .. }
            | Create { .. }
            | CreateOpen { .. }
            | Tmpfile { .. }
            | Unlink { .. }
            | Rmdir { .. }
            | Rename { .. }
            | Statfs => [None, None],
        }
    }
}

/// A change that may not be made twice ([`MetaOp::once`]), as its client
/// asks for it (version 15). The server writes the client's `origin`
/// (from its hello), the request's id and `settled` in the change's
/// journal record: a server restarted after a crash finds there whether
/// it made the change (NFSv4.1's replay cache, kept in the journal and
/// the checkpoint, not in memory alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Once {
    /// Every such request of the client with a lower id has been
    /// answered: the server may forget them.
    pub settled: u64,
    pub asking: Asking,
}

/// How a change that may not be made twice is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Asking {
    /// The first time.
    First,
    /// Sent again, with its first id, in a session after the server
    /// restarted, the first answer never having come: if the server made
    /// the change before, it answers as it did then (the inode the change
    /// made or named, as it is now), without making it again; if not, it
    /// makes it now.
    Again,
    /// As `Again`, but a change not made before is not made now: the
    /// answer is [`Reply::NotMade`](crate::Reply::NotMade). For a change
    /// its caller may make only in the session it was asked in (a write
    /// under the caller's locks, which the new session may have lost: the
    /// client's `within`), so that the caller decides anew.
    IfMade,
}

/// The most data one `Read` carries: a mount reads more in parts at
/// once, which the server's workers read in parallel.
pub const MAX_DATA: usize = 128 << 10;

/// The most data one `Write` carries (version 18; 128 KiB before): a
/// whole request of a FUSE mount's kernel, which sends a `write(2)` of
/// up to 1 MiB (less a page for a buffer not aligned to one) as one. So
/// such a write is made whole, as a local file system makes it: sent in
/// parts, one mount's parts and another's could interleave, and an
/// `O_APPEND` record of 200 KB landed with another mount's record inside
/// it (until session 42).
pub const MAX_WRITE: usize = 1 << 20;

/// One directory entry on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileType,
    /// Resumes the listing after this entry.
    pub cookie: u64,
    /// With `plus`; `None` even then for an entry removed while it was
    /// listed (skip it; its cookie still resumes the listing).
    pub attr: Option<Attr>,
}

/// The answer to a [`MetaOp`] that succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    Attr(Attr),
    /// Entries of a listing; `end`: there are no more.
    Entries {
        entries: Vec<Entry>,
        end: bool,
    },
    /// A symlink's target, an xattr's value.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Xattr names.
    Names(Vec<serde_bytes::ByteBuf>),
    /// `statfs` (version 9: with the server's space).
    StatFs(StatFs),
    Done,
    /// Where a `Seek` found what it looked for.
    Offset(u64),
    /// What a `CopyRange` copied (fewer than asked at the source's end),
    /// and the destination's attributes after it.
    Copied {
        bytes: u64,
        attr: Attr,
    },
    /// An inode's attribute flags, as a `Flags` request leaves them
    /// (version 25).
    Flags(u32),
}

/// A changelog consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerInfo {
    pub id: String,
    pub name: Option<String>,
    pub mask: u32,
    /// Every record up to this index is cleared.
    pub cleared: u64,
}

/// One changelog record, as Lustre's `lfs changelog` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangelogRecord {
    pub index: u64,
    /// Lustre's type number (1 = CREAT, …).
    pub rtype: u8,
    pub flags: u32,
    pub time: Nanos,
    pub target: Ino,
    pub parent: Ino,
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// A rename's source: (parent, name, the inode renamed).
    pub source: Option<(Ino, serde_bytes::ByteBuf, Ino)>,
    pub uid: u32,
    pub gid: u32,
}

/// Changelog requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangelogOp {
    /// A new consumer (`cl1`, `cl2`, …) that sees records of the types in
    /// `mask` from now on.
    Register {
        name: Option<String>,
        mask: u32,
    },
    /// By id or name.
    Deregister {
        id: String,
    },
    List,
    /// Up to `max` records after the consumer's cursor (or from `from`);
    /// if there are none, wait up to `wait_ms` for the first.
    Read {
        id: String,
        from: Option<u64>,
        max: u32,
        wait_ms: u32,
    },
    /// Acknowledge every record up to `upto`.
    Clear {
        id: String,
        upto: u64,
    },
}

/// Changelog answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangelogReply {
    Consumer(ConsumerInfo),
    Consumers(Vec<ConsumerInfo>),
    Records(Vec<ChangelogRecord>),
    Done,
}
