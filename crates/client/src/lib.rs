//! interlock's async client.
//!
//! - One connection per [`Client`], pipelined: any number of requests in
//!   flight, replies matched by id, grants and blocking callbacks pushed by
//!   the server on the same connection.
//! - Sessions with leases: the client renews in the background; after a
//!   lost connection it reconnects with backoff and resumes its session
//!   (keeping its locks; resuming takes the session's secret), and every
//!   request, reply and grant that was on the wire takes effect exactly
//!   once (requests made meanwhile wait for the new connection).
//! - At most one holder: if the server restarted while the client's lease
//!   still ran, the client reclaims every lock it holds during the
//!   server's recovery window. If its lease ran out instead (a stopped
//!   process), or a reclaim is refused, the locks are lost: never
//!   reclaimed, and reported to the caller ([`Client::lost_locks`],
//!   [`LostLock`]), who must stop acting under them. A client cut off
//!   from its server (a partition) does not wait to learn it: with no
//!   renewal answered for three quarters of the lease, it gives the
//!   session up and reports its locks lost then, a quarter of a lease
//!   ([`Client::loss_notice`]) before the server may give them to
//!   another. The lease is measured on the boot clock, which runs on
//!   while the machine is suspended, as the server's time does (see
//!   `clock`): a client suspended past that point reports its locks lost
//!   as it wakes. Requests that were in
//!   flight fail with [`ClientError::ConnectionLost`], or, if the server
//!   stopped cleanly before reading them, with [`ClientError::Unread`]:
//!   they had no effect and may be made again. Namespace changes that may
//!   not be made twice (create, rename, unlink, …) are the exception
//!   after a restart the client is back in time for: it asks the new
//!   server about each with its first id, and the server answers from
//!   its replay cache what it made, or makes it (protocol 15). A request that
//!   relies on a lock goes through [`Client::within`] the session the
//!   caller last checked its losses in ([`Client::settled`]): it is never
//!   sent in a later one, where the lock may be lost before its loss is
//!   reported.
//! - Open files ([`Client::open`], [`Client::create_open`]) are opened
//!   again in every new session, so a file unlinked while open outlives a
//!   server restart (the server keeps it through its recovery window).
//! - Blocking locks are futures: dropping one withdraws the wait at the
//!   server (and gives back a grant that raced the drop).
//! - Local first (seed 002): for POSIX, OFD and flock locks the client
//!   keeps its own lock table (the `interlock-core` engine, mirroring what
//!   its owners hold). A request that conflicts with a lock another owner
//!   of this client holds waits locally, in FIFO order, without a round
//!   trip, until that lock is unlocked; then it joins the server's queue.
//!   A non-blocking one fails at once. Unlocks are sent at once and never
//!   wait behind lock requests.
//! - Dropping the last clone of a [`Client`] ends its session at once:
//!   everything it holds is released, as when a process exits.
//!
//! ```no_run
//! use interlock_client::{Client, ClientOptions, LockSpec};
//! use interlock_core::{Mode, Range};
//! use interlock_proto::Kind;
//!
//! # async fn run() -> Result<(), interlock_client::ClientError> {
//! let client = Client::connect("127.0.0.1:7420", ClientOptions::default()).await?;
//! // Owner 1 (say, a process) takes a write lock on bytes 0..=99 of a file.
//! let spec = LockSpec {
//!     resource: b"/fs/data/file-17".to_vec(),
//!     kind: Kind::Posix,
//!     owner: 1,
//!     mode: Mode::EX,
//!     range: Range::new(0, 99).expect("start <= end"),
//! };
//! let grant = client.lock(&spec).await?; // waits at the server, FIFO
//! println!("fencing token {}", grant.fence);
//! client.unlock(&spec).await?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod clock;
mod connection;
mod guard;
mod lease;
mod lost;
pub mod meta;
mod opens;
mod outbox;

use foldhash::{HashMap, HashSet};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use interlock_core::{Effect, LockKind, LockRequest, LockSpace, Mode, Outcome, Range};
use interlock_proto::meta::{Asking, Once};
use interlock_proto::{
    ClientMsgRef, ConflictInfo, GrantInfo, Kind, Op, Reply, ResourceInfo, Secret, StatusInfo, Target, owner,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};

use clock::Moment;
use guard::{LocalWait, WaitGuard};
use lease::Lease;
use lost::Losses;
pub use lost::LostLock;
use outbox::Outbox;

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
    /// ran out (see [`Client::lost_locks`]).
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
    /// before it made it (a change asked again [`IfMade`](Asking::IfMade)).
    #[error("the server stopped before it made the request, which had no effect")]
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
    fn refusal(&self) -> Option<ClientError> {
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

/// Connection settings.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// The server's shared secret.
    pub token: Option<String>,
    /// Send every request to the server, without the local lock table (for
    /// measurements of the server alone).
    pub no_local: bool,
    /// How long connecting and the handshake may take, each time
    /// (reconnects included); `None`: as long as the system allows.
    pub connect_timeout: Option<Duration>,
    /// Speak TLS, trusting servers this configuration trusts (see
    /// `interlock_proto::tls::client_config`); the certificate must name
    /// the host of the server's address.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// A lock to take or give back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSpec {
    pub resource: Vec<u8>,
    pub kind: Kind,
    /// This client's name for the owner (a process, an open file).
    pub owner: u32,
    pub mode: Mode,
    /// Inclusive; `Range::WHOLE` for flock and whole-resource DLM locks.
    pub range: Range,
}

impl LockSpec {
    fn target(&self) -> Target {
        Target {
            resource: self.resource.clone(),
            kind: self.kind,
            owner: self.owner,
            start: self.range.start(),
            end: self.range.end(),
        }
    }

    fn core_kind(&self) -> LockKind {
        core_kind(self.kind)
    }

    /// The owner's id in the local table (kinds apart, as at the server).
    fn local_owner(&self) -> u64 {
        local_owner(self.kind, self.owner)
    }

    fn local(&self) -> bool {
        self.kind != Kind::Dlm
    }

    /// Refuses what the server would: a name over the engine's limit
    /// (said here, not as a frame over the protocol's limit).
    fn check(&self) -> Result<(), ClientError> {
        check_name(&self.resource)
    }

    /// This lock as a request to the local table.
    fn local_request(&self, wait: bool) -> LockRequest<'_> {
        LockRequest {
            resource: &self.resource,
            owner: self.local_owner(),
            kind: self.core_kind(),
            mode: self.mode,
            range: self.range,
            wait,
        }
    }
}

/// A local owner id: a POSIX owner and an OFD owner with the same number
/// are different owners (session 0: the table is the client's own).
fn local_owner(kind: Kind, number: u32) -> u64 {
    owner::id(kind, 0, number)
}

fn core_kind(k: Kind) -> LockKind {
    k.into()
}

fn check_name(resource: &[u8]) -> Result<(), ClientError> {
    if resource.len() > interlock_core::MAX_NAME_LEN {
        return Err(ClientError::Invalid(format!(
            "the name is {} bytes; the limit is {}",
            resource.len(),
            interlock_core::MAX_NAME_LEN
        )));
    }
    Ok(())
}

/// A blocking callback: a DLM lock of ours blocks someone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub resource: Vec<u8>,
    pub handle: u64,
    pub owner: u32,
    pub held: u8,
    pub wanted: u8,
}

/// A DLM lock held: (resource, owner, mode, start, end).
pub(crate) type DlmEntry = (Vec<u8>, u32, u8, u64, u64);

/// What comes back for a request: its reply, or why none will come in
/// its session.
pub(crate) type Replied = Result<Reply, NoReply>;

/// Why a request got no reply in the session it was sent in.
#[derive(Debug)]
pub(crate) enum NoReply {
    /// The server never read it: it stopped cleanly first (its
    /// `Goodbye`), so the request had no effect.
    Unread,
    /// A change that may not be made twice (`Once`), in flight when the
    /// server restarted: the client is back within the recovery window,
    /// so the server still knows whether it made the change. Ask again,
    /// with the same id.
    AskAgain,
}

impl From<NoReply> for ClientError {
    fn from(n: NoReply) -> ClientError {
        match n {
            NoReply::Unread => ClientError::Unread,
            NoReply::AskAgain => ClientError::ConnectionLost,
        }
    }
}

/// A request awaiting its reply.
struct Pending {
    /// Where the request ends in the session's stream.
    end: u64,
    tx: oneshot::Sender<Replied>,
    /// A change that may not be made twice: listed in `Tables::once`.
    once: bool,
}

#[derive(Default)]
struct Tables {
    /// Request id -> where its reply goes.
    pending: HashMap<u64, Pending>,
    /// Blocking requests, from sending until their future is done with
    /// them: the request, to send again in a new session, or to give back
    /// a grant that races a drop.
    waits: HashMap<u64, Waiting>,
    /// Queued requests whose future was dropped: a grant that still comes
    /// is given back.
    abandoned: HashMap<u64, Op>,
    /// Cancel request id -> the request it withdraws. Its reply comes after
    /// any grant that raced it, so the request is then forgotten.
    cancelling: HashMap<u64, u64>,
    /// Local waits -> who to wake.
    local_waits: HashMap<u64, oneshot::Sender<()>>,
    /// Resources with locks in the local table (for reclaim).
    local_resources: HashSet<(Kind, Vec<u8>)>,
    /// DLM locks held, by handle.
    dlm: HashMap<u64, DlmEntry>,
    /// After a reclaim, the new handle of a DLM lock the user knows by its
    /// old one.
    alias: HashMap<u64, u64>,
    /// Files held open at the server, to open again in a new session.
    opens: opens::Opens,
    /// The ids of the changes that may not be made twice and are not yet
    /// answered (listed in `pending`, or being sent again after a
    /// restart): the lowest is the `settled` each such request carries,
    /// which lets the server forget the ones below it.
    once: BTreeSet<u64>,
}

impl Tables {
    /// Sends request `id` and lists where its reply goes, under the
    /// tables' lock (the caller's), so that no reply arrives unlisted.
    fn send(&mut self, outbox: &Outbox, id: u64, op: &Op) -> Result<oneshot::Receiver<Replied>, ClientError> {
        let end = outbox.send(&ClientMsgRef::Request { id, op })?;
        let (tx, rx) = oneshot::channel();
        let once = matches!(op, Op::Meta { once: Some(_), .. });
        self.pending.insert(id, Pending { end, tx, once });
        Ok(rx)
    }

    /// Takes request `id` off the lists: its reply came. O(log once).
    fn resolve(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        if p.once {
            self.once.remove(&id);
        }
        Some(p)
    }

    /// The server stopped cleanly having read the session's stream up to
    /// byte `served`: the requests past it are told they had no effect.
    /// Waits are left listed, to be sent again in the next session as
    /// after any loss of the session. O(pending).
    fn unread_past(&mut self, served: u64) {
        let waits = &self.waits;
        for (id, p) in self.pending.extract_if(|id, p| p.end > served && !waits.contains_key(id)) {
            if p.once {
                self.once.remove(&id);
            }
            let _ = p.tx.send(Err(NoReply::Unread));
        }
    }

    /// The session is gone, and no reply listed will come. If the server
    /// restarted and the client is back within its recovery window
    /// (`reclaim`), each change that may not be made twice is told to ask
    /// again (the server kept whether it made it); every other request is
    /// dropped, and its caller sees [`ClientError::ConnectionLost`].
    /// O(pending).
    fn session_lost(&mut self, reclaim: bool) {
        for (id, p) in self.pending.drain() {
            let asks = reclaim && p.once && p.tx.send(Err(NoReply::AskAgain)).is_ok();
            if p.once && !asks {
                self.once.remove(&id);
            }
        }
    }
}

struct Inner {
    addr: String,
    options: ClientOptions,
    next_id: AtomicU64,
    /// This client, for its life: a random number its hello gives, which
    /// the server writes with each change that may not be made twice.
    origin: u64,
    session: AtomicU64,
    /// What resuming the session takes.
    secret: Mutex<Secret>,
    /// The server's start number at the last welcome.
    boot: AtomicU64,
    /// The server's write verifier at the last welcome.
    verifier: AtomicU64,
    /// The identity of the namespace the first welcome named (0 before
    /// it): every later welcome must name the same one (see `hello`).
    namespace: AtomicU64,
    /// The session's lease, as far as answered requests prove it.
    lease: Mutex<Lease>,
    /// Counts sessions: a grant answered in one session and recorded in a
    /// later one was lost between (changed under the tables' lock).
    generation: AtomicU64,
    /// The generation whose lost locks are all in `losses` (it trails
    /// `generation` while a new session's losses are being reported): see
    /// [`Client::settled`].
    settled: AtomicU64,
    losses: Losses,
    /// Bytes of the session's stream from the server taken in so far.
    received: AtomicU64,
    lease_ms: AtomicU64,
    outbox: Arc<Outbox>,
    tables: Mutex<Tables>,
    /// The client's own owners' locks, as granted by the server.
    local: LockSpace,
    blocking: Mutex<Option<mpsc::UnboundedSender<Blocking>>>,
    /// Every handle is gone: the session is ended and nothing reconnects.
    closed: AtomicBool,
    /// Why the server refused this client for good, once it has (see
    /// [`Client::refused`]): every later request fails with it.
    refused: watch::Sender<Option<Arc<ClientError>>>,
}

impl Inner {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// The refusal that ended this client, if one did, for a request that
    /// finds it ended: a caller that retries lost connections (`changelog
    /// read --follow`, `status --watch`) learns it must stop.
    fn refusal(&self) -> Option<ClientError> {
        self.refused.borrow().as_deref().and_then(ClientError::refusal)
    }

    /// Sends request `id`, first recording where its reply goes (and, for
    /// a blocking request, its pushed grant), so neither can arrive
    /// unseen. A blocking request is kept in `waits`, to be sent again
    /// after a reconnect; any other is handed back. A release leaves the
    /// files to open again in a new session as it is sent (see `opens`).
    /// With a `fence`, only in that session (see [`Client::within`]).
    fn submit(&self, id: u64, op: Op, wait: bool, fence: Option<u64>) -> Result<Submitted, ClientError> {
        let mut t = self.tables.lock();
        self.fenced(fence)?;
        self.submit_listed(&mut t, id, op, wait)
    }

    /// Whether a request fenced to session `fence` may go out now: the
    /// generation changes under the tables' lock (which the caller
    /// holds), so a fenced request is listed in its session or not sent
    /// at all.
    fn fenced(&self, fence: Option<u64>) -> Result<(), ClientError> {
        match fence {
            Some(g) if g != self.generation.load(Ordering::Relaxed) => Err(ClientError::ConnectionLost),
            _ => Ok(()),
        }
    }

    /// [`submit`](Inner::submit) of `op`, a change that may not be made
    /// twice (`Op::Meta` with `once`): a new request, or request
    /// `again`, sent again after a restart ([`NoReply::AskAgain`]). A new
    /// one is numbered under the tables' lock: so no such request with a
    /// lower id goes out after one whose `settled` has passed it, which
    /// would let the server forget it before it is made. Its id, and what
    /// [`submit`](Inner::submit) returns.
    /// A change fenced to an earlier session is asked again only
    /// [`IfMade`](Asking::IfMade): it went out in its session, but may not
    /// be made in this one.
    fn submit_once(&self, mut op: Op, again: Option<u64>, fence: Option<u64>) -> Result<(u64, Submitted), ClientError> {
        let mut t = self.tables.lock();
        let asking = match (again, self.fenced(fence)) {
            (None, Err(e)) => return Err(e),
            (None, Ok(())) => Asking::First,
            (Some(_), Ok(())) => Asking::Again,
            (Some(_), Err(_)) => Asking::IfMade,
        };
        let id = again.unwrap_or_else(|| self.next_id.fetch_add(1, Ordering::Relaxed));
        t.once.insert(id);
        if let Op::Meta { once: Some(o), .. } = &mut op {
            *o = Once { settled: *t.once.first().expect("just listed"), asking };
        }
        Ok((id, self.submit_listed(&mut t, id, op, false)?))
    }

    /// Sends request `id` and lists it in `t`, the tables, locked.
    fn submit_listed(&self, t: &mut Tables, id: u64, op: Op, wait: bool) -> Result<Submitted, ClientError> {
        let reply_rx = t.send(&self.outbox, id, &op).map_err(|e| self.refusal().unwrap_or(e))?;
        if let Op::Meta { op: interlock_proto::meta::MetaOp::Release { ino }, .. } = &op {
            t.opens.take(*ino);
        }
        let generation = self.generation.load(Ordering::Relaxed);
        if wait {
            let (grant_tx, grant_rx) = oneshot::channel();
            t.waits.insert(id, Waiting { grant_tx: Some(grant_tx), op });
            Ok(Submitted { reply_rx, grant_rx: Some(grant_rx), op: None, generation })
        } else {
            Ok(Submitted { reply_rx, grant_rx: None, op: Some(op), generation })
        }
    }

    /// Sends a request whose reply nobody awaits (acknowledgements,
    /// give-backs, reclaims of POSIX locks).
    fn send_unanswered(&self, op: &Op) {
        if self.outbox.send(&ClientMsgRef::Request { id: 0, op }).is_ok() {}
    }
}

/// A blocking request in `Tables::waits`.
struct Waiting {
    /// Where its grant goes (pushed, or the reply to the request sent
    /// again in a new session), or the refusal of a request sent again;
    /// taken when delivered (the request stays listed until its future is
    /// done with it).
    grant_tx: Option<oneshot::Sender<Answer>>,
    op: Op,
}

/// A blocking request's outcome, and the session (generation) in which it
/// came.
pub(crate) struct Answer {
    reply: Reply,
    generation: u64,
}

/// A request on its way: see [`Inner::submit`].
struct Submitted {
    reply_rx: oneshot::Receiver<Replied>,
    grant_rx: Option<oneshot::Receiver<Answer>>,
    op: Option<Op>,
    /// The session it was sent in: its reply, if any, comes in it (the
    /// replies awaited are dropped when the session changes).
    generation: u64,
}

/// A connection to an interlock server. Cheap to clone; all clones share
/// the session. When the last clone is dropped the session ends at once,
/// as a process's locks go when it exits: every lock it holds is released
/// and every wait withdrawn.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    _last: Arc<LastHandle>,
    /// Requests through this clone go out only in this session (see
    /// [`Client::within`]).
    fence: Option<u64>,
}

/// Dropped with the last [`Client`] clone.
struct LastHandle(Arc<Inner>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Relaxed);
        // The server ends the session and closes the connection; the
        // reader then stops, and nothing reconnects.
        let _ = self.0.outbox.send(&ClientMsgRef::Request { id: 0, op: &Op::Bye });
    }
}

impl Client {
    /// Connects and opens a session. Reconnects by itself afterwards.
    pub async fn connect(addr: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            options,
            next_id: AtomicU64::new(1),
            origin: random_origin(),
            session: AtomicU64::new(0),
            secret: Mutex::default(),
            boot: AtomicU64::new(0),
            verifier: AtomicU64::new(0),
            namespace: AtomicU64::new(0),
            lease: Mutex::new(Lease::new(Duration::ZERO, Moment::now())),
            generation: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            losses: Losses::default(),
            received: AtomicU64::new(0),
            lease_ms: AtomicU64::new(0),
            outbox: Arc::default(),
            tables: Mutex::new(Tables::default()),
            local: LockSpace::default(),
            blocking: Mutex::new(None),
            closed: AtomicBool::new(false),
            refused: watch::Sender::new(None),
        });
        let welcomed = connection::handshake(&inner).await?;
        *inner.lease.lock() = Lease::new(welcomed.lease, welcomed.sent);
        let client = Client { inner: inner.clone(), _last: Arc::new(LastHandle(inner)), fence: None };
        client.start(welcomed.conn);
        Ok(client)
    }

    /// Completes, with the reason, once the server has refused this
    /// client for good: a reconnect was refused (the token, say), or found
    /// another namespace ([`ClientError::OtherNamespace`]). Every request
    /// fails from then on. Never completes otherwise.
    pub fn refused(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut refused = self.inner.refused.subscribe();
        async move {
            // The reason, as a `String`: the watch's guard may not be
            // held across an await.
            let why = refused
                .wait_for(Option::is_some)
                .await
                .map(|why| why.as_ref().map_or_else(String::new, |e| e.to_string()));
            match why {
                Ok(why) => why,
                // The client's state, and the sender with it, went.
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// The session id the server gave this client.
    pub fn session(&self) -> u64 {
        self.inner.session.load(Ordering::Relaxed)
    }

    /// The write verifier of the server this client last connected to
    /// (as NFS's: it changes only at a start after which data written and
    /// not synced before may have been lost). Set before any answer of
    /// that connection is delivered: read before a write is sent, it is
    /// that of the server that took the write or an earlier one; read
    /// after an `fsync` is answered, that of the server that synced or a
    /// later one. So writes noted under one verifier and an `fsync` seen
    /// under another may be lost, and equal ones were not.
    pub fn verifier(&self) -> u64 {
        self.inner.verifier.load(Ordering::Acquire)
    }

    /// Counts this client's sessions, up to the one whose lost locks are
    /// all reported ([`Client::lost_since`]): a caller that reads this,
    /// then the losses, and finds a lock still held, sends what relies on
    /// it through [`Client::within`] this count, so that it never goes
    /// out in a later session, where the lock may be lost and not yet
    /// reported.
    pub fn settled(&self) -> u64 {
        self.inner.settled.load(Ordering::SeqCst)
    }

    /// A clone whose requests go out only in session `settled` (a
    /// [`Client::settled`] count): in any later one they fail with
    /// [`ClientError::ConnectionLost`], unsent, as requests in flight when
    /// a session ends do. What a program writes under a lock must not
    /// reach the server after the lease that held the lock ran out and
    /// another holder took it: a write queued while the client was
    /// stopped past its lease would otherwise go out in the new session
    /// before anyone learned of the loss.
    pub fn within(&self, settled: u64) -> Client {
        Client { fence: Some(settled), ..self.clone() }
    }

    /// Counts the locks this client has lost so far (see [`LostLock`]):
    /// await `changed()`, then read them with [`Client::lost_since`]. A
    /// lock is lost when the session's lease runs out (the server gave it
    /// to others) or a reclaim after a server restart is refused; whoever
    /// acts under a lost lock must stop.
    pub fn lost_locks(&self) -> watch::Receiver<usize> {
        self.inner.losses.watch()
    }

    /// How long before the server may give a lock of this client to
    /// another the client reports it lost, when it hears nothing from the
    /// server (a quarter of the lease): whatever acts under the lock has
    /// that long to stop.
    pub fn loss_notice(&self) -> Duration {
        Lease::notice(Duration::from_millis(self.inner.lease_ms.load(Ordering::Relaxed)))
    }

    /// The locks lost after the first `from`.
    pub fn lost_since(&self, from: usize) -> Vec<LostLock> {
        self.inner.losses.since(from)
    }

    /// Blocking callbacks for this client's DLM locks (the first call takes
    /// the stream).
    pub fn blocking_callbacks(&self) -> mpsc::UnboundedReceiver<Blocking> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.inner.blocking.lock() = Some(tx);
        rx
    }

    fn start(&self, conn: connection::Conn) {
        // Requests may be sent as soon as `connect` returns.
        self.inner.outbox.open();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            // The first connection has nothing to reclaim (its session is
            // new, not lost), so it counts as resumed.
            let mut conn = Some((conn, connection::Settled::Resumed));
            let mut goodbye = None;
            let mut refusal = None;
            while !inner.closed() {
                let (c, settled) = match conn.take() {
                    Some(c) => c,
                    None => match connection::reconnect(&inner).await {
                        Ok(w) => match connection::settle(&inner, &w, Moment::now(), goodbye.take()) {
                            Some(settled) => (w.conn, settled),
                            // Cannot happen with a sound server; not in a hot loop.
                            None => {
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                continue;
                            }
                        },
                        Err(e) => {
                            refusal = e;
                            break;
                        }
                    },
                };
                goodbye = connection::run(inner.clone(), c, settled).await;
            }
            // For good: what is in flight or sent later will not be
            // answered, and blocking requests will not be granted.
            inner.outbox.close();
            {
                let mut t = inner.tables.lock();
                t.session_lost(false);
                t.waits.clear();
            }
            if let Some(e) = refusal {
                connection::refused(&inner, e);
            }
        });
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let every = match weak.upgrade() {
                    Some(i) if !i.closed() => {
                        Lease::renew_every(Duration::from_millis(i.lease_ms.load(Ordering::Relaxed)))
                    }
                    _ => return,
                };
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let received = inner.received.load(Ordering::Relaxed);
                let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
                let sent_at = Moment::now();
                let Ok(sent) = inner.submit(id, Op::Renew { received }, false, None) else { continue };
                let generation = sent.generation;
                drop(inner);
                // Answered, a renewal proves the lease ran at least a lease
                // past its sending (see `lease`), however late the answer
                // comes; meanwhile the next renewals go anyway.
                let weak = weak.clone();
                tokio::spawn(async move {
                    if let Ok(Ok(Reply::Done)) = sent.reply_rx.await
                        && let Some(inner) = weak.upgrade()
                        && inner.generation.load(Ordering::Relaxed) == generation
                    {
                        inner.lease.lock().confirm(sent_at);
                    }
                });
            }
        });
    }

    async fn request(&self, op: Op) -> Result<Reply, ClientError> {
        self.request_in(op).await.map(|(r, _)| r)
    }

    /// A request's reply, and the session (generation) it came in. A
    /// change that may not be made twice, in flight when the server
    /// restarted, is asked about again in the new session (see
    /// [`NoReply::AskAgain`]): its caller sees one answer.
    async fn request_in(&self, op: Op) -> Result<(Reply, u64), ClientError> {
        let (id, mut sent) = match op {
            Op::Meta { once: Some(_), .. } => self.inner.submit_once(op, None, self.fence)?,
            op => {
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                (id, self.inner.submit(id, op, false, self.fence)?)
            }
        };
        loop {
            match sent.reply_rx.await.map_err(|_| ClientError::ConnectionLost)? {
                Err(NoReply::AskAgain) => {
                    let op = sent.op.expect("a request that does not wait is handed back");
                    sent = self.inner.submit_once(op, Some(id), self.fence)?.1;
                }
                Err(unread) => return Err(unread.into()),
                Ok(Reply::NotMade) => return Err(ClientError::Unread),
                Ok(Reply::Error(e)) => return Err(ClientError::Server(e)),
                Ok(Reply::Denied(e)) => return Err(ClientError::Denied(e)),
                Ok(Reply::Limit(e)) => return Err(ClientError::Limit(e)),
                Ok(Reply::Recovering { left_ms }) => {
                    return Err(ClientError::Recovering(Duration::from_millis(left_ms)));
                }
                Ok(r) => return Ok((r, sent.generation)),
            }
        }
    }

    /// Takes a lock, waiting as long as it takes. Dropping the future
    /// withdraws the request.
    pub async fn lock(&self, spec: &LockSpec) -> Result<GrantInfo, ClientError> {
        self.acquire(spec, true, None).await?.ok_or(ClientError::Server("a blocking request was refused".into()))
    }

    /// Takes a lock if it is free now; `None` if it is not.
    pub async fn try_lock(&self, spec: &LockSpec) -> Result<Option<GrantInfo>, ClientError> {
        self.acquire(spec, false, None).await
    }

    /// Takes a lock (waiting for it if `wait`) by `deadline`: `None` if it
    /// was held by others until then (or, without `wait`, now). If the
    /// server has not answered by then, [`ClientError::Timeout`]: a slow
    /// server is not a held lock. The request is withdrawn either way.
    pub async fn lock_by(
        &self,
        spec: &LockSpec,
        wait: bool,
        deadline: Instant,
    ) -> Result<Option<GrantInfo>, ClientError> {
        self.acquire(spec, wait, Some(deadline)).await
    }

    /// Whether the local table mirrors this client's locks.
    fn local_table(&self) -> bool {
        !self.inner.options.no_local
    }

    async fn acquire(
        &self,
        spec: &LockSpec,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<GrantInfo>, ClientError> {
        spec.check()?;
        let local = spec.local() && self.local_table();
        if local {
            let range = spec.range;
            let conflict = self
                .inner
                .local
                .test(&spec.resource, spec.local_owner(), spec.core_kind(), spec.mode, range)
                .map_err(|e| ClientError::Invalid(e.to_string()))?;
            if conflict.is_some() {
                if !wait {
                    return Ok(None);
                }
                // Wait here, behind the other local owner, without asking
                // the server anything.
                match within(deadline, self.wait_locally(spec)).await {
                    Some(r) => r?,
                    None => return Ok(None),
                }
            }
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let op = Op::Lock { target: spec.target(), mode: spec.mode as u8, wait, reclaim: false };
        let sent = self.inner.submit(id, op, wait, self.fence)?;
        let mut guard = WaitGuard {
            inner: &self.inner,
            id,
            op: sent.op,
            live: true,
            reply_rx: sent.reply_rx,
            grant_rx: sent.grant_rx,
        };
        let blocking = guard.grant_rx.is_some();
        let reply = match within(deadline, &mut guard.reply_rx).await {
            Some(Ok(Ok(r))) => r,
            // Never read (the server stopped cleanly first): nothing to
            // withdraw. Never so for a wait, which is sent again.
            Some(Ok(Err(unread))) => {
                guard.done();
                return Err(unread.into());
            }
            // The session changed before the reply came: a blocking
            // request is sent again in the new one (its answer comes
            // through `grant_rx`), any other failed.
            Some(Err(_)) if blocking => Reply::Queued,
            Some(Err(_)) => return Err(ClientError::ConnectionLost),
            None => return Err(ClientError::Timeout("the server did not answer the lock request in time".into())),
        };
        let mut generation = sent.generation;
        let reply = match (reply, guard.grant_rx.as_mut()) {
            (Reply::Queued, Some(grant_rx)) => match within(deadline, grant_rx).await {
                Some(a) => {
                    let a = a.map_err(|_| ClientError::ConnectionLost)?;
                    generation = a.generation;
                    a.reply
                }
                // Held by others until the deadline.
                None => return Ok(None),
            },
            (reply, _) => reply,
        };
        guard.done();
        match reply {
            Reply::Granted(g) => {
                self.record(spec, &g, local, generation)?;
                Ok(Some(g))
            }
            Reply::WouldBlock => Ok(None),
            Reply::Deadlock => Err(ClientError::Deadlock),
            Reply::Error(e) => Err(ClientError::Server(e)),
            Reply::Limit(e) => Err(ClientError::Limit(e)),
            Reply::Recovering { left_ms } => Err(ClientError::Recovering(Duration::from_millis(left_ms))),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Queues `spec` in the local table and waits until no other local
    /// owner holds what it wants. The local grant is given back at once:
    /// from here the request waits in the server's queue, and a local
    /// owner still waiting there must not hold back the other local owners
    /// (they would join the server's queue a whole rotation late).
    async fn wait_locally(&self, spec: &LockSpec) -> Result<(), ClientError> {
        let (tx, rx) = oneshot::channel();
        let resp = self.inner.local.lock(&spec.local_request(true)).map_err(|e| ClientError::Invalid(e.to_string()))?;
        match resp.outcome {
            Outcome::Queued(w) => {
                self.inner.tables.lock().local_waits.insert(w, tx);
                let mut guard = LocalWait { inner: self.inner.clone(), spec: spec.clone(), wait: Some(w) };
                local_effects(&self.inner, resp.effects);
                rx.await.map_err(|_| ClientError::ConnectionLost)?;
                guard.wait = None;
                Ok(())
            }
            Outcome::Granted(_) => {
                local_effects(&self.inner, resp.effects);
                drop(LocalWait { inner: self.inner.clone(), spec: spec.clone(), wait: None });
                Ok(())
            }
            Outcome::Deadlock => Err(ClientError::Deadlock),
            other => Err(ClientError::Server(format!("local table: {other:?}"))),
        }
    }

    /// Mirrors a grant made in session `generation` into the client's
    /// tables; if the session has changed since, the lock was lost with it
    /// (its lease ran out): [`ClientError::LockLost`]. Under the tables'
    /// lock, as the loss of a session is, so a grant is either recorded
    /// before a loss (and reported lost with the rest) or refused here.
    fn record(&self, spec: &LockSpec, grant: &GrantInfo, local: bool, generation: u64) -> Result<(), ClientError> {
        let mut t = self.inner.tables.lock();
        if self.inner.generation.load(Ordering::Relaxed) != generation {
            return Err(ClientError::LockLost);
        }
        let mut effects = Vec::new();
        if local {
            if let Ok(resp) = self.inner.local.lock(&spec.local_request(false)) {
                effects = resp.effects;
            }
            t.local_resources.insert((spec.kind, spec.resource.clone()));
        }
        if let Some(h) = grant.handle {
            let entry = (spec.resource.clone(), spec.owner, spec.mode as u8, spec.range.start(), spec.range.end());
            t.dlm.insert(h, entry);
        }
        drop(t);
        local_effects(&self.inner, effects);
        Ok(())
    }

    /// Releases `spec.range` of the owner (POSIX, OFD, flock). Sent at
    /// once; local waiters it frees go on to the server right away.
    pub async fn unlock(&self, spec: &LockSpec) -> Result<(), ClientError> {
        if spec.kind == Kind::Dlm {
            return Err(ClientError::Invalid("DLM locks are released with dlm_unlock".into()));
        }
        spec.check()?;
        let reply = self.request(Op::Unlock { target: spec.target() });
        if self.local_table() {
            let (owner, kind) = (spec.local_owner(), spec.core_kind());
            if let Ok(resp) = self.inner.local.unlock(&spec.resource, owner, kind, spec.range) {
                local_effects(&self.inner, resp.effects);
            }
            self.forget_if_free(spec.kind, &spec.resource);
        }
        reply.await.map(drop)
    }

    /// Drops `resource` from the resources to reclaim once no local owner
    /// holds a lock there, so a long-lived client that locks many names
    /// does not keep them all. Checked under the tables' lock, which a
    /// new local grant takes after it is in the local table, so a racing
    /// grant is never dropped.
    fn forget_if_free(&self, kind: Kind, resource: &[u8]) {
        let mut t = self.inner.tables.lock();
        if self.inner.local.lock_count(resource, core_kind(kind).namespace()).is_ok_and(|n| n == 0) {
            t.local_resources.remove(&(kind, resource.to_vec()));
        }
    }

    /// Releases every lock of the owner on the resource (a close).
    pub async fn close(&self, resource: &[u8], kind: Kind, owner: u32) -> Result<(), ClientError> {
        let reply = self.request(Op::Close { resource: resource.to_vec(), kind, owner });
        if self.local_table() {
            if let Ok(resp) = self.inner.local.release_owner(resource, local_owner(kind, owner), core_kind(kind)) {
                local_effects(&self.inner, resp.effects);
            }
            self.forget_if_free(kind, resource);
        }
        reply.await.map(drop)
    }

    /// `F_GETLK` at the server.
    pub async fn test(&self, spec: &LockSpec) -> Result<Option<ConflictInfo>, ClientError> {
        spec.check()?;
        match self.request(Op::Test { target: spec.target(), mode: spec.mode as u8 }).await? {
            Reply::Conflict(c) => Ok(c),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    fn handle_of(&self, handle: u64) -> u64 {
        *self.inner.tables.lock().alias.get(&handle).unwrap_or(&handle)
    }

    /// Releases a DLM lock, storing `lvb` if it was held PW or EX.
    pub async fn dlm_unlock(
        &self,
        resource: &[u8],
        owner: u32,
        handle: u64,
        lvb: Option<Vec<u8>>,
    ) -> Result<(), ClientError> {
        let handle = self.handle_of(handle);
        self.inner.tables.lock().dlm.remove(&handle);
        self.request(Op::DlmUnlock { resource: resource.to_vec(), owner, handle, lvb }).await.map(drop)
    }

    /// Converts a DLM lock; `None` if `wait` is false and it would block.
    pub async fn convert(
        &self,
        resource: &[u8],
        owner: u32,
        handle: u64,
        mode: Mode,
        wait: bool,
    ) -> Result<Option<GrantInfo>, ClientError> {
        let handle = self.handle_of(handle);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let op = Op::DlmConvert { resource: resource.to_vec(), owner, handle, mode: mode as u8, wait, lvb: None };
        let sent = self.inner.submit(id, op, wait, self.fence)?;
        let reply = sent.reply_rx.await.map_err(|_| ClientError::ConnectionLost).and_then(|r| Ok(r?));
        let reply = match (reply, sent.grant_rx) {
            (Ok(Reply::Queued), Some(grant_rx)) => {
                grant_rx.await.map(|a| a.reply).map_err(|_| ClientError::ConnectionLost)
            }
            (reply, _) => reply,
        };
        let out = match reply {
            Ok(Reply::Granted(g)) => Ok(Some(g)),
            Ok(Reply::WouldBlock) => Ok(None),
            Ok(Reply::Deadlock) => Err(ClientError::Deadlock),
            Ok(Reply::Error(e)) => Err(ClientError::Server(e)),
            Ok(Reply::Recovering { left_ms }) => Err(ClientError::Recovering(Duration::from_millis(left_ms))),
            Ok(other) => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
            Err(e) => Err(e),
        };
        let mut t = self.inner.tables.lock();
        t.waits.remove(&id);
        if let (Ok(Some(_)), Some(d)) = (&out, t.dlm.get_mut(&handle)) {
            d.2 = mode as u8;
        }
        out
    }

    /// The server's live counters.
    pub async fn status(&self) -> Result<StatusInfo, ClientError> {
        match self.request(Op::Status).await? {
            Reply::Status(s) => Ok(*s),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Who holds and who waits for `resource` at the server, in every lock
    /// map (record, flock, DLM).
    pub async fn inspect(&self, resource: &[u8]) -> Result<ResourceInfo, ClientError> {
        match self.request(Op::Inspect { resource: resource.to_vec() }).await? {
            Reply::Resource(r) => Ok(r),
            Reply::Error(e) => Err(ClientError::Server(e)),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Ends another session at once, as if its lease had run out: its
    /// locks are released, its waits withdrawn, and its client learns that
    /// it lost them.
    pub async fn evict(&self, session: u64) -> Result<(), ClientError> {
        match self.request(Op::Evict { session }).await? {
            Reply::Done => Ok(()),
            Reply::Error(e) => Err(ClientError::Server(e)),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Ends the session now: the server releases everything it holds.
    /// For good: the client does not reconnect afterwards (a reconnect
    /// would reclaim what the bye released), and later requests fail.
    pub async fn bye(&self) -> Result<(), ClientError> {
        self.inner.closed.store(true, Ordering::Relaxed);
        self.request(Op::Bye).await.map(drop)
    }
}

/// A client's origin: 64 random bits from the operating system (two
/// clients that drew the same could be answered each other's changes
/// after a restart: about one chance in 10^11 for a thousand clients).
fn random_origin() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the operating system's random source");
    u64::from_le_bytes(b)
}

/// Wakes local waiters that the local table granted.
fn local_effects(inner: &Inner, effects: Vec<Effect>) {
    for e in effects {
        if let Effect::Granted { wait, .. } = e
            && let Some(tx) = inner.tables.lock().local_waits.remove(&wait)
        {
            let _ = tx.send(());
        }
    }
}

/// `f`'s output, or `None` if `deadline` passes first. Without a deadline
/// `f` is awaited as it is: the common, untimed lock pays for no timer.
async fn within<F: std::future::Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), f).await.ok(),
        None => Some(f.await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a clean stop, the requests past where the server stopped
    /// reading are told they had no effect; those it read, and waits
    /// (sent again in the next session), are not.
    #[test]
    fn requests_past_the_goodbye_are_unread_and_the_rest_are_not() {
        let outbox = Outbox::default();
        outbox.open();
        let mut t = Tables::default();
        let mut rx: Vec<_> = (1..=4).map(|id| t.send(&outbox, id, &Op::Status).unwrap()).collect();
        let ends: Vec<u64> = (1..=4).map(|id| t.pending[&id].end).collect();
        assert!(ends.windows(2).all(|w| w[0] < w[1]), "{ends:?}");
        // Request 4 is a wait.
        t.waits.insert(4, Waiting { grant_tx: None, op: Op::Status });
        // The server read requests 1 and 2.
        t.unread_past(ends[1]);
        assert!(matches!(rx[2].try_recv(), Ok(Err(NoReply::Unread))), "request 3 was not read");
        let listed: Vec<u64> = {
            let mut l: Vec<u64> = t.pending.keys().copied().collect();
            l.sort();
            l
        };
        assert_eq!(listed, [1, 2, 4], "read ones wait for their replies; the wait stays to be sent again");
        assert!(rx[0].try_recv().is_err() && rx[1].try_recv().is_err() && rx[3].try_recv().is_err());
    }

    /// When the session is lost to a restart the client is back in time
    /// for, each change that may not be made twice is told to ask again
    /// and stays listed in `once` (its id holds `settled` down); any other
    /// request is dropped. Otherwise all are dropped and none stays.
    #[test]
    fn only_changes_made_once_are_asked_again_and_only_after_a_reclaim() {
        let outbox = Outbox::default();
        outbox.open();
        let change = |name: &[u8]| Op::Meta {
            cred: interlock_meta::Cred::root(),
            op: interlock_proto::meta::MetaOp::Unlink { parent: 1, name: name.to_vec() },
            once: Some(Once { settled: 0, asking: Asking::First }),
        };
        for reclaim in [true, false] {
            let mut t = Tables::default();
            t.once.extend([1, 3]);
            let mut rx = [t.send(&outbox, 1, &change(b"a")).unwrap(), t.send(&outbox, 2, &Op::Status).unwrap()];
            let gone = t.send(&outbox, 3, &change(b"b")).unwrap();
            drop(gone);
            t.session_lost(reclaim);
            assert!(t.pending.is_empty());
            match rx[0].try_recv() {
                Ok(Err(NoReply::AskAgain)) => assert!(reclaim),
                Err(_) => assert!(!reclaim),
                other => panic!("{other:?}"),
            }
            assert!(rx[1].try_recv().is_err(), "dropped: its caller sees ConnectionLost");
            let listed: Vec<u64> = t.once.iter().copied().collect();
            assert_eq!(
                listed,
                if reclaim { vec![1] } else { vec![] },
                "a change whose caller is gone is not asked again"
            );
        }
    }
}
