//! Errors for bad input. Contention is not an error: it is an
//! [`Outcome`](crate::Outcome). Every error leaves the engine unchanged.

/// Why a request was refused before it touched any state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// A byte range that is empty, inverted or beyond `OFFSET_MAX`.
    #[error("invalid range: {0}")]
    InvalidRange(String),
    /// A mode name that is not one of `nl cr cw pr pw ex` (`rd wr`), or a
    /// mode that the lock kind does not have (POSIX, OFD and flock locks
    /// are read (PR) or write (EX)).
    #[error("invalid mode: {0}")]
    InvalidMode(String),
    /// A resource name longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN).
    #[error("resource name is {0} bytes; the limit is {max}", max = crate::MAX_NAME_LEN)]
    NameTooLong(usize),
    /// A lock value block longer than [`MAX_LVB_LEN`](crate::MAX_LVB_LEN).
    #[error("lock value block is {0} bytes; the limit is {max}", max = crate::MAX_LVB_LEN)]
    LvbTooLong(usize),
    /// flock locks cover the whole file; a byte range was given.
    #[error("flock locks cover the whole file; a byte range {0} was given")]
    FlockRange(String),
    /// A DLM lock handle that does not name a lock held on that resource
    /// by that owner.
    #[error("no DLM lock {0} on this resource")]
    NoSuchLock(u64),
    /// The call is for one kind of lock and was given another.
    #[error("{0}")]
    WrongKind(&'static str),
}
