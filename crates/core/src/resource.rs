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
//!
//! Waiters are heads or followers (see [`crate::waiters`]). A waiter W may
//! follow L when: L is the latest earlier waiter that W conflicts with; L
//! dominates W (L's range covers W's, and L's mode conflicts with every
//! mode W's does); L overtakes no one (a follower never does, a head keeps
//! a flag); and, for the owner-merging kinds, W's owner holds nothing here
//! and has no earlier request queued here, so that no waiter can wait for
//! W's owner and W has no one to overtake. Then every holder and earlier
//! waiter W waits for, L waits for too, so W is certainly blocked and its
//! one waits-for edge, to L's owner, reaches everything its full list
//! would. Each condition is re-checked when it can change: when L leaves
//! the queue, when L starts overtaking, and when W's owner is granted a
//! lock here; a waiter that fails one becomes a head.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::ControlFlow;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::deadlock::WaitGraph;
use crate::granted::{Exempt, Granted, weakens};
use crate::tree::NodeId;
use crate::types::{
    Conflict, Effect, Grant, HeldLock, LockHandle, LockKind, LockRequest, Outcome, Owner, Response, WaitId, WaitingLock,
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

/// Heads to re-examine, earliest ticket first, each at most once at a time.
#[derive(Default)]
struct Dirty {
    heap: BinaryHeap<Reverse<(u64, WaitId)>>,
    listed: Set<WaitId>,
}

impl Dirty {
    /// Every head overlapping `range` whose ticket is after `after`.
    fn add(&mut self, waiters: &WaitQueue, range: Range, after: u64) {
        waiters.each_head_overlapping(range, |w| {
            if w.ticket > after {
                self.push(w.ticket, w.id);
            }
        });
    }

    fn push(&mut self, ticket: u64, id: WaitId) {
        if self.listed.insert(id) {
            self.heap.push(Reverse((ticket, id)));
        }
    }

    /// Every head overlapping any of `ranges`.
    fn of(waiters: &WaitQueue, ranges: &[Range]) -> Dirty {
        let mut dirty = Dirty::default();
        for &r in ranges {
            dirty.add(waiters, r, 0);
        }
        dirty
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

    /// Whether `owner` holds any lock here. O(1).
    pub fn owner_holds(&self, owner: Owner) -> bool {
        self.granted.owner_holds(owner)
    }

    /// The mode of the owner's flock lock here, if any. O(1).
    pub fn owner_whole_mode(&self, owner: Owner) -> Option<Mode> {
        self.granted.owner_whole_mode(owner)
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

    pub fn waiting(&self) -> Vec<WaitingLock> {
        self.waiters.all()
    }

    /// How many locks `owner` holds here (POSIX, OFD, flock). O(1).
    pub fn owner_lock_count(&self, owner: Owner) -> usize {
        self.granted.owner_lock_count(owner)
    }

    /// `F_GETLK`: the held lock that a `mode` lock on `range` by `owner`
    /// would conflict with and that Linux reports (the first in its list:
    /// see `Granted::kernel_first_conflict`): O(log n + k) for the k
    /// conflicts. DLM: any one, O(log n). `NL` (`F_UNLCK`) on a POSIX or
    /// OFD resource asks for the owner's own first lock on `range`
    /// instead: O(log n + k) for the owner's k locks there.
    pub fn test(&self, owner: Owner, kind: LockKind, mode: Mode, range: Range) -> Option<Conflict> {
        let ask = Ask { owner, kind, mode, range, convert: None };
        // (`LockSpace::test` lets `NL` through for POSIX and OFD only.)
        let found = match (kind.owner_merges(), mode) {
            (true, Mode::NL) => self.granted.owner_first_overlap(owner, range),
            (true, _) => self.granted.kernel_first_conflict(mode, range, ask.exempt()),
            (false, _) => self.granted.first_conflict(mode, range, ask.exempt()),
        };
        found.map(|id| self.granted.conflict(id))
    }

    /// A new lock request. O(log n + k); a blocking POSIX request that must
    /// wait also searches the waits-for graph.
    pub fn lock(&mut self, req: &LockRequest<'_>, ctx: &Ctx<'_>) -> Response {
        let mut effects = Vec::new();
        let ask = Ask { owner: req.owner, kind: req.kind, mode: req.mode, range: req.range, convert: None };
        if req.kind == LockKind::Flock {
            match self.owner_whole_mode(req.owner) {
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
        let leader = self.leader_for(&ask, ticket);
        let (blockers, overtakes) = match leader {
            Some((_, owner)) => (vec![owner], false),
            None => self.blockers(&ask, ticket, ctx),
        };
        if leader.is_none() && blockers.is_empty() && !self.behind_own(&ask, ticket) {
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
            overtakes,
            leader: leader.map(|(l, _)| l),
            followers: SmallVec::new(),
            notified,
        };
        self.waiters.push(waiter, ask.range);
        Outcome::Queued(id)
    }

    /// The waiter `ask` (at queue position `ticket`) may follow, and its
    /// owner, if the conditions in the module docs hold. O(log n) in a
    /// queue of contenders for the same bytes, else O(log n + k).
    fn leader_for(&self, ask: &Ask, ticket: u64) -> Option<(WaitId, Owner)> {
        if ask.kind.owner_merges()
            && (self.granted.owner_holds(ask.owner)
                || self
                    .waiters
                    .of_owner(ask.owner)
                    .iter()
                    .any(|&e| self.waiters.get(e).is_some_and(|(e, _)| e.ticket < ticket)))
        {
            return None;
        }
        let (l, lrange) = self.waiters.nearest_earlier(ask.range, ticket, |w| ask.conflicts_with_waiter(w))?;
        let dominates =
            lrange.contains(ask.range) && Mode::ALL.iter().all(|&m| ask.mode.compatible(m) || !l.mode.compatible(m));
        (dominates && (l.leader.is_some() || !l.overtakes)).then_some((l.id, l.owner))
    }

    /// Whether queued waiter `w` (on `wrange`) waits for `owner` directly:
    /// a lock of `owner` here blocks it, or an earlier queued request of
    /// `owner` that it does not overtake. A head's list says so; a
    /// follower's list is its leader's owner only, so it is worked out:
    /// O(log n + k) for k conflicting holders.
    fn waits_directly(&self, w: &Waiter, wrange: Range, owner: Owner) -> bool {
        if w.leader.is_none() {
            return w.blockers.binary_search(&owner).is_ok();
        }
        // A follower overtakes no one (its owner holds nothing here and
        // queued nothing before it), so every earlier conflicting request
        // of `owner` counts.
        let wask = Ask { owner: w.owner, kind: w.kind, mode: w.mode, range: wrange, convert: w.convert };
        let held = self.granted.conflicts(w.mode, wrange, wask.exempt(), |_, h| {
            if h.owner == owner { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        held.is_break()
            || self.waiters.of_owner(owner).iter().any(|&e| {
                self.waiters.get(e).is_some_and(|(e, erange)| {
                    e.ticket < w.ticket && erange.overlaps(wrange) && wask.conflicts_with_waiter(e)
                })
            })
    }

    /// The owners `ask` (with queue position `ticket`) would wait for now:
    /// holders of conflicting locks, and owners of earlier conflicting
    /// waiters that do not themselves wait for `ask`'s owner. Sorted,
    /// without repeats; and whether it overtakes any such waiter.
    /// O(log n + k).
    fn blockers(&self, ask: &Ask, ticket: u64, ctx: &Ctx<'_>) -> (Vec<Owner>, bool) {
        let mut out = Vec::new();
        let _ = self.granted.conflicts(ask.mode, ask.range, ask.exempt(), |_, h| {
            out.push(h.owner);
            ControlFlow::<()>::Continue(())
        });
        let mut overtakes = false;
        let earlier: Vec<(Owner, LockKind, bool)> = self
            .waiters
            .earlier_overlapping(ask.range, ticket)
            .into_iter()
            .filter(|(w, _)| ask.conflicts_with_waiter(w))
            .map(|(w, wrange)| (w.owner, w.kind, ask.kind.owner_merges() && self.waits_directly(w, wrange, ask.owner)))
            .collect();
        if !earlier.is_empty() {
            // Who waits for the requester through other POSIX owners: one
            // search behind it, made only when it holds a lock here (the
            // upgrade case this rule exists for); a requester that holds
            // nothing here is waited for only through its own queue
            // position, which the direct check covers.
            let holds_here = self.granted.owner_holds(ask.owner);
            let behind = (ask.kind == LockKind::Posix && holds_here).then(|| ctx.graph.lock().waiting_for(ask.owner));
            for (owner, kind, waits_for_us) in earlier {
                let waits_for_us = waits_for_us
                    || (ask.kind.owner_merges()
                        && kind == LockKind::Posix
                        && behind.as_ref().is_some_and(|b| b.contains(&owner)));
                if waits_for_us {
                    overtakes = true;
                } else {
                    out.push(owner);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        (out, overtakes)
    }

    /// Whether an earlier queued request of the same owner (POSIX, OFD,
    /// flock) overlaps `ask` with another mode: then the order of the two
    /// decides the owner's final locks, so they are granted in queue order.
    /// This is an ordering, not a wait for another owner, so it adds no
    /// waits-for edge. O(k) in the owner's own waits here.
    fn behind_own(&self, ask: &Ask, ticket: u64) -> bool {
        ask.kind.owner_merges()
            && self.waiters.of_owner(ask.owner).iter().any(|&e| {
                self.waiters
                    .get(e)
                    .is_some_and(|(w, wrange)| w.ticket < ticket && w.mode != ask.mode && wrange.overlaps(ask.range))
            })
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
        let mut dirty = Dirty::of(&self.waiters, &changed);
        self.after_install(ask, ctx, &mut dirty);
        self.settle(dirty, ctx, effects);
        grant
    }

    /// After `ask`'s owner got a lock here: its followers no longer meet
    /// the conditions (waiters may now wait for their owner), and its heads
    /// may now overtake waiters.
    fn after_install(&mut self, ask: &Ask, ctx: &Ctx<'_>, dirty: &mut Dirty) {
        if ask.kind.owner_merges() {
            self.owner_changed(ask.owner, dirty);
            let followers: SmallVec<[WaitId; 2]> = (self.waiters.of_owner(ask.owner).iter().copied())
                .filter(|&w| self.waiters.get(w).is_some_and(|(w, _)| w.leader.is_some()))
                .collect();
            self.reclassify(&followers, ctx, dirty);
        }
    }

    /// After `owner`'s locks or queued requests here changed: whether a
    /// follower waits for `owner` directly changed with them, and with it
    /// which waiters `owner`'s heads overtake, so they are looked at again.
    /// (A head's own list changes only with the bytes it covers, which
    /// settle follows.) O(k) in the owner's own waits here.
    fn owner_changed(&self, owner: Owner, dirty: &mut Dirty) {
        for &id in self.waiters.of_owner(owner) {
            if let Some((w, _)) = self.waiters.get(id)
                && w.leader.is_none()
            {
                dirty.push(w.ticket, id);
            }
        }
    }

    /// Gives each waiter in `ids` a leader again, or makes it a head and
    /// puts it on `dirty`. O(log n) each in a queue of contenders.
    fn reclassify(&mut self, ids: &[WaitId], ctx: &Ctx<'_>, dirty: &mut Dirty) {
        for &id in ids {
            let Some((w, wrange)) = self.waiters.get(id) else { continue };
            let ask = Ask { owner: w.owner, kind: w.kind, mode: w.mode, range: wrange, convert: w.convert };
            let ticket = w.ticket;
            match self.leader_for(&ask, ticket) {
                Some((leader, owner)) => {
                    if ask.kind == LockKind::Posix {
                        ctx.graph.lock().set(ask.owner, id, vec![owner]);
                    }
                    self.waiters.set_leader(id, Some(leader), vec![owner]);
                }
                None => {
                    // Settle works out what it waits for.
                    let blockers = w.blockers.clone();
                    self.waiters.set_leader(id, None, blockers);
                    dirty.push(ticket, id);
                }
            }
        }
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

    /// Grants every head on `dirty` that can now go and brings the
    /// blockers of the others up to date.
    ///
    /// A head's blockers depend only on the held locks it overlaps and the
    /// earlier waiters it overlaps, so heads are re-examined in queue order
    /// from a heap; a grant puts the heads overlapping it back on the heap
    /// (and the grantee's followers, now heads), a head whose blockers
    /// changed the later ones. This reaches the same fixed point as
    /// re-examining the whole queue in order, while touching only heads on
    /// changed bytes: O(h (log n + k)) for h such heads. Followers wait for
    /// their leaders and are not looked at: in a queue of contenders for
    /// one byte a hand-over is O(log n).
    fn settle(&mut self, mut dirty: Dirty, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
        while let Some(id) = dirty.pop() {
            let Some((w, wrange)) = self.waiters.get(id) else { continue };
            if w.leader.is_some() {
                continue;
            }
            let ask = Ask { owner: w.owner, kind: w.kind, mode: w.mode, range: wrange, convert: w.convert };
            let (ticket, old_blockers, old_overtakes) = (w.ticket, w.blockers.clone(), w.overtakes);
            let (blockers, overtakes) = self.blockers(&ask, ticket, ctx);
            if blockers.is_empty() && !self.behind_own(&ask, ticket) {
                let (w, _) = self.waiters.remove(id).expect("still queued");
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
                self.reclassify(&w.followers, ctx, &mut dirty);
                self.after_install(&ask, ctx, &mut dirty);
                continue;
            }
            if ask.kind == LockKind::Dlm {
                // A grant ahead of this waiter may hold bytes it wants now.
                let mut notified = std::mem::take(&mut self.waiters.get_mut(id).expect("still queued").notified);
                self.blocking_callbacks(&ask, &mut notified, effects);
                self.waiters.get_mut(id).expect("still queued").notified = notified;
            }
            if overtakes && !old_overtakes {
                // It may lead no longer.
                let followers = self.waiters.get(id).expect("still queued").0.followers.clone();
                self.reclassify(&followers, ctx, &mut dirty);
            }
            let w = self.waiters.get_mut(id).expect("still queued");
            w.overtakes = overtakes;
            if blockers != old_blockers {
                if ask.kind == LockKind::Posix {
                    ctx.graph.lock().set(ask.owner, id, blockers.clone());
                }
                w.blockers = blockers;
                // Only later waiters look at this one's blockers.
                dirty.add(&self.waiters, wrange, ticket);
            }
        }
    }

    /// Settles after the bytes in `changed` got weaker.
    fn settle_ranges(&mut self, changed: &[Range], ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
        if !self.waiters.is_empty() {
            self.settle(Dirty::of(&self.waiters, changed), ctx, effects);
        }
    }

    /// Settles after `owner`'s locks on `changed` got weaker.
    fn settle_owner(&mut self, owner: Owner, changed: &[Range], ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
        if !self.waiters.is_empty() {
            let mut dirty = Dirty::of(&self.waiters, changed);
            self.owner_changed(owner, &mut dirty);
            self.settle(dirty, ctx, effects);
        }
    }

    /// Takes waiter `id` out of the queue and settles the bytes it wanted;
    /// whether it was queued. O(log n) plus the settling.
    fn withdraw(&mut self, id: WaitId, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) -> bool {
        let Some((w, range)) = self.waiters.remove(id) else { return false };
        if w.kind == LockKind::Posix {
            ctx.graph.lock().remove(w.owner, id);
        }
        let mut dirty = Dirty::of(&self.waiters, &[range]);
        if w.kind.owner_merges() {
            self.owner_changed(w.owner, &mut dirty);
        }
        self.reclassify(&w.followers, ctx, &mut dirty);
        self.settle(dirty, ctx, effects);
        true
    }

    /// Unlocks `range` of `owner` (POSIX, OFD, flock). Unlocking bytes not
    /// held is not an error. O(log n + k).
    pub fn release(&mut self, owner: Owner, kind: LockKind, range: Range, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
        let mut changed = Vec::new();
        self.granted.set_owner_range(owner, kind, None, range, &mut changed);
        self.settle_owner(owner, &changed, ctx, effects);
    }

    /// Releases every lock of `owner` here, as closing a file does.
    /// O(k log n) for its k locks.
    pub fn release_owner(&mut self, owner: Owner, ctx: &Ctx<'_>) -> Response {
        let mut changed = Vec::new();
        let mut effects = Vec::new();
        self.granted.release_owner(owner, &mut changed);
        self.settle_owner(owner, &changed, ctx, &mut effects);
        Response { outcome: Outcome::Done, effects }
    }

    /// Withdraws a queued request; the waiters behind it may go. O(log n +
    /// k). Cancelling a wait that was already granted or never existed
    /// changes nothing and answers `NotQueued`.
    pub fn cancel(&mut self, wait: u64, ctx: &Ctx<'_>) -> Response {
        let mut effects = Vec::new();
        let outcome = if self.withdraw(wait, ctx, &mut effects) { Outcome::Done } else { Outcome::NotQueued };
        Response { outcome, effects }
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
            let _ = self.withdraw(wait, ctx, &mut effects);
        }
        let (held, range) = self.granted.remove(node);
        self.write_lvb(held.mode, lvb);
        self.settle_ranges(&[range], ctx, &mut effects);
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
