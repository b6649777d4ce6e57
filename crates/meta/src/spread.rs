//! What every creator in one directory would write (its intention lock,
//! entry count and times), spread over lines of their own per thread, so
//! that two cores creating in one directory do not pass the same cache
//! line back and forth on every create (seed 003's shape). A line's trip
//! between the two cores of the machine that measured it takes ~130 ns;
//! the directory's lock, count and times written by every create, with
//! its owner read under its mutex, its reference count and one inode
//! counter, held two creators on two cores to 1.23× one (session 28,
//! `bench mdtest --variant memory`; see `docs/architecture.md`). The other
//! writes went too: owner and mode are atomics read without a lock
//! (`inode`), the directory is borrowed without its reference count
//! (`Namespace::inode_in`) and inode numbers come in blocks per thread
//! (`Namespace::new_ino`).
//!
//! A directory starts with one intention lock, one count and its inode's
//! times. Once it holds [`BUSY`] entries it is *spread*: [`LINES`] more
//! locks, counts and pairs of times, each set on a line of its own, and a
//! thread takes the shared lock of, counts on, and moves the times of,
//! the line it was dealt ([`line`]). The count is then the base's plus
//! every line's (each may go below zero on its own: a thread may remove
//! what another made; the sum wraps back), and each time the latest of
//! the inode's and the lines'. Setting the directory's times (utimens,
//! chmod) sets the inode's and drops the lines': the same outcome as one
//! time moved forward by every change, whatever the order. An exclusive
//! holder (removing or replacing the directory) takes the base lock and
//! then, if the directory is spread, every line's.
//!
//! Why that excludes every shared holder: a directory is spread only by a
//! thread that holds its base lock shared ([`Intent::share`]). So while an
//! exclusive holder holds the base, no directory becomes spread; it looks
//! at whether this one is after taking the base, and that answer holds
//! until it lets go. If it was spread, the exclusive holder takes every
//! line too; if not, every shared holder took the base.
//!
//! Costs: sharing O(1); counting and moving the times O(1); excluding,
//! reading the count or the times, setting the times O([`LINES`]). A
//! spread directory carries [`LINES`] lines more (1 KiB) for as long as
//! it lives: ≤ 4 bytes per entry at [`BUSY`].

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};

use smallvec::SmallVec;

use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use crate::types::Nanos;

/// Lines a spread directory has: threads are dealt them in turn, so up to
/// this many threads creating in one directory share none.
pub(crate) const LINES: usize = if cfg!(loom) { 2 } else { 8 };

/// Entries from which a directory is spread (when a thread takes its
/// lock shared and finds it so).
pub(crate) const BUSY: u64 = 256;

/// The line the calling thread was dealt: threads take the next one, in
/// turn, the first time they ask. O(1).
pub(crate) fn line() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static LINE: usize = NEXT.fetch_add(1, Relaxed) % LINES);
    LINE.with(|l| *l)
}

/// A lock, a count and times on a line of their own (two lines: Intel's
/// prefetcher fetches lines in pairs).
#[repr(align(128))]
struct Line {
    intent: RwLock<()>,
    entries: AtomicU64,
    /// The latest change made on this line ([`Nanos::MIN`] for none
    /// since the directory's own times were set).
    mtime: AtomicI64,
    ctime: AtomicI64,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            intent: RwLock::new(()),
            entries: AtomicU64::new(0),
            mtime: AtomicI64::new(Nanos::MIN),
            ctime: AtomicI64::new(Nanos::MIN),
        }
    }
}

/// A directory's intention lock, entry count and, once spread, the times
/// its entry operations move.
#[derive(Default)]
pub(crate) struct Intent {
    base: RwLock<()>,
    entries: AtomicU64,
    spread: OnceLock<Box<[Line; LINES]>>,
}

impl Intent {
    /// Takes the lock shared, on the calling thread's line if the
    /// directory is spread; spreads it if it is busy.
    pub fn share(&self) -> RwLockReadGuard<'_, ()> {
        self.share_on(line())
    }

    /// [`share`](Intent::share) on line `at`.
    pub(crate) fn share_on(&self, at: usize) -> RwLockReadGuard<'_, ()> {
        if let Some(lines) = self.spread.get() {
            return lines[at].intent.read();
        }
        let held = self.base.read();
        // Only under the base lock held shared: see the module's doc.
        if self.entries() >= BUSY {
            self.spread.get_or_init(Box::default);
        }
        held
    }

    /// Takes the lock exclusive: the base, then every line if spread.
    pub fn exclude(&self) -> SmallVec<[RwLockWriteGuard<'_, ()>; 1 + LINES]> {
        let mut held: SmallVec<[_; 1 + LINES]> = smallvec::smallvec![self.base.write()];
        if let Some(lines) = self.spread.get() {
            held.extend(lines.iter().map(|l| l.intent.write()));
        }
        held
    }

    /// The entries, `.` and `..` not counted: exact under the lock held
    /// exclusive (or with nothing running), a moment's value otherwise.
    pub fn entries(&self) -> u64 {
        let spread = self
            .spread
            .get()
            .map_or(0, |lines| lines.iter().fold(0u64, |n, l| n.wrapping_add(l.entries.load(Relaxed))));
        self.entries.load(Relaxed).wrapping_add(spread)
    }

    /// One entry more.
    pub fn add(&self) {
        self.add_n(1);
    }

    /// `n` entries more.
    pub fn add_n(&self, n: u64) {
        self.counter().fetch_add(n, Relaxed);
    }

    /// One entry fewer.
    pub fn remove(&self) {
        self.counter().fetch_sub(1, Relaxed);
    }

    /// No entries (a directory replaced, or every count redone).
    pub fn clear(&self) {
        self.entries.store(0, Relaxed);
        for l in self.spread.get().into_iter().flat_map(|lines| lines.iter()) {
            l.entries.store(0, Relaxed);
        }
    }

    /// The count the calling thread changes.
    fn counter(&self) -> &AtomicU64 {
        match self.spread.get() {
            Some(lines) => &lines[line()].entries,
            None => &self.entries,
        }
    }

    /// The mtime and ctime the calling thread moves forward when it
    /// changes the directory, if it is spread (else the inode's own).
    pub fn times(&self) -> Option<(&AtomicI64, &AtomicI64)> {
        self.spread.get().map(|lines| {
            let l = &lines[line()];
            (&l.mtime, &l.ctime)
        })
    }

    /// The latest mtime and ctime of the lines ([`Nanos::MIN`] if none).
    /// O([`LINES`]).
    pub fn latest(&self) -> (Nanos, Nanos) {
        self.spread
            .get()
            .into_iter()
            .flat_map(|lines| lines.iter())
            .fold((Nanos::MIN, Nanos::MIN), |(m, c), l| (m.max(l.mtime.load(Relaxed)), c.max(l.ctime.load(Relaxed))))
    }

    /// The directory's own times were set: what the lines held is
    /// dropped (the mtime too if `mtime`).
    pub fn forget_times(&self, mtime: bool) {
        for l in self.spread.get().into_iter().flat_map(|lines| lines.iter()) {
            if mtime {
                l.mtime.store(Nanos::MIN, Relaxed);
            }
            l.ctime.store(Nanos::MIN, Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Counts made on many lines, up and down, sum to the entries, and
    /// a directory is spread once it is busy, not before.
    #[test]
    fn counts_on_every_line_sum_to_the_entries() {
        let d = Intent::default();
        for _ in 0..BUSY {
            d.add();
        }
        drop(d.share());
        assert!(d.spread.get().is_some(), "busy: spread");
        std::thread::scope(|s| {
            for t in 0..LINES * 2 {
                let d = &d;
                s.spawn(move || {
                    for _ in 0..100 {
                        d.add();
                    }
                    // Some threads remove more than they made on their line.
                    for _ in 0..(if t % 2 == 0 { 150 } else { 50 }) {
                        d.remove();
                    }
                });
            }
        });
        // Half the threads are 50 down, half 50 up.
        assert_eq!(d.entries(), BUSY);
        d.clear();
        assert_eq!(d.entries(), 0);
        let quiet = Intent::default();
        quiet.add();
        drop(quiet.share());
        assert!(quiet.spread.get().is_none(), "not busy: not spread");
    }
}
