//! The directories freed most recently, by number: what tells a request
//! on a removed directory from one on a removed file. The first is
//! `ENOENT`, as Linux answers for a name in a removed directory and for a
//! program's descriptor of one (`rm -rf` relative to a directory another
//! mount removed must meet `ENOENT`, which `rm -f` passes over); the
//! second is `ESTALE`, which makes a mount's kernel look the file's name
//! up again (see `interlock_proto::meta::MetaOp::inodes`). Inode numbers
//! are never reused, so a number here names that directory alone.
//!
//! Each keeps its last attributes (no links, its last change time): a
//! program whose working directory, or open descriptor, names a
//! directory removed meanwhile can still `fstat` it, as on Linux, where
//! the inode lives while anything holds it. `ls` in a removed working
//! directory asks for them before it lists (nothing, as on Linux).
//!
//! Bounded: the last [`KEPT`] directories freed (about 2 MB); a request
//! on one freed before those gets `ESTALE`, as a file's would. Not kept
//! across restarts (the journal's replay fills it again with the
//! directories it frees). Costs: O(1) to add, O(1) expected to ask.

use std::collections::{HashMap, VecDeque};

use crate::types::{Attr, Ino};

/// How many freed directories are remembered.
pub(crate) const KEPT: usize = 1 << 14;

#[derive(Default)]
pub(crate) struct FreedDirs {
    /// Oldest first.
    order: VecDeque<Ino>,
    attrs: HashMap<Ino, Attr>,
}

impl FreedDirs {
    /// Remembers the directory of `attr` as freed, with those last
    /// attributes; forgets the oldest past [`KEPT`].
    pub fn add(&mut self, attr: Attr) {
        let ino = attr.ino;
        if self.attrs.insert(ino, attr).is_none() {
            self.order.push_back(ino);
        }
        while self.order.len() > KEPT {
            if let Some(old) = self.order.pop_front() {
                self.attrs.remove(&old);
            }
        }
    }

    /// Whether `ino` is a directory freed among the last [`KEPT`].
    pub fn contains(&self, ino: Ino) -> bool {
        self.attrs.contains_key(&ino)
    }

    /// The last attributes of `ino`, if it is a directory freed among
    /// the last [`KEPT`].
    pub fn get(&self, ino: Ino) -> Option<Attr> {
        self.attrs.get(&ino).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::types::FileType;

    /// A freed directory's attributes, told apart by `ctime`.
    fn dir(ino: Ino, ctime: i64) -> Attr {
        Attr {
            ino,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 40,
            blocks: 0,
            atime: 0,
            mtime: 0,
            ctime,
            acl: false,
        }
    }

    #[test]
    fn the_oldest_are_forgotten_past_the_bound_and_the_newest_kept() {
        let mut f = FreedDirs::default();
        for ino in 1..=(KEPT as Ino + 10) {
            f.add(dir(ino, 1));
        }
        f.add(dir(KEPT as Ino + 10, 2));
        assert_eq!(f.get(10), None, "among the first ten: forgotten");
        assert!(!f.contains(10) && f.contains(11));
        assert_eq!(f.get(11), Some(dir(11, 1)), "the last KEPT");
        assert_eq!(f.get(KEPT as Ino + 10), Some(dir(KEPT as Ino + 10, 2)), "the newest attributes");
        assert_eq!((f.order.len(), f.attrs.len()), (KEPT, KEPT));
    }
}
