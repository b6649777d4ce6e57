//! One record per change to the namespace: what the journal holds (and
//! what the changelog projects from it), and all that replay needs. Each
//! carries the values the live operation chose (inode numbers, times,
//! owners), so applying the records in journal order rebuilds exactly the
//! state that was acknowledged.
//!
//! Every record is a *blind write*: it says what the objects it touches
//! (an entry, an inode's fields) become, never what they were, and
//! decides nothing from the state it is applied to (a rename names the
//! inodes it moves; a removal says whether it took the last name and
//! whether the inode stays open as an orphan). Counters that are
//! relative (link counts, entry counts) are rebuilt from the entries
//! after replay. That is what lets a checkpoint be taken while
//! operations run: the image may hold any object at any point of its
//! history after the checkpoint's start, and replaying every record from
//! that start, in order, over it gives the state the records describe
//! (see `checkpoint`).

use serde::{Deserialize, Serialize};

use crate::types::{FileType, Ino, Nanos};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// A new inode and its first name (create, mkdir, mknod, symlink).
    Create {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        ino: Ino,
        kind: FileType,
        /// Its mode's bits, and above them the attribute flags it takes
        /// from its directory (see `inode::with_flags`).
        perm: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
        /// A symlink's target; empty otherwise.
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
        time: Nanos,
    },
    /// Another name for `ino`.
    Link {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        ino: Ino,
        time: Nanos,
    },
    /// A name removed (unlink, rmdir); `ino` is what it named.
    Remove {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        ino: Ino,
        /// `rmdir` (a directory went), not `unlink`.
        dir: bool,
        gone: Gone,
        time: Nanos,
    },
    /// A rename (see [`Renamed`]). A newtype of the struct its fields
    /// were until session 31: postcard writes the two alike.
    Rename(Renamed),
    /// Attributes set, as resolved by the live operation.
    SetAttr {
        ino: Ino,
        perm: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<Nanos>,
        mtime: Option<Nanos>,
        ctime: Nanos,
    },
    /// Data written: the new size if it grew, the setuid/setgid bits a
    /// write by a non-root caller clears, and the time (mtime and ctime).
    Write { ino: Ino, size: Option<u64>, perm: Option<u32>, time: Nanos },
    SetXattr {
        ino: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        time: Nanos,
    },
    RemoveXattr {
        ino: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        time: Nanos,
    },
    /// The last open handle of an inode with no names closed (or, after
    /// a restart, nobody reclaimed it): it goes.
    Forget { ino: Ino },
    /// A regular file with no name, open (`open(O_TMPFILE)` in `parent`):
    /// an orphan from its start, which a [`Link`](Mutation::Link) may name
    /// if `linkable` (made without `O_EXCL`). `perm` as a
    /// [`Create`](Mutation::Create)'s.
    Tmpfile { parent: Ino, ino: Ino, perm: u32, uid: u32, gid: u32, linkable: bool, time: Nanos },
    /// A rename with `RENAME_WHITEOUT` (never an exchange), and in the
    /// same record a whiteout made at the old name: inode `whiteout`, a
    /// character device 0:0 with no permission bits, owned by
    /// `uid`:`gid` (what an overlay file system's upper layer marks a
    /// removed lower file with).
    RenameWhiteout { rename: Renamed, whiteout: Ino, uid: u32, gid: u32 },
    /// An access ACL set (`setfacl`), and the mode it gives the inode
    /// (its owner, group-class and other bits; setgid dropped for a
    /// setter outside the file's group): the ACL kept, or `None` where
    /// the mode says all it does, and any ACL the inode had removed (see
    /// `acl`).
    SetAcl {
        ino: Ino,
        perm: u32,
        #[serde(with = "serde_bytes")]
        acl: Option<Vec<u8>>,
        time: Nanos,
    },
    /// A new inode `ino`, made by `made` (a [`Create`](Mutation::Create),
    /// a [`Tmpfile`](Mutation::Tmpfile) or a
    /// [`RenameWhiteout`](Mutation::RenameWhiteout)'s whiteout, its mode
    /// already cut to them), and the ACLs it inherits from its
    /// directory's default ACL: an access ACL where the mode does not say
    /// it all, and a new directory's own default ACL. One record, so no
    /// crash leaves the inode made without them.
    Inherit {
        made: Box<Mutation>,
        ino: Ino,
        #[serde(with = "serde_bytes")]
        access: Option<Vec<u8>>,
        #[serde(with = "serde_bytes")]
        default: Option<Vec<u8>>,
    },
    /// An inode's attribute flags set (`chattr`: see
    /// [`KEPT_FLAGS`](crate::KEPT_FLAGS)), all of them, as they now are.
    SetFlags { ino: Ino, flags: u32, time: Nanos },
}

impl Mutation {
    /// The inode the change is to (what a create made, a removal
    /// removed, a rename moved): what a replayed answer is made from
    /// (see `replies`). O(1).
    pub fn ino(&self) -> Ino {
        match self {
            Mutation::Create { ino, .. }
            | Mutation::Link { ino, .. }
            | Mutation::Remove { ino, .. }
            | Mutation::SetAttr { ino, .. }
            | Mutation::Write { ino, .. }
            | Mutation::SetXattr { ino, .. }
            | Mutation::RemoveXattr { ino, .. }
            | Mutation::Forget { ino }
            | Mutation::Tmpfile { ino, .. }
            | Mutation::Rename(Renamed { ino, .. })
            | Mutation::RenameWhiteout { rename: Renamed { ino, .. }, .. }
            | Mutation::SetAcl { ino, .. }
            | Mutation::SetFlags { ino, .. } => *ino,
            Mutation::Inherit { made, .. } => made.ino(),
        }
    }

    /// The inode this change frees, whose data then goes: what a removal
    /// or a rename replaced and freed, or an orphan's end. O(1).
    pub fn frees(&self) -> Option<Ino> {
        match self {
            Mutation::Remove { ino, gone: Gone::Freed, .. } | Mutation::Forget { ino } => Some(*ino),
            Mutation::Rename(Renamed { victim: Some(v), gone: Gone::Freed, exchange: false, .. })
            | Mutation::RenameWhiteout { rename: Renamed { victim: Some(v), gone: Gone::Freed, .. }, .. } => Some(*v),
            // A whiteout's rename, under a default ACL.
            Mutation::Inherit { made, .. } => made.frees(),
            _ => None,
        }
    }

    /// Whether this change makes the namespace hold more in memory: a new
    /// inode, a new name, or an extended attribute set (refused while the
    /// namespace holds its budget: see `usage`). A rename is not, though
    /// its new name may be longer than the old: at most 254 bytes, and
    /// often one it replaces goes. O(1).
    pub fn grows(&self) -> bool {
        matches!(
            self,
            Mutation::Create { .. }
                | Mutation::Link { .. }
                | Mutation::Tmpfile { .. }
                | Mutation::SetXattr { .. }
                | Mutation::RenameWhiteout { .. }
                | Mutation::SetAcl { acl: Some(_), .. }
                | Mutation::Inherit { .. }
        )
    }

    /// Whether recording this change needs room on the journal's disk
    /// (see `Log::room`). A change that may free space does not (a
    /// removal, the end of an orphan, a truncate, an attribute removed),
    /// so that what was set aside lasts until those have made some. (A
    /// change to data is admitted before the data changes, by
    /// `Namespace::change_data`, so that a refusal never leaves data
    /// changed without its record.)
    pub fn needs_room(&self) -> bool {
        !matches!(
            self,
            Mutation::Remove { .. }
                | Mutation::Forget { .. }
                | Mutation::RemoveXattr { .. }
                | Mutation::SetAttr { size: Some(_), .. }
        )
    }
}

/// A rename of `ino`, replacing `victim` (what `new_name` named, if
/// anything), or with `exchange` a swap of the two.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renamed {
    pub parent: Ino,
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    pub ino: Ino,
    pub new_parent: Ino,
    #[serde(with = "serde_bytes")]
    pub new_name: Vec<u8>,
    pub victim: Option<Ino>,
    /// What became of a replaced victim.
    pub gone: Gone,
    pub exchange: bool,
    pub time: Nanos,
}

/// What a removal did to the inode that lost a name: decided by the live
/// operation under its locks, so replay need not count links.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Gone {
    /// It has other names still.
    #[default]
    Linked,
    /// That was its last name, and nothing holds it open: it is freed.
    Freed,
    /// That was its last name, but it is open: it lives on as an orphan
    /// until the last close ([`Mutation::Forget`]).
    Orphaned,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rename as journals before session 31 wrote it (a struct variant,
    /// the fourth: its index, then its fields in order, postcard's
    /// varints) reads as the newtype of [`Renamed`].
    #[test]
    fn a_rename_journaled_before_renamed_existed_reads_the_same() {
        // parent 1, name "a", ino 7, new_parent 2, new_name "b",
        // victim Some(9), gone Orphaned (2), exchange false, time 5
        // (zigzag: 10).
        let before: &[u8] = &[3, 1, 1, b'a', 7, 2, 1, b'b', 1, 9, 2, 0, 10];
        let read: Mutation = postcard::from_bytes(before).unwrap();
        let want = Renamed {
            parent: 1,
            name: b"a".to_vec(),
            ino: 7,
            new_parent: 2,
            new_name: b"b".to_vec(),
            victim: Some(9),
            gone: Gone::Orphaned,
            exchange: false,
            time: 5,
        };
        assert_eq!(read, Mutation::Rename(want.clone()));
        assert_eq!(postcard::to_stdvec(&Mutation::Rename(want)).unwrap(), before, "and is written as before");
    }

    /// Byte strings (names, targets, extended attributes, ACLs) were
    /// written as sequences of `u8` until session 55 and are written as
    /// bytes now (`serde_bytes`, which decodes with one copy, not a call
    /// per byte): postcard writes both as a varint length and the bytes,
    /// so every journal written before reads the same.
    #[test]
    fn byte_strings_are_written_as_before_serde_bytes() {
        let symlink = Mutation::Create {
            parent: 1,
            name: b"ab".to_vec(),
            ino: 7,
            kind: FileType::Symlink,
            perm: 7,
            uid: 3,
            gid: 4,
            rdev: 0,
            target: b"t".to_vec(),
            time: 5,
        };
        let xattr = Mutation::SetXattr { ino: 7, name: b"n".to_vec(), value: vec![0, 255], time: 5 };
        let acl = Mutation::SetAcl { ino: 7, perm: 7, acl: Some(vec![1, 2]), time: 5 };
        let inherit = Mutation::Inherit { made: Box::new(xattr.clone()), ino: 7, access: None, default: Some(vec![9]) };
        let cases: [(Mutation, &[u8]); 4] = [
            // variant 0, parent, "ab", ino, Symlink (2), perm, uid, gid,
            // rdev, "t", time (zigzag: 10)
            (symlink, &[0, 1, 2, b'a', b'b', 7, 2, 7, 3, 4, 0, 1, b't', 10]),
            // variant 6, ino, "n", [0, 255], time
            (xattr, &[6, 7, 1, b'n', 2, 0, 255, 10]),
            // variant 11, ino, perm, Some([1, 2]), time
            (acl, &[11, 7, 7, 1, 2, 1, 2, 10]),
            // variant 12, the xattr above, ino, None, Some([9])
            (inherit, &[12, 6, 7, 1, b'n', 2, 0, 255, 10, 7, 0, 1, 1, 9]),
        ];
        for (m, before) in cases {
            assert_eq!(postcard::from_bytes::<Mutation>(before).unwrap(), m, "reads as before");
            assert_eq!(postcard::to_stdvec(&m).unwrap(), before, "and is written as before");
        }
    }
}
