//! Locking for entry operations, so that one shared directory never
//! serializes its creators (seed 003): an operation holds its
//! directories' intention locks (shared for the directories whose
//! entries it changes, exclusive for a directory it removes or replaces)
//! and then exclusive locks on the stripes of the names it touches,
//! `(directory, name hash)` spread over [`STRIPES`] locks. Two creates
//! of different names in one directory share the intention lock and take
//! different stripes (unless their hashes meet in one of 4096).
//!
//! Deadlock freedom: every operation takes intention locks in inode
//! order, then stripes in index order, and nothing else while it holds
//! them (a directory rename that crosses directories first takes the
//! namespace's rename lock, as Linux's `s_vfs_rename_mutex`, so that the
//! tree's shape holds still while it checks for loops).

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::inode::Inode;
use crate::types::Ino;

/// Name stripes: a power of two.
pub(crate) const STRIPES: usize = 4096;

pub(crate) struct Stripes(Box<[RwLock<()>]>);

impl Default for Stripes {
    fn default() -> Self {
        Stripes((0..STRIPES).map(|_| RwLock::new(())).collect())
    }
}

/// The stripe of a name's hash in a directory.
pub(crate) fn stripe(parent: Ino, hash: u64) -> usize {
    (hash ^ parent.wrapping_mul(0x9e37_79b9_7f4a_7c15)) as usize & (STRIPES - 1)
}

/// Locks held; released on drop.
pub(crate) struct Held<'a> {
    _shared: Vec<RwLockReadGuard<'a, ()>>,
    _exclusive: Vec<RwLockWriteGuard<'a, ()>>,
}

impl Stripes {
    /// Takes the intention locks of `dirs` (exclusive where marked; a
    /// directory listed twice is locked once, exclusive if either asks)
    /// and the stripes of `names`, in the global order.
    pub fn lock<'a>(&'a self, dirs: &[(&'a Inode, bool)], names: &[usize]) -> Held<'a> {
        let mut dirs: Vec<(&Inode, bool)> = dirs.to_vec();
        dirs.sort_by_key(|(i, excl)| (i.ino, !excl));
        dirs.dedup_by_key(|(i, _)| i.ino);
        let (mut shared, mut exclusive) = (Vec::new(), Vec::new());
        for (i, excl) in dirs {
            let l = &i.dir().intent;
            if excl {
                exclusive.push(l.write());
            } else {
                shared.push(l.read());
            }
        }
        let mut names = names.to_vec();
        names.sort_unstable();
        names.dedup();
        exclusive.extend(names.into_iter().map(|s| self.0[s].write()));
        Held { _shared: shared, _exclusive: exclusive }
    }

    /// Runs `f` while no change is between its record and its apply:
    /// every change holds at least one stripe across both, and this
    /// takes them all (in order, so it joins the global order). A
    /// checkpoint uses it to pick the log position its image starts from.
    /// O(STRIPES) uncontended locks, plus the wait for changes in flight:
    /// tens of microseconds, whatever the namespace's size.
    pub fn quiesce<T>(&self, f: impl FnOnce() -> T) -> T {
        let _all: Vec<RwLockWriteGuard<'_, ()>> = self.0.iter().map(|l| l.write()).collect();
        f()
    }
}
