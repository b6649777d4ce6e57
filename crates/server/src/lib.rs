//! The interlock lock server: the protocol (`interlock-proto`) mapped onto
//! the lock engine (`interlock-core`), with sessions, leases, pushed grants
//! and recovery after a restart.
//!
//! - Each connection is a task that reads requests and answers each at
//!   once: a blocking request that must wait is answered `Queued` and its
//!   grant is pushed later, so no request ever waits behind another and an
//!   unlock is never queued behind lock requests (seed 002).
//! - A session outlives its connection for one lease: a client that
//!   reconnects in time (with the session's secret) keeps its locks, waits
//!   and pushed grants. When the lease expires, everything the session
//!   holds or waits for is released and the waiters behind it are granted;
//!   the session is never resumed.
//! - Locks are volatile. After a restart the server accepts reclaims of
//!   held locks for a recovery window and holds back new requests until it
//!   ends, apart from the connection, which reads on (a request that would
//!   not wait is refused at once). Reclaims are
//!   refused outside the window, and never offered to the client of a
//!   session evicted before the restart (evicts are on disk first). Fencing
//!   tokens grow for the life of the data directory (see `datadir`).
//!
//! - The namespace (`interlock-meta`'s store, in `DATA/meta`) is served
//!   on the same connections: each change is answered once its journal
//!   record is durable, without a task waiting for the disk (`durable`).
//!
//! Layout: `config` (settings, start errors), `datadir` (the data
//! directory's lock, start number, fencing floor and evicted sessions),
//! `session` (the session table), `transport` (a connection's bytes, in
//! clear or TLS), `wire` (a session's output stream), `dispatch` (requests
//! onto the engine), `meta` (namespace and changelog requests onto the
//! store, open files, the checkpointer), `durable` (answers that wait for
//! the journal), `squash` (whose root is served as whom), `peer` (which
//! user of this machine opened a connection), `connection` (handshake and
//! request loop), `stop` (a clean stop).

#![forbid(unsafe_code)]

mod budget;
mod config;
mod connection;
mod datadir;
mod dispatch;
mod durable;
mod follow;
mod meta;
mod metrics;
mod origins;
mod peer;
mod session;
mod squash;
mod stop;
mod supersede;
mod transport;
mod wire;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use interlock_core::LockSpace;
use interlock_proto::{GrantInfo, Secret, ServerMsg, StatusInfo};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use budget::Budget;
pub use config::{
    CHECKPOINT_EVERY, Config, Limits, REPLAY_KEEP, ServerError, TlsFiles, default_max_output_memory,
    default_max_total_locks, default_namespace_memory, default_threads, runtime,
};
use datadir::{DataDir, Evictions, FENCE_BLOCK, Fences};
pub use meta::now;
use origins::Ending;
pub use peer::LocalUser;
use session::Sessions;
pub use squash::{IpPrefix, RootSquash};

pub(crate) struct Inner {
    pub space: LockSpace,
    pub sessions: Arc<Sessions>,
    /// The namespace, its journal and changelog.
    pub store: interlock_meta::Store,
    pub acker: Arc<durable::Acker>,
    /// Files each session holds open.
    pub opens: meta::Opens,
    /// Each session's client, as its hello named it, and how long a
    /// client's replay cache outlives its sessions (see `origins`).
    pub origins: origins::Origins,
    /// Each client's connections: a new one stops the others before its
    /// welcome (see `supersede`).
    pub superseding: supersede::Superseding,
    /// This server, for work handed to other threads.
    pub me: std::sync::Weak<Inner>,
    config: Config,
    /// This start's number (grows at every start of the data directory).
    boot: u64,
    /// The write verifier (see `datadir`).
    verifier: u64,
    /// Records at a clean stop that every write is on disk.
    synced: datadir::Synced,
    fences: Fences,
    /// Sessions evicted lately, on disk: their clients may not reclaim
    /// after a restart (see `datadir`).
    evictions: Evictions,
    started: Instant,
    recovery_until: Option<Instant>,
    /// Set after a restart until the orphans nobody reopened in the
    /// recovery window are freed (the checkpointer's sweep): the recovery
    /// is over only then.
    orphans_pending: AtomicBool,
    /// Changelog reads that wait for records, woken by the syncs.
    pub following: Arc<follow::Waiting>,
    requests: AtomicU64,
    conns: Conns,
    /// Set when the server speaks TLS.
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Set when the server serves metrics.
    metrics: Option<metrics::Metrics>,
    /// Told by the checkpointer once the journal has failed (an I/O error
    /// it cannot go on from): [`Server::serve`] then ends with
    /// [`ServerError::JournalFailed`].
    pub journal_failed: tokio::sync::Notify,
    /// Whether the kernel names the owners of local clients' sockets
    /// (see `peer`): if not, they are trusted as remote clients are.
    pub owners_known: bool,
    /// Where a clean stop stands.
    pub stop: stop::Stop,
    /// Requests that wait, made in the recovery window and not yet
    /// served: (session, request). See `dispatch::later`.
    pub deferred: Mutex<std::collections::HashSet<(u64, u64)>>,
}

/// A bound server, ready to serve.
pub struct Server {
    listener: TcpListener,
    metrics: Option<TcpListener>,
    pub(crate) inner: Arc<Inner>,
    /// Held while the server runs.
    _data: DataDir,
}

impl Server {
    /// Checks the configuration, holds the data directory (refusing one
    /// another server holds), binds the listener, and only then counts the
    /// start and reserves fencing tokens, durably: a start that fails
    /// changes nothing on disk.
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        let opening = Instant::now();
        if !config.listen.ip().is_loopback() && config.token.is_none() {
            return Err(ServerError::TokenRequired(config.listen));
        }
        if !config.listen.ip().is_loopback() && config.tls.is_none() && !config.insecure_plaintext {
            return Err(ServerError::PlaintextRefused(config.listen));
        }
        let tls = match &config.tls {
            Some(f) => Some(tokio_rustls::TlsAcceptor::from(interlock_proto::tls::server_config(&f.cert, &f.key)?)),
            None => None,
        };
        let data = DataDir::open(&config.data)?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServerError::Listen { addr: config.listen, source })?;
        let metrics = match config.metrics {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| ServerError::Metrics { addr, source })?),
            None => None,
        };
        let (start, data) = data.start(FENCE_BLOCK, Instant::now())?;
        let (store, opened) =
            interlock_meta::Store::open(&config.data.join("meta"), store_options(&config), meta::now())?;
        tracing::info!(
            id = format!("{:016x}", store.id()),
            inodes = store.ns().inode_count(),
            replayed = opened.replayed,
            created = opened.created,
            torn_bytes = opened.torn_bytes.unwrap_or(0),
            data_removed = opened.data_removed,
            data_cut = opened.data_cut,
            "namespace opened"
        );
        store.ns().set_memory_budget(config.namespace_memory);
        // Past the budget already (a lower one than the last run's), the
        // namespace says so itself.
        match store.ns().memory() {
            (_, u64::MAX) => tracing::info!("the namespace's memory has no budget (max-namespace-memory)"),
            (bytes, budget) => {
                tracing::info!(bytes, budget, "the namespace's memory and its budget (max-namespace-memory)")
            }
        }
        if !opened.dangling.is_empty() {
            tracing::error!(
                entries = opened.dangling.len(),
                "the namespace has entries naming no inode: run interlock fsck"
            );
        }
        if config.unsafe_no_fsync {
            tracing::warn!(
                "--unsafe-no-fsync: changes are acknowledged before they are synced; a machine crash may lose them"
            );
        }
        let owners_known = peer::owners_known();
        if !owners_known {
            tracing::warn!(
                "the kernel does not say who owns a client's socket (sock_diag): every user of this machine is \
                 trusted with the ids its clients send, root's among them, as a remote host's clients are"
            );
        }
        if let Some(squash) = &config.root_squash {
            tracing::info!("root squash: root's namespace requests are served as {}", squash.info());
        }
        let started = Instant::now();
        let took = started - opening;
        if let Some(needed) = config.lease_needed_for(took).filter(|_| start.restarted) {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                lease_ms = config.lease.as_millis() as u64,
                "opening the data directory took more than half the lease: a restart this slow loses every client's locks \
                 (clients give them up before they can reclaim them); set lease-ms to at least {}",
                needed.as_millis()
            );
        }
        // A restart (not a first start) opens the recovery window, which
        // lasts at least a lease (`Config::recovery_window`).
        if start.restarted && config.recovery < config.lease {
            tracing::info!(
                recovery_ms = config.recovery.as_millis() as u64,
                lease_ms = config.lease.as_millis() as u64,
                "the recovery window lasts a lease: until then a client of the server that died may still count on its locks"
            );
        }
        let recovery_until = start.restarted.then(|| started + config.recovery_window());
        tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), boot = start.boot, recovering = recovery_until.is_some(), "interlock server listening");
        let inner = Arc::new_cyclic(|me| Inner {
            space: LockSpace::default(),
            sessions: Arc::new(Sessions::new(Budget::new(config.limits.max_output_memory))),
            store,
            acker: Arc::default(),
            opens: meta::Opens::default(),
            origins: origins::Origins::new(config.replay_keep),
            superseding: supersede::Superseding::default(),
            me: me.clone(),
            config,
            boot: start.boot,
            verifier: start.verifier,
            synced: start.synced,
            fences: start.fences,
            evictions: start.evictions,
            started,
            recovery_until,
            orphans_pending: AtomicBool::new(start.restarted),
            following: Arc::default(),
            owners_known,
            requests: AtomicU64::new(0),
            conns: Conns::default(),
            tls,
            metrics: metrics.is_some().then(metrics::Metrics::default),
            journal_failed: tokio::sync::Notify::new(),
            stop: stop::Stop::default(),
            deferred: Mutex::default(),
        });
        // Set once, on a journal only this server holds.
        let (answer, following) = (inner.acker.hook(inner.sessions.clone()), inner.following.clone());
        let _ = inner.store.changelog().journal().on_durable(Box::new(move |end, failed| {
            answer(end, failed);
            following.synced(end, failed);
        }));
        let me = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("interlock-checkpointer".into())
            .spawn(move || meta::checkpointer(me))
            .map_err(|source| ServerError::Data { path: inner.config.data.clone(), source })?;
        Ok(Server { listener, metrics, inner, _data: data })
    }

    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound")
    }

    /// The metrics address actually bound, if metrics are served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then stops cleanly (see
    /// `stop`: every request read is answered, and each client told where
    /// its server stopped reading); or until the journal fails
    /// ([`ServerError::JournalFailed`]).
    ///
    /// Why stop then: a journal that hit an I/O error it cannot go on from
    /// (a failed `fdatasync`, a file system gone read-only) records
    /// nothing more, so every change would fail, while the namespace in
    /// memory still shows changes whose records never became durable
    /// (never answered, but seen). A restart replays exactly what is
    /// durable, and clients carry on across it, as after any restart; so
    /// the server ends with an error for its supervisor to restart it, as
    /// etcd does when its log cannot be written and PostgreSQL when an
    /// `fsync` fails.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), ServerError> {
        let reaper = tokio::spawn(reap(self.inner.clone()));
        let metrics = self.metrics.map(|l| tokio::spawn(metrics::serve(l, self.inner.clone())));
        tokio::pin!(shutdown);
        let mut backoff = AcceptBackoff::default();
        let mut ended = Ok(());
        loop {
            tokio::select! {
                _ = &mut shutdown => {
                    stop::stop(&self.inner).await;
                    break;
                }
                () = self.inner.journal_failed.notified() => {
                    let why = self.inner.store.changelog().journal().failure().unwrap_or_default();
                    tracing::error!(error = %why, "the journal failed: stopping, so that a restart recovers what is durable");
                    ended = Err(ServerError::JournalFailed(why));
                    break;
                }
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        backoff.reset();
                        admit(&self.inner, stream, peer);
                    }
                    Err(e) => tokio::time::sleep(backoff.failed(&e)).await,
                },
            }
        }
        reaper.abort();
        if let Some(m) = metrics {
            m.abort();
        }
        ended
    }
}

/// Starts serving a new connection, or refuses it when the server is at
/// `max_connections` and every connection is a session: the oldest
/// connection that has not said hello is closed to make room first.
fn admit(inner: &Arc<Inner>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let max = inner.config.limits.max_connections;
    if inner.conns.open.load(Ordering::Relaxed) >= max && !inner.conns.evict_oldest() {
        tracing::warn!(%peer, max, "refused a connection: at max-connections");
        let mut out = bytes::BytesMut::new();
        let reason = format!("server busy: {max} connections open, the limit (max-connections)");
        wire::put(&mut out, &ServerMsg::Refused { reason, auth: false, busy: true });
        // Best effort, without waiting: the socket's buffer takes it. (A
        // TLS client cannot read it before a handshake: it sees the close.)
        if inner.tls.is_none() {
            let _ = stream.try_write(&out);
        }
        return;
    }
    inner.conns.open.fetch_add(1, Ordering::Relaxed);
    let (id, evicted) = inner.conns.arrived();
    let inner = inner.clone();
    tokio::spawn(async move {
        let conns = &inner.conns;
        connection::connection(inner.clone(), stream, peer, evicted, || conns.greeted(id)).await;
        inner.conns.greeted(id);
        inner.conns.open.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Open connections, and those that have not yet said hello, oldest
/// first (with what closes each).
#[derive(Default)]
struct Conns {
    open: AtomicUsize,
    next: AtomicU64,
    unready: Mutex<VecDeque<(u64, CancellationToken)>>,
}

impl Conns {
    /// A new connection, not yet greeted. O(1).
    fn arrived(&self) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.unready.lock().push_back((id, token.clone()));
        (id, token)
    }

    /// Connection `id` said hello (or ended). O(connections not greeted),
    /// which the hello timeout and eviction keep small.
    fn greeted(&self, id: u64) {
        self.unready.lock().retain(|(i, _)| *i != id);
    }

    /// Closes the oldest connection that has not said hello; whether there
    /// was one.
    fn evict_oldest(&self) -> bool {
        match self.unready.lock().pop_front() {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

/// Failed accepts (out of file descriptors, mostly) back off from 10 ms
/// to 1 s, and are logged at most once a second, with how many there
/// were, instead of filling the log.
#[derive(Default)]
struct AcceptBackoff {
    delay: Duration,
    failures: u64,
    logged: Option<Instant>,
}

impl AcceptBackoff {
    fn failed(&mut self, e: &std::io::Error) -> Duration {
        self.failures += 1;
        if self.logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            tracing::warn!(error = %e, failures = self.failures, "accept failed; backing off");
            self.logged = Some(Instant::now());
            self.failures = 0;
        }
        self.delay = (self.delay * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
        self.delay
    }

    fn reset(&mut self) {
        self.delay = Duration::ZERO;
    }
}

/// How the namespace's store writes: synced, unless the unsafe mode is on;
/// by the workers whose requests wait for it, before they sleep (see
/// [`runtime`]), not by a flusher woken for each group.
fn store_options(config: &Config) -> interlock_meta::StoreOptions {
    let mut o = interlock_meta::StoreOptions::default();
    o.journal.fsync = !config.unsafe_no_fsync;
    o.journal.callers_sync = true;
    o
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
        for sid in inner.sessions.expired(inner.config.lease, since, Instant::now()) {
            tracing::info!(session = sid, "lease expired; releasing its locks");
            if end_session(&inner, sid, Ending::Lapsed)
                && let Some(m) = &inner.metrics
            {
                m.expired();
            }
        }
        inner.origins.expire(Instant::now(), |origin| inner.store.ns().replies().forget(origin));
        epochs += 1;
        if epochs.is_multiple_of(4) {
            inner.space.reclaim(4096);
        }
    }
}

/// Releases everything a session holds or waits for and forgets it (see
/// `meta::end_session` for what `ending` changes); whether there was
/// such a session.
fn end_session(inner: &Inner, sid: u64, ending: Ending) -> bool {
    let Some(tracked) = inner.sessions.remove(sid) else { return false };
    for t in tracked {
        dispatch::release_track(inner, t);
    }
    meta::end_session(inner, sid, ending);
    true
}

/// A new session's secret: 128 bits from the operating system.
fn fresh_secret() -> Secret {
    let mut s = Secret::default();
    getrandom::fill(&mut s).expect("the operating system's random source");
    s
}

impl Inner {
    fn grant_info(&self, g: interlock_core::Grant) -> GrantInfo {
        GrantInfo { fence: self.fences.token(g.fence), lvb: g.lvb, handle: g.lock }
    }

    /// What is left of the recovery window, if it is not over.
    fn recovering(&self) -> Option<Duration> {
        self.recovery_until.and_then(|t| t.checked_duration_since(Instant::now())).filter(|d| !d.is_zero())
    }

    fn status(&self) -> StatusInfo {
        let s = self.space.stats();
        let disk = self.store.statfs().map_or((0, 0), |d| {
            let bytes = |blocks: u64| blocks * u64::from(d.block_size);
            (bytes(d.blocks), bytes(d.available))
        });
        StatusInfo {
            sessions: self.sessions.len() as u64,
            resources: s.resources as u64,
            locks: s.locks as u64,
            waiters: s.waiters as u64,
            requests: self.requests.load(Ordering::Relaxed),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            // Until its sweep of orphans is done, a recovery is not over.
            recovering_ms: self.recovering().map_or(u64::from(self.orphans_pending.load(Ordering::Relaxed)), ms_left),
            connections: self.conns.open.load(Ordering::Relaxed) as u64,
            max_connections: self.config.limits.max_connections as u64,
            max_total_locks: self.config.limits.max_total_locks as u64,
            inodes: self.store.ns().inode_count(),
            journal_last: self.store.changelog().journal().durable_end().saturating_sub(1),
            since_checkpoint: self.store.since_checkpoint(),
            durable: !self.config.unsafe_no_fsync,
            disk_bytes: disk.0,
            disk_available_bytes: disk.1,
            disk_full: self.store.changelog().journal().space_low(),
            root_squash: self.config.root_squash.as_ref().map(RootSquash::info),
            replay_clients: self.store.ns().replies().clients() as u64,
            namespace_bytes: self.store.ns().memory().0,
            namespace_budget: self.store.ns().memory().1,
            output_bytes: self.sessions.output() as u64,
            max_output_memory: self.config.limits.max_output_memory as u64,
            consumers: self
                .store
                .changelog()
                .consumers()
                .into_iter()
                .map(|c| interlock_proto::meta::ConsumerInfo {
                    id: c.id,
                    name: c.name,
                    mask: c.mask.0,
                    cleared: c.cleared,
                })
                .collect(),
        }
    }
}

/// Serves on `config` until Ctrl-C or SIGTERM; `bound` is told the
/// address once it listens.
pub async fn run(config: Config, bound: impl FnOnce(SocketAddr, Option<SocketAddr>)) -> Result<(), ServerError> {
    use tokio::signal::unix::{SignalKind, signal};
    // Handled from before the address is told, so that a SIGTERM sent as
    // soon as the server says it listens is a clean stop, not the default
    // action's death.
    let mut int = signal(SignalKind::interrupt()).map_err(ServerError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(ServerError::Signals)?;
    let server = Server::bind(config).await?;
    bound(server.local_addr(), server.metrics_addr());
    server
        .serve(async {
            tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
            tracing::info!("shutting down");
        })
        .await
}

/// A mutex-guarded value shared by the server's tasks.
pub(crate) type Shared<T> = Mutex<T>;

/// Milliseconds in `left`, rounded up: a window with less than a
/// millisecond left is not over. (Rounded down, `status` and the welcome
/// said 0, over, in a window's last millisecond, before the sweep that
/// ends it had run: a test that waited for the end saw the replay cache
/// still full, 3 times in 25 runs.)
fn ms_left(left: Duration) -> u64 {
    left.as_micros().div_ceil(1000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unsafe_mode_turns_off_the_journals_sync_and_only_it_does() {
        assert!(store_options(&Config::default()).journal.fsync);
        let unsafe_mode = Config { unsafe_no_fsync: true, ..Config::default() };
        assert!(!store_options(&unsafe_mode).journal.fsync);
    }

    #[test]
    fn a_window_with_any_time_left_has_a_millisecond_left() {
        let ms = |micros| ms_left(Duration::from_micros(micros));
        assert_eq!([ms(0), ms(1), ms(500), ms(1000), ms(1001)], [0, 1, 1, 1, 2]);
    }
}
