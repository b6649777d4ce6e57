//! Locking for entry operations, so that one shared directory never
//! serializes its creators (seed 003): an operation holds its
//! directories' intention locks (shared for the directories whose
//! entries it changes, on the calling thread's line of a busy one, see
//! `spread`; exclusive for a directory it removes or replaces)
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

use smallvec::SmallVec;

use crate::inode::Inode;
use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use crate::types::Ino;

/// Name stripes: a power of two (four under the model checker, which
/// explores every interleaving).
pub(crate) const STRIPES: usize = if cfg!(loom) { 4 } else { 4096 };

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

/// Locks held; released on drop. (Inline: an operation holds a few; the
/// four vectors a create allocated for them cost it ~6% of its CPU in
/// the namespace alone, 1.39-1.41 µs against 1.29-1.32.)
pub(crate) struct Held<'a> {
    _shared: SmallVec<[RwLockReadGuard<'a, ()>; 2]>,
    _exclusive: SmallVec<[RwLockWriteGuard<'a, ()>; 4]>,
}

impl Stripes {
    /// Takes the intention locks of `dirs` (exclusive where marked; a
    /// directory listed twice is locked once, exclusive if either asks)
    /// and the stripes of `names`, in the global order.
    pub fn lock<'a>(&'a self, dirs: &[(&'a Inode, bool)], names: &[usize]) -> Held<'a> {
        let mut dirs: SmallVec<[(&Inode, bool); 4]> = dirs.into();
        dirs.sort_by_key(|(i, excl)| (i.ino, !excl));
        dirs.dedup_by_key(|(i, _)| i.ino);
        let (mut shared, mut exclusive) = (SmallVec::new(), SmallVec::new());
        for (i, excl) in dirs {
            let l = &i.dir().intent;
            if excl {
                exclusive.extend(l.exclude());
            } else {
                shared.push(l.share());
            }
        }
        let mut names: SmallVec<[usize; 4]> = names.into();
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

/// The lock order under `loom`: an entry operation, two renames each
/// replacing the other's parent directory (intention locks asked for in
/// opposite orders, one of them twice) and a checkpoint's quiesce, in
/// every interleaving: none deadlocks (without the global order, the two
/// renames do), a stripe excludes its other holders, and an exclusive
/// intention lock excludes the shared ones. Run by `scripts/test` (`RUSTFLAGS="--cfg loom"`).
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU32, Ordering::SeqCst};

    use super::Stripes;
    use crate::access::Owner;
    use crate::inode::{Inode, Meta};
    use crate::types::FileType;

    fn dir(ino: u64) -> Inode {
        let owner = Owner { kind: FileType::Directory, perm: 0o755, uid: 0, gid: 0 };
        Inode::new(ino, owner, Meta::new(0, b"", 0), 0, 1)
    }

    /// Counts itself in while alive; asserts it is alone (`alone`) or
    /// that no one alone is in (`beside`).
    fn enter(count: &AtomicU32, alone: bool) {
        let before = count.fetch_add(if alone { 1000 } else { 1 }, SeqCst);
        assert!(if alone { before == 0 } else { before < 1000 }, "two holders where one may be: {before}");
    }

    fn leave(count: &AtomicU32, alone: bool) {
        count.fetch_sub(if alone { 1000 } else { 1 }, SeqCst);
    }

    #[test]
    fn entry_operations_renames_and_quiesce_never_deadlock_and_exclude() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let stripes = Arc::new(Stripes::default());
            let (a, b) = (Arc::new(dir(2)), Arc::new(dir(3)));
            // Holders of stripe 1, and of directory a's intention lock.
            let name = Arc::new(AtomicU32::new(0));
            let in_a = Arc::new(AtomicU32::new(0));
            // An entry operation in a.
            let create = {
                let (s, a, name, in_a) = (stripes.clone(), a.clone(), name.clone(), in_a.clone());
                loom::thread::spawn(move || {
                    let _held = s.lock(&[(&a, false)], &[1]);
                    enter(&name, true);
                    enter(&in_a, false);
                    leave(&in_a, false);
                    leave(&name, true);
                })
            };
            // A rename in b replacing directory a (asked for twice, once
            // exclusive), its names given in reverse order.
            let replace_a = {
                let (s, a, b, name, in_a) = (stripes.clone(), a.clone(), b.clone(), name.clone(), in_a.clone());
                loom::thread::spawn(move || {
                    let _held = s.lock(&[(&b, false), (&a, true), (&a, false)], &[2, 1]);
                    enter(&name, true);
                    enter(&in_a, true);
                    leave(&in_a, true);
                    leave(&name, true);
                })
            };
            // A rename in a replacing directory b: the other order.
            let replace_b = {
                let (s, a, b, in_a) = (stripes.clone(), a.clone(), b.clone(), in_a.clone());
                loom::thread::spawn(move || {
                    let _held = s.lock(&[(&a, false), (&b, true)], &[2]);
                    enter(&in_a, false);
                    leave(&in_a, false);
                })
            };
            stripes.quiesce(|| ());
            for t in [create, replace_a, replace_b] {
                t.join().unwrap();
            }
        });
    }

    /// A busy directory's intention lock (see `spread`): one thread takes
    /// it shared twice, first on the base (which spreads the directory,
    /// busy already) and then on line 0, while a second takes it shared on
    /// line 1 (or the base, if it comes first) and a third exclusive: in
    /// every interleaving the exclusive holder is alone. (An exclusive
    /// holder that took the base alone would meet the holders on lines.)
    #[test]
    fn a_spread_directorys_exclusive_holder_excludes_every_line() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let d = Arc::new(dir(2));
            for _ in 0..crate::spread::BUSY {
                d.dir().intent.add();
            }
            let in_d = Arc::new(AtomicU32::new(0));
            let shared = |line: usize, times: usize| {
                let (d, in_d) = (d.clone(), in_d.clone());
                loom::thread::spawn(move || {
                    for _ in 0..times {
                        let _held = d.dir().intent.share_on(line);
                        enter(&in_d, false);
                        leave(&in_d, false);
                    }
                })
            };
            let (first, second) = (shared(0, 2), shared(1, 1));
            {
                let _held = d.dir().intent.exclude();
                enter(&in_d, true);
                leave(&in_d, true);
            }
            for t in [first, second] {
                t.join().unwrap();
            }
        });
    }
}
