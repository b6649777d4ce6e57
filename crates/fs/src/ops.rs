//! Each kernel request as calls to the client: one round trip for most
//! (lookup, getattr, create, unlink, …) and writes (made whole), one
//! per 128 KiB of data, all issued at once, for reads, a page of a
//! listing per `READDIR(PLUS)`. The server checks permissions with the caller's ids
//! ([`creds`](crate::creds)) and answers errnos the kernel gets verbatim.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use futures::future::try_join_all;
use std::time::Duration;

use interlock_client::meta::{
    Attr, Caller, Cred, Fallocate, FileType, Ino, ROOT, RenameFlags, SeekTo, SetAttr, TimeSet, WANT_APPEND, XattrMode,
};
use interlock_client::{Client, ClientError};
use interlock_proto::meta::{MAX_DATA, MetaOp};
use tokio::sync::oneshot;

use crate::Config;
use crate::abi::{self, Args, InHeader, Malformed, Ttl, fattr, op};
use crate::acls::Acls;
use crate::handles::{Handles, Listing};
use crate::locks::{Lost, Owners, errno};
use crate::names::Names;
use crate::unsynced::Unsynced;

/// A reply's body, or the errno to fail with.
pub type Answer = Result<Vec<u8>, i32>;

impl From<Malformed> for i32 {
    fn from(m: Malformed) -> i32 {
        tracing::warn!("{m}");
        libc::EIO
    }
}

/// The file system a mount serves: the client, the open files, the lock
/// owners, and the device (for notifications).
pub struct Fs {
    pub(crate) client: Client,
    pub(crate) ttl: Ttl,
    pub(crate) read_only: bool,
    /// See [`Config::root_squashed`].
    root_squashed: bool,
    pub(crate) handles: Handles,
    acls: Acls,
    names: Names,
    pub(crate) owners: Owners,
    pub(crate) lost: Lost,
    unsynced: Unsynced,
    pub(crate) dev: Arc<File>,
    /// See [`Config::soft_timeout`].
    pub(crate) soft_timeout: Option<Duration>,
}

/// A call's result, failures as errnos.
fn call<T>(r: Result<T, ClientError>) -> Result<T, i32> {
    r.map_err(|e| errno(&e))
}

/// Whether a call that ended so is to be made again, after a pause, while
/// there is time left: one that had no effect (the server stopped
/// cleanly before it read it, or died before it made it:
/// `ClientError::Unread`) always; one whose session ended (the
/// server restarted, or the lease ran out) if it may be `repeated`; and a
/// lock request that would not wait, refused while the restarted server's
/// recovery window lasts, once the window is over: a conflict it cannot
/// yet rule out is not one (`EAGAIN` would say that another holds the
/// lock), and NFS's client, too, waits out the server's grace period.
async fn repeats<T>(r: &Result<T, ClientError>, until: tokio::time::Instant, repeated: bool) -> bool {
    let pause = Duration::from_millis(50);
    let pause = match r {
        Err(ClientError::Unread) => Some(pause),
        Err(ClientError::ConnectionLost) if repeated => Some(pause),
        Err(ClientError::Recovering(left)) => Some((*left).max(pause)),
        _ => None,
    };
    match pause {
        Some(p) if tokio::time::Instant::now() < until => {
            tokio::time::sleep(p).await;
            true
        }
        _ => false,
    }
}

/// Who makes a data call through open file `fh`: the caller, through a
/// handle whose access the server checked at its open, as Linux checks
/// an open file's access once. A daemon that opens its log as root and
/// then drops to `nobody` keeps writing it, and a file made unreadable
/// after it was opened is still read through the handle (before, the
/// server checked each call with the opener's ids against the mode of the
/// moment, and such reads failed, as on NFS). The privileges a write
/// drops are the caller's to decide, as on Linux: a write by `nobody`
/// through root's handle drops setuid. A handle this mount does not know
/// (the kernel always sends one it gave) vouches for nothing.
fn through<'a>(handles: &Handles, fh: u64, caller: &'a Cred) -> Caller<'a> {
    Caller { cred: caller, opened: handles.has(fh) }
}

/// What an open with `flags` asks of the file, in `access(2)`'s bits:
/// execute for `execve`'s open (`__FMODE_EXEC` in the flags, which needs
/// no read permission), else read, write or both by the access mode;
/// and [`WANT_APPEND`] for `O_APPEND`.
fn wanted(flags: u32) -> u32 {
    const FMODE_EXEC: u32 = 0x20;
    let want = if flags & FMODE_EXEC != 0 {
        libc::X_OK
    } else {
        match flags as i32 & libc::O_ACCMODE {
            libc::O_RDONLY => libc::R_OK,
            libc::O_WRONLY => libc::W_OK,
            _ => libc::R_OK | libc::W_OK,
        }
    };
    // The server opens an append-only file for writing only so.
    let append = if flags as i32 & libc::O_APPEND != 0 { WANT_APPEND } else { 0 };
    want as u32 | append
}

/// Entries asked of the server per listing call: the kernel's buffer holds
/// a page (about 25 entries with attributes); the rest waits in the
/// directory handle for the next call, so a listing costs a round trip
/// per 1,024 entries, not per 25.
const PAGE: u32 = 1024;

/// How long a call that can be repeated is retried after the server
/// restarted (the client reconnects meanwhile).
const RETRY_FOR: Duration = Duration::from_secs(60);

/// Runs `f` until [`repeats`] says no (`repeated`: whether a call whose
/// session ended is made again).
async fn retried<T, F: Future<Output = Result<T, ClientError>>>(f: impl Fn() -> F, repeated: bool) -> Result<T, i32> {
    let until = tokio::time::Instant::now() + RETRY_FOR;
    loop {
        let r = f().await;
        if !repeats(&r, until, repeated).await {
            return call(r);
        }
    }
}

impl Fs {
    pub fn new(client: Client, dev: Arc<File>, cfg: &Config) -> Fs {
        Fs {
            client,
            ttl: Ttl { entry: cfg.entry_timeout, attr: cfg.attr_timeout },
            read_only: cfg.options.read_only,
            root_squashed: cfg.root_squashed,
            handles: Handles::default(),
            acls: Acls::default(),
            names: Names::default(),
            owners: Owners::default(),
            lost: Lost::default(),
            unsynced: Unsynced::default(),
            dev,
            soft_timeout: cfg.soft_timeout,
        }
    }

    /// Answers one request; `None` for those the kernel wants no answer
    /// to. `cancel` fires, with the errno to answer, if a lock request is
    /// to be withdrawn (see `session`).
    pub async fn handle(&self, h: InHeader, body: &[u8], cancel: Option<oneshot::Receiver<i32>>) -> Option<Answer> {
        if matches!(h.opcode, op::FORGET | op::BATCH_FORGET) {
            return None;
        }
        let ino = h.nodeid;
        // Lock calls, and a copy's source, on a file whose locks were lost;
        // the data calls check their file as they go out (`on_file`).
        if matches!(h.opcode, op::COPY_FILE_RANGE | op::GETLK | op::SETLK | op::SETLKW)
            && let Err(e) = self.lost.check(&self.client, ino)
        {
            return Some(Err(e));
        }
        // Lock calls, flush and directory handles but their opening send
        // no credentials; a listing uses its opener's.
        let cred = match h.opcode {
            op::FLUSH
            | op::RELEASEDIR
            | op::FSYNCDIR
            | op::READDIR
            | op::READDIRPLUS
            | op::GETLK
            | op::SETLK
            | op::SETLKW => Cred { uid: h.uid, gid: h.gid, groups: Vec::new() },
            _ => crate::creds::of(&h),
        };
        let mut a = Args::new(body);
        let r = match h.opcode {
            op::LOOKUP => self.lookup(&cred, ino, &mut a).await,
            op::GETATTR => self.again(|| self.client.getattr(&cred, ino)).await.map(|at| self.attr_out(&at)),
            op::SETATTR => self.setattr((&cred, h.pid), ino, &mut a).await,
            op::READLINK => self.again(|| self.client.readlink(&cred, ino)).await,
            op::SYMLINK => self.symlink(&cred, ino, &mut a).await,
            op::MKNOD => self.mknod(&cred, ino, &mut a).await,
            op::MKDIR => self.mkdir(&cred, ino, &mut a).await,
            op::UNLINK => self.remove(&cred, ino, &mut a, false).await,
            op::RMDIR => self.remove(&cred, ino, &mut a, true).await,
            op::RENAME => self.rename(&cred, ino, &mut a, false).await,
            op::RENAME2 => self.rename(&cred, ino, &mut a, true).await,
            op::LINK => self.link(&cred, ino, &mut a).await,
            op::OPEN => self.open((&cred, h.pid), ino, &mut a).await,
            op::READ => self.read(&cred, ino, &mut a).await,
            op::WRITE => self.write(&cred, ino, &mut a).await,
            op::STATFS => self.statfs(&cred).await,
            op::RELEASE => self.release(&cred, &mut a).await,
            op::FALLOCATE => self.fallocate(&cred, ino, &mut a).await,
            op::LSEEK => self.lseek(&cred, ino, &mut a).await,
            op::COPY_FILE_RANGE => self.copy_file_range(&cred, ino, &mut a).await,
            op::FSYNC => self.fsync(&cred, ino).await,
            op::SETXATTR => self.setxattr(&cred, ino, &mut a).await,
            op::GETXATTR => self.getxattr(&cred, ino, &mut a).await,
            op::LISTXATTR => self.listxattr(&cred, ino, &mut a).await,
            op::REMOVEXATTR => self.removexattr(&cred, ino, &mut a).await,
            op::FLUSH => self.flush(ino, &mut a).await,
            op::OPENDIR => self.opendir(cred, ino).await,
            op::RELEASEDIR => a.u64().map_err(i32::from).map(|fh| {
                self.handles.close_dir(fh);
                Vec::new()
            }),
            op::FSYNCDIR | op::DESTROY => Ok(Vec::new()),
            op::READDIR => self.readdir(&cred, ino, &mut a, false).await,
            op::READDIRPLUS => self.readdir(&cred, ino, &mut a, true).await,
            op::GETLK => self.getlk(ino, &mut a).await,
            op::SETLK => self.setlk(ino, &mut a, false, cancel).await,
            op::SETLKW => self.setlk(ino, &mut a, true, cancel).await,
            op::CREATE => self.create(&cred, ino, &mut a).await,
            op::TMPFILE => self.tmpfile(&cred, ino, &mut a).await,
            op::IOCTL => self.ioctl(&cred, ino, &mut a).await,
            _ => Err(libc::ENOSYS),
        };
        Some(r)
    }

    /// Undoes what the answer `a` to `h` would have begun, had the kernel
    /// taken it: a request answered `EINTR` for its dying caller (see
    /// `session`) that then made an open leaves a handle nobody will
    /// release; it is released here. Anything else such a request made
    /// stands, as a killed program's last calls to a local file system do.
    /// O(1), or a release's round trips.
    pub async fn abandoned(&self, h: &InHeader, a: Answer) {
        // Each opening answer ends with its `fuse_open_out`: the handle,
        // then 8 bytes of flags.
        let Ok(out) = a else { return };
        let Some(at) = out.len().checked_sub(16) else { return };
        let mut fh = Args::new(&out[at..]);
        match h.opcode {
            op::OPENDIR => {
                if let Ok(fh) = fh.u64() {
                    self.handles.close_dir(fh);
                }
            }
            op::OPEN | op::CREATE | op::TMPFILE => {
                if let Err(e) = self.release(&crate::creds::of(h), &mut fh).await {
                    tracing::warn!(ino = h.nodeid, errno = e, "closing a file its dying opener never got");
                }
            }
            _ => {}
        }
    }

    /// Runs a call that may be repeated (a read, a write at an offset, a
    /// lookup, …) again if it failed because the server restarted and the
    /// session with it: the file system goes on across a server restart.
    pub(crate) async fn again<T, F: Future<Output = Result<T, ClientError>>>(
        &self,
        f: impl Fn() -> F,
    ) -> Result<T, i32> {
        retried(f, true).await
    }

    /// Runs a call that may not be repeated (create, unlink, rename, …:
    /// the first may have taken effect) again only if the server never
    /// read it, having stopped cleanly first. After a server's death the
    /// client asks the next server about it (protocol 15's replay cache),
    /// and only a session lost for good (the lease ran out, the recovery
    /// window passed) fails it with `EIO`. So neither a restart of the
    /// server for an upgrade nor its crash fails a program.
    pub(crate) async fn once<T, F: Future<Output = Result<T, ClientError>>>(
        &self,
        f: impl Fn() -> F,
    ) -> Result<T, i32> {
        retried(f, false).await
    }

    /// Runs a call on file `ino` that may act under this mount's locks on
    /// it (a read, a write, a truncation, …) in a session in which the
    /// mount has seen every lost lock reported and none of the file's
    /// (else `EIO`: see [`Lost`]): it goes out in that session or not at
    /// all (`Client::within`). Repeated as [`again`](Fs::again) repeats
    /// if `repeat`, after the same check. Without the fence, a write
    /// that a program made while this mount was stopped past its lease
    /// went out in the new session before the mount learned of the loss,
    /// over what the lock's new holder had written.
    pub(crate) async fn on_file<T, F: Future<Output = Result<T, ClientError>>>(
        &self,
        ino: Ino,
        repeat: bool,
        f: impl Fn(Client) -> F,
    ) -> Result<T, i32> {
        let until = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            let settled = self.client.settled();
            self.lost.check(&self.client, ino)?;
            let r = f(self.client.within(settled)).await;
            if !repeats(&r, until, repeat).await {
                return call(r);
            }
        }
    }

    /// Marks the files whose locks the session lost (see [`Lost`]), as
    /// the client reports them, until the client is gone.
    pub(crate) async fn watch_losses(&self) {
        let mut changed = self.client.lost_locks();
        while changed.changed().await.is_ok() {
            self.lost.note(&self.client);
        }
    }

    /// Fails changes on a read-only mount.
    fn writable(&self) -> Result<(), i32> {
        if self.read_only { Err(libc::EROFS) } else { Ok(()) }
    }

    /// An entry for the kernel (`fuse_entry_out`), noting whether the
    /// inode has an ACL (see `acls`), as every attribute the kernel gets.
    fn entry(&self, a: &Attr) -> Vec<u8> {
        self.acls.seen(a);
        abi::entry(a, self.ttl)
    }

    /// Attributes for the kernel (`fuse_attr_out`), noted as
    /// [`entry`](Fs::entry) notes them.
    fn attr_out(&self, a: &Attr) -> Vec<u8> {
        self.acls.seen(a);
        abi::attr_out(a, self.ttl)
    }

    async fn lookup(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>) -> Answer {
        let name = a.cstr()?;
        let at = self.again(|| self.client.lookup(cred, parent, name)).await?;
        self.names.seen(parent, name, &at);
        Ok(self.entry(&at))
    }

    async fn setattr(&self, (cred, pid): (&Cred, u32), ino: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let valid = a.u32()?;
        a.skip(4)?;
        let (_fh, size, _owner, atime, mtime, _ctime) = (a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?);
        let (atimensec, mtimensec, _ctimensec, mode) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
        a.skip(4)?;
        let (uid, gid) = (a.u32()?, a.u32()?);
        let has = |bit| valid & bit != 0;
        // A request that sets nothing is a `chown(-1, -1)`, which on Linux
        // drops setuid and setgid, the owner's or root's to make, and is
        // refused anyone else where it would drop one (with
        // `HANDLE_KILLPRIV` the kernel leaves that to us and sends no
        // ids); or the kernel asking us to drop them for a `fallocate` by
        // someone else through a handle of the file, whose request drops
        // them itself (as a write's does, which sends no such request).
        // Only a file open here can be the second, and then the caller's
        // thread tells: it waits in the call it made (`creds::in_chown`).
        // A thread that cannot be read (gone, or in another pid
        // namespace: pid 0) is taken for a `fallocate` by anyone but the
        // owner.
        let chown = has(fattr::UID)
            || has(fattr::GID)
            || (valid & fattr::CHANGES == 0
                && (cred.is_root()
                    || !self.handles.is_open(ino)
                    || crate::creds::in_chown(pid)
                    || self.again(|| self.client.getattr(cred, ino)).await?.uid == cred.uid));
        let time = |now, set, secs: u64, nsec: u32| {
            if has(now) {
                Some(TimeSet::Now)
            } else if has(set) {
                Some(TimeSet::At((secs as i64).saturating_mul(1_000_000_000).saturating_add(i64::from(nsec))))
            } else {
                None
            }
        };
        let set = SetAttr {
            perm: has(fattr::MODE).then_some(mode & 0o7777),
            uid: has(fattr::UID).then_some(uid),
            gid: has(fattr::GID).then_some(gid),
            size: has(fattr::SIZE).then_some(size),
            atime: time(fattr::ATIME_NOW, fattr::ATIME, atime, atimensec),
            mtime: time(fattr::MTIME_NOW, fattr::MTIME, mtime, mtimensec),
            opened_for_write: has(fattr::FH) && has(fattr::SIZE),
            chown,
        };
        let set = &set;
        self.on_file(ino, true, |c| async move { c.setattr(cred, ino, set.clone()).await })
            .await
            .map(|at| self.attr_out(&at))
    }

    /// Makes an inode of `kind` with permission bits from `mode`.
    async fn make(
        &self,
        cred: &Cred,
        (parent, name): (Ino, &[u8]),
        (kind, mode, rdev): (FileType, u32, u64),
        (target, umask): (&[u8], u32),
    ) -> Answer {
        self.writable()?;
        let (named, target, perm) = (name.to_vec(), target.to_vec(), mode & 0o7777);
        let op = MetaOp::Create { parent, name: named, kind, perm, rdev, target, umask };
        match self.once(|| self.client.meta(cred, op.clone())).await? {
            interlock_proto::meta::MetaReply::Attr(at) => {
                self.names.seen(parent, name, &at);
                Ok(self.entry(&at))
            }
            _ => Err(libc::EIO),
        }
    }

    async fn symlink(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>) -> Answer {
        let (name, target) = (a.cstr()?, a.cstr()?);
        self.make(cred, (parent, name), (FileType::Symlink, 0o777, 0), (target, 0)).await
    }

    async fn mknod(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>) -> Answer {
        let (mode, rdev, umask) = (a.u32()?, a.u32()?, a.u32()?);
        a.skip(4)?;
        let name = a.cstr()?;
        let kind = FileType::from_mode(mode).ok_or(libc::EINVAL)?;
        self.make(cred, (parent, name), (kind, mode, u64::from(rdev)), (b"", umask)).await
    }

    async fn mkdir(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>) -> Answer {
        let (mode, umask) = (a.u32()?, a.u32()?);
        let name = a.cstr()?;
        self.make(cred, (parent, name), (FileType::Directory, mode, 0), (b"", umask)).await
    }

    async fn remove(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>, dir: bool) -> Answer {
        self.writable()?;
        let name = a.cstr()?;
        let r = if dir {
            self.once(|| self.client.rmdir(cred, parent, name)).await
        } else {
            self.once(|| self.client.unlink(cred, parent, name)).await
        };
        r?;
        self.names.removed(parent, name);
        Ok(Vec::new())
    }

    async fn rename(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>, two: bool) -> Answer {
        self.writable()?;
        let new_parent = a.u64()?;
        let mut flags = RenameFlags::default();
        if two {
            let f = a.u32()?;
            a.skip(4)?;
            if f & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT) != 0 {
                return Err(libc::EINVAL);
            }
            flags.noreplace = f & libc::RENAME_NOREPLACE != 0;
            flags.exchange = f & libc::RENAME_EXCHANGE != 0;
            // What an overlay file system asks of its upper layer (which
            // refuses a layer without it).
            flags.whiteout = f & libc::RENAME_WHITEOUT != 0;
        }
        let (name, new_name) = (a.cstr()?, a.cstr()?);
        self.once(|| self.client.rename(cred, (parent, name), (new_parent, new_name), flags)).await?;
        self.names.renamed((parent, name), (new_parent, new_name), flags.exchange);
        Ok(Vec::new())
    }

    async fn link(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let ino = a.u64()?;
        let name = a.cstr()?;
        let at = self.once(|| self.client.link(cred, ino, parent, name)).await?;
        self.names.seen(parent, name, &at);
        Ok(self.entry(&at))
    }

    /// Holds `ino` open at the server and gives the kernel a handle. Data
    /// bypasses the page cache (`FOPEN_DIRECT_IO`): what another mount
    /// wrote is what the next read sees. The kernel's cached attributes
    /// are dropped, so a size changed elsewhere shows after the open
    /// (close-to-open). An open that finds the file without a name, or
    /// (asked beside it) its name naming another file, is undone and
    /// answered `ESTALE`, and the kernel looks the path up again: another
    /// mount replaced the file (see `names`).
    async fn open(&self, (cred, pid): (&Cred, u32), ino: Ino, a: &mut Args<'_>) -> Answer {
        let flags = a.u32()?;
        let opened = self.again(|| self.client.open(cred, ino, wanted(flags)));
        let retry = self.names.retrying(ino, pid);
        let (at, renamed) = match self.names.name_of(ino).filter(|_| !retry) {
            None => (opened.await?, false),
            Some((parent, name)) => {
                let (opened, named) = tokio::join!(opened, self.client.lookup(cred, parent, &name));
                let renamed = match named {
                    Ok(found) => found.ino != ino,
                    Err(e) => matches!(e, ClientError::Errno(libc::ENOENT | libc::ESTALE)),
                };
                (opened?, renamed)
            }
        };
        if !retry && (renamed || at.nlink == 0) {
            self.names.refused(ino, pid);
            if let Err(e) = self.client.release(cred, ino).await {
                tracing::warn!(ino, error = %e, "undoing the open of a file whose name went");
            }
            return Err(libc::ESTALE);
        }
        self.invalidate(ino);
        Ok(abi::open_out(self.handles.insert(ino), abi::fopen(flags)))
    }

    /// `FUSE_IOCTL`: the attribute flags of a regular file or directory,
    /// read or set at the server (see `fileattr`). A set drops the
    /// inode's cached attributes (its ctime moved).
    async fn ioctl(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        let asked = crate::fileattr::asked(a)?;
        if asked.set.is_some() {
            self.writable()?;
        }
        let flags = self.again(|| self.client.flags(cred, ino, asked.set)).await?;
        if asked.set.is_some() {
            self.invalidate(ino);
        }
        Ok(crate::fileattr::answer(&asked, flags))
    }

    /// `FUSE_OPENDIR`. The kernel has checked the caller's read
    /// permission (`default_permissions`), but with root's ids it passes
    /// every check, and a server that squashes root serves those ids as
    /// another user's. Such a caller's open is asked of the server (a
    /// first page of one entry), so that a directory closed to that user
    /// fails to open, as on NFS, rather than opening and failing to list.
    /// One round trip more for root's opens on such a server; none else.
    async fn opendir(&self, cred: Cred, ino: Ino) -> Answer {
        if self.root_squashed && cred.has_root_ids() {
            self.again(|| self.client.readdir(&cred, ino, 0, 1, false)).await?;
        }
        Ok(abi::open_out(self.handles.open_dir(cred), 0))
    }

    /// `FUSE_CREATE`: create and open. If another mount made the name
    /// first, and the caller did not ask for `O_EXCL`, the existing file
    /// is opened, as a local `open(O_CREAT)` would.
    async fn create(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let (flags, mode, umask) = (a.u32()?, a.u32()?, a.u32()?);
        a.skip(4)?;
        let name = a.cstr()?;
        let attr = self.create_or_open(cred, parent, name, (mode & 0o7777, umask), flags as i32).await?;
        self.names.seen(parent, name, &attr);
        Ok(self.opened(&attr, flags))
    }

    /// `FUSE_TMPFILE`: `open(O_TMPFILE)` in directory `parent`, a file
    /// with no name, open (the name the kernel sends is its placeholder,
    /// `/`). A `linkat` may name it, unless the open asked for `O_EXCL`
    /// (the kernel refuses that link itself; the server too).
    async fn tmpfile(&self, cred: &Cred, parent: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let (flags, mode, umask) = (a.u32()?, a.u32()?, a.u32()?);
        let linkable = flags as i32 & libc::O_EXCL == 0;
        let attr = self.once(|| self.client.tmpfile(cred, parent, (mode & 0o7777, umask), linkable)).await?;
        Ok(self.opened(&attr, flags))
    }

    /// The answer to a create that opens with `flags`: the new entry,
    /// then a handle.
    fn opened(&self, attr: &Attr, flags: u32) -> Vec<u8> {
        let mut out = self.entry(attr);
        out.extend_from_slice(&abi::open_out(self.handles.insert(attr.ino), abi::fopen(flags)));
        out
    }

    /// `open(2)` with `O_CREAT` of a name the kernel found missing: made
    /// and opened, or, without `O_EXCL`, what another made there since:
    /// a regular file is opened (and cut to nothing for `O_TRUNC`, which
    /// the kernel drops for a file it takes for new), a directory is
    /// `EISDIR` (as Linux answers), and anything else (a symlink to follow, a special file
    /// the kernel opens itself) is for the kernel's walk to see: `ESTALE`
    /// makes it look the path up again and redo the open (once: a name
    /// that changes again meanwhile leaves the program `ESTALE`, as on
    /// NFS). Before, such a race gave `EIO` (the kernel refuses a
    /// create's answer that is not a regular file) or `ENOENT`, where
    /// tmpfs gives only success or `EISDIR` (session 26: 236 and 20 of
    /// 6,000 opens against a name another mount made a directory, a
    /// symlink and nothing in turn).
    async fn create_or_open(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &[u8],
        perm: (u32, u32),
        flags: i32,
    ) -> Result<Attr, i32> {
        // A name made and removed again between our tries: a few more.
        for _ in 0..8 {
            match self.once(|| self.client.create_open(cred, parent, name, perm)).await {
                Err(libc::EEXIST) if flags & libc::O_EXCL == 0 => {}
                r => return r,
            }
            match self.again(|| self.client.lookup(cred, parent, name)).await {
                Ok(attr) if attr.kind == FileType::Regular => {
                    let opened = self.again(|| self.client.open(cred, attr.ino, wanted(flags as u32))).await?;
                    if flags & libc::O_TRUNC == 0 {
                        return Ok(opened);
                    }
                    // Checked as `truncate(2)` is: write permission.
                    let cut = SetAttr { size: Some(0), ..SetAttr::default() };
                    let r = self.again(|| self.client.setattr(cred, attr.ino, cut.clone())).await;
                    if r.is_err() {
                        let _ = self.client.release(cred, attr.ino).await;
                    }
                    return r;
                }
                Ok(attr) if attr.kind == FileType::Directory => return Err(libc::EISDIR),
                Ok(_) => return Err(libc::ESTALE),
                Err(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Err(libc::ESTALE)
    }

    async fn read(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        let (fh, offset, size) = (a.u64()?, a.u64()?, a.u32()? as usize);
        let who = through(&self.handles, fh, cred);
        let parts = (0..size.div_ceil(MAX_DATA)).map(|i| {
            let at = offset + (i * MAX_DATA) as u64;
            let len = (size - i * MAX_DATA).min(MAX_DATA) as u32;
            self.on_file(ino, true, move |c| async move { c.read(who, ino, at, len).await })
        });
        let parts = try_join_all(parts).await?;
        let mut out = Vec::with_capacity(size);
        for p in parts {
            let short = p.len() < MAX_DATA;
            out.extend_from_slice(&p);
            if short {
                break;
            }
        }
        Ok(out)
    }

    async fn write(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let (fh, offset, size) = (a.u64()?, a.u64()?, a.u32()? as usize);
        let who = through(&self.handles, fh, cred);
        a.skip(12)?;
        let flags = a.u32()? as i32;
        a.skip(4)?;
        let data = a.bytes(size)?;
        self.unsynced.wrote(ino, self.client.verifier());
        // One call, however large (the kernel sends no more than the
        // server takes): made whole, no other mount's write inside it.
        if flags & libc::O_APPEND != 0 {
            // At the server's end of the file, not at the kernel's idea of
            // it (another mount may have appended since).
            self.on_file(ino, false, |c| async move { c.append(who, ino, data).await }).await?;
        } else {
            self.on_file(ino, true, |c| async move { c.write(who, ino, offset, data).await }).await?;
        }
        // `O_SYNC`, `O_DSYNC`, or `pwritev2`'s `RWF_SYNC` and `RWF_DSYNC`
        // (the kernel sets `O_DSYNC` in the flags for each): durable
        // before the answer. The kernel syncs nothing after a direct
        // write; a file system that writes through is left to honour the
        // flags it passes. Until session 41 such a write returned with
        // its data in the server's page cache.
        if flags & libc::O_DSYNC != 0 {
            self.fsync(cred, ino).await?;
        }
        Ok(abi::write_out(size as u32))
    }

    /// `fsync(2)`, `fdatasync(2)`, `msync(2)`: the server syncs the file's
    /// data and every journal record so far; `EIO` if writes it should
    /// cover went to a server whose machine restarted since (see
    /// `unsynced`).
    async fn fsync(&self, cred: &Cred, ino: Ino) -> Answer {
        let mark = self.unsynced.mark();
        self.on_file(ino, true, |c| async move { c.fsync(cred, ino).await }).await?;
        self.unsynced.synced(ino, mark, self.client.verifier()).map(|()| Vec::new())
    }

    /// `fallocate(2)`: the kernel has checked the range and that the
    /// file is open for writing, and updates its idea of the size after.
    /// Repeated after a server restart as a write is: the same range
    /// reserved or zeroed twice is the same.
    async fn fallocate(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let (fh, offset, len, mode) = (a.u64()?, a.u64()?, a.u64()?, a.u32()?);
        let how = Fallocate::from_mode(mode).map_err(|e| e.0)?;
        let who = through(&self.handles, fh, cred);
        self.unsynced.wrote(ino, self.client.verifier());
        self.on_file(ino, true, |c| async move { c.fallocate(who, ino, how, offset, len).await })
            .await
            .map(|_| Vec::new())
    }

    /// `copy_file_range(2)` within the mount: the server copies, so no
    /// byte crosses the network twice (or at all). The kernel has checked
    /// the flags, the ranges and the files' modes. The server copies at
    /// most `COPY_MAX` (8 MiB) a call, and the caller goes on from a
    /// short copy (`cp` does); the answer's count is 32 bits, so the
    /// request asks for under 4 GiB. Repeated after a server restart as a
    /// write is.
    async fn copy_file_range(&self, cred: &Cred, src: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let (fh_in, src_off, dst, fh_out, dst_off, len) = (a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?);
        let who = Caller { cred, opened: self.handles.has(fh_in) && self.handles.has(fh_out) };
        let len = len.min(u64::from(u32::MAX) & !0xfff);
        self.unsynced.wrote(dst, self.client.verifier());
        let (bytes, _) = self
            .on_file(dst, true, |c| async move { c.copy_range(who, (src, src_off), (dst, dst_off), len).await })
            .await?;
        Ok(abi::write_out(bytes as u32))
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the kernel serves the other
    /// `lseek`s itself), from the server's data file: tools that skip
    /// holes (`qemu-img`, `cp` of a sparse file) read only the data.
    async fn lseek(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        let (fh, offset, whence) = (a.u64()?, a.u64()?, a.u32()? as i32);
        let who = through(&self.handles, fh, cred);
        let to = match whence {
            libc::SEEK_DATA => SeekTo::Data,
            libc::SEEK_HOLE => SeekTo::Hole,
            _ => return Err(libc::EINVAL),
        };
        let at = self.again(|| self.client.seek(who, ino, offset, to)).await?;
        let mut out = Vec::with_capacity(8);
        abi::put64(&mut out, at);
        Ok(out)
    }

    async fn statfs(&self, cred: &Cred) -> Answer {
        let s = self.again(|| self.client.statfs(cred)).await?;
        // Space is the server's disk's, where the files' data are; inodes
        // are what the namespace's memory budget has room for.
        let mut out = Vec::with_capacity(80);
        for v in [s.blocks, s.free, s.available, s.files + s.files_free, s.files_free] {
            abi::put64(&mut out, v);
        }
        for v in [s.block_size, s.name_max, s.block_size, 0, 0, 0, 0, 0, 0, 0] {
            abi::put32(&mut out, v);
        }
        Ok(out)
    }

    /// The last close of an open file: the locks taken through it go (OFD
    /// and flock locks; see [`locks`](crate::locks)), and the server's
    /// hold on the inode.
    async fn release(&self, cred: &Cred, a: &mut Args<'_>) -> Answer {
        let fh = a.u64()?;
        let Some(handle) = self.handles.remove(fh) else { return Ok(Vec::new()) };
        self.lost.clear_if(handle.ino, || !self.handles.is_open(handle.ino));
        self.unsynced.clear_if(handle.ino, || !self.handles.is_open(handle.ino));
        let lockers: Vec<_> = handle.lockers.lock().drain().collect();
        let resource = crate::locks::resource(handle.ino);
        for (kind, owner) in lockers {
            // The kernel names an OFD or flock owner after its open file's
            // address, which a new open may take while this release was on
            // its way: if a live handle locked as the same owner, its locks
            // are that file's now and stay (they go at its release).
            if !self.handles.locked_through_another(handle.ino, (kind, owner)) {
                let number = self.owners.number(owner);
                if let Err(e) = self.once(|| self.client.close(&resource, kind, number)).await {
                    let e = std::io::Error::from_raw_os_error(e);
                    tracing::warn!(ino = handle.ino, error = %e, "releasing the locks of a closed file");
                }
            }
            self.owners.unhold(owner);
        }
        // After a server restart the server no longer knows the open: it
        // went with the old session.
        match self.client.release(cred, handle.ino).await {
            Ok(()) | Err(ClientError::Errno(libc::EBADF) | ClientError::ConnectionLost | ClientError::Unread) => {
                Ok(Vec::new())
            }
            Err(e) => Err(errno(&e)),
        }
    }

    async fn setxattr(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let (size, flags) = (a.u32()? as usize, a.u32()?);
        let name = a.cstr()?;
        let value = a.bytes(size)?;
        let mode = match flags as i32 {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return Err(libc::EINVAL),
        };
        self.acls.changing(ino, name);
        self.once(|| self.client.setxattr(cred, ino, name, value, mode)).await.map(|()| Vec::new())
    }

    /// `FUSE_GETXATTR`. An ACL of an inode known to have none is
    /// `ENODATA` here (see `acls`).
    async fn getxattr(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        let size = a.u32()? as usize;
        a.skip(4)?;
        let name = a.cstr()?;
        if self.acls.known_none(ino, name) {
            return Err(libc::ENODATA);
        }
        sized(self.again(|| self.client.getxattr(cred, ino, name)).await?, size)
    }

    async fn listxattr(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        let size = a.u32()? as usize;
        let names = self.again(|| self.client.listxattr(cred, ino)).await?;
        let mut list = Vec::new();
        for n in names {
            list.extend_from_slice(&n);
            list.push(0);
        }
        sized(list, size)
    }

    async fn removexattr(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>) -> Answer {
        self.writable()?;
        let name = a.cstr()?;
        self.acls.changing(ino, name);
        self.once(|| self.client.removexattr(cred, ino, name)).await.map(|()| Vec::new())
    }

    /// A listing page: `.` and `..` (cookies 1 and 2), then the server's
    /// entries (cookies from 3, stable: an entry present throughout is
    /// listed once), as many as fit the kernel's buffer; the rest of the
    /// server's page is kept with the directory handle for the next call,
    /// and once under half a page is left the next page is asked for
    /// ahead, so a long listing does not wait a round trip per page. With
    /// `plus`, each entry's attributes too, so `ls -l` and `du` need no
    /// lookup per file.
    async fn readdir(&self, cred: &Cred, ino: Ino, a: &mut Args<'_>, plus: bool) -> Answer {
        let (fh, mut cookie, size) = (a.u64()?, a.u64()?, a.u32()? as usize);
        // Its opener's credentials, which the server checks a listing
        // from the start with; one that goes on (from a cookie the
        // server gave) is not checked again, as Linux checks a
        // directory's access at `opendir`: a chmod while a program lists
        // takes nothing from it (before session 31 the next page failed
        // with `EACCES`).
        let opener = self.handles.dir_opener(fh).unwrap_or_else(|| cred.clone());
        let cred = &opener;
        let who = |after: u64| Caller { cred, opened: after != 0 };
        let mut out = Vec::with_capacity(size);
        let dir = abi::dtype(FileType::Directory);
        let put = |out: &mut Vec<u8>, entry: Option<&Attr>, ino, cookie, kind, name: &[u8]| {
            if plus {
                if out.len() + abi::direntplus_len(name) > size {
                    return false;
                }
                match entry {
                    Some(at) => {
                        self.acls.seen(at);
                        abi::put_entry(out, at, self.ttl)
                    }
                    None => out.resize(out.len() + 128, 0),
                }
            }
            abi::put_dirent(out, size, ino, cookie, kind, name)
        };
        if cookie == 0 {
            if !put(&mut out, None, ino, 1, dir, b".") {
                return Ok(out);
            }
            cookie = 1;
        }
        if cookie == 1 {
            // The parent's number as the lister asks for it, else as root:
            // a listing needs only read permission, and Linux lists `..`
            // in a directory its reader may not search (where the
            // lister's look-up of `..` fails with `EACCES`). Root's is
            // not the first ask: a server that squashes root serves it
            // as nobody, who may search less than the lister.
            let root = Cred::root();
            let up = if ino == ROOT {
                ROOT
            } else {
                match self.again(|| self.client.lookup(cred, ino, b"..")).await {
                    Err(libc::EACCES) => self.again(|| self.client.lookup(&root, ino, b"..")).await?.ino,
                    up => up?.ino,
                }
            };
            if !put(&mut out, None, up, 2, dir, b"..") {
                return Ok(out);
            }
            cookie = 2;
        }
        let from = if cookie == 2 { 0 } else { cookie };
        let mut listing = self.handles.take_listing(fh, from, plus).unwrap_or_else(|| Listing::new(from, plus));
        'fill: loop {
            if listing.entries.is_empty() {
                if listing.end {
                    break;
                }
                // The page asked for ahead, else one asked for now (and
                // again if the first failed: `again` rides out a restart).
                let ahead = match listing.ahead.take() {
                    Some(ahead) => ahead.await.ok().and_then(Result::ok),
                    None => None,
                };
                let (page, end) = match ahead {
                    Some(page) => page,
                    None => {
                        self.again(|| self.client.readdir(who(listing.after), ino, listing.after, PAGE, plus)).await?
                    }
                };
                listing.end = end || page.is_empty();
                listing.entries = page.into();
            }
            while let Some(e) = listing.entries.front() {
                // An entry removed while it was listed has no attributes:
                // skipped (its cookie still counts).
                let removed = plus && e.attr.is_none();
                if !removed && !put(&mut out, e.attr.as_ref(), e.ino, e.cookie, abi::dtype(e.kind), &e.name) {
                    break 'fill;
                }
                listing.after = e.cookie;
                listing.entries.pop_front();
            }
        }
        // Ask for the next page while the kernel takes this one's rest.
        if !listing.end && listing.ahead.is_none() && listing.entries.len() < PAGE as usize / 2 {
            let (client, cred, after) = (self.client.clone(), cred.clone(), listing.next_cookie());
            listing.ahead = Some(tokio::spawn(async move {
                client.readdir(Caller { cred: &cred, opened: after != 0 }, ino, after, PAGE, plus).await
            }));
        }
        self.handles.keep_listing(fh, listing);
        Ok(out)
    }

    /// Tells the kernel to forget `ino`'s cached attributes.
    pub(crate) fn invalidate(&self, ino: Ino) {
        let mut body = Vec::with_capacity(24);
        abi::put64(&mut body, ino);
        abi::put64(&mut body, -1i64 as u64);
        abi::put64(&mut body, 0);
        // ENOENT: the kernel has no such inode cached; nothing to drop.
        if let Err(e) = (&*self.dev).write(&abi::notify(abi::NOTIFY_INVAL_INODE, &body))
            && e.raw_os_error() != Some(libc::ENOENT)
        {
            tracing::debug!(ino, error = %e, "invalidating cached attributes");
        }
    }
}

/// An xattr value or name list for a buffer of `size` (0: just the size).
fn sized(v: Vec<u8>, size: usize) -> Answer {
    if size == 0 {
        let mut out = Vec::with_capacity(8);
        abi::put32(&mut out, v.len() as u32);
        abi::put32(&mut out, 0);
        Ok(out)
    } else if v.len() > size {
        Err(libc::ERANGE)
    } else {
        Ok(v)
    }
}
