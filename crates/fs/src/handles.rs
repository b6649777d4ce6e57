//! Open files: the kernel's file handle (`fh`) for each open, the inode
//! it opened, and the lock owners that locked through it (whose locks go
//! when it is released). Each handle holds the inode open at the server,
//! so a file unlinked while open here keeps its data until released.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use foldhash::{HashMap, HashSet};
use interlock_client::meta::Ino;
use interlock_proto::Kind;
use parking_lot::Mutex;

pub struct Handle {
    pub ino: Ino,
    /// (kind, kernel owner) of every lock taken through this handle.
    pub lockers: Mutex<HashSet<(Kind, u64)>>,
}

#[derive(Default)]
pub struct Handles {
    open: Mutex<HashMap<u64, Arc<Handle>>>,
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
}
