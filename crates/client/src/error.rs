//! What a client call can fail with.

use std::time::Duration;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("server refused: {0}")]
    Refused(String),
    /// The server was at its connection limit (`max-connections`): a
    /// refusal of the moment. A reconnect tries again after it, as after
    /// a connection that failed, with the lease running meanwhile.
    #[error("server refused: {0}")]
    Busy(String),
    /// After a reconnect, the server serves another namespace than the
    /// one this client began with (another data directory at the same
    /// address): the client stops for good, since its inode numbers,
    /// open files and locks name nothing there, or other files.
    #[error(
        "{addr} now serves another namespace (id {now:016x}; this client began with {known:016x}): its files and locks are not there, so it stops; start it again to use the new one"
    )]
    OtherNamespace { addr: String, known: u64, now: u64 },
    /// The TLS handshake failed: the server's certificate is not trusted
    /// or does not name its address, or the server does not speak TLS.
    #[error("TLS with {addr}: {reason}")]
    Tls { addr: String, reason: String },
    /// The server closed the connection, or answered in another protocol,
    /// before it welcomed us.
    #[error(
        "{0} did not welcome us: it closed the connection or spoke another protocol (if it serves TLS, give the client its CA with --tls-ca)"
    )]
    Closed(String),
    /// The server refused the token (a wrong one, or none where one is
    /// needed).
    #[error("server refused: {0}")]
    Auth(String),
    /// The server refused the request to this caller: a user of the
    /// server's machine other than root or the server's own may not
    /// evict a session or use the changelog.
    #[error("{0}")]
    Denied(String),
    /// A time limit ran out; the message says at which step.
    #[error("{0}")]
    Timeout(String),
    /// A request that does not wait, made while the server's recovery
    /// window after a restart lasts (only reclaims are served then).
    #[error("the server restarted and is in its recovery window ({} ms left); only reclaims are served until it ends", .0.as_millis())]
    Recovering(Duration),
    /// The lock was lost while the request completed: the session's lease
    /// ran out (see [`Client::lost_locks`](crate::Client::lost_locks)).
    #[error("the lock was lost: the session's lease ran out")]
    LockLost,
    /// The request's session is gone: the server restarted, or the lease
    /// ran out before the client reconnected (then the client reclaims
    /// its locks in a new session), or the client was closed. A dropped
    /// connection alone does not fail requests: they wait for the next
    /// one and take effect exactly once.
    #[error("connection to the server lost")]
    ConnectionLost,
    /// The request had no effect, and may be made again once the client
    /// has its next server, whatever the request: the server stopped
    /// cleanly before it read it (see `ServerMsg::Goodbye`), or died
    /// before it made it (a change asked again [`IfMade`](interlock_proto::meta::Asking::IfMade)),
    /// or it was never sent, its client fenced to a session that ended
    /// ([`Client::within`](crate::Client::within)).
    #[error("the request had no effect (the server did not make it, or it was not sent); it may be made again")]
    Unread,
    #[error("server: {0}")]
    Server(String),
    /// A limit of the server's refused the request: the message names it
    /// (a mount answers `ENOLCK`).
    #[error("server: {0}")]
    Limit(String),
    #[error("deadlock: waiting would close a cycle of waiting owners (EDEADLK)")]
    Deadlock,
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A namespace operation failed at the server with this errno.
    #[error("{}", std::io::Error::from_raw_os_error(*.0))]
    Errno(i32),
}

impl ClientError {
    /// Whether the server refused this client for good: the token, the
    /// protocol version, or another namespace after a reconnect. Every
    /// later request of the client fails the same way, so a caller that
    /// waits out lost connections stops on it.
    pub fn is_refusal(&self) -> bool {
        self.refusal().is_some()
    }

    /// A copy of a refusal for good (see [`is_refusal`](Self::is_refusal)).
    pub(crate) fn refusal(&self) -> Option<ClientError> {
        match self {
            ClientError::Refused(r) => Some(ClientError::Refused(r.clone())),
            ClientError::Auth(r) => Some(ClientError::Auth(r.clone())),
            ClientError::OtherNamespace { addr, known, now } => {
                Some(ClientError::OtherNamespace { addr: addr.clone(), known: *known, now: *now })
            }
            _ => None,
        }
    }
}
