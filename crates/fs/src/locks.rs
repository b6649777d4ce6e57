//! fcntl, OFD and flock locks through the mount, onto the lock service.
//!
//! The kernel names a lock's owner with a 64-bit `lock_owner`: the
//! process's file table for POSIX locks, the open file for OFD and flock
//! locks. Each becomes one of the client's 32-bit owner numbers
//! ([`Owners`]). POSIX and OFD requests look alike on the wire (both are
//! `FUSE_SETLK` without `FUSE_LK_FLOCK`), so both are POSIX locks at the
//! server with owners that differ, which is how they conflict in the
//! kernel too; what tells them apart is when they go:
//!
//! - `FUSE_FLUSH` (every `close(2)`) carries the closing process's
//!   `lock_owner`: its POSIX locks on the file go, as POSIX says.
//! - `FUSE_RELEASE` (the last close of an open file) drops every lock
//!   taken through that open file (OFD and flock locks; a POSIX owner's
//!   were dropped at its flush already).
//!
//! Each inode is one resource at the server (`ino/N`), the same name on
//! every mount, so a lock taken on one mount is seen on every other.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use foldhash::{HashMap, HashSet};
use interlock_client::meta::Ino;
use interlock_client::{Client, ClientError, LockSpec};
use interlock_core::{Mode, Range};
use interlock_proto::Kind;
use parking_lot::Mutex;

use interlock_proto::owner;
use tokio::sync::oneshot;

use crate::abi::Args;
use crate::ops::{Answer, Fs};

/// The lock service's resource for an inode.
pub fn resource(ino: Ino) -> Vec<u8> {
    format!("ino/{ino}").into_bytes()
}

/// The inode a resource of [`resource`] names.
pub fn ino_of(resource: &[u8]) -> Option<Ino> {
    std::str::from_utf8(resource.strip_prefix(b"ino/")?).ok()?.parse().ok()
}

/// Inodes whose locks this mount lost (its session's lease ran out, or a
/// reclaim was refused): reads, writes, fsync, setattr and lock calls on
/// them fail with `EIO` rather than act as if the locks were held, until
/// every open of the file here is closed.
#[derive(Default)]
pub struct Lost {
    inos: Mutex<HashSet<Ino>>,
    /// How many of the client's lost locks have been looked at.
    seen: Mutex<usize>,
}

impl Lost {
    /// Marks the files of the locks `client` lost since the last look:
    /// whenever the client reports losses, and before each check. O(1)
    /// when there are none.
    pub fn note(&self, client: &Client) {
        let mut seen = self.seen.lock();
        let lost = client.lost_since(*seen);
        *seen += lost.len();
        for l in lost {
            if let Some(ino) = ino_of(&l.resource) {
                tracing::warn!(
                    ino,
                    "a lock on this file was lost: its reads, writes and locks fail with EIO until it is closed"
                );
                self.inos.lock().insert(ino);
            }
        }
    }

    /// `EIO` if `ino`'s locks were lost, among every loss `client` has
    /// reported so far (noted first: a call that may act under a lock
    /// is never let through on a loss only the client knows of yet).
    pub fn check(&self, client: &Client, ino: Ino) -> Result<(), i32> {
        self.note(client);
        if self.inos.lock().contains(&ino) { Err(libc::EIO) } else { Ok(()) }
    }

    /// Forgets `ino` once `closed` says no open of it is left (asked only
    /// of a lost inode). O(1) and `closed`.
    pub fn clear_if(&self, ino: Ino, closed: impl FnOnce() -> bool) {
        let mut lost = self.inos.lock();
        if lost.contains(&ino) && closed() {
            lost.remove(&ino);
        }
    }
}

/// Kernel lock owners as the client's owner numbers, and the pid that
/// took each owner's last lock (what `F_GETLK` reports on this mount).
///
/// An owner keeps its number while it may hold a lock here: each POSIX
/// (owner, inode) pair and each open file it locked through holds it
/// (taken before the lock is asked for, given back after its locks are
/// dropped). Then it is forgotten, so the table holds the owners that
/// may hold locks, not every process that ever locked (kernel owners are
/// addresses, reused by later processes: a new one simply gets a new
/// number).
#[derive(Default)]
pub struct Owners {
    /// Kernel owner -> its number, and the holds on it.
    numbers: Mutex<HashMap<u64, (u32, u32)>>,
    pids: Mutex<HashMap<u32, u32>>,
    next: AtomicU32,
    /// (kernel owner, inode) pairs holding POSIX locks: a flush of
    /// anything else asks the server nothing.
    posix: Mutex<HashSet<(u64, Ino)>>,
}

impl Owners {
    /// The number of kernel owner `owner`: the one it holds, else a new
    /// one (an owner that holds none has no locks here, so any unused
    /// number tests and unlocks the same). O(1).
    pub fn number(&self, owner: u64) -> u32 {
        self.numbers.lock().get(&owner).map_or_else(|| self.fresh(), |&(n, _)| n)
    }

    fn fresh(&self) -> u32 {
        self.next.fetch_add(1, Relaxed) + 1
    }

    /// `owner` may take locks through one more file or on one more
    /// inode; its number. O(1).
    pub fn hold(&self, owner: u64) -> u32 {
        let mut numbers = self.numbers.lock();
        let (number, holds) = numbers.entry(owner).or_insert_with(|| (self.fresh(), 0));
        *holds += 1;
        *number
    }

    /// One hold of `owner` fewer; at none it is forgotten. O(1).
    pub fn unhold(&self, owner: u64) {
        let mut numbers = self.numbers.lock();
        if let Some((number, holds)) = numbers.get_mut(&owner) {
            *holds -= 1;
            if *holds == 0 {
                let number = *number;
                numbers.remove(&owner);
                self.pids.lock().remove(&number);
            }
        }
    }

    pub fn note_pid(&self, number: u32, pid: u32) {
        self.pids.lock().insert(number, pid);
    }

    pub fn pid(&self, number: u32) -> u32 {
        self.pids.lock().get(&number).copied().unwrap_or(0)
    }

    /// `owner` may take POSIX locks on `ino`: held once per pair.
    pub fn note_posix(&self, owner: u64, ino: Ino) {
        if self.posix.lock().insert((owner, ino)) {
            self.hold(owner);
        }
    }

    /// Whether `owner` may hold POSIX locks on `ino`; forgets the pair
    /// (the caller drops the locks, then calls [`unhold`](Self::unhold)).
    pub fn take_posix(&self, owner: u64, ino: Ino) -> bool {
        self.posix.lock().remove(&(owner, ino))
    }

    /// Owners with numbers (for tests of the table's bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.numbers.lock().len()
    }
}

/// `fuse_lk_in`: which lock, for whom.
#[derive(Clone, Copy, Debug)]
pub struct LkIn {
    pub fh: u64,
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    pub typ: u32,
    pub pid: u32,
    pub flock: bool,
}

impl LkIn {
    pub fn parse(a: &mut Args<'_>) -> Result<LkIn, crate::abi::Malformed> {
        let (fh, owner, start, end, typ, pid, flags) =
            (a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u32()?, a.u32()?, a.u32()?);
        Ok(LkIn { fh, owner, start, end, typ, pid, flock: flags & crate::abi::LK_FLOCK != 0 })
    }

    pub fn kind(&self) -> Kind {
        if self.flock { Kind::Flock } else { Kind::Posix }
    }

    /// What the request asks for: a mode (`NL`: unlock) and a range;
    /// `EINVAL` for a type or range the kernel should not have sent.
    pub fn request(&self) -> Result<(Mode, Range), i32> {
        let mode = match self.typ as i32 {
            libc::F_RDLCK => Mode::PR,
            libc::F_WRLCK => Mode::EX,
            libc::F_UNLCK => Mode::NL,
            _ => return Err(libc::EINVAL),
        };
        let range =
            if self.flock { Range::WHOLE } else { Range::new(self.start, self.end).map_err(|_| libc::EINVAL)? };
        Ok((mode, range))
    }

    /// The request (from [`request`](Self::request)) as the client takes
    /// it, for owner number `owner`.
    pub fn spec(&self, ino: Ino, owner: u32, (mode, range): (Mode, Range)) -> LockSpec {
        LockSpec { resource: resource(ino), kind: self.kind(), owner, mode, range }
    }
}

/// `fuse_lk_out` for a conflicting lock (or `F_UNLCK`: none).
pub fn lk_out(start: u64, end: u64, mode: Option<u8>, pid: u32) -> Vec<u8> {
    let typ = match mode {
        None => libc::F_UNLCK,
        Some(m) if m == Mode::PR as u8 => libc::F_RDLCK,
        Some(_) => libc::F_WRLCK,
    };
    let mut out = Vec::with_capacity(24);
    crate::abi::put64(&mut out, start);
    crate::abi::put64(&mut out, end);
    crate::abi::put32(&mut out, typ as u32);
    crate::abi::put32(&mut out, pid);
    out
}

/// The errno a failed client call gives the caller.
pub fn errno(e: &ClientError) -> i32 {
    match e {
        ClientError::Errno(n) => *n,
        ClientError::Deadlock => libc::EDEADLK,
        ClientError::Limit(_) => libc::ENOLCK,
        ClientError::Recovering(_) => libc::EAGAIN,
        ClientError::Invalid(_) => libc::EINVAL,
        ClientError::LockLost | ClientError::ConnectionLost | ClientError::Unread => libc::EIO,
        other => {
            tracing::warn!(error = %other, "a call to the server failed");
            libc::EIO
        }
    }
}

impl Fs {
    /// `F_GETLK`/`F_OFD_GETLK`: the first conflicting lock at the server,
    /// with the pid that took it if it is this mount's, else 0 (a holder
    /// on another mount is in no pid namespace here). With `F_UNLCK`
    /// (`F_OFD_GETLK` only, Linux 6.3), the open file's own first lock
    /// on the range.
    pub(crate) async fn getlk(&self, ino: Ino, a: &mut Args<'_>) -> Answer {
        let lk = LkIn::parse(a)?;
        let owner = self.owners.number(lk.owner);
        let spec = &lk.spec(ino, owner, lk.request()?);
        let out = match self.on_file(ino, true, |c| async move { c.test(spec).await }).await? {
            None => lk_out(lk.start, lk.end, None, 0),
            Some(c) => {
                let here = owner::session(c.owner) == self.client.session();
                let pid = if here { self.owners.pid(owner::number(c.owner)) } else { 0 };
                lk_out(c.start, c.end, Some(c.mode), pid)
            }
        };
        Ok(out)
    }

    /// `F_SETLK(W)`, `F_OFD_SETLK(W)`, `flock`: a lock or an unlock at
    /// the server. A blocking request (`wait`) waits there, in FIFO order,
    /// holding no thread. If `cancel` fires (the caller was interrupted
    /// in a wait, or is dying, or a soft mount's time for the request is
    /// up: see `session`), the request is withdrawn and the caller gets
    /// the errno it carries (`EINTR`, `EIO`): dropping the client's lock future
    /// withdraws it at the server and gives back a grant on its way; an
    /// unlock already sent is made, one not sent is left to the close of
    /// the caller's files. A grant drops the kernel's cached attributes,
    /// so what was written under the lock elsewhere shows here.
    pub(crate) async fn setlk(
        &self,
        ino: Ino,
        a: &mut Args<'_>,
        wait: bool,
        cancel: Option<oneshot::Receiver<i32>>,
    ) -> Answer {
        let lk = LkIn::parse(a)?;
        let asked = lk.request()?;
        let withdrawn = async {
            // A cancel dropped unfired withdraws nothing.
            match cancel {
                Some(rx) => match rx.await {
                    Ok(errno) => errno,
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        if asked.0 == Mode::NL {
            let spec = &lk.spec(ino, self.owners.number(lk.owner), asked);
            tokio::select! {
                r = self.on_file(ino, true, |c| async move { c.unlock(spec).await }) => r?,
                errno = withdrawn => return Err(errno),
            }
            return Ok(Vec::new());
        }
        // Held before the request goes: the number stays while the lock
        // may be held.
        if let Some(h) = self.handles.get(lk.fh)
            && h.lockers.lock().insert((lk.kind(), lk.owner))
        {
            self.owners.hold(lk.owner);
        }
        if !lk.flock {
            self.owners.note_posix(lk.owner, ino);
        }
        let owner = self.owners.number(lk.owner);
        let spec = &lk.spec(ino, owner, asked);
        let asking = async {
            if wait {
                self.client.lock(spec).await.map(|_| true).map_err(|e| errno(&e))
            } else {
                self.on_file(ino, true, |c| async move { c.try_lock(spec).await }).await.map(|g| g.is_some())
            }
        };
        let granted = tokio::select! {
            r = asking => r?,
            errno = withdrawn => return Err(errno),
        };
        if !granted {
            return Err(libc::EAGAIN);
        }
        self.owners.note_pid(owner, lk.pid);
        self.invalidate(ino);
        Ok(Vec::new())
    }

    /// Every `close(2)`: the closing process's POSIX locks on the file go
    /// (asked of the server only if it took any here).
    pub(crate) async fn flush(&self, ino: Ino, a: &mut Args<'_>) -> Answer {
        a.skip(16)?;
        let owner = a.u64()?;
        if self.owners.take_posix(owner, ino) {
            let number = self.owners.number(owner);
            let closed = self.client.close(&resource(ino), Kind::Posix, number).await;
            self.owners.unhold(owner);
            closed.map_err(|e| errno(&e))?;
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_owners_get_stable_distinct_numbers() {
        let o = Owners::default();
        let a = o.hold(0xdead_beef_0000);
        let b = o.hold(0xdead_beef_0008);
        assert_ne!(a, b);
        assert_eq!(o.number(0xdead_beef_0000), a);
        assert_eq!(o.hold(0xdead_beef_0000), a);
        assert_ne!(o.number(0xdead_beef_0010), o.number(0xdead_beef_0010), "no number kept without a hold");
        assert_eq!(ino_of(&resource(12345)), Some(12345));
        assert_eq!(ino_of(b"ino/x"), None);
        assert_eq!(ino_of(b"backup"), None);
        o.note_posix(1, 5);
        assert!(o.take_posix(1, 5));
        assert!(!o.take_posix(1, 5));
    }

    /// Owners that took locks and dropped them all leave no trace: the
    /// table is bounded by the owners that may hold locks, not by every
    /// process that ever locked.
    #[test]
    fn an_owner_is_forgotten_when_nothing_holds_it() {
        let o = Owners::default();
        for owner in 0..10_000u64 {
            // A POSIX lock through an open file: the pair and the file
            // hold the owner, with one number.
            let n = o.hold(owner);
            o.note_posix(owner, 7);
            o.note_posix(owner, 7);
            assert_eq!(o.number(owner), n);
            o.note_pid(n, 42);
            assert_eq!(o.pid(n), 42);
            assert!(o.take_posix(owner, 7));
            o.unhold(owner);
            assert_eq!(o.number(owner), n, "the file still holds it");
            o.unhold(owner);
            assert_eq!(o.pid(n), 0);
        }
        assert_eq!(o.len(), 0);
        o.hold(1);
        o.hold(2);
        assert_eq!(o.len(), 2);
    }

    #[test]
    fn lock_types_map_to_modes_and_back() {
        let lk = LkIn { fh: 1, owner: 2, start: 0, end: 9, typ: libc::F_WRLCK as u32, pid: 3, flock: false };
        let spec = lk.spec(7, 1, lk.request().unwrap());
        assert_eq!((spec.mode, spec.kind, spec.owner), (Mode::EX, Kind::Posix, 1));
        assert_eq!(spec.range, Range::new(0, 9).unwrap());
        let read = LkIn { flock: true, typ: libc::F_RDLCK as u32, ..lk };
        let spec = read.spec(7, 1, read.request().unwrap());
        assert_eq!((spec.mode, spec.kind, spec.range), (Mode::PR, Kind::Flock, Range::WHOLE));
        assert_eq!(LkIn { typ: libc::F_UNLCK as u32, ..lk }.request().unwrap().0, Mode::NL);
        assert_eq!(LkIn { typ: 99, ..lk }.request(), Err(libc::EINVAL));
        assert_eq!(LkIn { start: 9, end: 0, ..lk }.request(), Err(libc::EINVAL));
        assert_eq!(&lk_out(0, 9, Some(Mode::PR as u8), 0)[16..20], &(libc::F_RDLCK as u32).to_ne_bytes());
        assert_eq!(&lk_out(0, 9, None, 0)[16..20], &(libc::F_UNLCK as u32).to_ne_bytes());
    }
}
