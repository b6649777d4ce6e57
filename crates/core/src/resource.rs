//! One resource: its granted locks, its wait queue, its value block and its
//! fencing token, and the rules that move requests between them.
//!
//! Every method runs under the resource's entry lock in the
//! [`LockSpace`](crate::LockSpace) table and costs O(log n + k) in the locks
//! and waiters of this resource, where k counts the conflicts, the owner's
//! neighbours and the waiters on the bytes that changed.
//!
//! The queue discipline: a blocking request waits behind held conflicts and
//! behind earlier queued requests it conflicts with (FIFO, so no waiter
//! starves), except those queued requests that themselves wait, directly or
//! through other POSIX owners, for the requester: letting them keep it
//! waiting would turn a plain lock upgrade into a deadlock the kernel does
//! not have. A non-blocking request follows POSIX: it fails only on a held
//! conflict.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::ControlFlow;

use parking_lot::Mutex;

use crate::deadlock::WaitGraph;
use crate::granted::{Exempt, Granted, weakens};
use crate::tree::NodeId;
use crate::types::{
    Conflict, Effect, Grant, HeldLock, LockHandle, LockKind, LockRequest, Outcome, Owner, Response, WaitId,
};
use crate::waiters::{CONVERT_CLASS, NEW_CLASS, WaitQueue, Waiter};
use crate::{Mode, Range, Set};

/// What a resource needs from its lock space.
pub(crate) struct Ctx<'a> {
    pub graph: &'a Mutex<WaitGraph>,
    /// Fresh ids for waits and DLM lock handles.
    pub next_id: &'a dyn Fn() -> u64,
}

#[derive(Debug, Default)]
pub(crate) struct Resource {
    granted: Granted,
    waiters: WaitQueue,
    lvb: Option<Vec<u8>>,
    fence: u64,
    /// The reclaim epoch at which the resource last became idle.
    pub idle_since: Option<u64>,
    /// Whether its key is on the lock space's idle queue.
    pub queued_for_reclaim: bool,
}

/// A request as it sits in the queue or is being decided.
struct Ask {
    owner: Owner,
    kind: LockKind,
    mode: Mode,
    range: Range,
    convert: Option<LockHandle>,
}

impl Ask {
    fn exempt(&self) -> Exempt {
        match (self.kind.owner_merges(), self.convert) {
            (true, _) => Exempt::Owner(self.owner),
            (false, Some(h)) => Exempt::Lock(h),
            (false, None) => Exempt::Nothing,
        }
    }

    /// Whether a queued waiter `w` stands in this request's way.
    fn conflicts_with_waiter(&self, w: &Waiter) -> bool {
        let same_owner = self.kind.owner_merges() && w.owner == self.owner;
        !(w.mode.compatible(self.mode) || same_owner)
    }
}

/// Waiters to re-examine, earliest ticket first, each at most once at a time.
#[derive(Default)]
struct Dirty {
    heap: BinaryHeap<Reverse<(u64, WaitId)>>,
    listed: Set<WaitId>,
}

impl Dirty {
    /// Every waiter overlapping `range` whose ticket is after `after`.
    fn add(&mut self, waiters: &WaitQueue, range: Range, after: u64) {
        waiters.each_overlapping(range, |w| {
            if w.ticket > after && self.listed.insert(w.id) {
                self.heap.push(Reverse((w.ticket, w.id)));
            }
        });
    }

    fn pop(&mut self) -> Option<WaitId> {
        let Reverse((_, id)) = self.heap.pop()?;
        self.listed.remove(&id);
        Some(id)
    }
}

impl Resource {
    /// No locks, no waiters: a candidate for reclaim.
    pub fn is_idle(&self) -> bool {
        self.granted.is_empty() && self.waiters.is_empty()
    }

    pub fn lock_count(&self) -> usize {
        self.granted.len()
    }

    pub fn waiter_count(&self) -> usize {
        self.waiters.len()
    }

    pub fn heap_bytes(&self) -> usize {
        self.granted.heap_bytes() + self.waiters.heap_bytes() + self.lvb.as_ref().map_or(0, |v| v.capacity())
    }

    pub fn locks(&self) -> Vec<HeldLock> {
        self.granted.all()
    }

    /// `F_GETLK`: one held lock that a `mode` lock on `range` by `owner`
    /// would conflict with. O(log n).
    pub fn test(&self, owner: Owner, kind: LockKind, mode: Mode, range: Range) -> Option<Conflict> {
        let ask = Ask { owner, kind, mode, range, convert: None };
        self.granted.first_conflict(mode, range, ask.exempt()).map(|id| self.granted.conflict(id))
    }

    /// A new lock request. O(log n + k); a blocking POSIX request that must
    /// wait also searches the waits-for graph.
    pub fn lock(&mut self, req: &LockRequest<'_>, ctx: &Ctx<'_>) -> Response {
        let mut effects = Vec::new();
        let ask = Ask { owner: req.owner, kind: req.kind, mode: req.mode, range: req.range, convert: None };
        if req.kind == LockKind::Flock {
            match self.granted.owner_whole_mode(req.owner) {
                Some(m) if m == req.mode => return Response::new(Outcome::Granted(self.grant_info(None))),
                // Linux drops the old flock lock before it tries the new
                // one (flock(2): conversion is not atomic), and a waiter
                // may take the gap.
                Some(_) => self.release(req.owner, req.kind, Range::WHOLE, ctx, &mut effects),
                None => {}
            }
        }
        let outcome = self.decide(ask, req.wait, ctx, &mut effects);
        Response { outcome, effects }
    }

    /// Grants, queues or refuses `ask`.
    fn decide(&mut self, ask: Ask, wait: bool, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) -> Outcome {
        let held = self.granted.first_conflict(ask.mode, ask.range, ask.exempt());
        let ticket = self.waiters.ticket(if ask.convert.is_some() { CONVERT_CLASS } else { NEW_CLASS });
        if !wait {
            // POSIX: only held locks count. DLM no-queue: earlier queued
            // requests count too, since a grant must not overtake them.
            let queued = ask.kind == LockKind::Dlm
                && self.waiters.any_overlapping(ask.range, |w| w.ticket < ticket && ask.conflicts_with_waiter(w));
            if held.is_some() || queued {
                return Outcome::WouldBlock;
            }
            let grant = self.grant(&ask, ctx, effects);
            return Outcome::Granted(grant);
        }
        let blockers = self.blockers(&ask, ticket, ctx);
        if blockers.is_empty() && !self.behind_own(&ask, ticket) {
            let grant = self.grant(&ask, ctx, effects);
            return Outcome::Granted(grant);
        }
        let id = (ctx.next_id)();
        if ask.kind == LockKind::Posix {
            let mut graph = ctx.graph.lock();
            if graph.reaches(&blockers, ask.owner) {
                return Outcome::Deadlock;
            }
            graph.set(ask.owner, id, blockers.clone());
        }
        let mut notified = Vec::new();
        if ask.kind == LockKind::Dlm {
            self.blocking_callbacks(&ask, &mut notified, effects);
        }
        let waiter = Waiter {
            id,
            owner: ask.owner,
            kind: ask.kind,
            mode: ask.mode,
            ticket,
            convert: ask.convert,
            blockers,
            notified,
        };
        self.waiters.push(waiter, ask.range);
        Outcome::Queued(id)
    }

    /// The owners `ask` (with queue position `ticket`) would wait for now:
    /// holders of conflicting locks, and owners of earlier conflicting
    /// waiters that do not themselves wait for `ask`'s owner. Sorted,
    /// without repeats. O(log n + k).
    fn blockers(&self, ask: &Ask, ticket: u64, ctx: &Ctx<'_>) -> Vec<Owner> {
        let mut out = Vec::new();
        let _ = self.granted.conflicts(ask.mode, ask.range, ask.exempt(), |_, h| {
            out.push(h.owner);
            ControlFlow::<()>::Continue(())
        });
        let mut earlier = Vec::new();
        self.waiters.any_overlapping(ask.range, |w| {
            if w.ticket < ticket && ask.conflicts_with_waiter(w) {
                earlier.push((w.owner, w.kind, w.blockers.binary_search(&ask.owner).is_ok()));
            }
            false
        });
        if !earlier.is_empty() {
            // Who waits for the requester through other POSIX owners: one
            // search behind it, made only when it holds a lock here (the
            // upgrade case this rule exists for); a requester that holds
            // nothing here is waited for only through its own queue
            // position, which the direct check covers.
            let holds_here = self.granted.owner_holds(ask.owner);
            let behind = (ask.kind == LockKind::Posix && holds_here).then(|| ctx.graph.lock().waiting_for(ask.owner));
            for (owner, kind, waits_for_us) in earlier {
                let waits_for_us = ask.kind.owner_merges()
                    && (waits_for_us
                        || (kind == LockKind::Posix && behind.as_ref().is_some_and(|b| b.contains(&owner))));
                if !waits_for_us {
                    out.push(owner);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether an earlier queued request of the same owner (POSIX, OFD,
    /// flock) overlaps `ask` with another mode: then the order of the two
    /// decides the owner's final locks, so they are granted in queue order.
    /// This is an ordering, not a wait for another owner, so it adds no
    /// waits-for edge. O(log n + k).
    fn behind_own(&self, ask: &Ask, ticket: u64) -> bool {
        ask.kind.owner_merges()
            && self
                .waiters
                .any_overlapping(ask.range, |w| w.ticket < ticket && w.owner == ask.owner && w.mode != ask.mode)
    }

    /// Blocking ASTs to the holders of DLM locks that block `ask`, except
    /// those in `notified` (which it then lists). O(log n + k).
    fn blocking_callbacks(&self, ask: &Ask, notified: &mut Vec<LockHandle>, effects: &mut Vec<Effect>) {
        let _ = self.granted.conflicts(ask.mode, ask.range, ask.exempt(), |_, h| {
            if !notified.contains(&h.handle) {
                notified.push(h.handle);
                effects.push(Effect::Blocking { lock: h.handle, owner: h.owner, held: h.mode, wanted: ask.mode });
            }
            ControlFlow::<()>::Continue(())
        });
    }

    fn grant_info(&self, lock: Option<LockHandle>) -> Grant {
        Grant { fence: self.fence, lvb: lock.and(self.lvb.clone()), lock }
    }

    /// Installs `ask` as granted and settles the queue around it.
    fn grant(&mut self, ask: &Ask, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) -> Grant {
        let mut changed = vec![ask.range];
        let handle = self.install(ask, ctx, &mut changed);
        if ask.mode.is_write() {
            self.fence += 1;
        }
        let grant = self.grant_info(handle);
        self.settle(changed, ctx, effects);
        grant
    }

    /// Puts `ask` into the granted set, recording in `changed` the bytes
    /// where some hold got weaker. Returns the DLM handle. O(log n + k).
    fn install(&mut self, ask: &Ask, ctx: &Ctx<'_>, changed: &mut Vec<Range>) -> Option<LockHandle> {
        if ask.kind.owner_merges() {
            self.granted.set_owner_range(ask.owner, ask.kind, Some(ask.mode), ask.range, changed);
            return None;
        }
        if let Some(h) = ask.convert {
            let node = self.granted.by_handle(h).expect("a queued conversion keeps its lock");
            let old = self.granted.held(node).mode;
            if weakens(old, ask.mode) {
                changed.push(ask.range);
            }
            self.granted.set_mode(node, ask.mode);
            return Some(h);
        }
        Some(self.granted.insert_dlm(ask.owner, ask.mode, ask.range, (ctx.next_id)() as u32))
    }

    /// After the bytes in `work` changed: grants every waiter that can now
    /// go and brings the blockers of the others up to date.
    ///
    /// A waiter's blockers depend only on the held locks it overlaps and
    /// the earlier waiters it overlaps, so the waiters are re-examined in
    /// queue order from a heap; a grant puts the waiters overlapping it back
    /// on the heap, a waiter whose blockers changed the later ones. This
    /// reaches the same fixed point as re-examining the whole queue in
    /// order, while touching only waiters on changed bytes:
    /// O(k (log n + k)) for k such waiters.
    fn settle(&mut self, work: Vec<Range>, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
        if self.waiters.is_empty() {
            return;
        }
        let mut dirty = Dirty::default();
        for r in work {
            dirty.add(&self.waiters, r, 0);
        }
        while let Some(id) = dirty.pop() {
            let Some((w, wrange)) = self.waiters.get(id) else { continue };
            let ask = Ask { owner: w.owner, kind: w.kind, mode: w.mode, range: wrange, convert: w.convert };
            let (ticket, old_blockers) = (w.ticket, w.blockers.clone());
            let blockers = self.blockers(&ask, ticket, ctx);
            if blockers.is_empty() && !self.behind_own(&ask, ticket) {
                self.waiters.remove(id);
                if ask.kind == LockKind::Posix {
                    ctx.graph.lock().remove(ask.owner, id);
                }
                let mut changed = vec![ask.range];
                let handle = self.install(&ask, ctx, &mut changed);
                if ask.mode.is_write() {
                    self.fence += 1;
                }
                effects.push(Effect::Granted { wait: id, owner: ask.owner, grant: self.grant_info(handle) });
                for r in changed {
                    dirty.add(&self.waiters, r, 0);
                }
                continue;
            }
            if ask.kind == LockKind::Dlm {
                // A grant ahead of this waiter may hold bytes it wants now.
                let mut notified = std::mem::take(&mut self.waiters.get_mut(id).expect("still queued").notified);
                self.blocking_callbacks(&ask, &mut notified, effects);
                self.waiters.get_mut(id).expect("still queued").notified = notified;
            }
            if blockers != old_blockers {
                if ask.kind == LockKind::Posix {
                    ctx.graph.lock().set(ask.owner, id, blockers.clone());
                }
                self.waiters.get_mut(id).expect("still queued").blockers = blockers;
                // Only later waiters look at this one's blockers.
                dirty.add(&self.waiters, wrange, ticket);
            }
        }
    }

    /// Unlocks `range` of `owner` (POSIX, OFD, flock). Unlocking bytes not
    /// held is not an error. O(log n + k).
    pub fn release(&mut self, owner: Owner, kind: LockKind, range: Range, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
        let mut changed = Vec::new();
        self.granted.set_owner_range(owner, kind, None, range, &mut changed);
        self.settle(changed, ctx, effects);
    }

    /// Releases every lock of `owner` here, as closing a file does.
    /// O(k log n) for its k locks.
    pub fn release_owner(&mut self, owner: Owner, ctx: &Ctx<'_>) -> Response {
        let mut changed = Vec::new();
        let mut effects = Vec::new();
        self.granted.release_owner(owner, &mut changed);
        self.settle(changed, ctx, &mut effects);
        Response { outcome: Outcome::Done, effects }
    }

    /// Withdraws a queued request; the waiters behind it may go. O(log n +
    /// k). Cancelling a wait that was already granted or never existed does
    /// nothing.
    pub fn cancel(&mut self, wait: u64, ctx: &Ctx<'_>) -> Response {
        let mut effects = Vec::new();
        if let Some((w, range)) = self.waiters.remove(wait) {
            if w.kind == LockKind::Posix {
                ctx.graph.lock().remove(w.owner, wait);
            }
            self.settle(vec![range], ctx, &mut effects);
        }
        Response { outcome: Outcome::Done, effects }
    }

    /// The DLM lock `handle` if `owner` holds it here.
    fn dlm_lock(&self, handle: LockHandle, owner: Owner) -> Option<NodeId> {
        self.granted.by_handle(handle).filter(|&n| self.granted.held(n).owner == owner)
    }

    /// Stores `lvb` if the lock leaving `mode` may write it (PW, EX).
    fn write_lvb(&mut self, mode: Mode, lvb: Option<&[u8]>) {
        if let (Some(v), Mode::PW | Mode::EX) = (lvb, mode) {
            self.lvb = Some(v.to_vec());
        }
    }

    /// Releases a DLM lock (withdrawing its pending conversion), writing
    /// the value block if it was held PW or EX. O(log n + k).
    pub fn dlm_unlock(
        &mut self,
        handle: LockHandle,
        owner: Owner,
        lvb: Option<&[u8]>,
        ctx: &Ctx<'_>,
    ) -> Option<Response> {
        let node = self.dlm_lock(handle, owner)?;
        let mut effects = Vec::new();
        if let Some(wait) = self.waiters.conversion_of(handle) {
            self.waiters.remove(wait);
        }
        let (held, range) = self.granted.remove(node);
        self.write_lvb(held.mode, lvb);
        self.settle(vec![range], ctx, &mut effects);
        Some(Response { outcome: Outcome::Done, effects })
    }

    /// Converts a DLM lock to `mode`, up or down. A down-conversion is
    /// granted at once (and writes the value block when leaving PW/EX); an
    /// up-conversion waits behind held conflicts and earlier conversions,
    /// ahead of every new request. O(log n + k).
    pub fn dlm_convert(
        &mut self,
        handle: LockHandle,
        owner: Owner,
        mode: Mode,
        wait: bool,
        lvb: Option<&[u8]>,
        ctx: &Ctx<'_>,
    ) -> Option<Response> {
        let node = self.dlm_lock(handle, owner)?;
        if self.waiters.conversion_of(handle).is_some() {
            // One conversion at a time per lock, as in the DLM.
            return Some(Response::new(Outcome::WouldBlock));
        }
        let (old, range) = (self.granted.held(node).mode, self.granted.range(node));
        if weakens(old, mode) {
            self.write_lvb(old, lvb);
        }
        let ask = Ask { owner, kind: LockKind::Dlm, mode, range, convert: Some(handle) };
        let mut effects = Vec::new();
        // A down-conversion is compatible with everything the old mode was,
        // so it can be granted at once; it must never queue, or it could
        // wait behind the very conversion it is making room for.
        let down = Mode::ALL.iter().all(|&m| !old.compatible(m) || mode.compatible(m));
        let outcome = if down {
            Outcome::Granted(self.grant(&ask, ctx, &mut effects))
        } else {
            self.decide(ask, wait, ctx, &mut effects)
        };
        Some(Response { outcome, effects })
    }
}
