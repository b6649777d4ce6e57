//! Writes not yet synced, per file, with the server's write verifier at
//! the first of them ([`Client::verifier`]). A write is answered before
//! the server's disk has it, as `write(2)` returns before the page cache
//! is written back; a crash of the server's machine may lose it, and the
//! mount, which keeps no copy, cannot send it again (as an NFS client
//! does). So an `fsync` seen under another verifier than the writes it
//! should cover fails with `EIO`, as Linux's `fsync` reports a writeback
//! error, once; without this it would succeed over the loss. A file's
//! entry goes with its last close here (as the error of a file nobody
//! has open is reported to nobody), so the table holds only open files.
//!
//! [`Client::verifier`]: interlock_client::Client::verifier

use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::HashMap;
use interlock_client::meta::Ino;
use parking_lot::Mutex;

/// The first unsynced write's verifier, and the number of the last one.
struct Pending {
    verifier: u64,
    last: u64,
}

#[derive(Default)]
pub struct Unsynced {
    files: Mutex<HashMap<Ino, Pending>>,
    /// Numbers the writes noted, in order, across every file.
    writes: AtomicU64,
}

impl Unsynced {
    /// A write to `ino` is about to be sent, the client's verifier being
    /// `verifier` (read now: that of the server that takes the write, or
    /// an earlier one). O(1).
    pub fn wrote(&self, ino: Ino, verifier: u64) {
        let last = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        self.files.lock().entry(ino).or_insert(Pending { verifier, last: 0 }).last = last;
    }

    /// Where an `fsync` about to be sent stands among the writes: those
    /// noted up to now are the ones it covers. O(1).
    pub fn mark(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// An `fsync` of `ino` sent at `mark` succeeded, the client's
    /// verifier being `verifier` after it (that of the server that
    /// synced, or a later one). `EIO` if writes noted under another
    /// verifier may be lost (said once: they are forgotten); else the
    /// writes it covered are forgotten, and any noted since are kept.
    /// O(1).
    pub fn synced(&self, ino: Ino, mark: u64, verifier: u64) -> Result<(), i32> {
        let mut files = self.files.lock();
        let Some(p) = files.get(&ino) else { return Ok(()) };
        let lost = p.verifier != verifier;
        if lost || p.last <= mark {
            files.remove(&ino);
        }
        if lost {
            tracing::error!(
                ino,
                "the server's machine restarted since this file was written: writes not synced before may be lost; \
                 fsync fails with EIO"
            );
            return Err(libc::EIO);
        }
        Ok(())
    }

    /// Forgets `ino` once `closed` says no open of it is left. O(1) and
    /// `closed`.
    pub fn clear_if(&self, ino: Ino, closed: impl FnOnce() -> bool) {
        let mut files = self.files.lock();
        if files.contains_key(&ino) && closed() {
            files.remove(&ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fsync_under_another_verifier_fails_once() {
        let u = Unsynced::default();
        u.wrote(5, 1);
        let mark = u.mark();
        assert_eq!(u.synced(5, mark, 2), Err(libc::EIO));
        assert_eq!(u.synced(5, u.mark(), 2), Ok(()), "said once");
    }

    #[test]
    fn an_fsync_forgets_what_it_covered_and_keeps_later_writes() {
        let u = Unsynced::default();
        u.wrote(5, 1);
        let mark = u.mark();
        // A write while the fsync is on its way: not covered by it.
        u.wrote(5, 1);
        assert_eq!(u.synced(5, mark, 1), Ok(()));
        assert_eq!(u.synced(5, u.mark(), 2), Err(libc::EIO), "the later write was kept");
        // Covered, then a restart: nothing left to lose.
        u.wrote(6, 2);
        assert_eq!(u.synced(6, u.mark(), 2), Ok(()));
        assert_eq!(u.synced(6, u.mark(), 3), Ok(()));
        // Another file's writes are its own.
        u.wrote(7, 2);
        assert_eq!(u.synced(8, u.mark(), 3), Ok(()));
        assert_eq!(u.synced(7, u.mark(), 3), Err(libc::EIO));
    }

    #[test]
    fn the_last_close_forgets_a_file() {
        let u = Unsynced::default();
        u.wrote(5, 1);
        u.clear_if(5, || false);
        assert_eq!(u.synced(5, u.mark(), 2), Err(libc::EIO), "still open");
        u.wrote(5, 1);
        u.clear_if(5, || true);
        assert_eq!(u.synced(5, u.mark(), 2), Ok(()));
    }
}
