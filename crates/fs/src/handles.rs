//! Open files: the kernel's file handle (`fh`) for each open, the inode
//! it opened, and the lock owners that locked through it (whose locks go
//! when it is released). Each handle holds the inode open at the server,
//! so a file unlinked while open here keeps its data until released. And
//! open directories, with where each one's listing stands.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use foldhash::{HashMap, HashSet};
use interlock_client::ClientError;
use interlock_client::meta::{Cred, Entry, Ino};
use interlock_proto::Kind;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

pub struct Handle {
    pub ino: Ino,
    /// (kind, kernel owner) of every lock taken through this handle.
    pub lockers: Mutex<HashSet<(Kind, u64)>>,
}

/// A server page of a listing: its entries, and whether the listing ends
/// with them.
pub type Page = (Vec<Entry>, bool);

/// Where a directory handle's listing stands: the entries fetched but not
/// yet given to the kernel (those after cookie `after`), and the server
/// page after them, asked for ahead so that the kernel's next calls find
/// it here rather than wait for a round trip (`du` lists while it stats).
pub struct Listing {
    pub after: u64,
    pub plus: bool,
    pub entries: VecDeque<Entry>,
    /// The server said the listing ends with `entries`.
    pub end: bool,
    /// The page after `entries`, on its way.
    pub ahead: Option<JoinHandle<Result<Page, ClientError>>>,
}

impl Listing {
    /// A listing from cookie `after` with nothing fetched yet.
    pub fn new(after: u64, plus: bool) -> Listing {
        Listing { after, plus, entries: VecDeque::new(), end: false, ahead: None }
    }

    /// Where the page after the fetched entries starts.
    pub fn next_cookie(&self) -> u64 {
        self.entries.back().map_or(self.after, |e| e.cookie)
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        if let Some(ahead) = &self.ahead {
            ahead.abort();
        }
    }
}

/// The open files: each handle, and how many each inode has.
#[derive(Default)]
struct Open {
    handles: HashMap<u64, Arc<Handle>>,
    per_ino: HashMap<Ino, usize>,
}

#[derive(Default)]
pub struct Handles {
    open: Mutex<Open>,
    /// Open directories: who opened each (its listings are checked with
    /// these credentials, as a file's data calls are) and where its
    /// listing stands.
    dirs: Mutex<HashMap<u64, (Cred, Option<Listing>)>>,
    next: AtomicU64,
}

impl Handles {
    /// A new handle of `ino`. O(1).
    pub fn insert(&self, ino: Ino) -> u64 {
        let fh = self.next.fetch_add(1, Relaxed) + 1;
        let mut open = self.open.lock();
        open.handles.insert(fh, Arc::new(Handle { ino, lockers: Mutex::default() }));
        *open.per_ino.entry(ino).or_default() += 1;
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.open.lock().handles.get(&fh).cloned()
    }

    /// Whether file handle `fh` is open. O(1).
    pub fn has(&self, fh: u64) -> bool {
        self.open.lock().handles.contains_key(&fh)
    }

    /// Closes handle `fh`. O(1).
    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        let mut open = self.open.lock();
        let handle = open.handles.remove(&fh)?;
        if let Some(n) = open.per_ino.get_mut(&handle.ino) {
            *n -= 1;
            if *n == 0 {
                open.per_ino.remove(&handle.ino);
            }
        }
        Some(handle)
    }

    /// Whether an open handle of `ino` has locked as `(kind, owner)`.
    /// O(open files).
    pub fn locked_through_another(&self, ino: Ino, locker: (Kind, u64)) -> bool {
        self.open.lock().handles.values().any(|h| h.ino == ino && h.lockers.lock().contains(&locker))
    }

    /// Whether any handle of `ino` is open. O(1).
    pub fn is_open(&self, ino: Ino) -> bool {
        self.open.lock().per_ino.contains_key(&ino)
    }

    /// A new directory handle, opened by `cred`. O(1).
    pub fn open_dir(&self, cred: Cred) -> u64 {
        let fh = self.next.fetch_add(1, Relaxed) + 1;
        self.dirs.lock().insert(fh, (cred, None));
        fh
    }

    /// Who opened directory handle `fh`, if it is open. O(1).
    pub fn dir_opener(&self, fh: u64) -> Option<Cred> {
        self.dirs.lock().get(&fh).map(|(cred, _)| cred.clone())
    }

    pub fn close_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    /// Directory handle `fh`'s listing, if it goes on from cookie
    /// `after` (a listing that seeks elsewhere starts afresh). O(1).
    pub fn take_listing(&self, fh: u64, after: u64, plus: bool) -> Option<Listing> {
        let mut dirs = self.dirs.lock();
        let (_, slot) = dirs.get_mut(&fh)?;
        slot.take().filter(|l| l.after == after && l.plus == plus)
    }

    /// Keeps a listing for the handle's next call (unless it was closed).
    pub fn keep_listing(&self, fh: u64, listing: Listing) {
        if let Some((_, slot)) = self.dirs.lock().get_mut(&fh) {
            *slot = Some(listing);
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
