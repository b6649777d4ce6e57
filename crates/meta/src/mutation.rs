//! One record per change to the namespace: what the journal holds (and
//! what the changelog projects from it), and all that replay needs. Each
//! carries the values the live operation chose (inode numbers, times,
//! owners), so applying the records in journal order rebuilds exactly the
//! state that was acknowledged.

use serde::{Deserialize, Serialize};

use crate::types::{FileType, Ino, Nanos};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// A new inode and its first name (create, mkdir, mknod, symlink).
    Create {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
        kind: FileType,
        perm: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
        /// A symlink's target; empty otherwise.
        target: Vec<u8>,
        time: Nanos,
    },
    /// Another name for `ino`.
    Link {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
        time: Nanos,
    },
    /// A name removed (unlink, rmdir); `ino` is what it named.
    Remove {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
        time: Nanos,
    },
    /// A rename, replacing what `new_name` named (if anything), or with
    /// `exchange` a swap of the two.
    Rename {
        parent: Ino,
        name: Vec<u8>,
        new_parent: Ino,
        new_name: Vec<u8>,
        exchange: bool,
        time: Nanos,
    },
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
    SetXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
        time: Nanos,
    },
    RemoveXattr {
        ino: Ino,
        name: Vec<u8>,
        time: Nanos,
    },
    /// The last open handle of an inode with no names closed: it goes.
    Forget {
        ino: Ino,
    },
}
