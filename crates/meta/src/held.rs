//! Files kept a moment after their last name went, for the open that
//! had already found them.
//!
//! A program's `open(2)` on a mount is two requests: its kernel looks
//! the name up, then opens the inode it found. A file renamed over
//! (or removed) by another mount between the two, with nobody holding
//! it open, used to be freed at once, and the open failed with `ESTALE`.
//! The kernel walks the path again once on `ESTALE`, so only a name
//! replaced twice in a row failed the program: 118 of 3,646 opens of a
//! file that another mount replaced by `rename` in a loop (session 43;
//! tmpfs: none). POSIX has such a name refer to the old file or the new
//! throughout a rename, and on one machine an open whose walk had found
//! the inode before the rename opens the old one.
//!
//! So a regular file that loses its last name, unopened, within a period
//! of being looked up is kept as an orphan (its removal records it as
//! one), and an open from a session that found it by that look-up may
//! open it (see [`Namespace::open`](crate::Namespace::open)'s `found`).
//! Likewise an orphan closed for the last time within a period of a
//! look-up of it (when it still had its name: a file renamed over while
//! a third mount had it open).
//! To every other request it is gone, as a freed file is: a mount whose
//! kernel kept the name walks it again and finds what is there now. At
//! the end of the next period the files held and not opened go.
//!
//! A period is what passes between two calls of
//! [`Namespace::end_period`](crate::Namespace::end_period) (the server
//! makes one every half second): a file is held if its last look-up was
//! in this period or the last, and then held into the next one. Periods
//! are counted in 7 bits of a byte that skip 0 (never looked up): a
//! look-up 127 periods old counts as recent again, which holds a file
//! for nothing but costs nothing else.
//!
//! Costs: a look-up writes its inode's byte when the period changed since
//! the last; a removal marks it; O(1) each. A file held costs a second
//! record (its end), and its data stays on the disk until then.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::inode::Inode;
use crate::types::{FileType, Ino};

/// Periods count 1 to this in [`Inode::looked`]'s low bits (0: never).
const PERIODS: u8 = 0x7f;
/// In [`Inode::looked`]: the file's last name is going (see
/// [`Held::going`]).
const GOING: u8 = 0x80;

pub(crate) struct Held {
    /// The period now: 1 to [`PERIODS`].
    period: AtomicU8,
    /// The files held in this period, then those held in the last.
    files: Mutex<[Vec<Ino>; 2]>,
}

impl Held {
    pub fn new() -> Held {
        Held { period: AtomicU8::new(1), files: Mutex::default() }
    }

    /// The period after `p`.
    fn next(p: u8) -> u8 {
        p % PERIODS + 1
    }

    /// Whether a look-up in period `looked` is recent now.
    fn recent(&self, looked: u8) -> bool {
        let now = self.period.load(Relaxed);
        looked != 0 && (looked == now || Self::next(looked) == now)
    }

    /// `i` was found by a look-up now: stamps it, unless its last name
    /// is going (`false`: the caller looks the name up again, and finds
    /// what the removal leaves). The stamp and [`going`](Self::going)'s
    /// mark are changes of one atomic byte, so one of them sees the
    /// other: a removal either holds the file or makes the look-up
    /// look again. A removal that read the byte before a look-up found
    /// the file would otherwise free it before its open (1 open in ~5,000
    /// still failed on a mount during a storm of renames). O(1); writes
    /// only when the period changed.
    pub fn looked_up(&self, i: &Inode) -> bool {
        if i.kind != FileType::Regular {
            return true;
        }
        let now = self.period.load(Relaxed);
        let mut was = i.looked.load(Relaxed);
        loop {
            if was & GOING != 0 {
                return false;
            }
            if was == now {
                return true;
            }
            match i.looked.compare_exchange(was, now, Relaxed, Relaxed) {
                Ok(_) => return true,
                Err(v) => was = v,
            }
        }
    }

    /// The last name of `i`, a file nobody holds open, is going, or its
    /// last handle as an orphan (the caller holds its inode lock): marks
    /// it, and says whether to hold it for an open (a regular file looked
    /// up in this period or the last). Look-ups that find it meanwhile
    /// look again. O(1).
    pub fn going(&self, i: &Inode) -> bool {
        i.kind == FileType::Regular && self.recent(i.looked.fetch_or(GOING, Relaxed) & PERIODS)
    }

    /// The removal [`going`](Self::going) marked `i` for failed: it keeps
    /// its name.
    pub fn stays(&self, i: &Inode) {
        i.looked.fetch_and(PERIODS, Relaxed);
    }

    /// Holds `ino` until the end of the next period.
    pub fn hold(&self, ino: Ino) {
        self.files.lock()[0].push(ino);
    }

    /// Every file held now. O(those).
    pub fn all(&self) -> std::collections::HashSet<Ino> {
        self.files.lock().iter().flatten().copied().collect()
    }

    /// Ends the period: the files held before it began, to let go of.
    pub fn end_period(&self) -> Vec<Ino> {
        let mut files = self.files.lock();
        let now = self.period.load(Relaxed);
        self.period.store(Self::next(now), Relaxed);
        let [this, last] = &mut *files;
        std::mem::replace(last, std::mem::take(this))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Owner;
    use crate::inode::Meta;

    fn file(kind: FileType) -> Inode {
        Inode::new(9, Owner { kind, perm: 0o644, uid: 0, gid: 0 }, Meta::new(0, b"", 0), 0, 1)
    }

    #[test]
    fn a_file_looked_up_in_this_period_or_the_last_is_held_into_the_next() {
        let held = Held::new();
        let (f, never, dir) = (file(FileType::Regular), file(FileType::Regular), file(FileType::Directory));
        assert!(held.looked_up(&f) && held.looked_up(&dir));
        assert!(held.going(&f));
        held.stays(&f);
        assert!(!held.going(&never), "never looked up");
        assert!(!held.going(&dir), "directories are not held");
        held.hold(1);
        assert_eq!(held.end_period(), Vec::<Ino>::new());
        held.stays(&f);
        assert!(held.going(&f), "looked up in the last period");
        held.stays(&f);
        held.hold(2);
        assert_eq!(held.end_period(), vec![1]);
        assert!(!held.going(&f), "two periods ago");
        assert_eq!(held.end_period(), vec![2]);
    }

    #[test]
    fn a_look_up_of_a_file_whose_name_is_going_looks_again() {
        let held = Held::new();
        let f = file(FileType::Regular);
        assert!(!held.going(&f), "not looked up: freed at once");
        assert!(!held.looked_up(&f), "so a look-up that found it must look again");
        held.stays(&f);
        assert!(held.looked_up(&f), "the removal failed: the name stays");
        assert!(held.going(&f), "and the look-up's stamp holds it");
    }

    #[test]
    fn periods_wrap_without_naming_never() {
        let held = Held::new();
        let f = file(FileType::Regular);
        for _ in 0..300 {
            held.end_period();
            assert_ne!(held.period.load(Relaxed), 0);
        }
        held.looked_up(&f);
        (0..PERIODS - 1).for_each(|_| drop(held.end_period()));
        assert!(!held.recent(f.looked.load(Relaxed)));
        held.end_period();
        assert!(held.recent(f.looked.load(Relaxed)), "a whole round on, the byte comes round");
    }
}
