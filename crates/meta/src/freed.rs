//! The directories freed most recently, by number: what tells a request
//! on a removed directory from one on a removed file. The first is
//! `ENOENT`, as Linux answers for a name in a removed directory and for a
//! program's descriptor of one (`rm -rf` relative to a directory another
//! mount removed must meet `ENOENT`, which `rm -f` passes over); the
//! second is `ESTALE`, which makes a mount's kernel look the file's name
//! up again (see `interlock_proto::meta::MetaOp::inodes`). Inode numbers
//! are never reused, so a number here names that directory alone.
//!
//! Bounded: the last [`KEPT`] directories freed (about half a megabyte);
//! a request on one freed before those gets `ESTALE`, as a file's would.
//! Not kept across restarts (the journal's replay fills it again with
//! the directories it frees). Costs: O(1) to add, O(1) expected to ask.

use std::collections::{HashSet, VecDeque};

use crate::types::Ino;

/// How many freed directories are remembered.
pub(crate) const KEPT: usize = 1 << 14;

#[derive(Default)]
pub(crate) struct FreedDirs {
    /// Oldest first.
    order: VecDeque<Ino>,
    set: HashSet<Ino>,
}

impl FreedDirs {
    /// Remembers directory `ino` as freed; forgets the oldest past
    /// [`KEPT`].
    pub fn add(&mut self, ino: Ino) {
        if self.set.insert(ino) {
            self.order.push_back(ino);
        }
        while self.order.len() > KEPT {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `ino` is a directory freed among the last [`KEPT`].
    pub fn contains(&self, ino: Ino) -> bool {
        self.set.contains(&ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_are_forgotten_past_the_bound_and_the_newest_kept() {
        let mut f = FreedDirs::default();
        for ino in 1..=(KEPT as Ino + 10) {
            f.add(ino);
        }
        f.add(KEPT as Ino + 10);
        assert!(!f.contains(10), "among the first ten: forgotten");
        assert!(f.contains(11) && f.contains(KEPT as Ino + 10), "the last KEPT");
        assert_eq!((f.order.len(), f.set.len()), (KEPT, KEPT));
    }
}
