//! interlock's async client.
//!
//! - One connection per [`Client`], pipelined: any number of requests in
//!   flight, replies matched by id, grants and blocking callbacks pushed by
//!   the server on the same connection.
//! - Sessions with leases: the client renews in the background; after a
//!   lost connection it reconnects with backoff and resumes its session
//!   (keeping its locks), and every request, reply and grant that was on
//!   the wire takes effect exactly once (requests made meanwhile wait for
//!   the new connection); if the server restarted, it reclaims every lock
//!   it holds during the server's recovery window, and the requests that
//!   were in flight fail with [`ClientError::ConnectionLost`].
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

mod connection;
mod guard;
mod outbox;

use foldhash::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use interlock_core::{Effect, LockKind, LockRequest, LockSpace, Mode, Outcome, Range};
use interlock_proto::{ClientMsgRef, ConflictInfo, GrantInfo, Kind, Op, Reply, StatusInfo, Target};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use guard::{LocalWait, WaitGuard};
use outbox::Outbox;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("server refused: {0}")]
    Refused(String),
    /// The request's session is gone: the server restarted, or the lease
    /// ran out before the client reconnected (then the client reclaims
    /// its locks in a new session), or the client was closed. A dropped
    /// connection alone does not fail requests: they wait for the next
    /// one and take effect exactly once.
    #[error("connection to the server lost")]
    ConnectionLost,
    #[error("server: {0}")]
    Server(String),
    #[error("deadlock: waiting would close a cycle of waiting owners (EDEADLK)")]
    Deadlock,
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// Connection settings.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// The server's shared secret.
    pub token: Option<String>,
    /// Send every request to the server, without the local lock table (for
    /// measurements of the server alone).
    pub no_local: bool,
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
/// are different owners.
fn local_owner(kind: Kind, owner: u32) -> u64 {
    kind.owner_tag() | u64::from(owner)
}

fn core_kind(k: Kind) -> LockKind {
    match k {
        Kind::Posix => LockKind::Posix,
        Kind::Ofd => LockKind::Ofd,
        Kind::Flock => LockKind::Flock,
        Kind::Dlm => LockKind::Dlm,
    }
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

#[derive(Default)]
struct Tables {
    /// Request id -> where its reply goes.
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    /// Blocking requests, from sending until their future is done with
    /// them: the request, to send again if the server restarted, or to
    /// give back a grant that races a drop.
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
    /// DLM locks held: handle -> (resource, owner, mode, start, end).
    dlm: HashMap<u64, (Vec<u8>, u32, u8, u64, u64)>,
    /// After a reclaim, the new handle of a DLM lock the user knows by its
    /// old one.
    alias: HashMap<u64, u64>,
}

struct Inner {
    addr: String,
    options: ClientOptions,
    next_id: AtomicU64,
    session: AtomicU64,
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
}

impl Inner {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Sends request `id`, first recording where its reply goes (and, for
    /// a blocking request, its pushed grant), so neither can arrive
    /// unseen. A blocking request is kept in `waits`, to be sent again
    /// after a reconnect; any other is handed back.
    fn submit(&self, id: u64, op: Op, wait: bool) -> Result<Submitted, ClientError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let mut t = self.tables.lock();
        self.outbox.send(&ClientMsgRef::Request { id, op: &op })?;
        t.pending.insert(id, reply_tx);
        if wait {
            let (grant_tx, grant_rx) = oneshot::channel();
            t.waits.insert(id, Waiting { grant_tx: Some(grant_tx), op });
            Ok(Submitted { reply_rx, grant_rx: Some(grant_rx), op: None })
        } else {
            Ok(Submitted { reply_rx, grant_rx: None, op: Some(op) })
        }
    }
}

/// A blocking request in `Tables::waits`.
struct Waiting {
    /// Where its pushed grant goes; taken when the grant is delivered
    /// (the request stays listed until its future is done with it).
    grant_tx: Option<oneshot::Sender<GrantInfo>>,
    op: Op,
}

/// A request on its way: see [`Inner::submit`].
struct Submitted {
    reply_rx: oneshot::Receiver<Reply>,
    grant_rx: Option<oneshot::Receiver<GrantInfo>>,
    op: Option<Op>,
}

/// A connection to an interlock server. Cheap to clone; all clones share
/// the session. When the last clone is dropped the session ends at once,
/// as a process's locks go when it exits: every lock it holds is released
/// and every wait withdrawn.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    _last: Arc<LastHandle>,
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
            session: AtomicU64::new(0),
            received: AtomicU64::new(0),
            lease_ms: AtomicU64::new(0),
            outbox: Arc::default(),
            tables: Mutex::new(Tables::default()),
            local: LockSpace::default(),
            blocking: Mutex::new(None),
            closed: AtomicBool::new(false),
        });
        let welcomed = connection::handshake(&inner).await?;
        let client = Client { inner: inner.clone(), _last: Arc::new(LastHandle(inner)) };
        client.start(welcomed.conn);
        Ok(client)
    }

    /// The session id the server gave this client.
    pub fn session(&self) -> u64 {
        self.inner.session.load(Ordering::Relaxed)
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
            let mut conn = Some((conn, true));
            while !inner.closed() {
                let (c, resumed) = match conn.take() {
                    Some(c) => c,
                    None => match connection::reconnect(&inner).await {
                        Some(w) if connection::settle(&inner, &w) => (w.conn, w.resumed),
                        // Cannot happen with a sound server; not in a hot loop.
                        Some(_) => {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                        None => break,
                    },
                };
                connection::run(inner.clone(), c, resumed).await;
            }
            // For good: what is in flight or sent later will not be
            // answered.
            inner.outbox.close();
            inner.tables.lock().pending.clear();
        });
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let every = match weak.upgrade() {
                    Some(i) if !i.closed() => Duration::from_millis((i.lease_ms.load(Ordering::Relaxed) / 3).max(50)),
                    _ => return,
                };
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let received = inner.received.load(Ordering::Relaxed);
                let _ = inner.outbox.send(&ClientMsgRef::Request { id: 0, op: &Op::Renew { received } });
            }
        });
    }

    async fn request(&self, op: Op) -> Result<Reply, ClientError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let sent = self.inner.submit(id, op, false)?;
        match sent.reply_rx.await.map_err(|_| ClientError::ConnectionLost)? {
            Reply::Error(e) => Err(ClientError::Server(e)),
            r => Ok(r),
        }
    }

    /// Takes a lock, waiting as long as it takes. Dropping the future
    /// withdraws the request.
    pub async fn lock(&self, spec: &LockSpec) -> Result<GrantInfo, ClientError> {
        self.acquire(spec, true).await?.ok_or(ClientError::Server("a blocking request was refused".into()))
    }

    /// Takes a lock if it is free now; `None` if it is not.
    pub async fn try_lock(&self, spec: &LockSpec) -> Result<Option<GrantInfo>, ClientError> {
        self.acquire(spec, false).await
    }

    /// Whether the local table mirrors this client's locks.
    fn local_table(&self) -> bool {
        !self.inner.options.no_local
    }

    async fn acquire(&self, spec: &LockSpec, wait: bool) -> Result<Option<GrantInfo>, ClientError> {
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
                self.wait_locally(spec).await?;
            }
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let op = Op::Lock { target: spec.target(), mode: spec.mode as u8, wait, reclaim: false };
        let sent = self.inner.submit(id, op, wait)?;
        let mut guard = WaitGuard {
            inner: &self.inner,
            id,
            op: sent.op,
            live: true,
            reply_rx: sent.reply_rx,
            grant_rx: sent.grant_rx,
        };
        let reply = (&mut guard.reply_rx).await.map_err(|_| ClientError::ConnectionLost)?;
        let grant = match (reply, guard.grant_rx.as_mut()) {
            (Reply::Granted(g), _) => g,
            (Reply::Queued, Some(grant_rx)) => grant_rx.await.map_err(|_| ClientError::ConnectionLost)?,
            (other, _) => {
                guard.done();
                return match other {
                    Reply::WouldBlock => Ok(None),
                    Reply::Deadlock => Err(ClientError::Deadlock),
                    Reply::Error(e) => Err(ClientError::Server(e)),
                    other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
                };
            }
        };
        guard.done();
        self.record(spec, &grant, local);
        Ok(Some(grant))
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

    /// Mirrors a grant into the local table.
    fn record(&self, spec: &LockSpec, grant: &GrantInfo, local: bool) {
        if local {
            if let Ok(resp) = self.inner.local.lock(&spec.local_request(false)) {
                local_effects(&self.inner, resp.effects);
            }
            self.inner.tables.lock().local_resources.insert((spec.kind, spec.resource.clone()));
        }
        if let Some(h) = grant.handle {
            let entry = (spec.resource.clone(), spec.owner, spec.mode as u8, spec.range.start(), spec.range.end());
            self.inner.tables.lock().dlm.insert(h, entry);
        }
    }

    /// Releases `spec.range` of the owner (POSIX, OFD, flock). Sent at
    /// once; local waiters it frees go on to the server right away.
    pub async fn unlock(&self, spec: &LockSpec) -> Result<(), ClientError> {
        if spec.kind == Kind::Dlm {
            return Err(ClientError::Invalid("DLM locks are released with dlm_unlock".into()));
        }
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
        let sent = self.inner.submit(id, op, wait)?;
        let reply = sent.reply_rx.await.map_err(|_| ClientError::ConnectionLost);
        let out = match (reply, sent.grant_rx) {
            (Ok(Reply::Granted(g)), _) => Ok(Some(g)),
            (Ok(Reply::Queued), Some(grant_rx)) => grant_rx.await.map(Some).map_err(|_| ClientError::ConnectionLost),
            (Ok(Reply::WouldBlock), _) => Ok(None),
            (Ok(Reply::Deadlock), _) => Err(ClientError::Deadlock),
            (Ok(Reply::Error(e)), _) => Err(ClientError::Server(e)),
            (Ok(other), _) => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
            (Err(e), _) => Err(e),
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
            Reply::Status(s) => Ok(s),
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
