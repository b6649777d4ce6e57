//! The changing operations: each checks what Linux checks, in Linux's
//! order (so the errno is the kernel's), under the locks `locks`
//! describes, then records its [`Mutation`] in the log and applies it,
//! still under those locks, and returns the record's [`Seq`]. The caller
//! acknowledges the operation once the log has made that durable.

use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use crate::access::{self, EXEC, Owner, WRITE};
use crate::acl;
use crate::errno::{Errno, Result};
use crate::inode::{Inode, with_flags};
use crate::locks::stripe;
use crate::log::Seq;
use crate::mutation::{Gone, Mutation, Renamed};
use crate::namespace::{CAPS, Namespace, check_name, xattr_permission};
use crate::types::{
    Attr, Caller, Cred, FILE_SIZE_MAX, FLAG_APPEND, FLAG_IMMUTABLE, Fallocate, FileType, Ino, KEPT_FLAGS, LINK_MAX,
    Nanos, ROOT, RenameFlags, SYMLINK_MAX, SetAttr, TimeSet, WANT_APPEND, XATTR_SIZE_MAX, XattrMode,
};

/// The flags that forbid a change to an inode's attributes, names and
/// links (see [`FLAG_IMMUTABLE`], [`FLAG_APPEND`]).
const FROZEN: u32 = FLAG_IMMUTABLE | FLAG_APPEND;

/// The most one `copy_range_with` copies: the destination's lock (a
/// stripe, which other inodes and names share) is held while its data is
/// copied, ~12 ms at this disk's 650 MB/s. A shorter copy than asked is
/// what `copy_file_range(2)` may return; its callers (`cp`) go on from it.
pub const COPY_MAX: u64 = 8 << 20;

/// What a change to a file's data reaches (see
/// `Namespace::change_data`).
struct Reach {
    /// It may make the file grow to the range's end.
    grows: bool,
    /// It frees space: admitted while the log's disk is full.
    frees: bool,
    /// It is allowed on an append-only file: it changes no byte but at
    /// the end, or (a write, a copy) it comes through a handle, which
    /// its open checked (Linux checks append-only at the open: a handle
    /// opened before the flag writes anywhere; an `fallocate` that is
    /// not a mere reservation is refused whatever the handle).
    appends: bool,
}

/// A new inode's owner and mode.
pub struct NewInode {
    pub kind: FileType,
    /// Permission bits, as asked for.
    pub perm: u32,
    pub rdev: u64,
    /// The caller's umask: the bits it takes from `perm`, unless the
    /// directory has a default ACL, which decides instead (as Linux
    /// applies it on a file system with ACLs). 0 for bits already
    /// masked.
    pub umask: u32,
}

impl Namespace {
    /// The stripe of `name` in `parent`.
    fn name_lock(&self, parent: Ino, name: &[u8]) -> usize {
        stripe(parent, self.hash(name))
    }

    /// The stripe of inode `ino` itself: held by every change to its
    /// links, attributes or open count, so those are logged in the order
    /// they are applied. (Hash 0 is no name's: names hash from
    /// [`FIRST_COOKIE`](crate::FIRST_COOKIE) up.)
    fn ino_lock(ino: Ino) -> usize {
        stripe(ino, 0)
    }

    /// Creates `name` in `parent`: a file, directory, symlink (`target`)
    /// or special file. The owner is the caller; the group is the
    /// caller's, or the directory's if it is setgid (and then a new
    /// directory is setgid too). O(log n).
    pub fn create(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &[u8],
        new: NewInode,
        target: &[u8],
        now: Nanos,
    ) -> Result<(Attr, Seq)> {
        self.make(cred, (parent, name), new, target, now, false)
    }

    /// Creates regular file `name` in `parent` and opens it (one handle,
    /// as [`open`](Self::open) counts): `open(O_CREAT)` in one step. The
    /// name's lock is held across both, so the file cannot be unlinked and
    /// freed in between. O(log n).
    pub fn create_open(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &[u8],
        (perm, umask): (u32, u32),
        now: Nanos,
    ) -> Result<(Attr, Seq)> {
        self.make(cred, (parent, name), NewInode { kind: FileType::Regular, perm, rdev: 0, umask }, b"", now, true)
    }

    fn make(
        &self,
        cred: &Cred,
        (parent, name): (Ino, &[u8]),
        new: NewInode,
        target: &[u8],
        now: Nanos,
        open: bool,
    ) -> Result<(Attr, Seq)> {
        check_name(name)?;
        let guard = scc::Guard::new();
        let dir = self.inode_in(parent, &guard)?;
        if !dir.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        // A create that opens changes the new inode's open count, so it
        // holds that inode's lock too (a look-up, open and release elsewhere
        // could otherwise race the count): its number is taken first.
        let early = open.then(|| self.new_ino());
        let locks: SmallVec<[usize; 2]> =
            std::iter::once(self.name_lock(parent, name)).chain(early.map(Self::ino_lock)).collect();
        let _held = self.stripes.lock(&[(dir, false)], &locks);
        // The directory's owner and mode read once, under the locks, for
        // both checks.
        let owner = dir.owner();
        dir.check(cred, &owner, EXEC)?;
        if new.kind == FileType::Symlink && target.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if matches!(name, b"." | b"..") || self.child(parent, name).is_some() {
            return Err(Errno::EEXIST);
        }
        if dir.dir().dead.load(Relaxed) {
            return Err(Errno::ENOENT);
        }
        dir.check(cred, &owner, WRITE | EXEC)?;
        // Device nodes are root's (`CAP_MKNOD`), but for a whiteout, the
        // character device 0:0, which anyone may make (Linux 5.8 on).
        let device = matches!(new.kind, FileType::CharDevice | FileType::BlockDevice);
        if device && !(new.kind == FileType::CharDevice && new.rdev == 0) && !cred.is_root() {
            return Err(Errno::EPERM);
        }
        if new.kind == FileType::Directory && dir.nlink.load(Relaxed) >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        let (perm, gid) = new_owner(cred, &owner, new.kind, new.perm);
        let (perm, acls) = inherited(dir, new.kind, perm, new.umask);
        let ino = early.unwrap_or_else(|| self.new_ino());
        let m = Mutation::Create {
            parent,
            name: name.to_vec(),
            ino,
            kind: new.kind,
            perm: with_flags(perm, dir.inherited_flags()),
            uid: cred.uid,
            gid,
            rdev: new.rdev,
            target: target.to_vec(),
            time: now,
        };
        let seq = self.commit_held(cred, &acls.wrap(m, ino), &[dir])?;
        let i = self.inode(ino)?;
        if open {
            i.opens.fetch_add(1, Relaxed);
        }
        Ok((i.attr(), seq))
    }

    /// `open(O_TMPFILE)` in directory `parent`: a regular file with no
    /// name, checked, owned and moded as a file created there would be,
    /// and open (one handle, as [`open`](Self::open) counts): an orphan
    /// from the start, freed at its last close unless [`link`](Self::link)
    /// names it first, which it may only if `linkable` (made without
    /// `O_EXCL`, Linux's `I_LINKABLE`). The directory does not change (no
    /// entry, no time). O(1) expected.
    pub fn tmpfile(
        &self,
        cred: &Cred,
        parent: Ino,
        (perm, umask): (u32, u32),
        linkable: bool,
        now: Nanos,
    ) -> Result<(Attr, Seq)> {
        let guard = scc::Guard::new();
        let dir = self.inode_in(parent, &guard)?;
        if !dir.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let ino = self.new_ino();
        let _held = self.stripes.lock(&[(dir, false)], &[Self::ino_lock(ino)]);
        let owner = dir.owner();
        dir.check(cred, &owner, WRITE | EXEC)?;
        let (perm, gid) = new_owner(cred, &owner, FileType::Regular, perm);
        let (perm, acls) = inherited(dir, FileType::Regular, perm, umask);
        let perm = with_flags(perm, dir.inherited_flags());
        let m = Mutation::Tmpfile { parent, ino, perm, uid: cred.uid, gid, linkable, time: now };
        let seq = self.commit(cred, &acls.wrap(m, ino))?;
        let i = self.inode(ino)?;
        i.opens.fetch_add(1, Relaxed);
        Ok((i.attr(), seq))
    }

    /// A new name `name` in `parent` for `ino`: any inode but a
    /// directory, and an inode with no name only if it is a linkable
    /// `O_TMPFILE` (see [`tmpfile`](Self::tmpfile)). O(log n).
    pub fn link(&self, cred: &Cred, ino: Ino, parent: Ino, name: &[u8], now: Nanos) -> Result<(Attr, Seq)> {
        check_name(name)?;
        let guard = scc::Guard::new();
        let dir = self.searchable(cred, parent, &guard)?;
        let target = self.inode(ino)?;
        let _held = self.stripes.lock(&[(dir, false)], &[self.name_lock(parent, name), Self::ino_lock(ino)]);
        if matches!(name, b"." | b"..") || self.child(parent, name).is_some() {
            return Err(Errno::EEXIST);
        }
        may_link(cred, &target)?;
        if dir.dir().dead.load(Relaxed) {
            return Err(Errno::ENOENT);
        }
        dir.check(cred, &dir.owner(), WRITE | EXEC)?;
        target.refuse_if(FROZEN)?;
        if target.is_dir() {
            return Err(Errno::EPERM);
        }
        // An open file whose last name went cannot be linked again; an
        // `O_TMPFILE` made without `O_EXCL` can.
        if target.nlink.load(Relaxed) == 0 && !target.linkable.load(Relaxed) {
            return Err(Errno::ENOENT);
        }
        if target.nlink.load(Relaxed) >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        let m = Mutation::Link { parent, name: name.to_vec(), ino, time: now };
        let seq = self.commit(cred, &m)?;
        Ok((target.attr(), seq))
    }

    /// Removes a name that is not a directory's. O(log n).
    pub fn unlink(&self, cred: &Cred, parent: Ino, name: &[u8], now: Nanos) -> Result<Seq> {
        self.remove(cred, parent, name, false, now)
    }

    /// Removes an empty directory. O(log n).
    pub fn rmdir(&self, cred: &Cred, parent: Ino, name: &[u8], now: Nanos) -> Result<Seq> {
        match name {
            b"." => return Err(Errno::EINVAL),
            b".." => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        self.remove(cred, parent, name, true, now)
    }

    fn remove(&self, cred: &Cred, parent: Ino, name: &[u8], dir_wanted: bool, now: Nanos) -> Result<Seq> {
        check_name(name)?;
        if !dir_wanted && matches!(name, b"." | b"..") {
            return Err(Errno::EISDIR);
        }
        let guard = scc::Guard::new();
        let dir = self.searchable(cred, parent, &guard)?;
        loop {
            // Which inode the name names decides the locks (a directory
            // is locked exclusive as it goes); checked again under them.
            let ino = self.child(parent, name).ok_or(Errno::ENOENT)?;
            let victim = self.inode(ino)?;
            let dirs = [(dir, false), (&*victim, true)];
            let dirs = &dirs[..if victim.is_dir() { 2 } else { 1 }];
            let _held = self.stripes.lock(dirs, &[self.name_lock(parent, name), Self::ino_lock(ino)]);
            if self.child(parent, name) != Some(ino) {
                continue;
            }
            may_delete(cred, dir, &victim, dir_wanted)?;
            if dir_wanted && victim.dir().intent.entries() != 0 {
                return Err(Errno::ENOTEMPTY);
            }
            let m =
                Mutation::Remove { parent, name: name.to_vec(), ino, dir: dir_wanted, gone: gone(&victim), time: now };
            return self.commit_held(cred, &m, &[dir, &victim]);
        }
    }

    /// `rename` and `renameat2`'s `RENAME_NOREPLACE`, `RENAME_EXCHANGE`
    /// and `RENAME_WHITEOUT` (a whiteout, a character device 0:0 with no
    /// permission bits, is left at the old name in the same record, owned
    /// as a node made there would be; anyone may, as on Linux since 5.8);
    /// nothing changes (nothing is journaled, [`Seq`] 0) when the two
    /// names already name one inode. O(log n), plus O(depth) for a
    /// directory moved to another directory (the loop check).
    pub fn rename(
        &self,
        cred: &Cred,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
        flags: RenameFlags,
        now: Nanos,
    ) -> Result<Seq> {
        if flags.exchange && (flags.noreplace || flags.whiteout) {
            return Err(Errno::EINVAL);
        }
        check_name(name)?;
        check_name(new_name)?;
        let guard = scc::Guard::new();
        let p = self.searchable(cred, parent, &guard)?;
        let np = self.searchable(cred, new_parent, &guard)?;
        if matches!(name, b"." | b"..") || matches!(new_name, b"." | b"..") {
            return Err(Errno::EBUSY);
        }
        loop {
            let ino = self.child(parent, name).ok_or(Errno::ENOENT)?;
            let moved = self.inode(ino)?;
            let victim = match self.child(new_parent, new_name) {
                Some(v) => Some(self.inode(v)?),
                None => None,
            };
            let crosses = parent != new_parent
                && (moved.is_dir() || victim.as_ref().is_some_and(|v| flags.exchange && v.is_dir()));
            let _tree = crosses.then(|| self.rename_lock.lock());
            let mut dirs: SmallVec<[(&Inode, bool); 3]> = [(p, false), (np, false)].into_iter().collect();
            if let Some(v) = victim.as_deref().filter(|v| v.is_dir()) {
                dirs.push((v, !flags.exchange));
            }
            let mut names: SmallVec<[usize; 4]> =
                [self.name_lock(parent, name), self.name_lock(new_parent, new_name), Self::ino_lock(ino)]
                    .into_iter()
                    .collect();
            names.extend(victim.as_ref().map(|v| Self::ino_lock(v.ino)));
            let _held = self.stripes.lock(&dirs, &names);
            if self.child(parent, name) != Some(ino)
                || self.child(new_parent, new_name) != victim.as_ref().map(|v| v.ino)
            {
                continue;
            }
            if flags.noreplace && victim.is_some() {
                return Err(Errno::EEXIST);
            }
            if flags.exchange && victim.is_none() {
                return Err(Errno::ENOENT);
            }
            // The source must not be an ancestor of the target; the target
            // not one of the source.
            if moved.is_dir() && self.is_ancestor(ino, new_parent) {
                return Err(Errno::EINVAL);
            }
            if let Some(v) = victim.as_deref().filter(|v| v.is_dir())
                && self.is_ancestor(v.ino, parent)
            {
                return Err(if flags.exchange { Errno::EINVAL } else { Errno::ENOTEMPTY });
            }
            if victim.as_ref().is_some_and(|v| v.ino == ino) {
                // Two names of one inode: nothing changes (POSIX).
                return Ok(0);
            }
            may_delete(cred, p, &moved, moved.is_dir())?;
            match &victim {
                None => {
                    if np.dir().dead.load(Relaxed) {
                        return Err(Errno::ENOENT);
                    }
                    np.check(cred, &np.owner(), WRITE | EXEC)?;
                }
                Some(v) => {
                    let is_dir = if flags.exchange { v.is_dir() } else { moved.is_dir() };
                    may_delete(cred, np, v, is_dir)?;
                }
            }
            if parent != new_parent {
                if moved.is_dir() {
                    moved.check(cred, &moved.owner(), WRITE)?;
                }
                if let Some(v) = victim.as_deref().filter(|v| flags.exchange && v.is_dir()) {
                    v.check(cred, &v.owner(), WRITE)?;
                }
            }
            if !flags.exchange
                && let Some(v) = victim.as_deref().filter(|v| v.is_dir())
                && v.dir().intent.entries() != 0
            {
                return Err(Errno::ENOTEMPTY);
            }
            if parent != new_parent && moved.is_dir() && victim.is_none() && np.nlink.load(Relaxed) >= LINK_MAX {
                return Err(Errno::EMLINK);
            }
            let rename = Renamed {
                parent,
                name: name.to_vec(),
                ino,
                new_parent,
                new_name: new_name.to_vec(),
                victim: victim.as_ref().map(|v| v.ino),
                gone: match &victim {
                    Some(v) if !flags.exchange => gone(v),
                    _ => Gone::Linked,
                },
                exchange: flags.exchange,
                time: now,
            };
            let m = if flags.whiteout {
                let (_, gid) = new_owner(cred, &p.owner(), FileType::CharDevice, 0);
                // Its mode stays 0 whatever it inherits.
                let (_, acls) = inherited(p, FileType::CharDevice, 0, 0);
                let whiteout = self.new_ino();
                acls.wrap(Mutation::RenameWhiteout { rename, whiteout, uid: cred.uid, gid }, whiteout)
            } else {
                Mutation::Rename(rename)
            };
            return self.commit(cred, &m);
        }
    }

    /// Whether directory `a` is `d` or one of its ancestors. O(depth);
    /// the tree holds still while the caller holds the rename lock.
    fn is_ancestor(&self, a: Ino, mut d: Ino) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == ROOT {
                return false;
            }
            match self.inode(d) {
                Ok(i) if i.is_dir() => d = i.dir().parent.load(Relaxed),
                _ => return false,
            }
        }
    }

    /// `chmod`, `chown`, `truncate`, `utimensat`, with Linux's rules:
    /// chmod by the owner or root (a non-member's setgid bit dropped);
    /// chown by root, chgrp by the owner to one of their groups; either
    /// clears setuid and setgid on a non-directory as Linux does
    /// (`access::dropped`); truncate needs write permission (unless
    /// opened for writing) and a regular file, and clears them as a write
    /// does; both times set to now need ownership or write permission,
    /// any other setting of times ownership. ctime always moves. O(1)
    /// expected.
    ///
    /// A directory's attributes are set under its intention lock held
    /// exclusive, so that the times its creators move forward and a time
    /// set here are logged in the order they are applied.
    pub fn setattr(&self, cred: &Cred, ino: Ino, set: &SetAttr, now: Nanos) -> Result<(Attr, Seq)> {
        self.setattr_with(cred, ino, set, now, |_| Ok(0))
    }

    /// [`setattr`](Namespace::setattr), calling `resize` with a new size
    /// after it is recorded and applied, still under the inode's lock (the
    /// store truncates the data file there, so no write lands between);
    /// `resize` returns the blocks the data then takes.
    pub fn setattr_with(
        &self,
        cred: &Cred,
        ino: Ino,
        set: &SetAttr,
        now: Nanos,
        resize: impl FnOnce(u64) -> Result<u64>,
    ) -> Result<(Attr, Seq)> {
        let i = self.inode(ino)?;
        let dirs: &[(&Inode, bool)] = if i.is_dir() { &[(&i, true)] } else { &[] };
        let _held = self.stripes.lock(dirs, &[Self::ino_lock(ino)]);
        let o = i.owner();
        // Linux's `may_setattr`, first: no mode, owner or time set on an
        // immutable or append-only inode; a `touch` (both times now)
        // allowed on an append-only one. A truncate's own times (see
        // below) are the truncate's, checked with it.
        let times = [set.atime, set.mtime];
        let truncates = set.size.is_some() && !times.iter().any(|t| matches!(t, Some(TimeSet::At(_))));
        let touches = times.iter().any(Option::is_some) && !truncates;
        let touch = times == [Some(TimeSet::Now); 2];
        if set.perm.is_some() || set.uid.is_some() || set.gid.is_some() || (touches && !touch) {
            i.refuse_if(FROZEN)?;
        } else if touches {
            i.refuse_if(FLAG_IMMUTABLE)?;
        }
        let mut perm = None;
        let (mut uid, mut gid) = (None, None);
        let chowns = set.chown || set.uid.is_some() || set.gid.is_some();
        if chowns {
            // Linux's chown_ok and chgrp_ok, each only for an id given.
            let owner = cred.uid == o.uid;
            let uid_ok = set.uid.is_none_or(|u| owner && u == o.uid);
            let gid_ok = set.gid.is_none_or(|g| owner && (g == o.gid || cred.in_group(g)));
            if !(cred.is_root() || (uid_ok && gid_ok)) {
                return Err(Errno::EPERM);
            }
            (uid, gid) = (set.uid, set.gid);
            if i.kind != FileType::Directory
                && let Some(p) = access::dropped(cred, &o)
            {
                // The cleared bits are a mode change: the owner's or
                // root's to make.
                if !access::owns(cred, &o) {
                    return Err(Errno::EPERM);
                }
                perm = Some(p);
            }
        }
        if let Some(p) = set.perm {
            if !access::owns(cred, &o) {
                return Err(Errno::EPERM);
            }
            let mut p = p & 0o7777;
            let group = gid.unwrap_or(o.gid);
            if !cred.is_root() && !cred.in_group(group) {
                p &= !libc::S_ISGID;
            }
            perm = Some(p);
        }
        let mut mtime = None;
        if let Some(size) = set.size {
            match i.kind {
                FileType::Directory => return Err(Errno::EISDIR),
                FileType::Regular => {}
                _ => return Err(Errno::EINVAL),
            }
            if !set.opened_for_write {
                i.check(cred, &o, WRITE)?;
            }
            // Never cut (append-only), nor changed through a handle opened
            // before the file was made immutable.
            i.refuse_if(FROZEN)?;
            if size > FILE_SIZE_MAX {
                return Err(Errno::EFBIG);
            }
            // Linux's truncate drops privileges as a write does, whether
            // or not the size changes (a mode given with it is a chmod,
            // and takes its place).
            if perm.is_none() {
                perm = access::dropped_by_data(cred, &o);
            }
            mtime = Some(now);
        }
        let resolve = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        // Times set to now, both (`utimensat` with both `UTIME_NOW`, or no
        // times: `touch`), need write permission; any other setting (a
        // time given, or one time now and the other left as it is:
        // `touch -a`, `touch -m`) needs ownership, as Linux has it. Times
        // set to now with a new size are the truncate's own (the kernel's
        // FUSE client sends a truncate's mtime as now), checked as it is.
        if touches && !access::owns(cred, &o) {
            if !touch {
                return Err(Errno::EPERM);
            }
            i.check(cred, &o, WRITE)?;
        }
        if let Some(t) = set.mtime {
            mtime = Some(resolve(t));
        }
        if set.size.is_some() || (chowns && i.kind != FileType::Directory) {
            self.kill_caps(cred, &i, now)?;
        }
        let m =
            Mutation::SetAttr { ino, perm, uid, gid, size: set.size, atime: set.atime.map(resolve), mtime, ctime: now };
        let seq = self.commit(cred, &m)?;
        if let Some(size) = set.size {
            i.blocks.store(resize(size)?, Relaxed);
        }
        Ok((i.attr(), seq))
    }

    /// A regular file the caller may read (see `may_use`), and its
    /// attributes. O(1) expected.
    pub fn readable(&self, who: Caller, ino: Ino) -> Result<Attr> {
        let i = self.inode(ino)?;
        may_use(who, &i, access::READ)?;
        Ok(i.attr())
    }

    /// Writes `len` bytes at `offset` (`None`: at the end, an append) of
    /// regular file `ino`: checks (write
    /// permission, the owner always having it; the size limit), then
    /// `put` writes the data (and returns the blocks it then takes), then
    /// the new size (if it grew) and times are recorded, all under the
    /// inode's lock, so size and data agree.
    /// A write by anyone but root clears setuid and setgid as Linux's
    /// `file_remove_privs` does (`access::dropped_by_data`, for the
    /// writer), and anyone's takes away the file's capabilities
    /// (`kill_caps`). O(1) expected, plus `put`.
    pub fn write_with(
        &self,
        who: Caller,
        ino: Ino,
        (offset, len): (Option<u64>, u64),
        now: Nanos,
        put: impl FnOnce(u64) -> Result<u64>,
    ) -> Result<(Attr, Seq)> {
        let how = Reach { grows: true, frees: false, appends: offset.is_none() || who.opened };
        self.change_data(who, ino, (offset, len), how, now, put)
    }

    /// `fallocate(2)` of `len` bytes at `offset` of regular file `ino`:
    /// the checks of a write (and `EINVAL` for an empty range), then
    /// `put` reserves or zeroes the data file's range as `how` says (and
    /// returns the blocks the data then takes), then
    /// the new size (if the range grew the file and `how` may grow it)
    /// and the times are recorded, with the privileges a write clears
    /// cleared (Linux's `file_modified`), all under the inode's lock.
    /// O(1) expected, plus `put`.
    pub fn fallocate_with(
        &self,
        who: Caller,
        ino: Ino,
        how: Fallocate,
        (offset, len): (u64, u64),
        now: Nanos,
        put: impl FnOnce() -> Result<u64>,
    ) -> Result<(Attr, Seq)> {
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        let reach = Reach {
            grows: how.grows(),
            // A punch frees space, so a full disk does not refuse it.
            frees: how == Fallocate::PunchHole,
            // Space reserved anywhere changes no byte of an append-only
            // file.
            appends: matches!(how, Fallocate::Allocate { .. }),
        };
        self.change_data(who, ino, (Some(offset), len), reach, now, |_| put())
    }

    /// What a write and a `fallocate` share: `put` changes `len` bytes
    /// of the data at `offset` (the end of the file for `None`), which may
    /// make the file grow to the range's end (if it `grows`), and returns the blocks
    /// the data then takes. It is admitted ([`Namespace::admit`]: one
    /// that `frees` space even while the log's disk is full) before `put`,
    /// so that a refusal (`ENOSPC`) leaves the data as it was. No change
    /// to an immutable file, even through a handle opened before the
    /// flag (as ext4 and XFS refuse it; tmpfs lets it through), nor one
    /// to an append-only file but what its caller says `appends`
    /// (`EPERM`).
    fn change_data(
        &self,
        who: Caller,
        ino: Ino,
        (offset, len): (Option<u64>, u64),
        Reach { grows, frees, appends }: Reach,
        now: Nanos,
        put: impl FnOnce(u64) -> Result<u64>,
    ) -> Result<(Attr, Seq)> {
        let i = self.inode(ino)?;
        let _held = self.stripes.lock(&[], &[Self::ino_lock(ino)]);
        self.inode(ino)?;
        let o = may_use(who, &i, WRITE)?;
        i.refuse_if(if appends { FLAG_IMMUTABLE } else { FROZEN })?;
        // An append takes the size under the inode's lock: appends from
        // any number of clients never overwrite each other.
        let offset = offset.unwrap_or_else(|| i.size.load(Relaxed));
        let end = offset.checked_add(len).filter(|&e| e <= FILE_SIZE_MAX).ok_or(Errno::EFBIG)?;
        self.admit(frees)?;
        self.kill_caps(who.cred, &i, now)?;
        i.note_data();
        i.blocks.store(put(offset)?, Relaxed);
        let size = (grows && end > i.size.load(Relaxed)).then_some(end);
        let perm = access::dropped_by_data(who.cred, &o);
        let seq = self.commit_admitted(who.cred, &Mutation::Write { ino, size, perm, time: now }, &[])?;
        Ok((i.attr(), seq))
    }

    /// Takes away the capabilities file `i` grants ([`CAPS`]), if it has
    /// any: the caller changes its data, size or owner. Recorded before
    /// that change, as Linux removes them first: a crash between leaves
    /// them gone, never the change made with them kept. Under the
    /// inode's lock, past the change's checks. O(the file's xattrs).
    fn kill_caps(&self, cred: &Cred, i: &Inode, now: Nanos) -> Result<()> {
        if !i.meta.lock().xattrs().iter().any(|(n, _)| &**n == CAPS) {
            return Ok(());
        }
        self.commit(cred, &Mutation::RemoveXattr { ino: i.ino, name: CAPS.to_vec(), time: now }).map(drop)
    }

    /// `copy_file_range(2)`: up to `len` bytes of regular file `src` from
    /// `src_off` (fewer at its end, none past it, and at most
    /// [`COPY_MAX`] a call) into regular file `dst` at `dst_off`. The
    /// source is checked as a read is, the destination
    /// as a write is; two ranges of one file that overlap are `EINVAL`, as
    /// Linux's checks make them (on the count cut to the source's end).
    /// `put(n)` copies the `n` bytes (and returns the blocks the
    /// destination's data then takes), then the destination's new size and
    /// times are recorded as a write's, under its lock; nothing is
    /// recorded when there is nothing to copy. Returns `n` with the
    /// destination's attributes. O(1) expected, plus `put`.
    pub fn copy_range_with(
        &self,
        who: Caller,
        (src, src_off): (Ino, u64),
        (dst, dst_off): (Ino, u64),
        len: u64,
        now: Nanos,
        put: impl FnOnce(u64) -> Result<u64>,
    ) -> Result<(u64, Attr, Seq)> {
        let size = self.readable(who, src)?.size;
        let n = len.min(size.saturating_sub(src_off)).min(COPY_MAX);
        if src == dst && dst_off < src_off.saturating_add(n) && src_off < dst_off.saturating_add(n) {
            return Err(Errno::EINVAL);
        }
        if n == 0 {
            let i = self.inode(dst)?;
            may_use(who, &i, WRITE)?;
            return Ok((0, i.attr(), 0));
        }
        let reach = Reach { grows: true, frees: false, appends: who.opened };
        let (a, seq) = self.change_data(who, dst, (Some(dst_off), n), reach, now, |_| put(n))?;
        Ok((n, a, seq))
    }

    /// Sets an extended attribute (see `xattr_permission` for who may).
    pub fn setxattr(
        &self,
        cred: &Cred,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
        now: Nanos,
    ) -> Result<Seq> {
        let i = self.inode(ino)?;
        let _held = self.stripes.lock(&[], &[Self::ino_lock(ino)]);
        if name == acl::ACCESS || name == acl::DEFAULT {
            return self.set_acl(cred, &i, name, value, now);
        }
        xattr_permission(cred, &i, name, true)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        let exists = i.meta.lock().xattrs().iter().any(|(n, _)| &**n == name);
        match (mode, exists) {
            (XattrMode::Create, true) => return Err(Errno::EEXIST),
            (XattrMode::Replace, false) => return Err(Errno::ENODATA),
            _ => {}
        }
        let m = Mutation::SetXattr { ino, name: name.to_vec(), value: value.to_vec(), time: now };
        self.commit(cred, &m)
    }

    /// Sets an ACL of `i` (the caller holds its lock), as Linux's
    /// `set_posix_acl` does: checked (`EINVAL`); none on a symlink
    /// (`EOPNOTSUPP`); a default ACL on a directory only (`EACCES`, but
    /// for none at all, which changes nothing); set by the owner or root
    /// (`EPERM`). One of no entries removes it; an access ACL sets the
    /// mode's owner, group-class and other bits and is kept only where
    /// it says more than they do, and drops setgid if the setter is
    /// neither in the file's group nor root. The create and replace
    /// flags are not looked at, as Linux does not. O(entries).
    fn set_acl(&self, cred: &Cred, i: &Inode, name: &[u8], value: &[u8], now: Nanos) -> Result<Seq> {
        acl::check_form(value)?;
        // Linux's `may_write_xattr`, before anything of the ACL's own.
        i.refuse_if(FROZEN)?;
        if name == acl::DEFAULT && acl::is_empty(value) && i.kind != FileType::Directory && i.kind != FileType::Symlink
        {
            return Ok(0);
        }
        xattr_permission(cred, i, name, true)?;
        acl::check(value)?;
        let ino = i.ino;
        if acl::is_empty(value) {
            // Removed as Linux removes one: whether or not there was one,
            // the ctime moves.
            return self.commit(cred, &Mutation::RemoveXattr { ino, name: name.to_vec(), time: now });
        }
        if name == acl::DEFAULT {
            return self
                .commit(cred, &Mutation::SetXattr { ino, name: name.to_vec(), value: value.to_vec(), time: now });
        }
        let o = i.owner();
        let (bits, plain) = acl::mode_of(value);
        let mut perm = o.perm & !0o777 | bits;
        if !cred.is_root() && !cred.in_group(o.gid) {
            perm &= !libc::S_ISGID;
        }
        let m = Mutation::SetAcl { ino, perm, acl: (!plain).then(|| value.to_vec()), time: now };
        self.commit(cred, &m)
    }

    /// Removes an extended attribute (`ENODATA` if unset).
    /// `security.capability` may be removed by anyone who could change
    /// the file (its owner, with a chown; a writer, with a write), which
    /// would take it away anyway: a mount's kernel removes it so, as the
    /// caller, before it truncates, chowns or reserves space in such a
    /// file (Linux's killpriv, made past the checks at which it refuses
    /// such a caller's `removexattr(2)` of it, before that call reaches a
    /// mount). Until session 42 the server refused it, and the truncate
    /// failed with `EPERM`.
    pub fn removexattr(&self, cred: &Cred, ino: Ino, name: &[u8], now: Nanos) -> Result<Seq> {
        let i = self.inode(ino)?;
        let _held = self.stripes.lock(&[], &[Self::ino_lock(ino)]);
        if name == acl::ACCESS || name == acl::DEFAULT {
            return self.set_acl(cred, &i, name, acl::NONE, now);
        }
        let changer = |o| access::owns(cred, &o) || i.permits(cred, &o, WRITE);
        if name == CAPS && changer(i.owner()) {
            i.refuse_if(FROZEN)?;
        } else {
            xattr_permission(cred, &i, name, true)?;
        }
        if !i.meta.lock().xattrs().iter().any(|(n, _)| &**n == name) {
            return Err(Errno::ENODATA);
        }
        let m = Mutation::RemoveXattr { ino, name: name.to_vec(), time: now };
        self.commit(cred, &m)
    }

    /// `FS_IOC_SETFLAGS` (`chattr`): sets regular file or directory
    /// `ino`'s attribute flags to `flags`, as Linux's `vfs_fileattr_set`
    /// and tmpfs do: by its owner or root (`EPERM`); immutable and
    /// append-only set or cleared by root alone (`CAP_LINUX_IMMUTABLE`,
    /// `EPERM`); any flag but [`KEPT_FLAGS`] `EOPNOTSUPP`; `ENOTTY` for
    /// any other kind of inode, as a mount's kernel answers for them. The
    /// ctime moves, whether or not a flag changes. Under the locks a
    /// `setattr` takes (a directory's intention lock exclusive), so that
    /// no change the flags forbid, checked before, is made after them.
    /// O(1) expected.
    pub fn set_flags(&self, cred: &Cred, ino: Ino, flags: u32, now: Nanos) -> Result<Seq> {
        let i = self.inode(ino)?;
        attributed(&i)?;
        let dirs: &[(&Inode, bool)] = if i.is_dir() { &[(&i, true)] } else { &[] };
        let _held = self.stripes.lock(dirs, &[Self::ino_lock(ino)]);
        self.inode(ino)?;
        if !access::owns(cred, &i.owner()) {
            return Err(Errno::EPERM);
        }
        if (i.flags() ^ flags) & FROZEN != 0 && !cred.is_root() {
            return Err(Errno::EPERM);
        }
        if flags & !KEPT_FLAGS != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        self.commit(cred, &Mutation::SetFlags { ino, flags, time: now })
    }

    /// An open handle of `ino` for `want` (`access(2)`'s bits: read,
    /// write, execute; none for a handle opened again in a new session;
    /// and [`WANT_APPEND`] for an `O_APPEND` open),
    /// checked as Linux checks an open, once: the data calls made through
    /// the handle are not checked again (see [`Caller`]). It lives while
    /// any is open, names or not. Open handles are not journaled (they
    /// are a session's, like its locks); an orphan outlives a restart
    /// because its removal said so. O(1) expected.
    pub fn open(&self, cred: &Cred, ino: Ino, want: u32) -> Result<Attr> {
        let i = self.inode(ino)?;
        let _held = self.stripes.lock(&[], &[Self::ino_lock(ino)]);
        // Freed between the look-up and the lock.
        self.inode(ino)?;
        let access = want & (access::READ | WRITE | EXEC);
        if access != 0 {
            i.check(cred, &i.owner(), access)?;
        }
        // Linux's `may_open`: an append-only file is written only at
        // its end.
        if access & WRITE != 0 && want & WANT_APPEND == 0 {
            i.refuse_if(FLAG_APPEND)?;
        }
        i.opens.fetch_add(1, Relaxed);
        Ok(i.attr())
    }

    /// Closes a handle; an orphan whose last handle this was goes (the
    /// record that says so is logged: [`Seq`] 0 if nothing went).
    pub fn release(&self, cred: &Cred, ino: Ino) -> Result<Seq> {
        let i = self.inode(ino)?;
        let _held = self.stripes.lock(&[], &[Self::ino_lock(ino)]);
        let was = i.opens.load(Relaxed);
        if was == 0 {
            return Err(Errno::EBADF);
        }
        i.opens.store(was - 1, Relaxed);
        if was == 1 && i.nlink.load(Relaxed) == 0 {
            return self.forget(cred, ino);
        }
        Ok(0)
    }
}

impl Namespace {
    /// After a restart, once the sessions that held files open have had
    /// their window to reopen them: the orphans nobody holds open go.
    /// Returns the last record's [`Seq`] (0 if none went). O(inodes).
    pub fn forget_orphans(&self, cred: &Cred) -> Result<Seq> {
        let mut orphans = Vec::new();
        self.inodes.iter_sync(|&ino, i| {
            if i.orphan.load(Relaxed) {
                orphans.push(ino);
            }
            true
        });
        self.forget_idle(cred, orphans)
    }

    /// Frees the orphans whose end found no room to be recorded (see
    /// [`release`](Namespace::release)), those the log now has room for:
    /// what a server runs now and then (each tick of its checkpointer).
    /// Returns the last record's [`Seq`] (0 if none went). O(1) when
    /// there are none; else O(those).
    pub fn retry_forgets(&self, cred: &Cred) -> Result<Seq> {
        let waiting = std::mem::take(&mut *self.unforgotten.lock());
        self.forget_idle(cred, waiting)
    }

    /// Frees each of `orphans` that nobody holds open and nothing names
    /// (checked under its lock: it may have been reopened, or freed,
    /// since it was listed). Returns the last record's [`Seq`].
    fn forget_idle(&self, cred: &Cred, orphans: Vec<Ino>) -> Result<Seq> {
        let mut last = 0;
        for ino in orphans {
            let Ok(i) = self.inode(ino) else { continue };
            let _held = self.stripes.lock(&[], &[Self::ino_lock(ino)]);
            if i.opens.load(Relaxed) == 0 && i.nlink.load(Relaxed) == 0 && self.inode(ino).is_ok() {
                last = self.forget(cred, ino)?.max(last);
            }
        }
        Ok(last)
    }

    /// Records and applies the end of orphan `ino`, which the caller holds
    /// under its lock. Where the log has no room (`ENOSPC`) the orphan is
    /// kept for [`retry_forgets`](Namespace::retry_forgets), and this is
    /// no error: the close that ended it happened. O(1).
    fn forget(&self, cred: &Cred, ino: Ino) -> Result<Seq> {
        match self.commit(cred, &Mutation::Forget { ino }) {
            Err(Errno::ENOSPC) => {
                self.unforgotten.lock().push(ino);
                Ok(0)
            }
            done => done,
        }
    }
}

/// The checks of a use of `i`'s data (`want`: read or write): a regular
/// file, and, unless the use is through a handle opened for it (checked
/// at its open), one the caller may use so (its owner always may, as an
/// NFS server lets the owner of a file it opened read and write it). Its
/// owner and mode, read once.
fn may_use(who: Caller, i: &Inode, want: u32) -> Result<Owner> {
    regular(i)?;
    let o = i.owner();
    if !who.opened && who.cred.uid != o.uid {
        i.check(who.cred, &o, want)?;
    }
    Ok(o)
}

/// The permission bits and group of a new inode of `kind` asked for with
/// `perm`, made by `cred` in a directory owned as `dir`: the group is the
/// caller's, or the directory's if it is setgid (and then a new
/// directory is setgid too); mkdir keeps only the sticky bit of the
/// special ones; a setgid file in a group the caller is not in loses the
/// bit; a symlink is 0777.
fn new_owner(cred: &Cred, dir: &Owner, kind: FileType, perm: u32) -> (u32, u32) {
    let sgid_dir = dir.perm & libc::S_ISGID != 0;
    let gid = if sgid_dir { dir.gid } else { cred.gid };
    let mut perm = perm & 0o7777;
    if kind == FileType::Directory {
        perm &= 0o1777;
        if sgid_dir {
            perm |= libc::S_ISGID;
        }
    }
    if kind != FileType::Directory && perm & libc::S_ISGID != 0 && !cred.is_root() && !cred.in_group(gid) {
        perm &= !libc::S_ISGID;
    }
    if kind == FileType::Symlink {
        perm = 0o777;
    }
    (perm, gid)
}

/// The ACLs a new inode inherits from its directory's default ACL (see
/// [`inherited`]).
enum Inherited {
    /// The directory has none: most.
    Nothing,
    /// Its access ACL, where its mode does not say it all, and a new
    /// directory's default ACL.
    Acls { access: Option<Vec<u8>>, default: Option<Vec<u8>> },
}

impl Inherited {
    /// The record of `made`, which makes inode `ino`: itself, or with
    /// the ACLs the inode inherits, [`Mutation::Inherit`].
    fn wrap(self, made: Mutation, ino: Ino) -> Mutation {
        match self {
            Inherited::Nothing => made,
            Inherited::Acls { access, default } => Mutation::Inherit { made: Box::new(made), ino, access, default },
        }
    }
}

/// The permission bits of a new inode of `kind` in `dir`, from `perm`
/// (as [`new_owner`] leaves them), and the ACLs it inherits, as Linux's
/// `posix_acl_create` makes them: where `dir` has a default ACL, the
/// bits are cut to it and it to them (an access ACL kept where it says
/// more than the bits), and a new directory takes it as its own default;
/// elsewhere `umask` takes its bits. A symlink is 0777 whatever. O(1)
/// without a default ACL; with one, `dir`'s `meta` lock and O(entries).
fn inherited(dir: &Inode, kind: FileType, perm: u32, umask: u32) -> (u32, Inherited) {
    if kind == FileType::Symlink {
        return (perm, Inherited::Nothing);
    }
    let default = if dir.has_default_acl() {
        dir.meta.lock().xattrs().iter().find(|(n, _)| **n == *acl::DEFAULT).map(|(_, v)| v.to_vec())
    } else {
        None
    };
    let Some(default) = default else { return (perm & !(umask & 0o777), Inherited::Nothing) };
    let (perm, access) = acl::inherit(&default, perm);
    (perm, Inherited::Acls { access, default: (kind == FileType::Directory).then_some(default) })
}

/// Attribute flags are a regular file's or a directory's: `ENOTTY` for
/// any other inode (a mount's kernel sends the ioctl for no other).
pub(crate) fn attributed(i: &Inode) -> Result<()> {
    match i.kind {
        FileType::Regular | FileType::Directory => Ok(()),
        _ => Err(Errno::ENOTTY),
    }
}

/// Data operations work on regular files only.
fn regular(i: &Inode) -> Result<()> {
    match i.kind {
        FileType::Regular => Ok(()),
        FileType::Directory => Err(Errno::EISDIR),
        _ => Err(Errno::EINVAL),
    }
}

/// What taking a name from `victim` does to it (the caller holds its
/// inode lock): its last name, or not; open, or not.
fn gone(victim: &Inode) -> Gone {
    if !victim.is_dir() && victim.nlink.load(Relaxed) > 1 {
        Gone::Linked
    } else if victim.opens.load(Relaxed) > 0 {
        Gone::Orphaned
    } else {
        Gone::Freed
    }
}

/// Linux's `may_delete`: write and search permission on the directory,
/// no name removed from an append-only directory, the sticky rule, no
/// immutable or append-only victim, and the type the caller expects.
fn may_delete(cred: &Cred, dir: &Inode, victim: &Inode, dir_wanted: bool) -> Result<()> {
    let d = dir.owner();
    dir.check(cred, &d, WRITE | EXEC)?;
    dir.refuse_if(FLAG_APPEND)?;
    access::check_sticky(cred, &d, &victim.owner())?;
    victim.refuse_if(FROZEN)?;
    match (dir_wanted, victim.is_dir()) {
        (true, false) => Err(Errno::ENOTDIR),
        (true, true) if victim.ino == ROOT => Err(Errno::EBUSY),
        (false, true) => Err(Errno::EISDIR),
        _ => Ok(()),
    }
}

/// Linux's protected hard links (`fs.protected_hardlinks = 1`, the
/// default): only the owner, root, or someone who may read and write a
/// regular file that is not setuid or setgid-executable may link to it.
fn may_link(cred: &Cred, target: &Inode) -> Result<()> {
    let o = target.owner();
    if access::owns(cred, &o) {
        return Ok(());
    }
    let safe = target.kind == FileType::Regular
        && o.perm & libc::S_ISUID == 0
        && o.perm & (libc::S_ISGID | libc::S_IXGRP) != (libc::S_ISGID | libc::S_IXGRP)
        && target.permits(cred, &o, access::READ | WRITE);
    if safe { Ok(()) } else { Err(Errno::EPERM) }
}
