//! The journal: appenders on the lock-free ring, one flusher thread that
//! writes groups to segment files and makes them durable together.
//!
//! ```text
//! appenders ──reserve (atomic add)──▶ ring slots ──publish──▶ flusher ──write+fsync──▶ segments
//!      ▲                                                          │
//!      └──────────────── durable watermark (group commit) ◀───────┘
//! ```
//!
//! - Append: O(payload) on the caller's thread (framing and the payload's
//!   CRC happen there, in parallel), one atomic add, one release store.
//! - Flush: O(1) per record plus a copy, one `write` and one `fdatasync`
//!   per group; every record published before the group started is in it.
//!   The segment's file is extended ahead of the records, a
//!   [`PREALLOCATE`] of written zeros at a time, so that a group's
//!   `fdatasync` writes over blocks the file already has: it neither
//!   writes the file's new size nor allocates (see `docs/architecture.md`
//!   for what each costs here). At least [`RESERVE`] of them stay ahead:
//!   when the disk is full, records go into those instead of failing the
//!   journal ([`Journal::space_low`] tells the callers, who then append
//!   only changes that free space).
//!   A group is closed at once when someone waits for one of its records
//!   ([`Journal::want`], [`Journal::wait_for`]); while nobody does, the
//!   flusher lets it grow as long as records keep coming, up to
//!   [`Options::linger_bytes`], napping between them
//!   ([`Options::linger_nap`]) rather than spinning. A sync costs CPU
//!   (the write-out, the device's interrupt, the flusher's wake-up,
//!   which preempts an appender): syncing eagerly for records nobody
//!   waits for made two appenders on two cores barely faster than one.
//! - Durable wait: returns at once if the watermark has passed; otherwise
//!   parks until the flusher, after the sync that covers it, unparks it
//!   (each waiter directly, outside any lock). A server that must not
//!   block a thread per waiter sets a hook instead
//!   ([`Journal::on_durable`]), which is called after each sync.
//! - Callers that sync ([`Options::callers_sync`], what the server runs):
//!   the threads that wait write and sync the groups themselves
//!   ([`Journal::sync_wanted`]; a server's worker before it sleeps), so an
//!   append wakes no other thread; the flusher writes only what sat
//!   unwritten for a whole period ([`Options::backstop`], lengthened up to
//!   [`Options::backstop_max`] while the callers keep up), one group a
//!   period. One
//!   writer at a time, whichever thread it is, behind the writer's lock; a
//!   caller that finds it held waits, then syncs what is left itself.
//! - Written, not synced ([`Journal::write_out`]): the same gather and
//!   write on the caller's thread, without the `fdatasync`; the records
//!   are then in the files' page cache, which a crash of this process
//!   does not lose (a crash of the machine may). The next sync covers
//!   them; the backstop also syncs records left written and unsynced for
//!   a whole period.
//! - Read: O(log s + SPARSE_EVERY + r) for r records from s segments.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::frame::{self, MAX_PAYLOAD};
use crate::ring::Ring;
use crate::segment::{self, Segment};
use crate::{Error, SegmentReport};

mod flusher;
mod tail;

use flusher::{Durably, Flushed, Writer, flush, flusher, retry_room, sync_waited};
#[cfg(doc)]
use tail::PREALLOCATE;
pub use tail::RESERVE;
use tail::Tail;

/// The name of each journal's flusher thread: what a profile, or a
/// benchmark timing the thread (`bench mdtest`), finds it by.
pub const FLUSHER_THREAD: &str = "journal-flusher";

/// How a journal writes.
#[derive(Clone, Debug)]
pub struct Options {
    /// A segment is closed and a new one started at the first group
    /// boundary after it reaches this many bytes.
    pub segment_bytes: u64,
    /// `fdatasync` every group before acknowledging it. Turning this off is
    /// the documented unsafe mode (`--unsafe-no-fsync`): a crash of the
    /// machine (not of the process) can lose acknowledged records.
    pub fsync: bool,
    /// Make every record durable on its own, one fsync each: the baseline
    /// that group commit is measured against, not a mode to run.
    pub fsync_each: bool,
    /// Slots in the append ring: how far appenders may run ahead of the
    /// flusher before they wait.
    pub ring_slots: usize,
    /// The most bytes the flusher gathers into one write.
    pub max_group_bytes: usize,
    /// While nobody waits for its records, a group grows up to this many
    /// bytes for as long as appenders keep adding to it, so that one sync
    /// covers them all; a waiter closes it at once.
    pub linger_bytes: usize,
    /// While nobody waits for a group's records (appenders that never
    /// wait), the longest the flusher naps for its next record before
    /// writing what it has. A waiter wakes it at once, and so does the
    /// appender that fills half the ring (or finds it full); no other
    /// appender pays a wake-up. Where someone waited for the last group
    /// it yields instead (see `flusher::linger`). Tests set it to an
    /// hour, so that only a wake-up can end a nap.
    pub linger_nap: Duration,
    /// The threads that wait for records make them durable themselves:
    /// an append wakes no flusher, and whoever waits calls
    /// [`Journal::sync_wanted`] (a server's worker, when it runs out of
    /// work and is about to sleep: tokio's `on_thread_park`, as Redis's
    /// `beforeSleep` writes its append-only file). The flusher then only
    /// writes what sat unwritten for a whole [`backstop`](Options::backstop)
    /// (records nobody waits for, or whose waiter's thread never went
    /// idle), one group a period. On two cores a wake-up of the flusher
    /// per group and the answers leaving from its thread were what set the
    /// pace of durable changes over loopback (see `docs/architecture.md`).
    pub callers_sync: bool,
    /// With `callers_sync`: how often the flusher looks for records that
    /// nobody took, while it finds some. Shorter costs the flusher more
    /// wake-ups (zero keeps it spinning); tests set it to an hour, so that
    /// what becomes durable, the callers made so.
    pub backstop: Duration,
    /// With `callers_sync`: the longest the flusher sleeps between looks
    /// while it finds the callers writing the records themselves. Each
    /// such look doubles its sleep up to this, and a look that finds
    /// records nobody took brings it back to
    /// [`backstop`](Options::backstop). So a record nobody takes waits at
    /// most two of these (and a sync) to be written, and the flusher of a
    /// server whose workers sync everything wakes a few hundred times a
    /// second, not thousands (session 22: a look every 300 µs, ~30 µs of
    /// CPU each here, took 9% of a core beside 50 clients' creates, and
    /// cost the worker 1-2 µs a create in the cores' caches and
    /// preemptions). Never below `backstop`.
    pub backstop_max: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_bytes: 64 << 20,
            fsync: true,
            fsync_each: false,
            ring_slots: 8192,
            max_group_bytes: 4 << 20,
            linger_bytes: 1 << 20,
            linger_nap: Duration::from_millis(2),
            callers_sync: false,
            backstop: Duration::from_micros(300),
            backstop_max: Duration::from_millis(5),
        }
    }
}

struct State {
    segments: Vec<Segment>,
}

struct Shared {
    dir: PathBuf,
    options: Options,
    ring: Ring,
    /// The index of ring position 0.
    base: u64,
    /// Every index below this is durable (written, and synced unless in
    /// unsafe mode).
    durable_end: AtomicU64,
    /// Every index below this is in the segments' files, synced or not
    /// ([`Journal::write_out`]): a crash of the process loses none of
    /// them, only a crash of the machine may. Never below `durable_end`.
    written_end: AtomicU64,
    /// The highest end any waiter needs durable ([`Journal::want`]): while
    /// it is above `durable_end`, the flusher syncs without lingering.
    wanted: AtomicU64,
    state: Mutex<State>,
    /// The one writer of the segments: whoever holds it gathers, writes
    /// and syncs a group (the flusher, or with [`Options::callers_sync`] a
    /// thread that waits).
    writer: Mutex<Writer>,
    /// The writer's ring position, for the backstop to read without the
    /// writer's lock: a look that took the lock would make a waiting
    /// caller wait behind it for nothing.
    gathered: AtomicU64,
    /// The flusher's I/O error, if it hit one: the journal then refuses
    /// appends and every waiter gets it.
    failure: Mutex<Option<String>>,
    /// Threads waiting for durability: (index they need durable, thread).
    /// The flusher unparks exactly those its sync satisfied, each directly:
    /// a condition variable would wake them all through one mutex, one
    /// after another, and on two cores that chain, not the disk, would set
    /// the pace.
    durable_waiters: Mutex<Vec<(u64, Thread)>>,
    waiters: AtomicUsize,
    /// Appenders asleep because the ring is full, and where they sleep: on
    /// two cores, spinning appenders would starve the flusher they wait for.
    space_waiters: AtomicUsize,
    space: Mutex<()>,
    space_cv: Condvar,
    failed: AtomicBool,
    /// The disk had no room to extend the current segment the last time
    /// the writer tried: the records go into the zeros set aside
    /// ([`RESERVE`]) until it has room again ([`Journal::space_low`]).
    space_low: AtomicBool,
    /// The zeros left after the records in the segment being written, as
    /// of the writer's last write (what [`Journal::reserve_left`] says).
    zeros_left: AtomicU64,
    shutdown: AtomicBool,
    flusher_sleeping: AtomicBool,
    /// 0, or while the flusher naps over a group nobody waits for (see
    /// `flusher::linger`), 1 + the ring position it naps for. A waiter
    /// wakes it ([`Journal::want`]), and so does an appender that finds
    /// half the ring filled since, or none left; no other appender does.
    flusher_napping: AtomicU64,
    flusher: std::sync::OnceLock<Thread>,
    /// Called by the flusher after each advance of the watermark (see
    /// [`Journal::on_durable`]).
    on_durable: std::sync::OnceLock<DurableHook>,
}

/// The open journals whose callers sync ([`Options::callers_sync`]), for
/// [`sync_wanted_everywhere`]. Dropped journals leave at the next call.
static CALLERS_SYNC: Mutex<Vec<std::sync::Weak<Shared>>> = Mutex::new(Vec::new());

/// [`Journal::sync_wanted`] on every open journal whose callers sync: what
/// a server's runtime runs on a worker that has run out of work, before it
/// sleeps (tokio's `on_thread_park`; the worker need not know which
/// journals its tasks wrote to). O(journals) when nobody waits.
pub fn sync_wanted_everywhere() {
    // Only those someone waits on (usually none, or one: no allocation
    // when none), synced outside the list's lock.
    let journals: Vec<Arc<Shared>> = {
        let mut all = CALLERS_SYNC.lock();
        all.retain(|j| j.strong_count() > 0);
        all.iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|s| s.wanted.load(Ordering::SeqCst) > s.durable_end.load(Ordering::SeqCst))
            .collect()
    };
    for s in journals {
        sync_waited(&s, None);
    }
}

/// What the flusher calls after each advance of the durable watermark,
/// with the new watermark and whether the journal has failed (then once
/// more, last). It runs on the thread that synced the group (the flusher,
/// or with [`Options::callers_sync`] a caller), holding the writer: it
/// must be short and must not wait for the journal.
pub type DurableHook = Box<dyn Fn(u64, bool) + Send + Sync>;

/// An append-only log of byte records with indices 1, 2, 3, …
pub struct Journal {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
    /// The directory, held until the flusher has stopped (see `held`).
    _held: std::fs::File,
}

/// What `Journal::open` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The first index still in the log.
    pub first: u64,
    /// The index the next append gets.
    pub next: u64,
    /// Bytes cut off a torn tail, if any.
    pub torn_bytes: Option<u64>,
}

impl Journal {
    /// Opens (creating if needed) the log in `dir`, recovering after a
    /// crash: every record is checked; a torn tail is cut off; corruption
    /// is an error naming the file and offset. O(bytes in the log).
    pub fn open(dir: &Path, options: Options) -> Result<(Journal, Recovery), Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let held = crate::held::hold(dir)?;
        let (mut segments, torn) = recover(dir, true)?;
        let mut torn_bytes = None;
        if let Some((len_before, scanned)) = torn {
            torn_bytes = Some(len_before - scanned);
            tracing::warn!(dir = %dir.display(), bytes = len_before - scanned, "cut off a torn tail");
        }
        if segments.is_empty() {
            segments.push(segment::create(dir, 1, options.fsync)?.1);
        }
        let last = segments.last().expect("one segment at least");
        let file = Tail::open(last)?;
        let next = last.end;
        let recovery = Recovery { first: segments[0].first, next, torn_bytes };
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            ring: Ring::new(options.ring_slots),
            options,
            base: next,
            durable_end: AtomicU64::new(next),
            written_end: AtomicU64::new(next),
            wanted: AtomicU64::new(next),
            state: Mutex::new(State { segments }),
            writer: Mutex::new(Writer { file, pos: 0, group: Vec::new(), unsynced: false, waited: false }),
            gathered: AtomicU64::new(0),
            failure: Mutex::new(None),
            durable_waiters: Mutex::new(Vec::new()),
            waiters: AtomicUsize::new(0),
            space_waiters: AtomicUsize::new(0),
            space: Mutex::new(()),
            space_cv: Condvar::new(),
            failed: AtomicBool::new(false),
            space_low: AtomicBool::new(false),
            zeros_left: AtomicU64::new(u64::MAX),
            shutdown: AtomicBool::new(false),
            flusher_sleeping: AtomicBool::new(false),
            flusher_napping: AtomicU64::new(0),
            on_durable: std::sync::OnceLock::new(),
            flusher: std::sync::OnceLock::new(),
        });
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name(FLUSHER_THREAD.into())
            .spawn(move || flusher(&s))
            .map_err(|e| Error::io(dir, e))?;
        let _ = shared.flusher.set(handle.thread().clone());
        if shared.options.callers_sync {
            CALLERS_SYNC.lock().push(Arc::downgrade(&shared));
        }
        Ok((Journal { shared, flusher: Some(handle), _held: held }, recovery))
    }

    /// Appends a record and returns its index; it is durable once
    /// [`wait_durable`](Journal::wait_durable) returns for that index.
    /// Never takes a lock: one atomic add, a copy into the caller's own
    /// slot, one release store. Waits only if the ring is full (the flusher
    /// is `ring_slots` records behind).
    pub fn append(&self, payload: &[u8]) -> Result<u64, Error> {
        if payload.len() > MAX_PAYLOAD {
            return Err(Error::TooLarge(payload.len()));
        }
        let s = &*self.shared;
        if s.failed.load(Ordering::Acquire) {
            return Err(s.failure());
        }
        let pos = s.ring.reserve();
        let index = s.base + pos;
        let mut spins = 0u32;
        while !s.ring.writable(pos) {
            if spins < 128 {
                backoff(&mut spins);
            } else {
                s.wait_for_space(pos);
            }
        }
        s.ring.publish(pos, frame::framed_len(payload), |buf| frame::prepare(buf, index, payload));
        // Pairs with the fence in the flusher: either it sees this record
        // when it rechecks before sleeping, or we see that it sleeps.
        fence(Ordering::SeqCst);
        if s.flusher_sleeping.load(Ordering::Relaxed) && s.flusher_sleeping.swap(false, Ordering::AcqRel) {
            s.flusher.get().expect("flusher started").unpark();
        }
        // Half the ring filled while the flusher napped: it gathers now,
        // before the appenders run out of room.
        let napping = s.flusher_napping.load(Ordering::Relaxed);
        if napping != 0 && pos + 1 >= napping + s.ring.capacity() / 2 {
            s.wake_napping();
        }
        Ok(index)
    }

    /// Has the flusher `hook` called after each advance of the durable
    /// watermark: a server answers waiting requests from there, with no
    /// thread of its own to wake in between. Set once; a second hook is
    /// refused (returned).
    pub fn on_durable(&self, hook: DurableHook) -> Result<(), DurableHook> {
        self.shared.on_durable.set(hook)
    }

    /// Whether the flusher failed: nothing more becomes durable.
    pub fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// Why it failed (the I/O error, naming its file), if it has.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().clone()
    }

    /// Whether the disk is full: the last try to extend the segment being
    /// written (or to start the next) found no room, and records now go
    /// into the [`RESERVE`] of zeros already on disk. A caller should then
    /// append only records of changes that free space (a removal), so
    /// that the reserve lasts until they have freed some. The writer tries
    /// again at each group, the idle flusher every period, and this call
    /// itself, so room made meanwhile is seen at once. O(1); while the disk
    /// is full, one failing `write` (after the group being written, if
    /// one is).
    pub fn space_low(&self) -> bool {
        let s = &self.shared;
        s.space_low.load(Ordering::Relaxed) && {
            retry_room(s);
            s.space_low.load(Ordering::Relaxed)
        }
    }

    /// While the disk is full ([`space_low`](Journal::space_low)), the
    /// bytes of the [`RESERVE`] that records have not yet used, as of the
    /// writer's last write (records appended since may use some). A caller
    /// that stops appending well before it is gone keeps the journal from
    /// failing for want of room. O(1).
    pub fn reserve_left(&self) -> u64 {
        self.shared.zeros_left.load(Ordering::Relaxed)
    }

    /// Appends a record and waits until it is durable.
    pub fn append_durable(&self, payload: &[u8]) -> Result<u64, Error> {
        let index = self.append(payload)?;
        self.wait_durable(index)?;
        Ok(index)
    }

    /// Blocks until record `index` is durable. O(1) when it already is.
    pub fn wait_durable(&self, index: u64) -> Result<(), Error> {
        self.wait_for(index + 1, None).map(|_| ())
    }

    /// Says that someone waits for every index below `end` to be durable:
    /// the flusher then syncs the group holding them without lingering for
    /// more. A caller that waits by other means than
    /// [`wait_for`](Journal::wait_for) (a server that parks its answer
    /// until the durable hook) calls this, or its record may wait for the
    /// group to fill or for the appenders to pause. O(1).
    pub fn want(&self, end: u64) {
        let s = &*self.shared;
        s.wanted.fetch_max(end, Ordering::SeqCst);
        // A flusher of callers that sync never lingers (the server's
        // every durable change comes this way).
        if s.options.callers_sync {
            return;
        }
        // Pairs with the fence in `flusher::linger`: either the flusher
        // sees this want before it naps, or we see that it naps.
        fence(Ordering::SeqCst);
        if s.flusher_napping.load(Ordering::Relaxed) != 0 {
            s.wake_napping();
        }
    }

    /// Blocks until the durable watermark reaches `end` (every index below
    /// it durable) or `timeout` passes; returns the watermark. Hastens the
    /// sync ([`want`](Journal::want)).
    pub fn wait_for(&self, end: u64, timeout: Option<Duration>) -> Result<u64, Error> {
        // Already durable: no shared write on this common path.
        let now = self.shared.durable_end.load(Ordering::Acquire);
        if now >= end {
            return Ok(now);
        }
        self.want(end);
        if self.shared.options.callers_sync {
            sync_waited(&self.shared, Some(end));
        }
        self.watch_for(end, timeout)
    }

    /// With [`Options::callers_sync`]: makes durable, on the calling
    /// thread, every record someone waits for ([`want`](Journal::want)):
    /// if another thread is writing, after waiting for it to finish its
    /// group. (A record still being copied into the ring by its appender
    /// is left to the backstop after a moment's wait.) O(1) when nobody
    /// waits; else one `write` and one `fdatasync` per group. Must not be
    /// called from the durable hook, which runs while its thread holds the
    /// writer. Without `callers_sync`, the flusher does this and the call
    /// changes nothing it would not.
    pub fn sync_wanted(&self) {
        sync_waited(&self.shared, None)
    }

    /// Writes every record below `end` into the segments' files, on the
    /// calling thread, without syncing them (but for a segment that
    /// fills: it is synced before the next is begun): a crash of this
    /// process then loses none of them, only a crash of the machine may,
    /// until they are durable. What a server answers a `write(2)` after,
    /// as a local file system answers it once its page cache has the
    /// data. The records become durable with the next sync (a waiter's,
    /// or the flusher's within two [`backstop_max`](Options::backstop_max)
    /// periods). Waits for a writer at work (its `fdatasync`, if it is
    /// syncing). O(1) when they are written; else one `write` per group.
    pub fn write_out(&self, end: u64) -> Result<(), Error> {
        let s = &*self.shared;
        let mut spins = 0;
        while s.written_end.load(Ordering::SeqCst) < end {
            if s.failed.load(Ordering::SeqCst) {
                return Err(s.failure());
            }
            let mut w = s.writer.lock();
            match flush(s, &mut w, false, Durably::No) {
                Flushed::Failed => return Err(s.failure()),
                Flushed::Wrote => {}
                // A record before `end` is still being copied into its
                // slot by its appender: a moment's wait.
                Flushed::Nothing => {
                    drop(w);
                    backoff(&mut spins);
                }
            }
        }
        Ok(())
    }

    /// The index after the last record in the segments' files (see
    /// [`write_out`](Journal::write_out)).
    pub fn written_end(&self) -> u64 {
        self.shared.written_end.load(Ordering::Acquire)
    }

    /// As [`wait_for`](Journal::wait_for), without hastening the sync: for
    /// a reader that follows what others make durable (a changelog
    /// consumer), whose waiting should not cost the writers a sync each.
    pub fn watch_for(&self, end: u64, timeout: Option<Duration>) -> Result<u64, Error> {
        let s = &*self.shared;
        let now = s.durable_end.load(Ordering::Acquire);
        if now >= end {
            return Ok(now);
        }
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        s.waiters.fetch_add(1, Ordering::SeqCst);
        s.durable_waiters.lock().push((end, std::thread::current()));
        let result = loop {
            let now = s.durable_end.load(Ordering::SeqCst);
            if now >= end {
                break Ok(now);
            }
            if s.failed.load(Ordering::SeqCst) {
                break Err(s.failure());
            }
            match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        let me = std::thread::current().id();
                        s.durable_waiters.lock().retain(|(need, t)| !(*need == end && t.id() == me));
                        break Ok(now);
                    }
                    std::thread::park_timeout(left);
                }
                None => std::thread::park(),
            }
        };
        s.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// The index the next append will get: every record below it has been
    /// appended (or is being appended now).
    pub fn next_index(&self) -> u64 {
        self.shared.base + self.shared.ring.reserved()
    }

    /// The index after the last durable record.
    pub fn durable_end(&self) -> u64 {
        self.shared.durable_end.load(Ordering::Acquire)
    }

    /// The first index still held (older segments may have been purged).
    pub fn first_index(&self) -> u64 {
        self.shared.state.lock().segments[0].first
    }

    /// Calls `f` on durable records from `from`, in order, at most `max`.
    /// Returns how many. O(log s + SPARSE_EVERY + r).
    pub fn read(&self, from: u64, max: usize, mut f: impl FnMut(u64, &[u8])) -> Result<usize, Error> {
        let until = self.durable_end();
        // Each segment's file, first index, where in it to start (its
        // sparse index's entry at or before `from`; its start if it begins
        // after `from`) and where its records end (a segment rotated just
        // before a crash may keep the zeros it set aside). Not the segments
        // themselves: that copied every sparse index, O(records /
        // SPARSE_EVERY), on every read.
        let segments: Vec<(PathBuf, u64, (u64, u64))> = {
            let state = self.shared.state.lock();
            let first = state.segments[0].first;
            if from < first {
                return Err(Error::Purged { index: from, first });
            }
            let at = state.segments.partition_point(|s| s.first <= from).saturating_sub(1);
            state.segments[at..]
                .iter()
                .map(|seg| (seg.path.clone(), seg.first, (seg.seek_hint(from), seg.len)))
                .collect()
        };
        let mut done = 0;
        for (path, first, bounds) in &segments {
            if done >= max || *first >= until {
                break;
            }
            done += segment::read_at(path, *bounds, from.max(*first), until, max - done, &mut f)?;
        }
        Ok(done)
    }

    /// Removes whole segments whose records are all below `index`. The
    /// segment being written is never removed. O(segments removed).
    pub fn purge_below(&self, index: u64) -> Result<usize, Error> {
        let mut state = self.shared.state.lock();
        let mut removed = 0;
        while state.segments.len() > 1 && state.segments[1].first <= index {
            let seg = state.segments.remove(0);
            std::fs::remove_file(&seg.path).map_err(|e| Error::io(&seg.path, e))?;
            removed += 1;
        }
        if removed > 0 && self.shared.options.fsync {
            segment::sync_dir(&self.shared.dir)?;
        }
        Ok(removed)
    }

    /// The segments, for `journal check`.
    pub fn segments(&self) -> Vec<SegmentReport> {
        self.shared.state.lock().segments.iter().map(SegmentReport::from).collect()
    }
}

impl Drop for Journal {
    /// Flushes every record appended so far, then stops the flusher.
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        if let Some(t) = self.shared.flusher.get() {
            t.unpark();
        }
        if let Some(h) = self.flusher.take() {
            let _ = h.join();
        }
    }
}

impl Shared {
    fn failure(&self) -> Error {
        Error::Failed(self.failure.lock().clone().unwrap_or_else(|| "journal failed".into()))
    }

    fn fail(&self, why: String) {
        tracing::error!(error = %why, "journal flusher failed; refusing further appends");
        *self.failure.lock() = Some(why);
        self.failed.store(true, Ordering::SeqCst);
        for (_, t) in self.durable_waiters.lock().drain(..) {
            t.unpark();
        }
    }

    /// Calls the durable hook, if one is set.
    fn tell(&self, failed: bool) {
        if let Some(hook) = self.on_durable.get() {
            hook(self.durable_end.load(Ordering::SeqCst), failed);
        }
    }

    /// Sleeps until the slot of `pos` is free (the flusher wakes us after
    /// it frees slots).
    fn wait_for_space(&self, pos: u64) {
        self.space_waiters.fetch_add(1, Ordering::SeqCst);
        // A flusher napping over a group must not leave a full ring
        // waiting out its nap.
        self.wake_napping();
        let mut g = self.space.lock();
        while !self.ring.writable(pos) && !self.failed.load(Ordering::Acquire) {
            self.space_cv.wait_for(&mut g, Duration::from_millis(10));
        }
        drop(g);
        self.space_waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes the flusher if it naps over a group (see `flusher_napping`).
    fn wake_napping(&self) {
        if self.flusher_napping.swap(0, Ordering::AcqRel) != 0 {
            self.flusher.get().expect("flusher started").unpark();
        }
    }

    /// Wakes appenders waiting for ring space, if any.
    fn freed_space(&self) {
        fence(Ordering::SeqCst);
        if self.space_waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.space.lock();
            self.space_cv.notify_all();
        }
    }

    fn advance(&self, end: u64) {
        self.durable_end.store(end, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let mut wake = Vec::new();
            self.durable_waiters.lock().retain(|(need, t)| {
                let done = *need <= end;
                if done {
                    wake.push(t.clone());
                }
                !done
            });
            // Outside the lock: waiters queueing for the next group must
            // not wait behind these system calls.
            for t in wake {
                t.unpark();
            }
        }
    }
}

/// Spin briefly, then yield: the wait of an appender on a full ring.
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A torn tail found by recovery: the last segment's length before, and
/// where the tail began.
pub(crate) type Torn = Option<(u64, u64)>;

/// Recovers the segments of `dir`, and the torn tail if there was one.
/// `repair` cuts the tail off.
pub(crate) fn recover(dir: &Path, repair: bool) -> Result<(Vec<Segment>, Torn), Error> {
    let files = segment::list(dir)?;
    let mut segments: Vec<Segment> = Vec::new();
    let mut torn = None;
    for (i, (_, path)) in files.iter().enumerate() {
        let last = i + 1 == files.len();
        let expect = segments.last().map(|s| s.end);
        let len_before = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        if last && len_before < frame::SEGMENT_HEADER as u64 && expect.is_some() {
            // Created by a rotation whose header never reached the disk:
            // it holds nothing.
            if repair {
                std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
            }
            torn = Some((len_before, 0));
            break;
        }
        let scanned = segment::scan(path, expect, last, repair)?;
        if scanned.torn_at.is_some() {
            torn = Some((len_before, scanned.segment.len));
        }
        segments.push(scanned.segment);
    }
    Ok((segments, torn))
}
