//! What the namespace holds in memory, kept as it changes, and the budget
//! past which it grows no more.
//!
//! Why: the namespace lives in memory (`docs/namespace.md`), and until
//! session 45 nothing bounded it. One user's loop of `setfattr` with
//! 64 KiB values grew a server by ~50 MB a second; at the machine's end
//! the kernel kills the server, and its restart, which loads the same
//! namespace, is killed again: nobody can reach the files to remove
//! some. With a budget, a change that would make the namespace larger (a
//! new inode, name or extended attribute: [`Mutation::grows`]) is refused
//! with `ENOSPC` once the namespace holds its budget, as tmpfs refuses
//! one once its inodes' space is spent. Removals, writes and every other
//! change go on, so room is made as on a full disk.
//!
//! What is counted: bytes charged for what each object takes on the heap,
//! by estimate ([`INODE`], [`DIRECTORY`], [`ENTRY`], [`EXTRA`],
//! [`XATTR`], plus the bytes of names, targets and values), and the
//! inodes. `bench restart` prints the estimate per file beside the heap's
//! own count, so a change that makes them part shows there.
//!
//! How, with no line that every creator writes (see `spread`): each
//! thread counts on the line it was dealt ([`spread::line`]); a thread
//! whose line's count crosses a multiple of [`CHECK`] bytes adds every
//! line up and sets `full`, and a change reads `full` alone (a line
//! written only when it flips). So the budget may be passed by up to
//! [`LINES`] × [`CHECK`] bytes and one change's.
//!
//! The counts are exact on the live path (each change is applied once).
//! Replay may apply a change over an image that holds part of it
//! already, so a store that opens counts everything again
//! ([`Namespace::rebuild_counts`](crate::Namespace::rebuild_counts)).
//!
//! Costs: [`Usage::charge`] O(1), and O([`LINES`]) once every [`CHECK`]
//! bytes; [`Usage::full`] O(1); [`Usage::totals`] O([`LINES`]).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

#[cfg(doc)]
use crate::mutation::Mutation;
use crate::spread::{self, LINES};

/// An inode: 96 bytes and its `Arc`'s counts (a 112-byte size class), and
/// its slot in the inode table.
pub(crate) const INODE: i64 = 144;
/// A directory's part: its intention lock, count and parent, boxed.
pub(crate) const DIRECTORY: i64 = 48;
/// An entry, its name's bytes apart: its slot in the names' table, its
/// key in the order, and its name's allocation.
pub(crate) const ENTRY: i64 = 120;
/// What few inodes have (a symlink's target, a device, extended
/// attributes), boxed, its bytes apart.
pub(crate) const EXTRA: i64 = 48;
/// An extended attribute, its name's and value's bytes apart: two boxed
/// slices in a vector.
pub(crate) const XATTR: i64 = 64;

/// A file of a 16-byte name: what `statfs` counts the inodes left in.
pub(crate) const FILE: u64 = (INODE + ENTRY + 16) as u64;

/// A thread looks at the whole each time its line's count crosses a
/// multiple of this.
const CHECK: i64 = if cfg!(test) { 1024 } else { 64 << 10 };

/// A thread line's counts, on a line of its own. Each may go below zero:
/// a thread may remove what another made.
#[derive(Default)]
#[repr(align(128))]
struct Line {
    inodes: AtomicI64,
    bytes: AtomicI64,
}

/// The namespace's inodes and estimated bytes, and its budget: on a line
/// of their own, which every change reads and only a flip writes.
#[repr(align(128))]
pub(crate) struct Usage {
    lines: Box<[Line; LINES]>,
    /// [`u64::MAX`]: none.
    budget: AtomicU64,
    /// The bytes were at or past the budget at the last look.
    full: AtomicBool,
}

impl Default for Usage {
    fn default() -> Self {
        Usage { lines: Box::default(), budget: AtomicU64::new(u64::MAX), full: AtomicBool::new(false) }
    }
}

impl Usage {
    /// `inodes` and `bytes` more (or fewer), counted on the calling
    /// thread's line.
    pub fn charge(&self, inodes: i64, bytes: i64) {
        let line = &self.lines[spread::line()];
        if inodes != 0 {
            line.inodes.fetch_add(inodes, Relaxed);
        }
        let before = line.bytes.fetch_add(bytes, Relaxed);
        // A look each time the line's count crosses a multiple of CHECK,
        // either way, or moves by more.
        if before.div_euclid(CHECK) != before.wrapping_add(bytes).div_euclid(CHECK) {
            self.look();
        }
    }

    /// Inodes and bytes: a moment's sum of the lines (exact with nothing
    /// running).
    pub fn totals(&self) -> (u64, u64) {
        let (mut inodes, mut bytes) = (0i64, 0i64);
        for l in self.lines.iter() {
            inodes = inodes.wrapping_add(l.inodes.load(Relaxed));
            bytes = bytes.wrapping_add(l.bytes.load(Relaxed));
        }
        (inodes.max(0) as u64, bytes.max(0) as u64)
    }

    /// Counts made again from scratch: what the lines hold goes. Only
    /// while nothing else changes the namespace.
    pub fn reset(&self, inodes: u64, bytes: u64) {
        for l in self.lines.iter() {
            l.inodes.store(0, Relaxed);
            l.bytes.store(0, Relaxed);
        }
        self.lines[0].inodes.store(inodes as i64, Relaxed);
        self.lines[0].bytes.store(bytes as i64, Relaxed);
        self.look();
    }

    /// The budget in bytes ([`u64::MAX`]: none), and whether it is held.
    pub fn budget(&self) -> u64 {
        self.budget.load(Relaxed)
    }

    pub fn set_budget(&self, bytes: u64) {
        self.budget.store(bytes, Relaxed);
        self.look();
    }

    /// Whether the namespace held its budget at the last look: a change
    /// that would grow it is refused.
    pub fn full(&self) -> bool {
        self.full.load(Relaxed)
    }

    /// Adds the lines up and sets `full`, writing it (and saying so) only
    /// if it flips.
    fn look(&self) {
        let (bytes, budget) = (self.totals().1, self.budget());
        let full = bytes >= budget;
        if self.full.load(Relaxed) != full {
            self.full.store(full, Relaxed);
            if full {
                tracing::warn!(
                    bytes,
                    budget,
                    "the namespace holds its memory budget: new files, names and extended attributes get ENOSPC \
                     until removals make room"
                );
            } else {
                tracing::info!(bytes, budget, "the namespace is under its memory budget again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_held_once_the_lines_add_up_to_it() {
        let u = Usage::default();
        u.set_budget(10_000);
        u.charge(1, 5_000);
        assert!(!u.full(), "under the budget");
        // Charged from another thread: another line, seen at its next look.
        std::thread::scope(|s| {
            s.spawn(|| u.charge(1, 5_000));
        });
        assert_eq!(u.totals(), (2, 10_000));
        assert!(u.full(), "each charge of CHECK bytes or more looks");
        u.charge(-1, -10);
        assert!(u.full(), "small moves do not look");
        u.charge(-1, -4_990);
        assert!(!u.full(), "a removal that moves CHECK bytes looks, and the flag flips back");
        assert_eq!(u.totals(), (0, 5_000));
        u.reset(3, 20_000);
        assert_eq!(u.totals(), (3, 20_000));
        assert!(u.full(), "a reset looks");
        u.set_budget(u64::MAX);
        assert!(!u.full(), "no budget");
    }
}
