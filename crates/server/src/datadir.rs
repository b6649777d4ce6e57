//! The data directory: held by one server at a time, and what it remembers
//! across restarts: the start number, the fencing floor, and the sessions
//! lately evicted.
//!
//! Fencing tokens must grow for the life of a data directory, so storage
//! can refuse a writer whose lock has moved on even after the server
//! restarted. A token is `floor + fence`, where `fence` is the engine's
//! per-resource counter (from 1 in each run, growing with every exclusive
//! grant) and `floor` lies above every token of every earlier run: each
//! run durably reserves the tokens `[floor, floor + reserved)` before it
//! issues any of them (a block at start, another each time a counter
//! reaches the end of the reservation), and the next run's floor is the
//! end of the last reservation. No arithmetic here can wrap: a start whose
//! reservation would pass `u64::MAX` is refused.
//!
//! Locks are volatile, and after a restart the server takes a client's
//! word for the locks it reclaims. That is safe for a client whose session
//! ended by its lease (it gave its locks up before the server could end
//! it), but not for one an operator evicted: the evict ends the session
//! at once and gives its locks to others, and a client cut off at that
//! moment still believes it holds them. Should the server die before that
//! client hears of it, the next server would know nothing of the evict,
//! and the client would reclaim locks that others were granted. So an
//! evict is recorded here, durably, before the session ends
//! ([`Evictions::record`]); after a restart, a client whose hello names
//! an evicted session is told it may not reclaim (its welcome says no
//! recovery window: it counts every lock lost). An entry is needed only
//! while its client may still hold its lease, so it is kept for a lease
//! (the evicting run's) from the evict, or from the start of each later
//! run that loads it, and dropped at the next evict after that. Session
//! ids listed are not given to new sessions.
//!
//! A write to a file's data is answered before it is synced, as
//! `write(2)` returns before the disk has the data: a crash of the
//! server's process loses none of it (the kernel holds it), a crash of
//! the machine may. A mount outlives the server's machine, and an
//! `fsync` it makes afterwards must not vouch for writes that crash
//! lost. So each start has a write verifier, as NFS's: the previous
//! run's, unless the machine restarted since that run began (the
//! kernel's boot id changed) and that run did not end with everything
//! on disk ([`Synced::mark`], at a clean stop); then this start's number.
//! A client that wrote under one verifier and syncs under another is
//! told the writes may be lost (`EIO`, see the mount's `unsynced`).
//!
//! On disk: `DIR/lock` (held with an exclusive `flock` while the server
//! runs; a second server on the directory is refused) and
//! `DIR/server.json` (`{"epoch": N, "fence_reserved": F, "evicted":
//! [{"session": S, "lease_ms": L}, ...], "verifier": V, "machine": B,
//! "synced": false}`, replaced atomically: written to a temporary file,
//! synced, renamed, directory synced). A directory from before the floor
//! (no `fence_reserved`) had tokens `epoch << 40 | fence`; its floor is
//! `(epoch + 1) << 40`; one from before the verifier (none) starts a new
//! one.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::ServerError;

/// Tokens reserved at a time: one fsync per 4 billion exclusive grants on
/// one resource.
pub(crate) const FENCE_BLOCK: u64 = 1 << 32;

#[derive(serde::Serialize, serde::Deserialize, Default, Clone, Debug, PartialEq, Eq)]
struct Persisted {
    /// The number of the last start.
    epoch: u64,
    /// Every token issued so far is below this.
    #[serde(default)]
    fence_reserved: Option<u64>,
    /// Sessions evicted whose clients may not know it yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    evicted: Vec<Evicted>,
    /// The last run's write verifier (see the module docs).
    #[serde(default)]
    verifier: Option<u64>,
    /// The kernel's boot id when the last run started, if it could be
    /// read.
    #[serde(default)]
    machine: Option<String>,
    /// The last run ended with every write it took on disk.
    #[serde(default)]
    synced: bool,
}

/// The kernel's id of this boot of the machine, if it says.
fn machine() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_owned())
}

/// This start's write verifier: the last run's, unless writes it answered
/// may have been lost since (the run did not end synced, and the machine
/// restarted since it began, by `machine`, or either boot id is
/// unknown); else `boot`, this start's number, which no run had before.
fn verifier(prev: &Persisted, machine: Option<&str>, boot: u64) -> u64 {
    let same_machine = machine.is_some() && prev.machine.as_deref() == machine;
    match prev.verifier {
        Some(v) if prev.synced || same_machine => v,
        _ => boot,
    }
}

/// An evicted session, and the lease it had.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct Evicted {
    session: u64,
    lease_ms: u64,
}

/// A data directory held by this process.
pub(crate) struct DataDir {
    path: PathBuf,
    /// Held for the server's life: the `flock` is the exclusion.
    _lock: File,
    /// What the last run left, `None` on a first start.
    previous: Option<Persisted>,
}

/// What a start left: its number, the tokens it may issue, and the
/// sessions evicted.
pub(crate) struct Start {
    pub boot: u64,
    /// The write verifier (see the module docs).
    pub verifier: u64,
    pub synced: Synced,
    /// The directory had been used before: the server restarted.
    pub restarted: bool,
    pub fences: Fences,
    pub evictions: Evictions,
}

impl DataDir {
    /// Creates the directory if needed (`0700`: it holds every file's
    /// data, which the namespace's modes do not guard there) and holds
    /// it. An existing directory that other users may enter is used, with
    /// a warning. O(1).
    pub fn open(path: &Path) -> Result<DataDir, ServerError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let err = |p: &Path| {
            let path = p.to_path_buf();
            move |source| ServerError::Data { path, source }
        };
        match std::fs::metadata(path) {
            Ok(m) if !m.is_dir() => return Err(ServerError::DataNotDir(path.to_path_buf())),
            Ok(m) if m.permissions().mode() & 0o077 != 0 => tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", m.permissions().mode() & 0o777),
                "other users of this machine may enter the data directory, where every file's data is theirs \
                 to read whatever its mode in the namespace; chmod 700 it"
            ),
            Ok(_) => {}
            Err(_) => std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(err(path))?,
        }
        if let Some(caveat) = file_system_caveat(path) {
            tracing::warn!(path = %path.display(), "{caveat}");
        }
        let lock_path = path.join("lock");
        let lock =
            File::options().create(true).truncate(false).write(true).open(&lock_path).map_err(err(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(ServerError::DataInUse(path.to_path_buf())),
            Err(std::fs::TryLockError::Error(e)) => return Err(err(&lock_path)(e)),
        }
        let state = path.join("server.json");
        let previous = match std::fs::read(&state) {
            Ok(b) => Some(serde_json::from_slice(&b).map_err(|e| ServerError::Data {
                path: state.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(&state)(e)),
        };
        Ok(DataDir { path: path.to_path_buf(), _lock: lock, previous })
    }

    /// Counts a start (at `now`) and reserves its first block of
    /// tokens, durably, before any is issued. Call it only once the
    /// server can serve (a failed start counts nothing).
    pub fn start(mut self, block: u64, now: Instant) -> Result<(Start, DataDir), ServerError> {
        let state = self.path.join("server.json");
        let exhausted = |what: &str| ServerError::Exhausted { path: state.clone(), what: what.into() };
        let restarted = self.previous.is_some();
        let prev = self.previous.take().unwrap_or_default();
        let boot = prev.epoch.checked_add(1).ok_or_else(|| exhausted("the start number is at its maximum"))?;
        let floor = match (restarted, prev.fence_reserved) {
            (false, _) => 0,
            (true, Some(f)) => f,
            // Tokens of the old layout were below (epoch + 1) << 40.
            (true, None) => (prev.epoch + 1)
                .checked_mul(1 << 40)
                .ok_or_else(|| exhausted("the old start number leaves no fencing tokens above its own"))?,
        };
        let reserved = floor.checked_add(block).ok_or_else(|| exhausted("fencing tokens are used up"))?;
        let machine = machine();
        let verifier = verifier(&prev, machine.as_deref(), boot);
        // Those evicted before are known from now on.
        let evicted: Vec<_> = prev.evicted.into_iter().map(|e| (e, now)).collect();
        let ids = Mutex::new(ids_of(&evicted));
        let file =
            StateFile { path: state, epoch: boot, fence_reserved: reserved, evicted, verifier, machine, synced: false };
        file.write()?;
        let file = Arc::new(Mutex::new(file));
        let fences = Fences { floor, reserved: AtomicU64::new(block), block, file: file.clone() };
        let synced = Synced { dir: self.path.clone(), file: file.clone() };
        Ok((Start { boot, verifier, synced, restarted, fences, evictions: Evictions { file, ids } }, self))
    }
}

/// `server.json` as this run last wrote it, rewritten atomically at every
/// change.
struct StateFile {
    path: PathBuf,
    epoch: u64,
    fence_reserved: u64,
    /// The sessions evicted, each with when this run first knew of it.
    evicted: Vec<(Evicted, Instant)>,
    verifier: u64,
    machine: Option<String>,
    synced: bool,
}

/// What a machine crash may cost on the file system that holds `dir`,
/// if more than the guarantees' (`docs/namespace.md`, "What is assumed
/// of the disk": among them, that syncing a new data file makes its name
/// durable, as ext4, XFS and btrfs do). One `statfs`.
fn file_system_caveat(dir: &Path) -> Option<&'static str> {
    const EXT4: i64 = 0xef53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683e;
    const TMPFS: i64 = 0x0102_1994;
    const RAMFS: i64 = 0x8584_58f6;
    // `f_type` is an `i64` here, an `i32` or `u32` on other targets.
    #[allow(clippy::useless_conversion)]
    let kind = i64::from(rustix::fs::statfs(dir).ok()?.f_type);
    match kind {
        EXT4 | XFS | BTRFS => None,
        TMPFS | RAMFS => Some("the data directory is in memory: every file in it is lost when the machine restarts"),
        _ => Some(
            "the data directory is on a file system other than ext4, XFS or btrfs, which may not make a new file's \
             name durable when its data is synced: after a machine crash, a file made and synced just before it \
             may read as zeros (docs/namespace.md)",
        ),
    }
}

impl StateFile {
    fn write(&self) -> Result<(), ServerError> {
        let persisted = Persisted {
            epoch: self.epoch,
            fence_reserved: Some(self.fence_reserved),
            evicted: self.evicted.iter().map(|&(e, _)| e).collect(),
            verifier: Some(self.verifier),
            machine: self.machine.clone(),
            synced: self.synced,
        };
        let bytes = serde_json::to_vec(&persisted).expect("serializes");
        let dir = self.path.parent().expect("in the data directory");
        let tmp = dir.join("server.json.tmp");
        (|| -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            File::open(dir)?.sync_all()
        })()
        .map_err(|source| ServerError::Data { path: self.path.clone(), source })
    }
}

/// Records that a run ends with every write it took on disk, so that the
/// next start keeps the write verifier even after the machine restarted.
pub(crate) struct Synced {
    dir: PathBuf,
    file: Arc<Mutex<StateFile>>,
}

impl Synced {
    /// Syncs the file system of the data directory (every file's data and
    /// the journal: `syncfs(2)`), then records that on disk. Call it only
    /// once no write can come: at the end of a clean stop. Blocks for the
    /// sync; O(dirty data).
    pub fn mark(&self) -> Result<(), ServerError> {
        let err = |source| ServerError::Data { path: self.dir.clone(), source };
        let dir = File::open(&self.dir).map_err(err)?;
        rustix::fs::syncfs(&dir).map_err(|e| err(e.into()))?;
        let mut file = self.file.lock();
        file.synced = true;
        let written = file.write();
        if written.is_err() {
            file.synced = false;
        }
        written
    }
}

/// The fencing tokens of one run: see the module docs.
pub(crate) struct Fences {
    floor: u64,
    /// Counters below this may be issued: their tokens are reserved.
    reserved: AtomicU64,
    block: u64,
    file: Arc<Mutex<StateFile>>,
}

impl Fences {
    /// The token of the engine's per-resource counter `fence`. O(1): one
    /// atomic load, and an fsync once per `block` grants on one resource.
    pub fn token(&self, fence: u64) -> u64 {
        if fence >= self.reserved.load(Ordering::Acquire) {
            self.reserve(fence);
        }
        // No overflow: `floor + reserved` was checked before it was stored.
        self.floor + fence
    }

    /// Durably reserves tokens up to past `floor + fence`. A server that
    /// cannot stops: a token issued without its reservation could be
    /// issued again after a restart.
    #[cold]
    fn reserve(&self, fence: u64) {
        let mut file = self.file.lock();
        let mut reserved = self.reserved.load(Ordering::Acquire);
        while fence >= reserved {
            let next = reserved.checked_add(self.block).filter(|r| r.checked_add(self.floor).is_some());
            let Some(next) = next else {
                tracing::error!("fencing tokens are used up; stopping rather than issue one twice");
                std::process::abort();
            };
            file.fence_reserved = self.floor + next;
            if let Err(e) = file.write() {
                tracing::error!(error = %e, "cannot reserve fencing tokens; stopping rather than issue one twice");
                std::process::abort();
            }
            reserved = next;
            self.reserved.store(reserved, Ordering::Release);
        }
    }
}

/// The sessions evicted whose clients may not know it yet: see the module
/// docs.
pub(crate) struct Evictions {
    file: Arc<Mutex<StateFile>>,
    /// Their ids, as last written: looked up without waiting for a write
    /// under way (a new session's id is chosen under the session table's
    /// lock).
    ids: Mutex<HashSet<u64>>,
}

impl Evictions {
    /// Records durably, at `now`, that session `session` (whose lease is
    /// `lease`) is evicted; call it before the session ends. Entries past
    /// their lease are dropped. The caller waits for a write and two
    /// syncs: run it where that blocks no one. O(evicts in the last
    /// lease).
    pub fn record(&self, session: u64, lease: Duration, now: Instant) -> Result<(), ServerError> {
        let mut file = self.file.lock();
        let before = file.evicted.clone();
        let past = |&(e, since): &(Evicted, Instant)| {
            now.saturating_duration_since(since).as_millis() >= u128::from(e.lease_ms)
        };
        // Evicted twice at once: listed once, from the later.
        file.evicted.retain(|e| !past(e) && e.0.session != session);
        file.evicted.push((Evicted { session, lease_ms: lease.as_millis() as u64 }, now));
        let written = file.write();
        if written.is_err() {
            // The evict is refused: its session goes on. (A copy a
            // half-done write left on disk costs its client, after a
            // restart, only locks it counts lost.)
            file.evicted = before;
        } else {
            *self.ids.lock() = ids_of(&file.evicted);
        }
        written
    }

    /// Whether `session` was evicted (by this run or one before) and may
    /// still be named by its client. O(1).
    pub fn contains(&self, session: u64) -> bool {
        self.ids.lock().contains(&session)
    }
}

/// The session ids of `evicted`.
fn ids_of(evicted: &[(Evicted, Instant)]) -> HashSet<u64> {
    evicted.iter().map(|(e, _)| e.session).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(dir: &Path, block: u64) -> (Start, DataDir) {
        DataDir::open(dir).unwrap().start(block, Instant::now()).unwrap()
    }

    fn state(dir: &Path) -> Persisted {
        serde_json::from_slice(&std::fs::read(dir.join("server.json")).unwrap()).unwrap()
    }

    /// Tokens grow across restarts and across reservations within a run,
    /// whatever each run's counters reached.
    #[test]
    fn tokens_grow_for_the_life_of_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut last = 0;
        for (run, grants) in [5u64, 17, 1, 40].into_iter().enumerate() {
            let (s, held) = start(dir.path(), 8);
            assert_eq!(s.boot, run as u64 + 1);
            assert_eq!(s.restarted, run > 0);
            for fence in 1..=grants {
                let t = s.fences.token(fence);
                assert!(t > last, "run {run}: token {t} after {last}");
                last = t;
            }
            drop(held);
        }
    }

    /// The write verifier is kept across restarts of the server on one
    /// boot of the machine, and after a run that ended synced; a restart
    /// of the machine after a run that did not end synced gives a new
    /// one, as does a directory from before the verifier.
    #[test]
    fn the_write_verifier_changes_only_where_unsynced_writes_may_be_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (s, held) = start(dir.path(), 8);
        let first = s.verifier;
        drop(held);
        let (s, held) = start(dir.path(), 8);
        assert_eq!(s.verifier, first, "a restart on the same boot");
        drop(held);
        let rebooted = |d: &Path| {
            let mut p = state(d);
            p.machine = Some("another boot".into());
            std::fs::write(d.join("server.json"), serde_json::to_vec(&p).unwrap()).unwrap();
        };
        rebooted(dir.path());
        let (s, held) = start(dir.path(), 8);
        assert_ne!(s.verifier, first, "a restart of the machine after a crash");
        assert_eq!(s.verifier, s.boot);
        let second = s.verifier;
        s.synced.mark().unwrap();
        assert!(state(dir.path()).synced);
        drop(held);
        rebooted(dir.path());
        let (s, held) = start(dir.path(), 8);
        assert_eq!(s.verifier, second, "a restart of the machine after a run that ended synced");
        assert!(!state(dir.path()).synced, "a run is not synced until it says so");
        drop(held);
        let mut old = state(dir.path());
        old.verifier = None;
        std::fs::write(dir.path().join("server.json"), serde_json::to_vec(&old).unwrap()).unwrap();
        let (s, _held) = start(dir.path(), 8);
        assert_ne!(s.verifier, second, "a directory from before the verifier");
    }

    /// An evict is on disk once recorded: the next run knows it, and
    /// keeps it for a lease from its own start (the client's lease runs
    /// on while no server does), then drops it at the next evict; a run's
    /// own evicts are kept for a lease from each.
    #[test]
    fn an_evict_is_remembered_for_a_lease_of_each_run_that_knows_it() {
        let dir = tempfile::tempdir().unwrap();
        let lease = Duration::from_secs(1);
        let t0 = Instant::now();
        let (s, held) = DataDir::open(dir.path()).unwrap().start(8, t0).unwrap();
        s.evictions.record(7, lease, t0).unwrap();
        assert!(s.evictions.contains(7) && !s.evictions.contains(8));
        drop((s, held));
        let t1 = t0 + Duration::from_secs(60);
        let (s, held) = DataDir::open(dir.path()).unwrap().start(8, t1).unwrap();
        assert!(s.evictions.contains(7), "known after a restart, whatever time passed");
        s.evictions.record(8, lease, t1 + Duration::from_millis(999)).unwrap();
        assert!(s.evictions.contains(7), "a lease from this run's start is not over");
        s.evictions.record(9, lease, t1 + lease).unwrap();
        s.evictions.record(9, lease, t1 + lease).unwrap();
        assert!(!s.evictions.contains(7) && s.evictions.contains(8) && s.evictions.contains(9));
        assert_eq!(state(dir.path()).evicted.iter().map(|e| e.session).collect::<Vec<_>>(), [8, 9]);
        // Fencing reservations keep the list.
        s.fences.token(8);
        drop((s, held));
        let (s, _held) = start(dir.path(), 8);
        assert!(s.evictions.contains(8) && s.evictions.contains(9) && !s.evictions.contains(7));
    }

    /// An evict that cannot be written is refused and not listed.
    #[test]
    fn an_evict_that_cannot_be_written_is_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _held) = start(dir.path(), 8);
        std::fs::create_dir(dir.path().join("server.json.tmp")).unwrap();
        assert!(s.evictions.record(7, Duration::from_secs(1), Instant::now()).is_err());
        assert!(!s.evictions.contains(7));
        std::fs::remove_dir(dir.path().join("server.json.tmp")).unwrap();
        s.evictions.record(8, Duration::from_secs(1), Instant::now()).unwrap();
        assert_eq!(state(dir.path()).evicted, [Evicted { session: 8, lease_ms: 1000 }]);
    }

    #[test]
    fn a_second_holder_is_refused_and_the_first_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let held = DataDir::open(dir.path()).unwrap();
        assert!(matches!(DataDir::open(dir.path()), Err(ServerError::DataInUse(_))));
        drop(held);
        DataDir::open(dir.path()).unwrap();
    }

    /// The old layout's tokens (`epoch << 40 | fence`) stay below the new
    /// floor; a start number or floor at the top is refused, not wrapped.
    #[test]
    fn no_overflow_path() {
        let dir = tempfile::tempdir().unwrap();
        let put = |text: &str| std::fs::write(dir.path().join("server.json"), text).unwrap();
        put(r#"{"epoch": 3}"#);
        let (s, held) = start(dir.path(), 8);
        assert!(s.fences.token(1) > (3 << 40 | ((1 << 40) - 1)));
        drop(held);
        for bad in [
            r#"{"epoch": 16777216}"#,
            &format!(r#"{{"epoch": {}}}"#, u64::MAX),
            r#"{"epoch": 1, "fence_reserved": 18446744073709551610}"#,
        ] {
            put(bad);
            let before = state(dir.path());
            let r = DataDir::open(dir.path()).unwrap().start(8, Instant::now());
            assert!(matches!(r, Err(ServerError::Exhausted { .. })), "{bad}");
            assert_eq!(state(dir.path()), before, "a refused start changes nothing");
        }
    }

    #[test]
    fn a_new_data_directory_is_its_users_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("a/data");
        drop(DataDir::open(&data).unwrap());
        assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_file_is_not_a_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(DataDir::open(&file), Err(ServerError::DataNotDir(_))));
    }

    #[test]
    fn a_data_directory_off_the_disks_it_is_meant_for_is_told() {
        assert_eq!(file_system_caveat(std::env::temp_dir().as_path()).is_none(), on_disk(&std::env::temp_dir()));
        assert!(file_system_caveat("/dev/shm".as_ref()).is_some_and(|c| c.contains("in memory")));
        assert!(file_system_caveat("/proc".as_ref()).is_some_and(|c| c.contains("other than ext4")));
    }

    /// Whether `df` calls `dir`'s file system one of those meant for data.
    fn on_disk(dir: &std::path::Path) -> bool {
        let out = std::process::Command::new("df").args(["--output=fstype"]).arg(dir).output().unwrap();
        let kind = String::from_utf8(out.stdout).unwrap();
        ["ext4", "xfs", "btrfs"].contains(&kind.lines().nth(1).unwrap().trim())
    }
}
