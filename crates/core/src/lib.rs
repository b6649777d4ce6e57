//! The interlock lock engine: POSIX record locks, OFD locks, flock and DLM
//! locks with the exact semantics of Linux `fs/locks.c` and the VMS/Linux
//! DLM, where every operation costs O(log n + k) in the locks of its
//! resource.
//!
//! This crate is sans-I/O, in the manner of `rustls`: no sockets, no files,
//! no clock, no async. A call takes a request and returns a [`Response`]:
//! what happened to the request ([`Outcome`]) and the [`Effect`]s the caller
//! must carry out for others, such as grants to deliver to waiters that
//! an unlock let in, and blocking callbacks to the holders of DLM locks. The
//! engine never calls back and never waits, so every behaviour is testable
//! in a plain unit test.
//!
//! # Layout
//!
//! - [`range`]: byte ranges up to `OFFSET_MAX`, and POSIX `(start, len)`.
//! - [`mode`]: the six DLM modes and their compatibility matrix.
//! - [`tree`]: the augmented interval treap that indexes locks and waiters.
//! - `granted`: a resource's granted locks, one tree per mode plus a
//!   per-owner ordered view (`owner_locks`) for merge and split.
//! - `waiters`: a resource's queue of blocked requests, by range.
//! - `deadlock`: the waits-for graph of POSIX owners (`EDEADLK`).
//! - `resource`: the rules that move requests from queued to granted.
//! - [`LockSpace`]: the concurrent table of resources and incremental
//!   reclaim.
//!
//! # Example
//!
//! ```
//! use interlock_core::{LockKind, LockRequest, LockSpace, Mode, Outcome, Range};
//!
//! let space = LockSpace::default();
//! let req = |owner, mode, wait| LockRequest {
//!     resource: b"/data/file",
//!     owner,
//!     kind: LockKind::Ofd,
//!     mode,
//!     range: Range::new(0, 99).unwrap(),
//!     wait,
//! };
//! assert!(matches!(space.lock(&req(1, Mode::EX, false)).unwrap().outcome, Outcome::Granted(_)));
//! assert_eq!(space.lock(&req(2, Mode::PR, false)).unwrap().outcome, Outcome::WouldBlock);
//! let Outcome::Queued(wait) = space.lock(&req(2, Mode::PR, true)).unwrap().outcome else { panic!() };
//! // Owner 1's unlock returns the grant to deliver to owner 2.
//! let r = space.unlock(b"/data/file", 1, LockKind::Ofd, Range::WHOLE).unwrap();
//! assert!(matches!(r.effects[..], [interlock_core::Effect::Granted { wait: w, owner: 2, .. }] if w == wait));
//! ```

#![forbid(unsafe_code)]

/// The hash maps of the engine: foldhash, seeded per process, is several
/// times faster than SipHash on short keys and still randomized against
/// crafted resource names.
type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type Set<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

mod deadlock;
mod error;
mod granted;
pub mod mode;
mod owner_locks;
pub mod range;
mod resource;
mod space;
pub mod tree;
mod types;
mod waiters;

pub use error::LockError;
pub use mode::Mode;
pub use range::{OFFSET_MAX, Range};
pub use space::{Config, LockSpace, MAX_LVB_LEN, MAX_NAME_LEN, Stats};
pub use types::{
    Conflict, Effect, Grant, HeldLock, LockHandle, LockKind, LockRequest, Namespace, Outcome, Owner, Response, WaitId,
    WaitingLock,
};
