//! interlock's namespace: files, directories, hard links, symlinks,
//! special files, attributes and extended attributes, with Linux's
//! semantics (the errno of every failure included), sans I/O: callers
//! pass the time and the caller's credentials in, and get back, for every
//! change, the [`Mutation`] to journal. The server acknowledges a change
//! once that record is durable; replay applies the records in order
//! ([`Namespace::apply`]).
//!
//! Parallelism (seed 003): no operation takes a per-directory mutex.
//! Entry operations share their directory's intention lock and lock only
//! their names' stripes; directory counters and times are atomics. See
//! `locks` for the order that keeps it deadlock-free.
//!
//! ```
//! use interlock_meta::{Cred, FileType, Namespace, NewInode, ROOT};
//! let ns = Namespace::new(7, 0);
//! let me = Cred { uid: 1000, gid: 1000, groups: vec![] };
//! let (dir, _) = ns
//!     .create(&Cred::root(), ROOT, b"home", NewInode { kind: FileType::Directory, perm: 0o777, rdev: 0, umask: 0 }, b"", 1)
//!     .unwrap();
//! let (file, record) = ns
//!     .create(&me, dir.ino, b"notes", NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 }, b"", 2)
//!     .unwrap();
//! assert_eq!((file.uid, file.nlink), (1000, 1));
//! // `record` goes to the journal; replayed into a fresh namespace it
//! // rebuilds the same file.
//! # let _ = record;
//! ```

#![forbid(unsafe_code)]

mod access;
mod acl;
mod apply;
mod checkpoint;
mod data;
mod entries;
mod errno;
mod freed;
pub mod fsck;
mod inode;
mod locks;
mod log;
mod mutation;
mod namespace;
mod ops;
mod record;
mod replies;
mod spread;
mod store;
mod sync;
mod types;
mod usage;

pub use checkpoint::Written;
pub use errno::{Errno, Result};
pub use log::{Log, Room, Seq};
pub use mutation::{Gone, Mutation, Renamed};
pub use namespace::{FIRST_COOKIE, Namespace};
pub use ops::{COPY_MAX, NewInode};
pub use record::{FLAG_LAST, project};
pub use replies::{Replies, Tag, tagged};
pub use store::{Opened, Store, StoreOptions};
pub use types::*;
