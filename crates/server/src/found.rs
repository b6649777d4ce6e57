//! The files each session has just found by name: its open of one may
//! open it even if its last name went since the look-up (the namespace
//! held it for that open: see `interlock_meta`'s `held`). A mount's
//! kernel opens a file by looking its name up, then opening the inode
//! it found; another mount's rename over the name between the two must
//! not fail the open.
//!
//! Per session, a table of [`SLOTS`] numbers indexed by the number's
//! low bits, made at the session's first look-up of a file (8 KiB): a
//! look-up writes its slot, an open takes it (a `getattr` only asks:
//! a kernel may ask for the attributes of what its walk found first). Two files found at once
//! that share a slot leave the first unmarked, and its open, if its
//! name went meanwhile, fails with `ESTALE` as before (the kernel then
//! walks the path again). Costs: O(1) a look-up and an open.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use interlock_meta::Ino;

/// Slots per session.
const SLOTS: usize = 1024;

#[derive(Default)]
pub(crate) struct Found(scc::HashMap<u64, Box<[AtomicU64]>, foldhash::fast::RandomState>);

impl Found {
    fn slot(ino: Ino) -> usize {
        ino as usize % SLOTS
    }

    /// Session `sid` looked up file `ino`.
    pub fn note(&self, sid: u64, ino: Ino) {
        let noted = self.0.read_sync(&sid, |_, t| t[Self::slot(ino)].store(ino, Relaxed));
        if noted.is_none() {
            let t = self.0.entry_sync(sid).or_insert_with(|| (0..SLOTS).map(|_| AtomicU64::new(0)).collect());
            t.get()[Self::slot(ino)].store(ino, Relaxed);
        }
    }

    /// Whether session `sid` found `ino` by its last look-up in that
    /// slot (not yet taken).
    pub fn has(&self, sid: u64, ino: Ino) -> bool {
        self.0.read_sync(&sid, |_, t| t[Self::slot(ino)].load(Relaxed) == ino).unwrap_or(false)
    }

    /// Whether session `sid` found `ino` by its last look-up in that
    /// slot; forgets it.
    pub fn take(&self, sid: u64, ino: Ino) -> bool {
        self.0
            .read_sync(&sid, |_, t| t[Self::slot(ino)].compare_exchange(ino, 0, Relaxed, Relaxed).is_ok())
            .unwrap_or(false)
    }

    /// Session `sid` ended.
    pub fn end(&self, sid: u64) {
        self.0.remove_sync(&sid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_takes_what_its_sessions_look_up_found() {
        let found = Found::default();
        assert!(!found.take(1, 7), "nothing looked up");
        found.note(1, 7);
        assert!(!found.take(2, 7), "another session's look-up");
        assert!(found.has(1, 7) && found.has(1, 7), "asking takes nothing");
        assert!(found.take(1, 7));
        assert!(!found.take(1, 7), "taken by the first open");
        found.note(1, 7);
        found.note(1, 7 + SLOTS as u64);
        assert!(!found.take(1, 7), "its slot taken by a later look-up");
        assert!(found.take(1, 7 + SLOTS as u64));
        found.note(1, 9);
        found.end(1);
        assert!(!found.take(1, 9), "the session ended");
    }
}
