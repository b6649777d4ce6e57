//! The vocabulary of requests, outcomes and effects.
//!
//! The engine answers every call with a [`Response`]: what happened to the
//! caller's own request, and the effects the caller must carry out for
//! others (grants to deliver to waiters, blocking callbacks to holders).
//! It never calls back into the caller and never waits.

use crate::{Mode, Range};

/// Who holds a lock: opaque to the engine. The server maps a client
/// process (POSIX), an open file (OFD, flock) or a DLM user to one.
pub type Owner = u64;

/// The lock families. POSIX and OFD locks share one lock map per file (as
/// in Linux, where they conflict with each other); flock and DLM locks live
/// in maps of their own, so a resource name means three separate
/// resources, one per [`Namespace`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// `fcntl(F_SETLK)` record locks; owner = client process. The only
    /// kind with deadlock detection (as in Linux).
    Posix,
    /// `fcntl(F_OFD_SETLK)` locks; owner = open file description.
    Ofd,
    /// `flock(2)`: whole file, owner = open file description.
    Flock,
    /// DLM locks: each lock is its own handle; locks of one owner conflict
    /// with each other.
    Dlm,
}

/// The separate lock maps a resource name can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Namespace {
    /// POSIX and OFD record locks.
    Record,
    /// flock(2) locks.
    Flock,
    /// DLM locks.
    Dlm,
}

impl LockKind {
    /// The lock map this kind lives in.
    pub fn namespace(self) -> Namespace {
        match self {
            LockKind::Posix | LockKind::Ofd => Namespace::Record,
            LockKind::Flock => Namespace::Flock,
            LockKind::Dlm => Namespace::Dlm,
        }
    }

    /// Whether locks of one owner merge and replace each other rather than
    /// conflict (everything but DLM).
    pub(crate) fn owner_merges(self) -> bool {
        !matches!(self, LockKind::Dlm)
    }
}

/// A DLM lock, named by the handle its grant returned.
pub type LockHandle = u64;

/// A blocking request parked at a resource, named by the handle its
/// [`Outcome::Queued`] returned; unique within a [`LockSpace`](crate::LockSpace).
pub type WaitId = u64;

/// A request for a lock.
#[derive(Clone, Debug)]
pub struct LockRequest<'a> {
    /// Resource name: at most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    pub resource: &'a [u8],
    pub owner: Owner,
    pub kind: LockKind,
    pub mode: Mode,
    /// [`Range::WHOLE`] for flock and whole-resource DLM locks.
    pub range: Range,
    /// Queue behind conflicts (`F_SETLKW`, a blocking DLM request) instead
    /// of failing with [`Outcome::WouldBlock`].
    pub wait: bool,
}

/// A lock another owner holds, as `F_GETLK` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub owner: Owner,
    pub kind: LockKind,
    pub mode: Mode,
    pub range: Range,
}

/// What a grant carries back to its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The resource's fencing token after this grant: it grows with every
    /// grant of a write mode (CW, PW, EX), so storage can refuse a writer
    /// whose token is older than one it has already seen.
    pub fence: u64,
    /// The resource's lock value block, for DLM grants.
    pub lvb: Option<Vec<u8>>,
    /// The handle of a DLM lock (for unlock and convert).
    pub lock: Option<LockHandle>,
}

/// What happened to the caller's own request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The lock is held.
    Granted(Grant),
    /// The request waits; its grant will come as an [`Effect::Granted`].
    Queued(WaitId),
    /// A non-blocking request met a conflict (`EAGAIN`).
    WouldBlock,
    /// Waiting would close a cycle of POSIX owners waiting for each other
    /// (`EDEADLK`). Nothing changed.
    Deadlock,
    /// An unlock, release or cancel took effect (or, for an unlock, had
    /// nothing to do, which POSIX does not count as an error).
    Done,
    /// A cancel found no such wait: it was granted already (its
    /// [`Effect::Granted`] went out with the call that granted it) or
    /// never queued. A caller racing a grant learns from this that the
    /// lock is the waiter's and must be given back.
    NotQueued,
}

/// Work the caller must carry out for others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// A queued request has been granted: tell its owner.
    Granted { wait: WaitId, owner: Owner, grant: Grant },
    /// A granted DLM lock blocks a queued request: ask its holder to
    /// release or convert it down (a blocking AST).
    Blocking { lock: LockHandle, owner: Owner, held: Mode, wanted: Mode },
}

/// The answer to every call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub outcome: Outcome,
    pub effects: Vec<Effect>,
}

impl Response {
    pub(crate) fn new(outcome: Outcome) -> Response {
        Response { outcome, effects: Vec::new() }
    }
}

/// One queued request, for status: who waits for which bytes in which
/// mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingLock {
    pub id: WaitId,
    pub owner: Owner,
    pub range: Range,
    pub mode: Mode,
}

/// One granted lock, for dumps and status.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldLock {
    pub owner: Owner,
    pub range: Range,
    pub mode: Mode,
    /// The DLM lock's handle; 0 for the other kinds.
    pub handle: LockHandle,
}
