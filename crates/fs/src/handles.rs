//! Open files: the kernel's file handle (`fh`) for each open, the inode
//! it opened, and the lock owners that locked through it (whose locks go
//! when it is released). Each handle holds the inode open at the server,
//! so a file unlinked while open here keeps its data until released.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use foldhash::{HashMap, HashSet};
use interlock_client::meta::{Entry, Ino};
use interlock_proto::Kind;
use parking_lot::Mutex;

pub struct Handle {
    pub ino: Ino,
    /// (kind, kernel owner) of every lock taken through this handle.
    pub lockers: Mutex<HashSet<(Kind, u64)>>,
}

/// Entries of a listing fetched but not yet given to the kernel: those
/// after cookie `after`, and whether the listing ends with them.
struct Page {
    after: u64,
    plus: bool,
    entries: Vec<Entry>,
    end: bool,
}

#[derive(Default)]
pub struct Handles {
    open: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Open directories and what each has fetched ahead.
    dirs: Mutex<HashMap<u64, Option<Page>>>,
    next: AtomicU64,
}

impl Handles {
    /// A new handle of `ino`. O(1).
    pub fn insert(&self, ino: Ino) -> u64 {
        let fh = self.next.fetch_add(1, Relaxed) + 1;
        self.open.lock().insert(fh, Arc::new(Handle { ino, lockers: Mutex::default() }));
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.open.lock().get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.open.lock().remove(&fh)
    }

    /// Whether an open handle of `ino` has locked as `(kind, owner)`.
    /// O(open files).
    pub fn locked_through_another(&self, ino: Ino, locker: (Kind, u64)) -> bool {
        self.open.lock().values().any(|h| h.ino == ino && h.lockers.lock().contains(&locker))
    }

    /// Whether any handle of `ino` is open. O(open files).
    pub fn is_open(&self, ino: Ino) -> bool {
        self.open.lock().values().any(|h| h.ino == ino)
    }

    /// A new directory handle. O(1).
    pub fn open_dir(&self) -> u64 {
        let fh = self.next.fetch_add(1, Relaxed) + 1;
        self.dirs.lock().insert(fh, None);
        fh
    }

    pub fn close_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    /// The entries fetched ahead for directory handle `fh` that follow
    /// cookie `after`, if that is where they start (a listing that seeks
    /// elsewhere asks the server again).
    pub fn take_page(&self, fh: u64, after: u64, plus: bool) -> Option<(Vec<Entry>, bool)> {
        let mut dirs = self.dirs.lock();
        let slot = dirs.get_mut(&fh)?;
        match slot.take() {
            Some(p) if p.after == after && p.plus == plus => Some((p.entries, p.end)),
            _ => None,
        }
    }

    pub fn keep_page(&self, fh: u64, after: u64, plus: bool, entries: Vec<Entry>, end: bool) {
        if let Some(slot) = self.dirs.lock().get_mut(&fh) {
            *slot = Some(Page { after, plus, entries, end });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locker_seen_through_another_open_handle_is_found() {
        let h = Handles::default();
        let (one, two) = (h.insert(7), h.insert(7));
        h.get(one).unwrap().lockers.lock().insert((Kind::Flock, 42));
        let gone = h.remove(one).unwrap();
        assert!(gone.lockers.lock().contains(&(Kind::Flock, 42)));
        assert!(!h.locked_through_another(7, (Kind::Flock, 42)));
        h.get(two).unwrap().lockers.lock().insert((Kind::Flock, 42));
        assert!(h.locked_through_another(7, (Kind::Flock, 42)));
        assert!(!h.locked_through_another(8, (Kind::Flock, 42)));
        assert!(h.is_open(7));
        h.remove(two);
        assert!(!h.is_open(7));
    }
}
