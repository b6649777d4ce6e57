//! Close-to-open for names: an open by a name another mount replaced or
//! removed opens what the name names now.
//!
//! The kernel keeps a name's inode for the entry timeout and opens by
//! inode. When another mount replaced a file (a new file renamed over
//! it, as every safe save and every lock-file protocol does), an open
//! here within that time opened the old file if anything, anywhere, still
//! held it open (a file nobody holds is gone, and its open answers
//! `ESTALE`): a program read the old contents after the rename had
//! returned elsewhere. NFS's client looks the name up again at each open;
//! a FUSE kernel gives the open no name. Two checks close it, each
//! answering `ESTALE`, which makes the kernel walk the path again with a
//! fresh look-up of every name and open what it finds:
//!
//! - An open that finds the file without a name (`nlink` 0 in the
//!   open's answer: an old file held open) is undone. Free: the answer
//!   carries the count. It covers every name the kernel holds, those
//!   that came with a listing's entries too.
//! - A file the kernel was given by a look-up, a create or a link is
//!   noted with that name ([`Names::seen`]; renames and removals
//!   through this mount move or drop the note), and its open asks the
//!   server for the name beside the open, in the same round trip
//!   ([`Names::name_of`]). This catches a name that now names another
//!   file while the old one keeps a name elsewhere (moved away, or a hard
//!   link). A listing's entries are not noted: at ~0.5 µs each, that was
//!   ~10% of a `du` of a cold mount.
//!
//! An open made through `/proc/PID/fd` of a file whose name went has no
//! path to walk again: the kernel retries the same inode at once, from
//! the same thread. A second open of the same inode by the same thread
//! within [`RETRY`] of a refusal is therefore let through unchecked
//! ([`Names::retrying`]).
//!
//! Bounded: past [`MOST`] names noted, the notes start again from none (a
//! file without a note has its open checked by the count alone). Costs:
//! O(1) expected per name given, renamed or removed, and per open; one
//! look-up request more per open of a noted file, sent with it.

use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use interlock_client::meta::{Attr, FileType, Ino};
use parking_lot::Mutex;

/// The most names noted before the notes start again.
const MOST: usize = 1 << 16;

/// How long after a refusal the same thread's open of the same inode is
/// taken for the kernel's retry.
const RETRY: Duration = Duration::from_secs(1);

/// See the module's docs.
#[derive(Default)]
pub(crate) struct Names(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    /// Inode -> the directory and name it was last given under.
    by_ino: HashMap<Ino, (Ino, Box<[u8]>)>,
    /// (directory, the name's hash) -> inode: the same notes, for
    /// renames and removals made through this mount. Two names of a
    /// directory whose hashes meet keep the later here; the earlier's
    /// note then stays where it was, and an open after its rename is
    /// refused once and walked again: slower, never wrong.
    by_name: HashMap<(Ino, u64), Ino>,
    /// (inode, thread) -> when its open was refused.
    refused: HashMap<(Ino, u32), Instant>,
}

/// A name's hash for [`Inner::by_name`].
fn hash(name: &[u8]) -> u64 {
    foldhash::fast::FixedState::with_seed(0).hash_one(name)
}

impl Inner {
    /// Drops the note of the inode `(parent, name)` names, if any.
    fn forget_name(&mut self, parent: Ino, name: &[u8]) -> Option<Ino> {
        let key = (parent, hash(name));
        let ino = *self.by_name.get(&key)?;
        if self.by_ino.get(&ino).is_none_or(|(p, n)| (*p, &**n) != (parent, name)) {
            return None;
        }
        self.by_name.remove(&key);
        self.by_ino.remove(&ino);
        Some(ino)
    }

    fn note(&mut self, parent: Ino, name: &[u8], ino: Ino) {
        if self.by_ino.get(&ino).is_some_and(|(p, n)| (*p, &**n) == (parent, name)) {
            return;
        }
        if self.by_ino.len() >= MOST {
            self.by_ino.clear();
            self.by_name.clear();
        }
        self.forget_name(parent, name);
        if let Some((p, n)) = self.by_ino.insert(ino, (parent, Box::from(name))) {
            let old = (p, hash(&n));
            if self.by_name.get(&old) == Some(&ino) {
                self.by_name.remove(&old);
            }
        }
        self.by_name.insert((parent, hash(name)), ino);
    }
}

impl Names {
    /// Notes that the kernel was given `a` under `name` in `parent` (a
    /// look-up, a create, a link). Only regular files are opened so.
    /// O(1) expected; no allocation for a name noted already.
    pub fn seen(&self, parent: Ino, name: &[u8], a: &Attr) {
        if a.kind == FileType::Regular {
            self.0.lock().note(parent, name, a.ino);
        }
    }

    /// A rename through this mount moved what `from` named to `to` (and,
    /// for an exchange, what `to` named to `from`).
    pub fn renamed(&self, from: (Ino, &[u8]), to: (Ino, &[u8]), exchange: bool) {
        let mut inner = self.0.lock();
        let moved = inner.forget_name(from.0, from.1);
        let other = inner.forget_name(to.0, to.1);
        if let Some(ino) = moved {
            inner.note(to.0, to.1, ino);
        }
        if let Some(ino) = other.filter(|_| exchange) {
            inner.note(from.0, from.1, ino);
        }
    }

    /// A removal through this mount took `name` from `parent`.
    pub fn removed(&self, parent: Ino, name: &[u8]) {
        self.0.lock().forget_name(parent, name);
    }

    /// Whether an open of `ino` by thread `pid` is the kernel's retry of
    /// one refused just before (once).
    pub fn retrying(&self, ino: Ino, pid: u32) -> bool {
        let mut inner = self.0.lock();
        !inner.refused.is_empty() && inner.refused.remove(&(ino, pid)).is_some_and(|at| at.elapsed() < RETRY)
    }

    /// The name noted for `ino`, to check an open against.
    pub fn name_of(&self, ino: Ino) -> Option<(Ino, Vec<u8>)> {
        self.0.lock().by_ino.get(&ino).map(|(parent, name)| (*parent, name.to_vec()))
    }

    /// The open of `ino` by thread `pid` was refused: its name names
    /// another inode now, or nothing. The note stays: the kernel may
    /// still have the name's old inode (a retry through `/proc` looks
    /// nothing up), and the next open by that name must be checked too.
    pub fn refused(&self, ino: Ino, pid: u32) {
        let mut inner = self.0.lock();
        let now = Instant::now();
        inner.refused.retain(|_, at| now.duration_since(*at) < RETRY);
        inner.refused.insert((ino, pid), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ino: Ino, kind: FileType) -> Attr {
        let (perm, nlink, uid, gid, rdev, size, blocks, atime, mtime, ctime, acl) = Default::default();
        Attr { ino, kind, perm, nlink, uid, gid, rdev, size, blocks, atime, mtime, ctime, acl }
    }

    fn file(ino: Ino) -> Attr {
        of(ino, FileType::Regular)
    }

    #[test]
    fn a_name_is_checked_until_it_moves_or_goes() {
        let names = Names::default();
        names.seen(1, b"a", &file(10));
        assert_eq!(names.name_of(10), Some((1, b"a".to_vec())));
        names.renamed((1, b"a"), (2, b"b"), false);
        assert_eq!(names.name_of(10), Some((2, b"b".to_vec())));
        names.seen(2, b"b", &file(11));
        assert_eq!(names.name_of(10), None, "its name names another now");
        names.removed(2, b"b");
        assert_eq!(names.name_of(11), None);
        names.seen(1, b"dir", &of(12, FileType::Directory));
        assert_eq!(names.name_of(12), None, "directories are not opened so");
    }

    #[test]
    fn an_exchange_swaps_the_names() {
        let names = Names::default();
        names.seen(1, b"a", &file(10));
        names.seen(1, b"b", &file(11));
        names.renamed((1, b"a"), (1, b"b"), true);
        assert_eq!(names.name_of(10), Some((1, b"b".to_vec())));
        assert_eq!(names.name_of(11), Some((1, b"a".to_vec())));
        names.renamed((1, b"a"), (1, b"b"), false);
        assert_eq!(names.name_of(10), None, "replaced");
        assert_eq!(names.name_of(11), Some((1, b"b".to_vec())));
    }

    #[test]
    fn a_refused_open_is_let_through_once_for_the_same_thread() {
        let names = Names::default();
        names.seen(1, b"a", &file(10));
        names.refused(10, 7);
        assert!(!names.retrying(10, 8), "another thread");
        assert!(names.retrying(10, 7), "the retry");
        assert!(!names.retrying(10, 7), "once");
        assert_eq!(names.name_of(10), Some((1, b"a".to_vec())), "the note stays");
    }
}
