//! interlock's async client.
//!
//! - One connection per [`Client`], pipelined: any number of requests in
//!   flight, replies matched by id, grants and blocking callbacks pushed by
//!   the server on the same connection.
//! - Sessions with leases: the client renews in the background; after a
//!   lost connection it reconnects with backoff and resumes its session
//!   (keeping its locks); if the server restarted, it reclaims every lock
//!   it holds during the server's recovery window.
//! - Blocking locks are futures: dropping one withdraws the wait at the
//!   server (and gives back a grant that raced the drop).
//! - Local first (seed 002): for POSIX, OFD and flock locks the client
//!   keeps its own lock table (the `interlock-core` engine, mirroring what
//!   its owners hold). A request that conflicts with a lock another owner
//!   of this client holds waits locally, in FIFO order, without a round
//!   trip, until that lock is unlocked; then it joins the server's queue.
//!   A non-blocking one fails at once. Unlocks are sent at once and never
//!   wait behind lock requests.

use foldhash::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use interlock_core::{Effect, LockKind, LockRequest, LockSpace, Mode, Namespace, Outcome, Range};
use interlock_proto::{
    self as proto, ClientMsg, ConflictInfo, GrantInfo, Kind, Op, Reply, ServerMsg, StatusInfo, Target,
};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::Framed;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("server refused: {0}")]
    Refused(String),
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

    fn local(&self) -> bool {
        self.kind != Kind::Dlm
    }

    /// This lock as a request to the local table.
    fn local_request(&self, wait: bool) -> LockRequest<'_> {
        LockRequest {
            resource: &self.resource,
            owner: u64::from(self.owner),
            kind: self.core_kind(),
            mode: self.mode,
            range: self.range,
            wait,
        }
    }
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
    /// Request id of a queued lock -> where its grant goes, and the request
    /// to send again if the server restarted.
    waits: HashMap<u64, (oneshot::Sender<GrantInfo>, Op)>,
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
    lease_ms: AtomicU64,
    tx: Mutex<Option<mpsc::UnboundedSender<ClientMsg>>>,
    tables: Mutex<Tables>,
    /// The client's own owners' locks, as granted by the server.
    local: LockSpace,
    blocking: Mutex<Option<mpsc::UnboundedSender<Blocking>>>,
}

/// A connection to an interlock server. Cheap to clone; all clones share
/// the session.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

type Conn = Framed<TcpStream, tokio_util::codec::LengthDelimitedCodec>;

impl Client {
    /// Connects and opens a session. Reconnects by itself afterwards.
    pub async fn connect(addr: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            options,
            next_id: AtomicU64::new(1),
            session: AtomicU64::new(0),
            lease_ms: AtomicU64::new(0),
            tx: Mutex::new(None),
            tables: Mutex::new(Tables::default()),
            local: LockSpace::default(),
            blocking: Mutex::new(None),
        });
        let (conn, _) = handshake(&inner).await?;
        let client = Client { inner };
        client.start(conn);
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

    fn start(&self, conn: Conn) {
        let weak = Arc::downgrade(&self.inner);
        // Requests may be sent as soon as `connect` returns.
        let first = open_channel(&self.inner);
        tokio::spawn(async move {
            // The first connection has nothing to reclaim (its session is
            // new, not lost), so it counts as resumed.
            let mut conn = Some((conn, true, first));
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let (c, resumed, rx) = match conn.take() {
                    Some(c) => c,
                    None => match reconnect(&inner).await {
                        Some((c, resumed)) => (c, resumed, open_channel(&inner)),
                        None => return,
                    },
                };
                run_connection(inner, c, resumed, rx).await;
            }
        });
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let every = match weak.upgrade() {
                    Some(i) => Duration::from_millis((i.lease_ms.load(Ordering::Relaxed) / 3).max(50)),
                    None => return,
                };
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                send(&inner, ClientMsg::Request { id: 0, op: Op::Renew });
            }
        });
    }

    async fn request(&self, op: Op) -> Result<Reply, ClientError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.inner.tables.lock().pending.insert(id, tx);
        if !send(&self.inner, ClientMsg::Request { id, op }) {
            self.inner.tables.lock().pending.remove(&id);
            return Err(ClientError::ConnectionLost);
        }
        match rx.await.map_err(|_| ClientError::ConnectionLost)? {
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

    async fn acquire(&self, spec: &LockSpec, wait: bool) -> Result<Option<GrantInfo>, ClientError> {
        let local = spec.local() && !self.inner.options.no_local;
        if local {
            let range = spec.range;
            let conflict = self
                .inner
                .local
                .test(&spec.resource, u64::from(spec.owner), spec.core_kind(), spec.mode, range)
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
        let (reply_tx, reply_rx) = oneshot::channel();
        let (grant_tx, grant_rx) = oneshot::channel();
        {
            let mut t = self.inner.tables.lock();
            t.pending.insert(id, reply_tx);
            if wait {
                t.waits.insert(id, (grant_tx, op.clone()));
            }
        }
        let mut guard = WaitGuard { inner: &self.inner, id, op: Some(op.clone()), reply_rx, grant_rx };
        if !send(&self.inner, ClientMsg::Request { id, op }) {
            return Err(ClientError::ConnectionLost);
        }
        let reply = (&mut guard.reply_rx).await.map_err(|_| ClientError::ConnectionLost)?;
        let grant = match reply {
            Reply::Granted(g) => g,
            Reply::Queued => (&mut guard.grant_rx).await.map_err(|_| ClientError::ConnectionLost)?,
            Reply::WouldBlock => {
                guard.forget();
                return Ok(None);
            }
            Reply::Deadlock => {
                guard.forget();
                return Err(ClientError::Deadlock);
            }
            Reply::Error(e) => {
                guard.forget();
                return Err(ClientError::Server(e));
            }
            other => {
                guard.forget();
                return Err(ClientError::Server(format!("unexpected reply {other:?}")));
            }
        };
        guard.granted();
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
        if let Ok(resp) = self.inner.local.unlock(&spec.resource, u64::from(spec.owner), spec.core_kind(), spec.range) {
            local_effects(&self.inner, resp.effects);
        }
        self.forget_if_free(spec.kind, &spec.resource);
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
        if let Ok(resp) = self.inner.local.release_owner(resource, u64::from(owner), core_kind(kind)) {
            local_effects(&self.inner, resp.effects);
        }
        self.forget_if_free(kind, resource);
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
        let (reply_tx, reply_rx) = oneshot::channel();
        let (grant_tx, grant_rx) = oneshot::channel();
        {
            let mut t = self.inner.tables.lock();
            t.pending.insert(id, reply_tx);
            t.waits.insert(id, (grant_tx, op.clone()));
        }
        send(&self.inner, ClientMsg::Request { id, op });
        let out = match reply_rx.await.map_err(|_| ClientError::ConnectionLost)? {
            Reply::Granted(g) => Some(g),
            Reply::Queued => Some(grant_rx.await.map_err(|_| ClientError::ConnectionLost)?),
            Reply::WouldBlock => None,
            Reply::Deadlock => return Err(ClientError::Deadlock),
            Reply::Error(e) => return Err(ClientError::Server(e)),
            other => return Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        };
        self.inner.tables.lock().waits.remove(&id);
        if let Some(d) = self.inner.tables.lock().dlm.get_mut(&handle) {
            d.2 = mode as u8;
        }
        Ok(out)
    }

    /// The server's live counters.
    pub async fn status(&self) -> Result<StatusInfo, ClientError> {
        match self.request(Op::Status).await? {
            Reply::Status(s) => Ok(s),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Ends the session now: the server releases everything it holds.
    pub async fn bye(&self) -> Result<(), ClientError> {
        self.request(Op::Bye).await.map(drop)
    }
}

/// Withdraws a request whose future was dropped, and gives back a grant
/// that raced the drop: one already in a receiver, or one still to come
/// (then the request is listed as abandoned and `dispatch` gives it back).
struct WaitGuard<'a> {
    inner: &'a Arc<Inner>,
    id: u64,
    op: Option<Op>,
    reply_rx: oneshot::Receiver<Reply>,
    grant_rx: oneshot::Receiver<GrantInfo>,
}

impl WaitGuard<'_> {
    /// The request ended with no lock: nothing to withdraw.
    fn forget(&mut self) {
        self.inner.tables.lock().waits.remove(&self.id);
        self.op = None;
    }

    /// The lock is ours.
    fn granted(&mut self) {
        self.inner.tables.lock().waits.remove(&self.id);
        self.op = None;
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        {
            // Under one lock, so `dispatch` finds the request either here
            // (and delivers into a receiver) or abandoned.
            let mut t = self.inner.tables.lock();
            t.pending.remove(&self.id);
            t.waits.remove(&self.id);
            t.abandoned.insert(self.id, op.clone());
        }
        let grant = match self.reply_rx.try_recv() {
            Ok(Reply::Granted(g)) => Some(g),
            Ok(Reply::Queued) => self.grant_rx.try_recv().ok(),
            Ok(_) => {
                // Refused: nothing held, nothing to come.
                self.inner.tables.lock().abandoned.remove(&self.id);
                return;
            }
            // No reply (or `Queued`, consumed): a grant may have come
            // first all the same (the server writes the pushes it made
            // before a request's reply ahead of it), and with `waits` no
            // longer listing us, what is in the receiver is all there is.
            Err(_) => self.grant_rx.try_recv().ok(),
        };
        match grant {
            Some(g) => {
                self.inner.tables.lock().abandoned.remove(&self.id);
                give_back(self.inner, op, g);
            }
            None => {
                let cancel = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                self.inner.tables.lock().cancelling.insert(cancel, self.id);
                send(self.inner, ClientMsg::Request { id: cancel, op: Op::Cancel { request: self.id } });
            }
        }
    }
}

/// A local wait, withdrawn if its future is dropped; once granted
/// (`wait: None`), the local grant, given back when dropped.
struct LocalWait {
    inner: Arc<Inner>,
    spec: LockSpec,
    wait: Option<u64>,
}

impl Drop for LocalWait {
    fn drop(&mut self) {
        let s = &self.spec;
        let resp = match self.wait {
            Some(w) => {
                self.inner.tables.lock().local_waits.remove(&w);
                self.inner.local.cancel(&s.resource, s.core_kind(), w)
            }
            None => self.inner.local.unlock(&s.resource, u64::from(s.owner), s.core_kind(), s.range),
        };
        if let Ok(resp) = resp {
            local_effects(&self.inner, resp.effects);
        }
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

fn send(inner: &Inner, msg: ClientMsg) -> bool {
    inner.tx.lock().as_ref().is_some_and(|tx| tx.send(msg).is_ok())
}

/// Opens a connection and says hello, resuming the session if there is
/// one. Returns the connection and whether the session was resumed.
async fn handshake(inner: &Inner) -> Result<(Conn, bool), ClientError> {
    let stream = TcpStream::connect(&inner.addr)
        .await
        .map_err(|source| ClientError::Connect { addr: inner.addr.clone(), source })?;
    let _ = stream.set_nodelay(true);
    let mut conn = Framed::new(stream, proto::codec());
    let session = Some(inner.session.load(Ordering::Relaxed)).filter(|&s| s != 0);
    let hello = ClientMsg::Hello { version: proto::VERSION, token: inner.options.token.clone(), session };
    conn.send(proto::frame(&hello)).await.map_err(|_| ClientError::ConnectionLost)?;
    let frame = conn.next().await.ok_or(ClientError::ConnectionLost)?.map_err(|_| ClientError::ConnectionLost)?;
    match proto::decode::<ServerMsg>(&frame) {
        Ok(ServerMsg::Welcome { session, lease_ms, resumed, .. }) => {
            inner.session.store(session, Ordering::Relaxed);
            inner.lease_ms.store(lease_ms, Ordering::Relaxed);
            Ok((conn, resumed))
        }
        Ok(ServerMsg::Refused { reason }) => Err(ClientError::Refused(reason)),
        _ => Err(ClientError::Server("unexpected answer to hello".into())),
    }
}

/// Reconnects with exponential backoff (50 ms to 2 s). Gives up only when
/// the server refuses the client.
async fn reconnect(inner: &Arc<Inner>) -> Option<(Conn, bool)> {
    let mut delay = Duration::from_millis(50);
    loop {
        match handshake(inner).await {
            Ok(c) => return Some(c),
            Err(ClientError::Refused(why)) => {
                tracing::error!(reason = %why, "server refused the reconnect");
                return None;
            }
            Err(e) => tracing::debug!(error = %e, "reconnect failed; retrying"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// A fresh outbound channel for the next connection; requests go to it.
fn open_channel(inner: &Inner) -> mpsc::UnboundedReceiver<ClientMsg> {
    let (tx, rx) = mpsc::unbounded_channel::<ClientMsg>();
    *inner.tx.lock() = Some(tx);
    rx
}

/// Drives one connection until it drops.
async fn run_connection(inner: Arc<Inner>, conn: Conn, resumed: bool, rx: mpsc::UnboundedReceiver<ClientMsg>) {
    let (sink, mut source) = conn.split();
    if !resumed {
        reclaim(&inner);
    }
    let tables = inner.clone();
    let writer = tokio::spawn(proto::pump(rx, sink, move || tables.tables.lock().pending.len() > 1));
    while let Some(Ok(frame)) = source.next().await {
        let Ok(msg) = proto::decode::<ServerMsg>(&frame) else {
            tracing::warn!("undecodable message from the server");
            break;
        };
        dispatch(&inner, msg);
    }
    *inner.tx.lock() = None;
    writer.abort();
    // Replies to requests in flight are lost with the connection.
    inner.tables.lock().pending.clear();
}

/// After the server lost our session (it restarted, or our lease ran
/// out): claim back every lock we hold and ask again for what we waited
/// for.
fn reclaim(inner: &Arc<Inner>) {
    let (resources, dlm, waits) = {
        let t = inner.tables.lock();
        let waits: Vec<(u64, Op)> = t.waits.iter().map(|(&id, (_, op))| (id, op.clone())).collect();
        (t.local_resources.iter().cloned().collect::<Vec<_>>(), t.dlm.clone(), waits)
    };
    for (kind, resource) in resources {
        let ns = if kind == Kind::Flock { Namespace::Flock } else { Namespace::Record };
        for l in inner.local.locks(&resource, ns).unwrap_or_default() {
            let target = Target {
                resource: resource.clone(),
                kind,
                owner: l.owner as u32,
                start: l.range.start(),
                end: l.range.end(),
            };
            let op = Op::Lock { target, mode: l.mode as u8, wait: false, reclaim: true };
            send(inner, ClientMsg::Request { id: 0, op });
        }
    }
    for (old, (resource, owner, mode, start, end)) in dlm {
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let target = Target { resource: resource.clone(), kind: Kind::Dlm, owner, start, end };
        let (tx, rx) = oneshot::channel();
        inner.tables.lock().pending.insert(id, tx);
        send(inner, ClientMsg::Request { id, op: Op::Lock { target, mode, wait: false, reclaim: true } });
        let weak = Arc::downgrade(inner);
        tokio::spawn(async move {
            if let (Ok(Reply::Granted(g)), Some(inner)) = (rx.await, weak.upgrade())
                && let Some(new) = g.handle
            {
                let mut t = inner.tables.lock();
                if let Some(entry) = t.dlm.remove(&old) {
                    t.dlm.insert(new, entry);
                }
                t.alias.insert(old, new);
            }
        });
    }
    for (id, op) in waits {
        send(inner, ClientMsg::Request { id, op });
    }
}

fn dispatch(inner: &Arc<Inner>, msg: ServerMsg) {
    match msg {
        ServerMsg::Reply { id: 0, .. } => {}
        ServerMsg::Reply { id, reply } => {
            let mut t = inner.tables.lock();
            if let Some(tx) = t.pending.remove(&id) {
                let _ = tx.send(reply);
            } else if let Some(request) = t.cancelling.remove(&id) {
                t.abandoned.remove(&request);
            } else if t.abandoned.contains_key(&id) {
                // The request's future is gone: a lock granted at once is
                // given back; `Queued` leaves it to the grant or the cancel.
                match reply {
                    Reply::Granted(g) => {
                        let op = t.abandoned.remove(&id).expect("listed");
                        drop(t);
                        give_back(inner, op, g);
                    }
                    Reply::Queued => {}
                    _ => {
                        t.abandoned.remove(&id);
                    }
                }
            }
        }
        ServerMsg::Granted { id, grant } => {
            let mut t = inner.tables.lock();
            if let Some((tx, _)) = t.waits.remove(&id) {
                let _ = tx.send(grant);
            } else if let Some(op) = t.abandoned.remove(&id) {
                // The wait was dropped but the grant won the race: give
                // the lock back.
                drop(t);
                give_back(inner, op, grant);
            }
        }
        ServerMsg::Blocking { resource, handle, owner, held, wanted } => {
            if let Some(tx) = inner.blocking.lock().as_ref() {
                let _ = tx.send(Blocking { resource, handle, owner, held, wanted });
            }
        }
        ServerMsg::Welcome { .. } | ServerMsg::Refused { .. } => {}
    }
}

fn give_back(inner: &Inner, op: Op, grant: GrantInfo) {
    let undo = match (op, grant.handle) {
        (Op::Lock { target, .. }, Some(handle)) if target.kind == Kind::Dlm => {
            Op::DlmUnlock { resource: target.resource, owner: target.owner, handle, lvb: None }
        }
        (Op::Lock { target, .. }, _) => Op::Unlock { target },
        _ => return,
    };
    send(inner, ClientMsg::Request { id: 0, op: undo });
}
