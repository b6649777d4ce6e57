//! The namespace: inodes by number, and every directory entry keyed by
//! (directory, name hash) in a hash table for lookups and an ordered
//! index for listings in hash order with stable cookies (`entries`).
//! Reads take no lock; changes lock as `locks` says, then apply their
//! [`Mutation`] (see `apply`).
//!
//! Costs, for n entries in the namespace and k listed: lookup and
//! getattr O(1) expected; create, link, unlink, rmdir, rename O(log n);
//! readdir O(log n + k); setattr O(1) expected; xattrs O(x) in the
//! inode's attributes.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::access::{self, EXEC, Owner, READ};
use crate::acl;
use crate::entries::{Entries, Key, Name};
use crate::errno::{Errno, Result};
use crate::freed::FreedDirs;
use crate::inode::{Inode, Meta};
use crate::locks::Stripes;
use crate::log::Log;
use crate::replies::Replies;
use crate::spread;
use crate::types::{
    Attr, Caller, Cred, DirEntry, FILES_MAX, FLAG_APPEND, FLAG_IMMUTABLE, FileType, Ino, NAME_MAX, Nanos, ROOT,
    STATFS_BLOCK, StatFs, XATTR_LIST_MAX, XATTR_NAME_MAX,
};
use crate::usage::{self, Usage};

/// Inode numbers a thread's block takes at once (see
/// [`Namespace::new_ino`]).
const INO_BLOCK: u64 = 1024;

/// A thread line's free inode numbers, on a line of its own.
#[derive(Default)]
#[repr(align(128))]
struct InoBlock(Mutex<std::ops::Range<Ino>>);

/// Cookies below this are the caller's (`.` and `..` in a listing).
pub const FIRST_COOKIE: u64 = 3;

pub struct Namespace {
    /// Inodes by number. A `HashIndex`, whose reads take no lock: an
    /// `scc::HashMap` read locks its bucket, a write to a line that every
    /// creator in a directory shares (the directory's bucket), and its
    /// look-ups were 10% of a create's time.
    pub(crate) inodes: scc::HashIndex<Ino, Arc<Inode>, foldhash::fast::RandomState>,
    pub(crate) entries: Entries,
    /// Every inode number below this is taken (used, or in a thread's
    /// block).
    pub(crate) next_ino: AtomicU64,
    /// Each thread line's block of numbers still free (see
    /// [`new_ino`](Namespace::new_ino)).
    ino_blocks: Box<[InoBlock; spread::LINES]>,
    pub(crate) stripes: Stripes,
    /// Held by directory renames across directories (see `locks`).
    pub(crate) rename_lock: Mutex<()>,
    /// The directories freed most recently (see `freed`).
    pub(crate) freed_dirs: Mutex<FreedDirs>,
    /// Where changes are recorded before they are applied (see `log`).
    pub(crate) log: Option<Arc<dyn Log>>,
    /// Orphans closed for the last time when the log had no room to
    /// record their end (`ENOSPC`): kept, data and all, until
    /// [`retry_forgets`](Namespace::retry_forgets) finds room.
    pub(crate) unforgotten: Mutex<Vec<Ino>>,
    /// The changes clients may ask about again (see `replies`).
    pub(crate) replies: Replies,
    /// Inodes and bytes held, and the budget (see `usage`).
    pub(crate) usage: Usage,
    /// Names hash with this seed, chosen when the namespace is made and
    /// kept with it: cookies stay valid across restarts, and names cannot
    /// be crafted to collide.
    seed: u64,
}

impl Namespace {
    /// An empty namespace: a root directory owned by root, mode 0755,
    /// made at `time`; names hashed with `seed`.
    pub fn new(seed: u64, time: Nanos) -> Namespace {
        let ns = Namespace::empty(seed);
        let owner = Owner { kind: FileType::Directory, perm: 0o755, uid: 0, gid: 0 };
        let root = Inode::new(ROOT, owner, Meta::new(time, b"", 0), time, ROOT);
        ns.put_inode(Arc::new(root));
        ns
    }

    /// No inodes at all, not even the root: what a checkpoint is loaded
    /// into.
    pub(crate) fn empty(seed: u64) -> Namespace {
        Namespace {
            inodes: scc::HashIndex::default(),
            entries: Entries::new(),
            next_ino: AtomicU64::new(ROOT + 1),
            ino_blocks: Box::default(),
            stripes: Stripes::default(),
            rename_lock: Mutex::new(()),
            freed_dirs: Mutex::default(),
            log: None,
            unforgotten: Mutex::default(),
            replies: Replies::default(),
            usage: Usage::default(),
            seed,
        }
    }

    /// A name's hash: its place in its directory's listing, and the
    /// listing's cookie after it. Never below [`FIRST_COOKIE`].
    pub(crate) fn hash(&self, name: &[u8]) -> u64 {
        (foldhash::fast::FixedState::with_seed(self.seed).hash_one(name) >> 2) + FIRST_COOKIE
    }

    /// The changes clients may ask about again after a restart (see
    /// [`Replies`]).
    pub fn replies(&self) -> &Replies {
        &self.replies
    }

    pub(crate) fn key(&self, parent: Ino, name: &[u8]) -> Key {
        Key { parent, hash: self.hash(name), name: Name::from_slice(name) }
    }

    /// A number for a new inode, never given before: from the calling
    /// thread's block, which takes [`INO_BLOCK`] at a time from
    /// `next_ino`, so that two creators on two cores do not pass one
    /// counter's line back and forth on every create (see `spread`). The
    /// numbers left in the blocks when the namespace stops are never
    /// used (a checkpoint keeps `next_ino`; replay moves it past every
    /// number recorded). O(1).
    pub(crate) fn new_ino(&self) -> Ino {
        let mut block = self.ino_blocks[spread::line()].0.lock();
        if block.is_empty() {
            let first = self.next_ino.fetch_add(INO_BLOCK, Relaxed);
            *block = first..first + INO_BLOCK;
        }
        let ino = block.start;
        block.start += 1;
        ino
    }

    pub(crate) fn inode(&self, ino: Ino) -> Result<Arc<Inode>> {
        self.inodes.peek_with(&ino, |_, i| i.clone()).ok_or(Errno::ENOENT)
    }

    /// Puts `i` in the table, in place of any inode of its number (replay
    /// and a checkpoint's load may meet one twice), and counts it (see
    /// `usage`). O(1) expected, plus O(its extended attributes).
    pub(crate) fn put_inode(&self, i: Arc<Inode>) {
        let bytes = i.bytes();
        match self.place_inode(i) {
            Some(old) => self.usage.charge(0, bytes - old.bytes()),
            None => self.usage.charge(1, bytes),
        }
    }

    /// Puts `i` in the table, in place of any inode of its number, which
    /// it returns, without counting it: a checkpoint's load, which
    /// [`rebuild_counts`](Namespace::rebuild_counts) counts whole after
    /// (at 10M inodes, a look at each one's attributes saved). O(1)
    /// expected.
    pub(crate) fn place_inode(&self, i: Arc<Inode>) -> Option<Arc<Inode>> {
        match self.inodes.entry_sync(i.ino) {
            scc::hash_index::Entry::Occupied(mut o) => {
                let old = o.get().clone();
                o.update(i);
                Some(old)
            }
            scc::hash_index::Entry::Vacant(v) => {
                v.insert_entry(i);
                None
            }
        }
    }

    /// Takes inode `ino` out of the table, if it is there, and counts it
    /// out. O(1) expected, plus O(its extended attributes).
    pub(crate) fn drop_inode(&self, ino: Ino) {
        let mut bytes = 0;
        if self.inodes.remove_if_sync(&ino, |i| {
            bytes = i.bytes();
            true
        }) {
            self.usage.charge(-1, -bytes);
        }
    }

    /// Inode `ino`, borrowed while `guard` lives: unlike
    /// [`inode`](Namespace::inode) it writes no reference count, a line
    /// every creator in a directory would write for the directory. O(1)
    /// expected.
    pub(crate) fn inode_in<'g>(&'g self, ino: Ino, guard: &'g scc::Guard) -> Result<&'g Inode> {
        self.inodes.peek(&ino, guard).map(|i| &**i).ok_or(Errno::ENOENT)
    }

    /// A directory the caller may search, borrowed while `guard` lives.
    pub(crate) fn searchable<'g>(&'g self, cred: &Cred, ino: Ino, guard: &'g scc::Guard) -> Result<&'g Inode> {
        let dir = self.inode_in(ino, guard)?;
        if !dir.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        dir.check(cred, &dir.owner(), EXEC)?;
        Ok(dir)
    }

    /// Whether `ino` is a directory freed recently (among the last
    /// `freed::KEPT`): a request on it is answered as Linux answers for a
    /// removed directory (`ENOENT`), not as for a removed file. O(1)
    /// expected.
    pub fn freed_dir(&self, ino: Ino) -> bool {
        self.freed_dirs.lock().contains(ino)
    }

    /// `getattr`, or for a directory freed recently its last attributes
    /// (no links), as Linux's `fstat` of a removed directory answers
    /// while a descriptor or a working directory holds it. O(1) expected.
    pub fn stat(&self, ino: Ino) -> Result<Attr> {
        self.getattr(ino).or_else(|e| self.freed_dirs.lock().get(ino).ok_or(e))
    }

    /// What `name` in `parent` names, without checks.
    pub(crate) fn child(&self, parent: Ino, name: &[u8]) -> Option<Ino> {
        self.entries.get(&self.key(parent, name))
    }

    /// `lookup`: needs search permission on `parent`. `.` and `..` name
    /// the directory and its parent.
    pub fn lookup(&self, cred: &Cred, parent: Ino, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let guard = scc::Guard::new();
        let dir = self.searchable(cred, parent, &guard)?;
        let ino = match name {
            b"." => parent,
            b".." => dir.dir().parent.load(Relaxed),
            _ => self.child(parent, name).ok_or(Errno::ENOENT)?,
        };
        Ok(self.inode(ino)?.attr())
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        Ok(self.inode(ino)?.attr())
    }

    /// A symlink's target.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        if i.kind != FileType::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(i.meta.lock().target().to_vec())
    }

    /// Up to `max` entries of directory `ino` after `cookie` (0: from the
    /// start), in hash order, each with the cookie that resumes after it.
    /// An entry present throughout a listing is returned exactly once,
    /// whatever is created and removed meanwhile (two names of one
    /// directory whose 62-bit hashes meet could share a cookie: with a
    /// seeded hash, odds of 1 in 10^13 for a million entries). Needs read
    /// permission, unless the caller lists through a directory handle
    /// whose listing was checked when it began (`opened`: Linux checks a
    /// directory's access at `opendir`, so a chmod while a program lists
    /// takes nothing from it). O(log n + max).
    pub fn readdir<'a>(&self, who: impl Into<Caller<'a>>, ino: Ino, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        let who = who.into();
        let dir = self.inode(ino)?;
        if !dir.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if !who.opened {
            dir.check(who.cred, &dir.owner(), READ)?;
        }
        let guard = scc::Guard::new();
        let mut out = Vec::new();
        // After the largest cookie there is nothing (it must not wrap to
        // the start: a client's made-up cookie would list it again).
        for e in self.entries.range(ino, cookie.max(FIRST_COOKIE - 1).saturating_add(1), &guard) {
            if out.len() == max {
                break;
            }
            // Gone between the index and the table: removed meanwhile.
            let Ok(i) = self.inode(e.ino) else { continue };
            out.push(DirEntry { name: e.name.to_vec(), ino: e.ino, kind: i.kind, cookie: e.hash });
        }
        Ok(out)
    }

    /// `readdir` with each entry's attributes (what `ls -l` and `du`
    /// need, in one call). An entry removed between the listing and its
    /// attributes comes without them, not left out: a page shorter than
    /// `max` means the listing is over, and only then. O(log n + max).
    pub fn readdirplus<'a>(
        &self,
        who: impl Into<Caller<'a>>,
        ino: Ino,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        Ok(self
            .readdir(who, ino, cookie, max)?
            .into_iter()
            .map(|e| {
                let a = self.getattr(e.ino).ok();
                (e, a)
            })
            .collect())
    }

    /// `FS_IOC_GETFLAGS` (`lsattr`): regular file or directory `ino`'s
    /// attribute flags (see [`KEPT_FLAGS`](crate::KEPT_FLAGS); `ENOTTY`
    /// for another kind of inode). Anyone's to read, as Linux lets
    /// whoever opened a file read them. O(1) expected.
    pub fn flags(&self, ino: Ino) -> Result<u32> {
        let i = self.inode(ino)?;
        crate::ops::attributed(&i)?;
        Ok(i.flags())
    }

    /// An extended attribute's value (`ENODATA` if unset).
    pub fn getxattr(&self, cred: &Cred, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        xattr_permission(cred, &i, name, false)?;
        let m = i.meta.lock();
        let v = m.xattrs().iter().find(|(n, _)| &**n == name).map(|(_, v)| v).ok_or(Errno::ENODATA)?;
        // An access ACL's class entries are the mode's (see `acl`).
        Ok(if name == acl::ACCESS { acl::with_mode(v, i.owner().perm) } else { v.to_vec() })
    }

    /// The names of the extended attributes the caller may see; `E2BIG`
    /// if they take more than [`XATTR_LIST_MAX`] bytes listed, as Linux
    /// answers (until session 42 such a list went out whole, and one
    /// larger than a frame was never answered: a mount's `listxattr` of
    /// a file with 20,000 long names waited forever). O(xattrs).
    pub fn listxattr(&self, cred: &Cred, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let i = self.inode(ino)?;
        let m = i.meta.lock();
        let names: Vec<Vec<u8>> = m
            .xattrs()
            .iter()
            .filter(|(n, _)| !n.starts_with(b"trusted.") || cred.is_root())
            .map(|(n, _)| n.to_vec())
            .collect();
        if names.iter().map(|n| n.len() + 1).sum::<usize>() > XATTR_LIST_MAX {
            return Err(Errno::E2BIG);
        }
        Ok(names)
    }

    /// The counts; no space (a [`Store`](crate::Store) adds its disk's).
    /// The inodes that may still be made are what the budget has left
    /// over a file's charge (an inode, and an entry with a 16-byte name),
    /// [`FILES_MAX`] in all at most. O(1).
    pub fn statfs(&self) -> StatFs {
        let (files, bytes) = self.usage.totals();
        let room = self.usage.budget().saturating_sub(bytes) / usage::FILE;
        StatFs {
            files,
            files_free: room.min(FILES_MAX.saturating_sub(files)),
            name_max: NAME_MAX as u32,
            block_size: STATFS_BLOCK,
            blocks: 0,
            free: 0,
            available: 0,
        }
    }

    /// The seed names hash with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Inodes in the namespace (orphans included). O(1).
    pub fn inode_count(&self) -> u64 {
        self.usage.totals().0
    }

    /// The bytes of memory the namespace is charged (an estimate: see
    /// `usage`), and its budget ([`u64::MAX`]: none). O(1).
    pub fn memory(&self) -> (u64, u64) {
        (self.usage.totals().1, self.usage.budget())
    }

    /// Sets the budget: once the namespace is charged this many bytes, a
    /// change that would grow it (a new inode, name or extended
    /// attribute) fails with `ENOSPC` until removals bring it under.
    /// [`u64::MAX`] (the default): none. O(1).
    pub fn set_memory_budget(&self, bytes: u64) {
        self.usage.set_budget(bytes);
    }
}

/// A name a directory entry may have: 1 to 255 bytes, no `/` or NUL.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// The extended attribute that holds the capabilities a file grants the
/// programs run from it (`setcap`). A change to the file's data, size or
/// owner takes it away, whoever makes it, as Linux's
/// `security_inode_killpriv` does: a changed program keeps none.
pub(crate) const CAPS: &[u8] = b"security.capability";

/// Who may read (`write` false) or set an extended attribute, by its
/// namespace, as Linux's `xattr_permission`: `user.` by the file's read or
/// write permission, and only on regular files and directories; `trusted.`
/// by root only; `security.` read by anyone, set or removed by root only
/// (Linux's capability module asks `CAP_SYS_ADMIN`; until session 31 the
/// file's owner could too; [`CAPS`] is removed by anyone who could change
/// the file: see `Namespace::removexattr`); POSIX ACLs
/// (`system.posix_acl_access`, `..._default`: see `acl`) read by anyone,
/// set or removed by the owner or root, never on a symlink, a default
/// one on a directory only; other names of `system.`, and other
/// prefixes, are not supported (`EOPNOTSUPP`). Until session 46 ACLs
/// were refused, as on a file system without them: neither the mount's
/// kernel nor the server applied them. A name that is its namespace's prefix alone (`user.`)
/// names nothing: `EINVAL` once the caller may, as Linux's
/// `xattr_resolve_name` answers after the permission checks (until
/// session 41 it was stored). No change to an immutable or append-only
/// inode's (`EPERM`, before the rest, as Linux's `xattr_permission`).
pub(crate) fn xattr_permission(cred: &Cred, i: &Inode, name: &[u8], write: bool) -> Result<()> {
    xattr_access(cred, i, name, write)?;
    if [b"trusted.".as_slice(), b"user.", b"security."].contains(&name) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Who may read or set `name`, by its namespace: see `xattr_permission`.
fn xattr_access(cred: &Cred, i: &Inode, name: &[u8], write: bool) -> Result<()> {
    if name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    if name.is_empty() {
        return Err(Errno::ERANGE);
    }
    if write {
        i.refuse_if(FLAG_IMMUTABLE | FLAG_APPEND)?;
    }
    let o = i.owner();
    if name.starts_with(b"trusted.") {
        return if cred.is_root() {
            Ok(())
        } else if write {
            Err(Errno::EPERM)
        } else {
            Err(Errno::ENODATA)
        };
    }
    if name.starts_with(b"user.") {
        if !matches!(i.kind, FileType::Regular | FileType::Directory) {
            return Err(if write { Errno::EPERM } else { Errno::ENODATA });
        }
        if write && i.kind == FileType::Directory && o.perm & libc::S_ISVTX != 0 && !access::owns(cred, &o) {
            return Err(Errno::EPERM);
        }
        return i.check(cred, &o, if write { access::WRITE } else { READ });
    }
    if name.starts_with(b"security.") {
        if write && !cred.is_root() {
            return Err(Errno::EPERM);
        }
        return Ok(());
    }
    if name == acl::ACCESS || name == acl::DEFAULT {
        // As Linux's `vfs_set_acl`: none on a symlink, a default ACL on
        // a directory only, set by the owner or root; read by anyone.
        if i.kind == FileType::Symlink {
            return Err(Errno::EOPNOTSUPP);
        }
        if write && name == acl::DEFAULT && i.kind != FileType::Directory {
            return Err(Errno::EACCES);
        }
        if write && !access::owns(cred, &o) {
            return Err(Errno::EPERM);
        }
        return Ok(());
    }
    Err(Errno::EOPNOTSUPP)
}
