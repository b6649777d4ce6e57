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
//! - Blocking locks and DLM converts are futures: dropping one withdraws
//!   the wait at the server (and gives back a grant that raced the drop:
//!   a converted lock converts back to the mode its caller knows).
//! - Local first (seed 002): for POSIX, OFD and flock locks the client
//!   keeps its own lock table (the `interlock-core` engine, mirroring what
//!   its owners hold). A non-blocking request that conflicts with a lock
//!   another owner of this client holds fails at once, without a round
//!   trip. A blocking OFD or flock one waits locally, in FIFO order,
//!   until that lock is unlocked; then it joins the server's queue. A
//!   blocking POSIX one joins the server's queue at once, so that the
//!   server's waits-for graph sees every POSIX wait and answers a cycle
//!   through it with `EDEADLK`. A flock conversion unlocks the old lock
//!   first, at the server too, as Linux drops it whatever becomes of the
//!   new one. Unlocks are sent at once and never wait behind lock
//!   requests.
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
mod dlm;
mod error;
mod guard;
mod lease;
mod locks;
mod lost;
pub mod meta;
mod opens;
mod outbox;
mod reclaim;
mod spec;
mod tables;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use interlock_core::LockSpace;
use interlock_proto::meta::{Asking, Once};
use interlock_proto::{ClientMsgRef, Op, Reply, ResourceInfo, Secret, StatusInfo};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use clock::Moment;
pub use error::ClientError;
use lease::Lease;
use locks::local_effects;
use lost::Losses;
pub use lost::LostLock;
use outbox::Outbox;
pub use spec::LockSpec;
use tables::{Answer, NoReply, Replied, Submitted, Tables, Waiting};

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

/// A blocking callback: a DLM lock of ours blocks someone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub resource: Vec<u8>,
    pub handle: u64,
    pub owner: u32,
    pub held: u8,
    pub wanted: u8,
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
    /// Woken when a DLM lock's reclaim is answered (see `dlm`).
    reclaim_answered: Notify,
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
            Some(g) if g != self.generation.load(Ordering::Relaxed) => Err(ClientError::Unread),
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
            reclaim_answered: Notify::new(),
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
    /// [`Client::settled`] count): in any later one they fail unsent,
    /// with [`ClientError::Unread`] (no effect: the caller checks its
    /// losses and may make the request again). Until session 50 they
    /// failed with [`ClientError::ConnectionLost`], which says a request
    /// may have been made, and a mount failed such an append with `EIO`
    /// when the session changed between its check and its send. A request
    /// sent and in flight when its session ends fails as any does. What a
    /// program writes under a lock must not reach the server after the
    /// lease that held the lock ran out and another holder took it: a
    /// write queued while the client was stopped past its lease would
    /// otherwise go out in the new session before anyone learned of the
    /// loss.
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
                    None => match connection::reconnect(&inner, &mut goodbye).await {
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
                t.unpark(false);
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
        let (id, sent) = match op {
            Op::Meta { once: Some(_), .. } => self.inner.submit_once(op, None, self.fence)?,
            op => {
                let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                (id, self.inner.submit(id, op, false, self.fence)?)
            }
        };
        self.answer(id, sent).await
    }

    /// The reply to request `id`, which went out as `sent` and does not
    /// wait, and the session (generation) it came in.
    async fn answer(&self, id: u64, mut sent: Submitted) -> Result<(Reply, u64), ClientError> {
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
