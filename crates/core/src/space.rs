//! The lock space: the table of resources and everything that spans them.
//!
//! Seed 004 is a DLM whose resource hash chains became lists at millions of
//! resources. Here the table is an `scc::HashMap`: per-bucket locks, no
//! global lock on lookup, and a resize that moves buckets incrementally
//! instead of rehashing everything while the world waits. A call locks one
//! bucket entry for its duration; calls on different resources run in
//! parallel.
//!
//! Reclaim never scans the table. A resource that becomes idle (no locks, no
//! waiters) puts its key on a lock-free queue once; [`LockSpace::reclaim`]
//! pops a bounded number of keys and frees those still idle after a grace
//! period of `grace_epochs` reclaim calls, so a resource locked and unlocked
//! in a tight loop is not freed and re-created on every cycle. The engine
//! has no clock: the caller decides how often an epoch passes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_queue::SegQueue;
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::deadlock::WaitGraph;
use crate::error::LockError;
use crate::resource::{Ctx, Resource};
use crate::types::{
    Conflict, HeldLock, LockHandle, LockKind, LockRequest, Namespace, Owner, Response, WaitId, WaitingLock,
};
use crate::{Mode, Range};

/// The longest resource name, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// The longest lock value block, in bytes.
pub const MAX_LVB_LEN: usize = 64;

/// Names up to 24 bytes (a Lustre FID is 16) live inside the table entry:
/// no allocation, and no pointer to chase when a bucket compares keys.
type Key = (Namespace, SmallVec<[u8; 24]>);

/// Tuning of a [`LockSpace`].
#[derive(Clone, Debug)]
pub struct Config {
    /// How many [`LockSpace::reclaim`] calls an idle resource survives.
    pub grace_epochs: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config { grace_epochs: 2 }
    }
}

/// Live counters, for `interlock status` and the benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Resources in the table, idle ones awaiting reclaim included.
    pub resources: usize,
    /// Granted locks.
    pub locks: usize,
    /// Queued requests.
    pub waiters: usize,
    /// Keys on the idle queue.
    pub idle_queued: usize,
}

/// A set of named resources and their locks. All methods take `&self` and
/// may be called from many threads.
///
/// Owner ids are the caller's; they must be unique across lock kinds
/// within one lock space (a POSIX owner and an OFD owner are different
/// owners).
pub struct LockSpace {
    /// Resources are boxed so that the incremental resize moves 48-byte
    /// entries, not whole resources.
    table: scc::HashMap<Key, Box<Resource>, foldhash::fast::RandomState>,
    idle: SegQueue<Key>,
    epoch: AtomicU64,
    graph: Mutex<WaitGraph>,
    next_id: AtomicU64,
    resources: AtomicUsize,
    locks: AtomicUsize,
    waiters: AtomicUsize,
    config: Config,
}

impl Default for LockSpace {
    fn default() -> Self {
        LockSpace::new(Config::default())
    }
}

fn check_name(name: &[u8]) -> Result<(), LockError> {
    if name.len() > MAX_NAME_LEN { Err(LockError::NameTooLong(name.len())) } else { Ok(()) }
}

fn check_lvb(lvb: Option<&[u8]>) -> Result<(), LockError> {
    match lvb {
        Some(v) if v.len() > MAX_LVB_LEN => Err(LockError::LvbTooLong(v.len())),
        _ => Ok(()),
    }
}

fn check_request(kind: LockKind, mode: Mode, range: Range) -> Result<(), LockError> {
    if kind != LockKind::Dlm && !mode.is_posix() {
        return Err(LockError::InvalidMode(format!("{mode}: {kind:?} locks are read (pr/rd) or write (ex/wr)")));
    }
    if kind == LockKind::Flock && range != Range::WHOLE {
        return Err(LockError::FlockRange(range.to_string()));
    }
    Ok(())
}

impl LockSpace {
    pub fn new(config: Config) -> LockSpace {
        LockSpace {
            table: scc::HashMap::with_hasher(foldhash::fast::RandomState::default()),
            idle: SegQueue::new(),
            epoch: AtomicU64::new(0),
            graph: Mutex::new(WaitGraph::default()),
            next_id: AtomicU64::new(1),
            resources: AtomicUsize::new(0),
            locks: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            config,
        }
    }

    /// Runs `f` on the resource under its entry lock, creating it if
    /// `create`, then keeps the counters and the idle queue. O(1) expected
    /// for the lookup.
    fn with<R>(
        &self,
        ns: Namespace,
        name: &[u8],
        create: bool,
        f: impl FnOnce(&mut Resource, &Ctx<'_>) -> R,
    ) -> Result<Option<R>, LockError> {
        check_name(name)?;
        let key: Key = (ns, SmallVec::from_slice(name));
        let entry = if create {
            Some(match self.table.entry_sync(key) {
                scc::hash_map::Entry::Occupied(o) => o,
                scc::hash_map::Entry::Vacant(v) => {
                    self.resources.fetch_add(1, Ordering::Relaxed);
                    v.insert_entry(Box::default())
                }
            })
        } else {
            self.table.get_sync(&key)
        };
        let Some(mut entry) = entry else { return Ok(None) };
        let next_id = || self.next_id.fetch_add(1, Ordering::Relaxed);
        let ctx = Ctx { graph: &self.graph, next_id: &next_id };
        let res = entry.get_mut();
        let (locks, waiters) = (res.lock_count(), res.waiter_count());
        let out = f(res, &ctx);
        adjust(&self.locks, locks, res.lock_count());
        adjust(&self.waiters, waiters, res.waiter_count());
        if !res.is_idle() {
            res.idle_since = None;
        } else if res.idle_since.is_none() {
            res.idle_since = Some(self.epoch.load(Ordering::Relaxed));
            if !res.queued_for_reclaim {
                res.queued_for_reclaim = true;
                self.idle.push(entry.key().clone());
            }
        }
        Ok(Some(out))
    }

    /// Requests a lock: granted, queued (when `req.wait`), refused with
    /// `WouldBlock`, or `Deadlock`. O(log n + k) in the locks of the
    /// resource, k counting the conflicts and the owner's neighbours it
    /// touches; a POSIX request that queues also searches the waits-for
    /// graph.
    pub fn lock(&self, req: &LockRequest<'_>) -> Result<Response, LockError> {
        check_request(req.kind, req.mode, req.range)?;
        Ok(self.with(req.kind.namespace(), req.resource, true, |r, ctx| r.lock(req, ctx))?.expect("created"))
    }

    /// `F_UNLCK` on `range` for a POSIX, OFD or flock owner (flock: the
    /// whole file). Unlocking what is not held is not an error.
    /// O(log n + k).
    pub fn unlock(&self, resource: &[u8], owner: Owner, kind: LockKind, range: Range) -> Result<Response, LockError> {
        if kind == LockKind::Dlm {
            return Err(LockError::WrongKind("DLM locks are released by handle (dlm_unlock)"));
        }
        check_request(kind, Mode::PR, range)?;
        let out = self.with(kind.namespace(), resource, false, |r, ctx| {
            let mut effects = Vec::new();
            r.release(owner, kind, range, ctx, &mut effects);
            effects
        })?;
        Ok(Response { outcome: crate::Outcome::Done, effects: out.unwrap_or_default() })
    }

    /// The mode of `owner`'s flock lock on `resource`, if it holds one.
    /// O(1) expected.
    pub fn flock_mode(&self, resource: &[u8], owner: Owner) -> Result<Option<Mode>, LockError> {
        Ok(self.with(LockKind::Flock.namespace(), resource, false, |r, _| r.owner_whole_mode(owner))?.flatten())
    }

    /// Whether `owner` holds any POSIX, OFD or flock lock on `resource`.
    /// O(1) expected.
    pub fn holds(&self, resource: &[u8], owner: Owner, kind: LockKind) -> Result<bool, LockError> {
        Ok(self.with(kind.namespace(), resource, false, |r, _| r.owner_holds(owner))?.unwrap_or(false))
    }

    /// `F_GETLK`: a held lock of another owner that a `mode` lock on `range`
    /// would conflict with (for DLM: any held lock, the owner's own
    /// included). Queued requests are not reported, as in POSIX. Of several
    /// conflicts, the one Linux reports: the earliest owner to have taken a
    /// lock here (and kept one since), its lowest start; O(log n + k) for
    /// k conflicts. DLM: any one, O(log n).
    ///
    /// `NL` on a POSIX or OFD resource is Linux's `F_OFD_GETLK` with
    /// `F_UNLCK` (since 6.3): the owner's own lock of lowest start on
    /// `range`, so a program can read back what one open file holds.
    /// O(log n + k) for the owner's k locks on `range`.
    pub fn test(
        &self,
        resource: &[u8],
        owner: Owner,
        kind: LockKind,
        mode: Mode,
        range: Range,
    ) -> Result<Option<Conflict>, LockError> {
        let own = mode == Mode::NL && matches!(kind, LockKind::Posix | LockKind::Ofd);
        if !own {
            check_request(kind, mode, range)?;
        }
        Ok(self.with(kind.namespace(), resource, false, |r, _| r.test(owner, kind, mode, range))?.flatten())
    }

    /// How many locks `owner` holds on `resource` (POSIX, OFD, flock), after
    /// merges and splits: what a per-client limit counts. O(1) expected.
    pub fn owner_lock_count(&self, resource: &[u8], owner: Owner, kind: LockKind) -> Result<usize, LockError> {
        Ok(self.with(kind.namespace(), resource, false, |r, _| r.owner_lock_count(owner))?.unwrap_or(0))
    }

    /// Releases every lock `owner` holds on the resource, as the close of a
    /// file does for POSIX (any descriptor) and OFD/flock (the last one).
    /// O(k log n) for its k locks.
    pub fn release_owner(&self, resource: &[u8], owner: Owner, kind: LockKind) -> Result<Response, LockError> {
        if kind == LockKind::Dlm {
            return Err(LockError::WrongKind("DLM locks are released by handle (dlm_unlock)"));
        }
        let out = self.with(kind.namespace(), resource, false, |r, ctx| r.release_owner(owner, ctx))?;
        Ok(out.unwrap_or_else(|| Response::new(crate::Outcome::Done)))
    }

    /// Withdraws a queued request (the caller gave up, timed out, or its
    /// session ended): `Done`, or `NotQueued` if it was not waiting (granted
    /// already). The waiters behind it may be granted. O(log n + k).
    pub fn cancel(&self, resource: &[u8], kind: LockKind, wait: WaitId) -> Result<Response, LockError> {
        let out = self.with(kind.namespace(), resource, false, |r, ctx| r.cancel(wait, ctx))?;
        Ok(out.unwrap_or_else(|| Response::new(crate::Outcome::NotQueued)))
    }

    /// Releases DLM lock `lock`, storing `lvb` as the resource's value block
    /// if the lock was held PW or EX. O(log n + k).
    pub fn dlm_unlock(
        &self,
        resource: &[u8],
        owner: Owner,
        lock: LockHandle,
        lvb: Option<&[u8]>,
    ) -> Result<Response, LockError> {
        check_lvb(lvb)?;
        self.with(Namespace::Dlm, resource, false, |r, ctx| r.dlm_unlock(lock, owner, lvb, ctx))?
            .flatten()
            .ok_or(LockError::NoSuchLock(lock))
    }

    /// Converts DLM lock `lock` to `mode`. Down-conversions are granted at
    /// once (storing `lvb` when leaving PW or EX); up-conversions queue
    /// ahead of new requests when `wait`, else fail with `WouldBlock`.
    /// O(log n + k).
    pub fn dlm_convert(
        &self,
        resource: &[u8],
        owner: Owner,
        lock: LockHandle,
        mode: Mode,
        wait: bool,
        lvb: Option<&[u8]>,
    ) -> Result<Response, LockError> {
        check_lvb(lvb)?;
        self.with(Namespace::Dlm, resource, false, |r, ctx| r.dlm_convert(lock, owner, mode, wait, lvb, ctx))?
            .flatten()
            .ok_or(LockError::NoSuchLock(lock))
    }

    /// Every lock held on a resource, sorted by owner then start. O(n log n).
    pub fn locks(&self, resource: &[u8], ns: Namespace) -> Result<Vec<HeldLock>, LockError> {
        Ok(self.with(ns, resource, false, |r, _| r.locks())?.unwrap_or_default())
    }

    /// Every request queued on a resource, in queue order. O(n).
    pub fn waiting(&self, resource: &[u8], ns: Namespace) -> Result<Vec<WaitingLock>, LockError> {
        Ok(self.with(ns, resource, false, |r, _| r.waiting())?.unwrap_or_default())
    }

    /// How many locks are held on `resource`. O(1) expected.
    pub fn lock_count(&self, resource: &[u8], ns: Namespace) -> Result<usize, LockError> {
        Ok(self.with(ns, resource, false, |r, _| r.lock_count())?.unwrap_or(0))
    }

    /// Heap bytes held by one resource's lock structures (for benchmarks).
    pub fn resource_heap_bytes(&self, resource: &[u8], ns: Namespace) -> Result<usize, LockError> {
        Ok(self.with(ns, resource, false, |r, _| r.heap_bytes())?.unwrap_or(0))
    }

    /// Advances the reclaim epoch and frees up to `budget` resources that
    /// have stayed idle for the grace period. O(budget); never scans the
    /// table. Returns how many were freed.
    pub fn reclaim(&self, budget: usize) -> usize {
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        let mut freed = 0;
        for _ in 0..budget.min(self.idle.len()) {
            let Some(key) = self.idle.pop() else { break };
            let mut young = false;
            let removed = self.table.remove_if_sync(&key, |r| match r.idle_since {
                Some(t) if r.is_idle() && t + self.config.grace_epochs <= epoch => true,
                Some(_) if r.is_idle() => {
                    young = true;
                    false
                }
                _ => {
                    r.queued_for_reclaim = false;
                    false
                }
            });
            if removed.is_some() {
                self.resources.fetch_sub(1, Ordering::Relaxed);
                freed += 1;
            } else if young {
                self.idle.push(key);
            }
        }
        freed
    }

    /// Locks held and requests queued, in every resource: what a server's
    /// limit on the whole table counts, asked on every lock request. Two
    /// loads, without [`stats`](Self::stats)'s look at the idle queue,
    /// whose ends every release that idles a resource writes. O(1).
    pub fn held_and_queued(&self) -> usize {
        self.locks.load(Ordering::Relaxed) + self.waiters.load(Ordering::Relaxed)
    }

    /// The live counters. O(1).
    pub fn stats(&self) -> Stats {
        Stats {
            resources: self.resources.load(Ordering::Relaxed),
            locks: self.locks.load(Ordering::Relaxed),
            waiters: self.waiters.load(Ordering::Relaxed),
            idle_queued: self.idle.len(),
        }
    }
}

fn adjust(counter: &AtomicUsize, before: usize, after: usize) {
    if after > before {
        counter.fetch_add(after - before, Ordering::Relaxed);
    } else if before > after {
        counter.fetch_sub(before - after, Ordering::Relaxed);
    }
}
