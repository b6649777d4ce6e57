//! The interlock lock server: the protocol (`interlock-proto`) mapped onto
//! the lock engine (`interlock-core`), with sessions, leases, pushed grants
//! and recovery after a restart.
//!
//! - Each connection is a task that reads requests and answers each at
//!   once: a blocking request that must wait is answered `Queued` and its
//!   grant is pushed later, so no request ever waits behind another and an
//!   unlock is never queued behind lock requests (seed 002).
//! - A session outlives its connection for one lease: a client that
//!   reconnects in time keeps its locks, waits and pushed grants. When the
//!   lease expires, everything the session holds or waits for is released
//!   and the waiters behind it are granted.
//! - Locks are volatile. After a restart the server accepts reclaims of
//!   held locks for a recovery window and holds back new requests until it
//!   ends. Fencing tokens carry a start epoch kept in the data directory,
//!   so they grow across restarts.

mod session;
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::{FutureExt, StreamExt};
use interlock_core::{Effect, LockKind, LockRequest, LockSpace, Mode, Outcome, Range};
use interlock_proto::{self as proto, ClientMsg, GrantInfo, Kind, Op, Reply, ServerMsg, StatusInfo, Target};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};

use session::{Delivered, Raced, Sessions, Track};
use wire::Wire;

/// Per-session limits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Locks (resource and owner pairs, DLM handles) a session may hold.
    pub max_locks: usize,
    /// Requests a session may have queued at once.
    pub max_waiters: usize,
    /// Requests of one connection read ahead of writing their replies. The
    /// server reads nothing more from a connection whose replies it cannot
    /// write: a client that pipelines without reading is slowed down, and
    /// cannot make the server buffer without bound.
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_locks: 100_000, max_waiters: 10_000, max_in_flight: 4096 }
    }
}

/// How a server runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// Where the server keeps its state (the start epoch).
    pub data: PathBuf,
    /// Shared secret clients must present; required off loopback.
    pub token: Option<String>,
    /// A session whose client has not been heard from for this long is
    /// ended and its locks released.
    pub lease: Duration,
    /// After a restart, how long clients may reclaim their locks.
    pub recovery: Duration,
    pub limits: Limits,
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("refusing to listen on {0} without a token: use --token-file (a token is required off loopback)")]
    TokenRequired(SocketAddr),
    #[error("{path}: {source}")]
    Data { path: PathBuf, source: std::io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// What the data directory remembers across restarts.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Persisted {
    /// Incremented at every start; the high bits of every fencing token.
    epoch: u64,
}

pub(crate) struct Inner {
    pub space: LockSpace,
    pub sessions: Sessions,
    config: Config,
    epoch: u64,
    started: Instant,
    recovery_until: Option<Instant>,
    requests: AtomicU64,
}

/// A bound server, ready to serve.
pub struct Server {
    listener: TcpListener,
    inner: Arc<Inner>,
}

impl Server {
    /// Checks the configuration, bumps the start epoch in the data
    /// directory (durably) and binds the listener.
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        if !config.listen.ip().is_loopback() && config.token.is_none() {
            return Err(ServerError::TokenRequired(config.listen));
        }
        let data_err = |path: &std::path::Path| {
            let path = path.to_path_buf();
            move |source| ServerError::Data { path, source }
        };
        std::fs::create_dir_all(&config.data).map_err(data_err(&config.data))?;
        let state_path = config.data.join("server.json");
        let previous: Option<Persisted> = match std::fs::read(&state_path) {
            Ok(b) => Some(serde_json::from_slice(&b).map_err(|e| ServerError::Data {
                path: state_path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(data_err(&state_path)(e)),
        };
        let epoch = previous.as_ref().map_or(0, |p| p.epoch) + 1;
        let tmp = config.data.join("server.json.tmp");
        let bytes = serde_json::to_vec(&Persisted { epoch }).expect("serializes");
        (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &state_path)?;
            std::fs::File::open(&config.data)?.sync_all()
        })()
        .map_err(data_err(&state_path))?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServerError::Listen { addr: config.listen, source })?;
        let started = Instant::now();
        // A restart (not a first start) opens the recovery window.
        let recovery_until =
            previous.is_some().then(|| started + config.recovery).filter(|_| !config.recovery.is_zero());
        tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), epoch, recovering = recovery_until.is_some(), "interlock server listening");
        let inner = Arc::new(Inner {
            space: LockSpace::default(),
            sessions: Sessions::default(),
            config,
            epoch,
            started,
            recovery_until,
            requests: AtomicU64::new(0),
        });
        Ok(Server { listener, inner })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound")
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let reaper = tokio::spawn(reap(self.inner.clone()));
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(connection(self.inner.clone(), stream, peer));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        reaper.abort();
    }
}

/// Ends sessions whose lease ran out, a few times per lease.
async fn reap(inner: Arc<Inner>) {
    let every = (inner.config.lease / 4).max(Duration::from_millis(20));
    let mut tick = tokio::time::interval(every);
    let mut epochs = 0u64;
    loop {
        tick.tick().await;
        // A request held back by the recovery window holds back the
        // renewals behind it: no lease runs out before the window ends.
        let since = inner.recovery_until.unwrap_or(inner.started);
        for sid in inner.sessions.expired(inner.config.lease, since) {
            tracing::info!(session = sid, "lease expired; releasing its locks");
            end_session(&inner, sid);
        }
        epochs += 1;
        if epochs.is_multiple_of(4) {
            inner.space.reclaim(4096);
        }
    }
}

/// Releases everything a session holds or waits for and forgets it.
fn end_session(inner: &Inner, sid: u64) {
    let Some(tracked) = inner.sessions.remove(sid) else { return };
    for t in tracked {
        release_track(inner, t);
    }
}

/// Gives back one thing a session held or waited for: releases the locks,
/// withdraws the wait (releasing its grant if the grant won the race).
fn release_track(inner: &Inner, t: Track) {
    let resp = match &t {
        Track::Owned { resource, kind, owner } => inner.space.release_owner(resource, *owner, *kind),
        Track::Dlm { resource, owner, handle } => inner.space.dlm_unlock(resource, *owner, *handle, None),
        Track::Wait { resource, kind, wait, owner } => {
            if let Ok(resp) = inner.space.cancel(resource, *kind, *wait) {
                let granted = resp.outcome == Outcome::NotQueued;
                deliver(inner, resource, resp.effects);
                if granted {
                    let r = Raced { resource: resource.clone(), kind: *kind, owner: *owner, range: None };
                    if let Some((r, g)) = inner.sessions.raced(*wait, r) {
                        release_raced(inner, r, g);
                    }
                }
            }
            return;
        }
    };
    if let Ok(resp) = resp {
        deliver(inner, t.resource(), resp.effects);
    }
}

/// Releases a lock granted to a wait that was withdrawn (see [`Raced`]),
/// so that no grant is orphaned.
fn release_raced(inner: &Inner, r: Raced, grant: GrantInfo) {
    let resp = match (r.kind, grant.handle, r.range) {
        (LockKind::Dlm, Some(handle), _) => inner.space.dlm_unlock(&r.resource, r.owner, handle, None),
        (_, _, Some(range)) => inner.space.unlock(&r.resource, r.owner, r.kind, range),
        _ => inner.space.release_owner(&r.resource, r.owner, r.kind),
    };
    if let Ok(resp) = resp {
        deliver(inner, &r.resource, resp.effects);
    }
}

fn kind(k: Kind) -> LockKind {
    match k {
        Kind::Posix => LockKind::Posix,
        Kind::Ofd => LockKind::Ofd,
        Kind::Flock => LockKind::Flock,
        Kind::Dlm => LockKind::Dlm,
    }
}

fn mode(m: u8) -> Result<Mode, String> {
    Mode::ALL.get(m as usize).copied().ok_or_else(|| format!("invalid mode {m}: modes are 0 (NL) to 5 (EX)"))
}

/// The engine's owner id for a client's owner: its kind, its session
/// (30 bits: see [`session::SESSION_BITS`]), the client's number for it.
fn owner_id(sid: u64, kind: Kind, owner: u32) -> u64 {
    kind.owner_tag() | (sid << 32) | u64::from(owner)
}

/// The session of an engine owner id.
fn session_of(owner: u64) -> u64 {
    (owner >> 32) & ((1 << session::SESSION_BITS) - 1)
}

impl Inner {
    fn grant_info(&self, g: interlock_core::Grant) -> GrantInfo {
        GrantInfo { fence: (self.epoch << 40) | g.fence, lvb: g.lvb, handle: g.lock }
    }

    fn recovering(&self) -> Option<Duration> {
        self.recovery_until.and_then(|t| t.checked_duration_since(Instant::now())).filter(|d| !d.is_zero())
    }

    fn status(&self) -> StatusInfo {
        let s = self.space.stats();
        StatusInfo {
            sessions: self.sessions.len() as u64,
            resources: s.resources as u64,
            locks: s.locks as u64,
            waiters: s.waiters as u64,
            requests: self.requests.load(Ordering::Relaxed),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            recovering_ms: self.recovering().map_or(0, |d| d.as_millis() as u64),
        }
    }
}

/// Carries out the engine's effects: grants pushed to the sessions whose
/// requests waited, blocking callbacks to DLM holders.
fn deliver(inner: &Inner, resource: &[u8], effects: Vec<Effect>) {
    for e in effects {
        match e {
            Effect::Granted { wait, grant, .. } => {
                let info = inner.grant_info(grant);
                match inner.sessions.granted(wait, info) {
                    Delivered::Kick(wire) => wire.kick(),
                    Delivered::Release(r, g) => release_raced(inner, r, g),
                    Delivered::Kept => {}
                }
            }
            Effect::Blocking { lock, owner, held, wanted } => {
                let msg = ServerMsg::Blocking {
                    resource: resource.to_vec(),
                    handle: lock,
                    owner: owner as u32,
                    held: held as u8,
                    wanted: wanted as u8,
                };
                if let Delivered::Kick(wire) = inner.sessions.push(session_of(owner), msg) {
                    wire.kick();
                }
            }
        }
    }
}

/// One request, answered at once.
fn handle(inner: &Inner, sid: u64, id: u64, op: Op) -> Reply {
    inner.requests.fetch_add(1, Ordering::Relaxed);
    match execute(inner, sid, id, op) {
        Ok(r) => r,
        Err(e) => Reply::Error(e),
    }
}

/// The reply to a lock or conversion request of `owner` on `target`:
/// `on_grant` records a grant made at once; a request that waits is
/// recorded as the session's (or answered `Granted` if its grant came
/// first, from another connection).
fn lock_reply(
    inner: &Inner,
    sid: u64,
    id: u64,
    outcome: Outcome,
    target: &Target,
    owner: u64,
    on_grant: impl FnOnce(&GrantInfo) -> Result<(), Reply>,
) -> Reply {
    match outcome {
        Outcome::Granted(g) => {
            let info = inner.grant_info(g);
            match on_grant(&info) {
                Ok(()) => Reply::Granted(info),
                Err(reply) => reply,
            }
        }
        Outcome::Queued(wait) => {
            let track = Track::Wait { resource: target.resource.clone(), kind: kind(target.kind), wait, owner };
            match inner.sessions.queued(sid, id, track, target, owner) {
                Ok(Some(info)) => Reply::Granted(info),
                Ok(None) => Reply::Queued,
                Err(gone) => session_gone(inner, gone),
            }
        }
        Outcome::WouldBlock => Reply::WouldBlock,
        Outcome::Deadlock => Reply::Deadlock,
        Outcome::Done | Outcome::NotQueued => Reply::Done,
    }
}

/// A request raced the end of its session (the lease ran out while it
/// was read): what it just got is given back at once, or no one would.
fn session_gone(inner: &Inner, t: Track) -> Reply {
    release_track(inner, t);
    Reply::Error("session ended".into())
}

fn range_of(t: &Target) -> Result<Range, String> {
    Range::new(t.start, t.end).map_err(|e| e.to_string())
}

fn execute(inner: &Inner, sid: u64, id: u64, op: Op) -> Result<Reply, String> {
    let err = |e: interlock_core::LockError| e.to_string();
    match op {
        Op::Lock { target, mode: m, wait, reclaim: _ } => {
            let k = kind(target.kind);
            let owner = owner_id(sid, target.kind, target.owner);
            inner.sessions.check_limits(sid, &inner.config.limits, wait)?;
            let req = LockRequest {
                resource: &target.resource,
                owner,
                kind: k,
                mode: mode(m)?,
                range: range_of(&target)?,
                wait,
            };
            let resp = inner.space.lock(&req).map_err(err)?;
            let reply = lock_reply(inner, sid, id, resp.outcome, &target, owner, |info| {
                inner
                    .sessions
                    .track(sid, Track::held(&target, owner, info.handle))
                    .map_err(|gone| session_gone(inner, gone))
            });
            deliver(inner, &target.resource, resp.effects);
            Ok(reply)
        }
        Op::Unlock { target } => {
            let (owner, k) = (owner_id(sid, target.kind, target.owner), kind(target.kind));
            let resp = inner.space.unlock(&target.resource, owner, k, range_of(&target)?).map_err(err)?;
            deliver(inner, &target.resource, resp.effects);
            // Nothing left here: it no longer counts against the limit.
            let track = Track::Owned { resource: target.resource, kind: k, owner };
            inner
                .sessions
                .untrack_unless(sid, &track, || inner.space.holds(track.resource(), owner, k).unwrap_or(true));
            Ok(Reply::Done)
        }
        Op::Test { target, mode: m } => {
            let c = inner
                .space
                .test(
                    &target.resource,
                    owner_id(sid, target.kind, target.owner),
                    kind(target.kind),
                    mode(m)?,
                    range_of(&target)?,
                )
                .map_err(err)?;
            Ok(Reply::Conflict(c.map(|c| proto::ConflictInfo {
                owner: c.owner,
                mode: c.mode as u8,
                start: c.range.start(),
                end: c.range.end(),
            })))
        }
        Op::Close { resource, kind: k, owner } => {
            let resp = inner.space.release_owner(&resource, owner_id(sid, k, owner), kind(k)).map_err(err)?;
            inner.sessions.untrack(
                sid,
                &Track::Owned { resource: resource.clone(), kind: kind(k), owner: owner_id(sid, k, owner) },
            );
            deliver(inner, &resource, resp.effects);
            Ok(Reply::Done)
        }
        Op::Cancel { request } => {
            if let Some((Track::Wait { resource, kind, wait, owner }, range)) = inner.sessions.take_wait(sid, request) {
                let resp = inner.space.cancel(&resource, kind, wait).map_err(err)?;
                let granted = resp.outcome == Outcome::NotQueued;
                deliver(inner, &resource, resp.effects);
                if granted {
                    // The grant won the race (it was not yet reported, or
                    // it would have been pushed ahead of this reply): the
                    // client gave up the request, so it is given back here.
                    let r = Raced { resource, kind, owner, range };
                    if let Some((r, g)) = inner.sessions.raced(wait, r) {
                        release_raced(inner, r, g);
                    }
                }
            }
            Ok(Reply::Done)
        }
        Op::DlmUnlock { resource, owner, handle, lvb } => {
            let owner = owner_id(sid, Kind::Dlm, owner);
            let resp = inner.space.dlm_unlock(&resource, owner, handle, lvb.as_deref()).map_err(err)?;
            inner.sessions.untrack(sid, &Track::Dlm { resource: resource.clone(), owner, handle });
            deliver(inner, &resource, resp.effects);
            Ok(Reply::Done)
        }
        Op::DlmConvert { resource, owner, handle, mode: m, wait, lvb } => {
            let owner_full = owner_id(sid, Kind::Dlm, owner);
            let resp =
                inner.space.dlm_convert(&resource, owner_full, handle, mode(m)?, wait, lvb.as_deref()).map_err(err)?;
            // The lock is tracked already: a granted conversion changes
            // only its mode.
            let target = Target { resource, kind: Kind::Dlm, owner, start: 0, end: 0 };
            let reply = lock_reply(inner, sid, id, resp.outcome, &target, owner_full, |_| Ok(()));
            deliver(inner, &target.resource, resp.effects);
            Ok(reply)
        }
        Op::Renew { received } => inner.sessions.ack(sid, received).map(|()| Reply::Done),
        Op::Status => Ok(Reply::Status(inner.status())),
        Op::Bye => Ok(Reply::Done),
    }
}

/// Constant-time comparison, so a wrong token's timing tells nothing.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One client connection.
async fn connection(inner: Arc<Inner>, stream: TcpStream, peer: SocketAddr) {
    let (rd, mut wr) = stream.into_split();
    let mut source = proto::reader::<ClientMsg, _>(rd);
    let hello = match tokio::time::timeout(Duration::from_secs(10), source.next()).await {
        Ok(Some(Ok(msg))) => msg,
        Ok(Some(Err(e))) => {
            tracing::warn!(%peer, error = %e, "garbage instead of hello; closing");
            return;
        }
        _ => return,
    };
    let refuse = |reason: String| ServerMsg::Refused { reason };
    let ClientMsg::Hello { version, token, session, received } = hello else {
        let _ = proto::send(&mut wr, &refuse("the first message must be Hello".into())).await;
        return;
    };
    if version != proto::VERSION {
        let why = format!("unsupported protocol version {version}; this server speaks {}", proto::VERSION);
        let _ = proto::send(&mut wr, &refuse(why)).await;
        return;
    }
    if let Some(want) = &inner.config.token
        && !token.as_deref().is_some_and(|t| same_token(t, want))
    {
        tracing::warn!(%peer, "refused: wrong or missing token");
        let _ = proto::send(&mut wr, &refuse("authentication failed: wrong or missing token".into())).await;
        return;
    }
    let wr = Arc::new(wr);
    let Some((session, mut turn)) = take_over(&inner, session, received, &wr, peer).await else { return };
    let mut welcome = BytesMut::new();
    wire::put(
        &mut welcome,
        &ServerMsg::Welcome {
            version: proto::VERSION,
            session: session.sid,
            lease_ms: inner.config.lease.as_millis() as u64,
            resumed: session.resumed,
            recovering_ms: inner.recovering().map_or(0, |d| d.as_millis() as u64),
            received: *turn,
        },
    );
    let serve = async {
        // Ahead of the stream, which waits for it (`Wire::attach`).
        wire::write_all(&wr, &welcome).await.ok()?;
        session.wire.open();
        Some(serve_connection(&inner, session.sid, peer, &mut source, &session.wire, &mut turn).await)
    };
    // Stopped at any await, it leaves the session whole: see
    // `serve_connection`.
    let bye = tokio::select! {
        () = session.stop.cancelled() => false,
        bye = serve => bye == Some(true),
    };
    session.wire.detach(&wr);
    if bye {
        end_session(&inner, session.sid);
    }
}

/// Gives the session `want` (or a new one) to a new connection: stops the
/// connection that served it and waits for its turn, then has the
/// session's stream resent from `received`. A session whose stream cannot
/// be resent from there (it piled up past its limit while the client did
/// not acknowledge it) cannot resume: it ends, and the client reclaims in
/// a new one, as after a restart. `None`: a newer connection took over
/// meanwhile.
async fn take_over(
    inner: &Inner,
    want: Option<u64>,
    received: u64,
    wr: &Arc<tokio::net::tcp::OwnedWriteHalf>,
    peer: SocketAddr,
) -> Option<(session::Attached, tokio::sync::OwnedMutexGuard<u64>)> {
    let mut session = inner.sessions.attach(want);
    loop {
        let turn = session.turn.clone().lock_owned().await;
        if session.stop.is_cancelled() {
            return None;
        }
        if session.wire.attach(wr.clone(), if session.resumed { received } else { 0 }) {
            return Some((session, turn));
        }
        tracing::warn!(%peer, session = session.sid, received, "the session's stream cannot be resent from there; ending it");
        drop(turn);
        end_session(inner, session.sid);
        session = inner.sessions.attach(Some(session.sid));
    }
}

/// What the connection does next.
enum Next {
    Frame(Option<Result<ClientMsg, proto::ReadError>>),
    Flush,
}

/// Serves one connection's requests, answering each at once. A burst of
/// pipelined requests is read, answered into the session's stream (see
/// [`Wire`]) and written back in one write. It reads ahead at most
/// `max_in_flight` requests before writing their replies, and reads
/// nothing while it cannot write: a client that does not read its
/// replies is held back. Between bursts it writes what other tasks pushed
/// and could not write themselves. `served` counts the bytes of the
/// client's stream served, request by request. Returns whether the client
/// said `Bye`.
async fn serve_connection(
    inner: &Inner,
    sid: u64,
    peer: SocketAddr,
    source: &mut tokio_util::codec::FramedRead<tokio::net::tcp::OwnedReadHalf, proto::Reader<ClientMsg>>,
    wire: &Wire,
    served: &mut u64,
) -> bool {
    let limit = inner.config.limits.max_in_flight.max(1);
    let mut unflushed = 0usize;
    let mut touched = false;
    // Where the client's stream stood when this connection began (modulo
    // 2^64: the hello counts in `consumed` but not in the stream).
    let origin = served.wrapping_sub(source.decoder().consumed());
    if wire.flush().await.is_err() {
        return false;
    }
    loop {
        let next = if unflushed == 0 {
            tokio::select! {
                () = wire.ready() => Next::Flush,
                f = source.next() => Next::Frame(f),
            }
        } else if unflushed < limit
            && let Some(f) = source.next().now_or_never()
        {
            Next::Frame(f)
        } else {
            Next::Flush
        };
        let (id, op) = match next {
            Next::Flush => {
                if wire.flush().await.is_err() {
                    return false;
                }
                unflushed = 0;
                touched = false;
                continue;
            }
            Next::Frame(f) => match read_request(f, sid, peer) {
                Some(req) => req,
                None => return false,
            },
        };
        // Once per batch of requests read together: it renews the lease
        // and checks that the session has not ended. (A session that ends
        // while a request runs gets back what that request obtained: see
        // `session_gone`.)
        if !touched {
            if !inner.sessions.touch(sid) {
                return false;
            }
            touched = true;
        }
        // After a restart, only reclaims go through until the window ends.
        let reclaim = matches!(op, Op::Lock { reclaim: true, .. });
        if !reclaim && let Some(left) = inner.recovering() {
            tokio::time::sleep(left).await;
        }
        let bye = matches!(op, Op::Bye);
        let reply = handle(inner, sid, id, op);
        // Behind any push this request made: a grant that raced a cancel
        // reaches the client before the cancel's reply. Served and
        // answered with no await between: a connection stopped at an
        // await has each request it read either served and answered in
        // the stream, or neither.
        wire.append(&ServerMsg::Reply { id, reply });
        *served = origin.wrapping_add(source.decoder().consumed());
        unflushed += 1;
        if bye {
            let _ = wire.flush().await;
            return true;
        }
    }
}

/// The request read, or `None` (logged) if the connection must close.
fn read_request(read: Option<Result<ClientMsg, proto::ReadError>>, sid: u64, peer: SocketAddr) -> Option<(u64, Op)> {
    match read? {
        Ok(ClientMsg::Request { id, op }) => Some((id, op)),
        Ok(ClientMsg::Hello { .. }) => {
            tracing::warn!(%peer, session = sid, "second hello; closing the connection");
            None
        }
        Err(e) => {
            tracing::warn!(%peer, session = sid, error = %e, "bad request; closing the connection");
            None
        }
    }
}

/// Serves on `config` until Ctrl-C or SIGTERM; `bound` is told the
/// address once it listens.
pub async fn run(config: Config, bound: impl FnOnce(SocketAddr)) -> Result<(), ServerError> {
    let server = Server::bind(config).await?;
    bound(server.local_addr());
    server
        .serve(async {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
                tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            }
            #[cfg(not(unix))]
            let _ = ctrl_c.await;
            tracing::info!("shutting down");
        })
        .await;
    Ok(())
}

/// A mutex-guarded value shared by the server's tasks.
pub(crate) type Shared<T> = Mutex<T>;
