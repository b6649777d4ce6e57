//! How a server runs, and why it may not start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::RootSquash;

/// Per-session and per-server limits. Each one bounds memory that a client
/// could otherwise grow at will; each refusal names the limit.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Locks a session may hold, counted as the engine stores them: every
    /// byte range of every POSIX, OFD and flock owner after merges and
    /// splits, and every DLM lock.
    pub max_locks: usize,
    /// Requests a session may have queued at once.
    pub max_waiters: usize,
    /// Requests of one connection read ahead of writing their replies. The
    /// server reads nothing more from a connection whose replies it cannot
    /// write: a client that pipelines without reading is slowed down, and
    /// cannot make the server buffer without bound.
    pub max_in_flight: usize,
    /// Connections open at once. At the limit, the oldest connection that
    /// has not yet said hello makes room for a new one (so a flood of idle
    /// connections cannot lock out `interlock status`); when every one is
    /// a session, the new one is refused with a message naming the limit.
    pub max_connections: usize,
    /// Locks held and requests queued in all sessions together, counted
    /// as `max_locks` and `max_waiters` count them: the lock table's
    /// memory. The per-session limits alone bound nothing once a client
    /// opens many sessions (thousands of connections each holding 100,000
    /// locks). See [`default_max_total_locks`].
    pub max_total_locks: usize,
    /// Bytes all sessions' streams may keep together (answers not yet
    /// acknowledged, answers on their way, requests held back) before
    /// each is held to a share of them (see `budget`). Each stream is
    /// bounded on its own (80 MiB), but not the thousands a client may
    /// open. See [`default_max_output_memory`].
    pub max_output_memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_locks: 100_000,
            max_waiters: 10_000,
            max_in_flight: 4096,
            max_connections: 4096,
            max_total_locks: default_max_total_locks(),
            max_output_memory: default_max_output_memory(),
        }
    }
}

/// What a lock (or a queued request) takes at most, as the limits count
/// it: its range in the engine with a resource of its own (~310 bytes,
/// `bench rsb`), and its session's record of it.
const LOCK_BYTES: u64 = 512;

/// The lock table's limit unless told: a quarter of the memory the
/// server may use (see [`default_namespace_memory`], which takes half),
/// at 512 bytes a lock (`LOCK_BYTES`): ~12M locks on a machine of 24 GiB.
/// [`usize::MAX`] if the memory cannot be read.
pub fn default_max_total_locks() -> usize {
    memory().map_or(usize::MAX, |bytes| (bytes / 4 / LOCK_BYTES) as usize)
}

/// The streams' limit unless told: an eighth of the memory the server may
/// use (the namespace takes half, the lock table a quarter), at least 256
/// MiB: 3 GiB on a machine of 24 GiB. As the streams keep up to about
/// twice it under an attack, a quarter in all. [`usize::MAX`] if the
/// memory cannot be read.
pub fn default_max_output_memory() -> usize {
    memory().map_or(usize::MAX, |bytes| (bytes / 8).max(256 << 20) as usize)
}

/// How a server runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// Where the server keeps its state (the start number and the fencing
    /// floor); held with a lock file while the server runs.
    pub data: PathBuf,
    /// Shared secret clients must present; required off loopback.
    pub token: Option<String>,
    /// A session whose client has not been heard from for this long is
    /// ended and its locks released.
    pub lease: Duration,
    /// After a restart, how long clients may reclaim their locks (never
    /// shorter than the lease: see [`Config::recovery_window`]).
    pub recovery: Duration,
    /// How long a client whose last session lapsed (its lease ran out,
    /// or it was evicted) keeps its replay cache: a client cut off that
    /// long or less asks about its changes on their way when it comes
    /// back, rather than failing them (see `origins`). 0: none is kept.
    pub replay_keep: Duration,
    pub limits: Limits,
    /// Serve TLS with this certificate and key. Off loopback the server
    /// refuses to start without it unless `insecure_plaintext` is set:
    /// the token never crosses a network in clear by default.
    pub tls: Option<TlsFiles>,
    pub insecure_plaintext: bool,
    /// Serve Prometheus metrics over HTTP at `/metrics` on this address.
    pub metrics: Option<SocketAddr>,
    /// The documented unsafe mode: namespace changes are acknowledged
    /// once written to the journal, without `fdatasync`. A crash of the
    /// server process loses nothing (the kernel has the writes); a crash
    /// of the machine may lose acknowledged changes.
    pub unsafe_no_fsync: bool,
    /// Threads that serve connections (the runtime's workers, which also
    /// sync the journal and send the durable answers; the journal's
    /// flusher, a backstop, and the checkpointer are threads of their own
    /// besides). At least 1.
    pub threads: usize,
    /// Root squash (see [`RootSquash`]). `None`: every client's ids are
    /// trusted as sent, root's too.
    pub root_squash: Option<RootSquash>,
    /// The namespace's memory budget in bytes ([`u64::MAX`]: none): past
    /// it, a change that would make the namespace larger (a new file,
    /// name or extended attribute) fails with `ENOSPC`, so that clients
    /// cannot grow the server until the kernel kills it (and its restart,
    /// which loads the same namespace). See
    /// [`default_namespace_memory`].
    pub namespace_memory: u64,
    /// Journal records after which the checkpointer writes a new image
    /// of the namespace ([`CHECKPOINT_EVERY`] unless told): a restart
    /// replays at most about this many. Fewer make restarts shorter and
    /// images more frequent (an image of 10M files is ~700 MB). At least 1.
    pub checkpoint_every: u64,
}

/// Journal records between two checkpoints unless told: about 100 MB of
/// journal, the most a restart replays after loading the image.
pub const CHECKPOINT_EVERY: u64 = 1_000_000;

/// The threads that serve connections unless told: one per core, as
/// tokio's default. Fewer can be faster where the server shares its cores
/// (session 18, 2 cores, server and clients on one machine over
/// loopback): with one worker instead of two, 50 clients' stats ran 29%
/// faster (90k to 116k/s) and their creates cost the server 14% less CPU
/// (15.4 to 13.3 µs; the journal's flusher, which sends their answers,
/// had a core to itself), but lock round trips from 4 pipelining
/// connections (`bench net`) lost 12% of their rate (567k to 500k/s,
/// their p99 halved). Which way a workload leans is measured, not
/// guessed: hence a setting, and the default that uses every core.
/// Since the workers sync the journal themselves (session 19), the gap
/// for creates widened: 50 clients' durable creates ran 69-77k/s with one
/// worker against 64k with two, in the same rounds. Since the journal's
/// backstop stopped waking thousands of times a second (session 22), it
/// closed again (81.5k against 80.9k/s, medians of 5 rounds), while
/// stats stayed faster with one (129k against 101k/s).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Tasks a busy worker runs between two looks at the sockets (tokio's
/// `event_interval`, 61 by default). While one worker syncs the journal
/// and sends the answers (from its park hook: ~140 µs of `fdatasync`,
/// then a send per connection), the other is the only one that can
/// notice the requests those answers bring back, and a busy worker looks
/// only every this many tasks. With 15, 50 clients' durable creates on
/// 50 connections ran 76-80k/s against 66-73k with 61 (4 alternated
/// rounds; 31 gave 69-73k), at 10.1-10.8 µs of server CPU a create
/// against 11.0-11.7; stats, creates on one connection and lock round
/// trips (`bench net`) moved within their noise (session 28).
const EVENT_INTERVAL: u32 = 15;

/// The runtime a server with `config` runs on: `config.threads` workers.
/// The last worker to run out of work makes the journal records its
/// requests wait for durable before it sleeps, and sends their answers
/// (`interlock_journal::sync_wanted_everywhere`): the workers read every
/// change that has arrived, one sync covers them all, and no other thread
/// is woken for it, as Redis's event loop writes its append-only file
/// before it sleeps. Meanwhile the requests that arrive queue in their
/// sockets and make the next group. A worker that goes idle while another
/// still runs leaves the sync to that one (a smaller group each would cost
/// a sync each); the journal's flusher writes what waits a whole
/// backstop period (`interlock_journal::Options::backstop`).
pub fn runtime(config: &Config) -> std::io::Result<tokio::runtime::Runtime> {
    // Workers not parked; each starts running. (Not counted at thread
    // start: the blocking pool's threads start too, and never park.)
    let workers = config.threads.max(1);
    let busy = Arc::new(AtomicUsize::new(workers));
    let (woke, idle) = (busy.clone(), busy);
    tokio::runtime::Builder::new_multi_thread()
        .event_interval(EVENT_INTERVAL)
        .worker_threads(workers)
        .on_thread_unpark(move || {
            woke.fetch_add(1, Ordering::SeqCst);
        })
        .on_thread_park(move || {
            if idle.fetch_sub(1, Ordering::SeqCst) == 1 {
                interlock_journal::sync_wanted_everywhere();
            }
        })
        .enable_all()
        .build()
}

impl Config {
    /// The lease a restart that took `took` needs, if this one is shorter.
    ///
    /// A client gives its locks up three quarters of a lease after the
    /// send of its last answered renewal, and renews every quarter lease,
    /// so a crash may leave it only half a lease: a restart that takes
    /// longer than that loses every client's locks. The time a restart
    /// takes grows with the namespace (about 15 s at 10M files here), so
    /// the operator is told at the restart that shows it.
    pub(crate) fn lease_needed_for(&self, took: Duration) -> Option<Duration> {
        let needed = took.saturating_mul(2);
        (needed > self.lease).then_some(needed)
    }

    /// The recovery window after a restart: `recovery`, but never
    /// shorter than the lease. A client of the server that died counts on
    /// its locks until three quarters of a lease after its last renewal
    /// answered, which was before this start: until a lease from now (a
    /// quarter more, for clocks that run at slightly different rates), no
    /// one else may be granted them, whether or not their holder comes
    /// back to reclaim them (NFSv4's grace period lasts a lease for the
    /// same reason).
    pub fn recovery_window(&self) -> Duration {
        self.recovery.max(self.lease)
    }
}

/// The server's TLS certificate chain and private key, PEM files.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// How long a lapsed client's replay cache is kept unless told: long
/// enough for a network to heal or a machine to come back from a hang.
pub const REPLAY_KEEP: Duration = Duration::from_secs(15 * 60);

impl Default for Config {
    /// Loopback on port 7420, `./interlock-data`, no token, a 5 s lease,
    /// a 10 s recovery window, replay caches kept [`REPLAY_KEEP`] after a
    /// lapse, the default limits, no TLS, no metrics,
    /// every change synced, [`default_threads`], root not squashed, a
    /// checkpoint every [`CHECKPOINT_EVERY`] records.
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            data: PathBuf::from("./interlock-data"),
            token: None,
            lease: Duration::from_secs(5),
            recovery: Duration::from_secs(10),
            replay_keep: REPLAY_KEEP,
            limits: Limits::default(),
            tls: None,
            insecure_plaintext: false,
            metrics: None,
            unsafe_no_fsync: false,
            threads: default_threads(),
            root_squash: None,
            namespace_memory: default_namespace_memory(),
            checkpoint_every: CHECKPOINT_EVERY,
        }
    }
}

/// The namespace's memory budget unless told: half of the memory the
/// server may use, the machine's or its control group's limit if lower
/// (as tmpfs takes half of the machine's by default). The rest is for the
/// server's other memory (connections, locks, the journal's buffers, the
/// allocator's slack) and the machine's page cache. [`u64::MAX`] (none)
/// if neither can be read.
pub fn default_namespace_memory() -> u64 {
    memory().map_or(u64::MAX, |bytes| bytes / 2)
}

/// The memory the server may use: the machine's, or its control group's
/// limit if lower; `None` if neither can be read.
fn memory() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let kib = m.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok().map(|k| k << 10)
    });
    let group = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| cgroup_limit(&c, std::path::Path::new("/sys/fs/cgroup")));
    machine.into_iter().chain(group).min()
}

/// The lowest memory limit of the control groups that `cgroup` (the text
/// of `/proc/self/cgroup`) names and the groups above them, under `sys`
/// (`/sys/fs/cgroup`): a v2 group's `memory.max` (`0::/PATH`), a v1
/// memory group's `memory.limit_in_bytes` (`N:memory:/PATH`). None if
/// none sets one. O(depth).
fn cgroup_limit(cgroup: &str, sys: &std::path::Path) -> Option<u64> {
    let limit = |line: &str| {
        let (_, rest) = line.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        let (root, file) = if controllers.is_empty() {
            (sys.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (sys.join("memory"), "memory.limit_in_bytes")
        } else {
            return None;
        };
        let mut dir = root.join(path.trim_start_matches('/'));
        let mut lowest: Option<u64> = None;
        loop {
            // "max" (v2's none) does not parse, and is no limit.
            if let Some(max) = std::fs::read_to_string(dir.join(file)).ok().and_then(|m| m.trim().parse().ok()) {
                lowest = Some(lowest.map_or(max, |l: u64| l.min(max)));
            }
            if dir == root || !dir.pop() {
                return lowest;
            }
        }
    };
    cgroup.lines().filter_map(limit).min()
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("refusing to listen on {0} without a token: use --token-file (a token is required off loopback)")]
    TokenRequired(SocketAddr),
    #[error(
        "refusing to serve {0} in clear off loopback: the token and every lock would cross the network unencrypted; give --tls-cert and --tls-key, or --insecure-plaintext on a network you trust"
    )]
    PlaintextRefused(SocketAddr),
    #[error("TLS: {0}")]
    Tls(#[from] interlock_proto::tls::TlsError),
    #[error("{path}: {source}")]
    Data { path: PathBuf, source: std::io::Error },
    #[error("{0} is not a directory: --data names the directory where the server keeps its state")]
    DataNotDir(PathBuf),
    #[error(
        "{0} is in use by another interlock server (its lock file is held); two servers on one data directory would grant the same locks twice"
    )]
    DataInUse(PathBuf),
    #[error("{path}: {what}; refusing to start rather than let fencing tokens go backwards")]
    Exhausted { path: PathBuf, what: String },
    /// The journal hit an I/O error it cannot go on from: the server
    /// stops, and a restart recovers what is durable.
    #[error(
        "the journal failed ({0}); stopped so that a restart recovers exactly what is durable (nothing not yet durable was answered)"
    )]
    JournalFailed(String),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics { addr: SocketAddr, source: std::io::Error },
    #[error("cannot handle signals (SIGINT, SIGTERM): {0}")]
    Signals(std::io::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("the namespace store: {0}")]
    Store(#[from] interlock_journal::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_longer_than_half_the_lease_asks_for_a_longer_lease() {
        let config = Config { lease: Duration::from_secs(5), ..Config::default() };
        assert_eq!(config.lease_needed_for(Duration::from_millis(2500)), None);
        assert_eq!(config.lease_needed_for(Duration::from_millis(2501)), Some(Duration::from_millis(5002)));
        assert_eq!(config.lease_needed_for(Duration::from_secs(15)), Some(Duration::from_secs(30)));
    }

    #[test]
    fn the_recovery_window_lasts_at_least_a_lease() {
        let s = Duration::from_secs;
        let window = |recovery, lease| Config { recovery, lease, ..Config::default() }.recovery_window();
        assert_eq!((window(s(10), s(5)), window(s(0), s(5)), window(s(2), s(5))), (s(10), s(5), s(5)));
    }

    /// The lowest limit of a v2 group and those above it, or of a v1
    /// memory group; "max" and missing files are no limit.
    #[test]
    fn a_control_groups_memory_limit_is_the_lowest_on_its_way_up() {
        let sys = tempfile::tempdir().unwrap();
        let put = |dir: &str, file: &str, text: &str| {
            std::fs::create_dir_all(sys.path().join(dir)).unwrap();
            std::fs::write(sys.path().join(dir).join(file), text).unwrap();
        };
        put("", "memory.max", "max\n");
        put("a", "memory.max", "3000\n");
        put("a/b", "memory.max", "max\n");
        put("memory/x", "memory.limit_in_bytes", "9223372036854771712\n");
        put("memory/x/y", "memory.limit_in_bytes", "2000\n");
        assert_eq!(cgroup_limit("0::/a/b\n", sys.path()), Some(3000));
        assert_eq!(cgroup_limit("0::/\n", sys.path()), None);
        assert_eq!(cgroup_limit("4:memory:/x/y\n1:cpu:/a\n0::/\n", sys.path()), Some(2000));
        assert_eq!(cgroup_limit("4:memory:/x\n", sys.path()), Some(9223372036854771712));
        assert_eq!(cgroup_limit("4:cpu,cpuacct:/a\n", sys.path()), None);
        assert_eq!(cgroup_limit("garbage", sys.path()), None);
    }
}
