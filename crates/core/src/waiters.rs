//! The queue of blocked requests on one resource.
//!
//! Waiters are kept in interval trees by range, so that a release of
//! `[0, 9]` finds only the waiters that overlap `[0, 9]` (O(log n + k))
//! instead of waking every waiter into a recheck. Order among waiters is
//! their ticket: DLM conversions come before new requests (as in the VMS
//! DLM), otherwise first come, first served.
//!
//! # Heads and followers
//!
//! Seed 002's queue is many owners wanting the same bytes. Re-examining
//! all of them at every hand-over, or keeping for each the list of every
//! owner ahead of it, costs O(k) per waiter and O(k²) per hand-over. So a
//! waiter that stands directly behind a *dominating* earlier waiter (one
//! whose range covers its own and whose mode conflicts with everything its
//! mode conflicts with) is a **follower** of it, its **leader**: the
//! follower cannot go before its leader does, and everything it waits for
//! its leader waits for too, so it needs neither re-examination nor a list
//! of its own. Like the tree of blocked requests in Linux's `fs/locks.c`,
//! a hand-over then touches the head of the queue and the one waiter that
//! followed it. The other waiters are **heads**, kept in their own tree and
//! re-examined when the bytes they cover change. See `Resource` for the
//! conditions under which a waiter may follow.

use smallvec::SmallVec;

use crate::Map;

use std::collections::BTreeMap;

use crate::tree::{Forest, NodeId, Root};
use crate::types::{LockHandle, LockKind, Owner, WaitId, WaitingLock};
use crate::{Mode, Range};

/// Conversions are served before new requests: their tickets sort first.
pub(crate) const CONVERT_CLASS: u64 = 0;
pub(crate) const NEW_CLASS: u64 = 1 << 63;

/// How many earlier waiters a search walks in queue order before it asks
/// the interval tree instead: queue order finds the nearest conflicting
/// waiter at once in a queue of contenders for the same bytes, the tree in
/// a queue of waiters on unrelated bytes.
const SCAN_BUDGET: usize = 32;

#[derive(Debug)]
pub(crate) struct Waiter {
    pub id: WaitId,
    pub owner: Owner,
    pub kind: LockKind,
    pub mode: Mode,
    /// Position in the queue: lower is earlier.
    pub ticket: u64,
    /// The DLM lock being converted, if this is a conversion.
    pub convert: Option<LockHandle>,
    /// A head: the owners it waits for now (holders of conflicting locks
    /// and owners of earlier conflicting waiters it does not overtake),
    /// sorted, without repeats, kept current on every change to the bytes
    /// it covers. A follower: its leader's owner, which reaches all of
    /// those through the waits-for graph.
    pub blockers: Vec<Owner>,
    /// A head: whether it overtakes some earlier conflicting waiter (one
    /// that waits for its owner). Such a head may not lead: its followers
    /// would wait for the waiter it overtook, and it does not.
    pub overtakes: bool,
    /// The earlier waiter this one follows, if it is a follower.
    pub leader: Option<WaitId>,
    /// The waiters following this one.
    pub followers: SmallVec<[WaitId; 1]>,
    /// DLM: the granted locks already sent a blocking callback for this
    /// waiter, so that each gets one, once.
    pub notified: Vec<LockHandle>,
}

/// The queue. It allocates at the first wait, since most resources never
/// have a waiter, and keeps its allocation when it empties: two owners
/// passing a lock back and forth would otherwise allocate it at every
/// hand-over. It goes with the resource when that is reclaimed.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    inner: Option<Box<Queue>>,
}

#[derive(Debug, Default)]
struct Queue {
    forest: Forest<Waiter>,
    heads: Root,
    followers: Root,
    by_id: Map<WaitId, NodeId>,
    /// Queue order.
    by_ticket: BTreeMap<u64, NodeId>,
    /// Each owner's waiters here.
    by_owner: Map<Owner, SmallVec<[WaitId; 1]>>,
    /// DLM lock handle -> its queued conversion.
    conversions: Map<LockHandle, WaitId>,
    next_ticket: u64,
}

impl Queue {
    fn range(&self, node: NodeId) -> Range {
        let (s, e) = self.forest.interval(node);
        Range::new(s, e).expect("stored ranges are valid")
    }

    /// The waiters overlapping `range` with a ticket below `ticket`, by
    /// walking the queue backwards if that ends within the budget, else
    /// from the trees. O(min(budget, log n + k)) for k overlapping.
    fn earlier_overlapping(&self, range: Range, ticket: u64) -> SmallVec<[NodeId; 4]> {
        let mut out = SmallVec::new();
        let mut walk = self.by_ticket.range(..ticket).rev();
        for _ in 0..SCAN_BUDGET {
            match walk.next() {
                Some((_, &node)) => {
                    if self.range(node).overlaps(range) {
                        out.push(node);
                    }
                }
                None => return out,
            }
        }
        self.earlier_in_trees(range, ticket)
    }

    /// The same, from the interval trees. O(log n + k).
    fn earlier_in_trees(&self, range: Range, ticket: u64) -> SmallVec<[NodeId; 4]> {
        let mut out = SmallVec::new();
        for root in [self.heads, self.followers] {
            let _ = self.forest.overlaps(root, range.start(), range.end(), &mut |node, w: &Waiter| {
                if w.ticket < ticket {
                    out.push(node);
                }
                std::ops::ControlFlow::<()>::Continue(())
            });
        }
        out
    }
}

impl WaitQueue {
    pub fn is_empty(&self) -> bool {
        self.inner.as_ref().is_none_or(|q| q.forest.is_empty())
    }

    pub fn len(&self) -> usize {
        self.inner.as_ref().map_or(0, |q| q.forest.len())
    }

    pub fn heap_bytes(&self) -> usize {
        self.inner.as_ref().map_or(0, |q| {
            std::mem::size_of::<Queue>()
                + q.forest.capacity_bytes()
                + q.by_id.capacity() * (std::mem::size_of::<(WaitId, NodeId)>() + 1)
                + q.by_ticket.len() * std::mem::size_of::<(u64, NodeId)>() * 2
                + q.by_owner.capacity() * (std::mem::size_of::<(Owner, SmallVec<[WaitId; 1]>)>() + 1)
        })
    }

    /// Every waiter, in queue order (conversions first). O(n).
    pub fn all(&self) -> Vec<WaitingLock> {
        let Some(q) = &self.inner else { return Vec::new() };
        q.by_ticket
            .values()
            .map(|&node| {
                let w = q.forest.get(node);
                WaitingLock { id: w.id, owner: w.owner, range: q.range(node), mode: w.mode }
            })
            .collect()
    }

    /// The next position in the queue: later than every queued waiter.
    pub fn ticket(&mut self, class: u64) -> u64 {
        match &mut self.inner {
            Some(q) => {
                q.next_ticket += 1;
                class | q.next_ticket
            }
            // The first waiter will take ticket 1 (see `push`).
            None => class | 1,
        }
    }

    /// Parks a waiter, as a follower of `waiter.leader` if it names one.
    /// O(log n).
    pub fn push(&mut self, waiter: Waiter, range: Range) {
        let q = self.inner.get_or_insert_with(|| Box::new(Queue { next_ticket: 1, ..Queue::default() }));
        let (id, ticket, owner, leader) = (waiter.id, waiter.ticket, waiter.owner, waiter.leader);
        if let Some(h) = waiter.convert {
            q.conversions.insert(h, id);
        }
        let root = if leader.is_some() { &mut q.followers } else { &mut q.heads };
        let node = q.forest.insert(root, range.start(), range.end(), waiter);
        q.by_id.insert(id, node);
        q.by_ticket.insert(ticket, node);
        q.by_owner.entry(owner).or_default().push(id);
        if let Some(l) = leader {
            let &ln = q.by_id.get(&l).expect("a leader is queued");
            q.forest.get_mut(ln).followers.push(id);
        }
    }

    /// Removes a waiter; its followers (returned in it) are left naming it
    /// as their leader until the caller gives them another. O(log n).
    pub fn remove(&mut self, id: WaitId) -> Option<(Waiter, Range)> {
        let q = self.inner.as_mut()?;
        let node = q.by_id.remove(&id)?;
        let range = q.range(node);
        let root = if q.forest.get(node).leader.is_some() { &mut q.followers } else { &mut q.heads };
        let w = q.forest.remove(root, node);
        q.by_ticket.remove(&w.ticket);
        if let Some(mine) = q.by_owner.get_mut(&w.owner) {
            mine.retain(|x| *x != id);
            if mine.is_empty() {
                q.by_owner.remove(&w.owner);
            }
        }
        if let Some(l) = w.leader
            && let Some(&ln) = q.by_id.get(&l)
        {
            q.forest.get_mut(ln).followers.retain(|x| *x != id);
        }
        if let Some(h) = w.convert {
            q.conversions.remove(&h);
        }
        Some((w, range))
    }

    /// Makes `id` follow `leader`, or a head if `None`, with `blockers` as
    /// its list. O(log n).
    pub fn set_leader(&mut self, id: WaitId, leader: Option<WaitId>, blockers: Vec<Owner>) {
        let q = self.inner.as_mut().expect("a queued waiter");
        let node = q.by_id[&id];
        let old = q.forest.get(node).leader;
        if let Some(l) = old
            && let Some(&ln) = q.by_id.get(&l)
        {
            q.forest.get_mut(ln).followers.retain(|x| *x != id);
        }
        if let Some(l) = leader {
            let ln = q.by_id[&l];
            q.forest.get_mut(ln).followers.push(id);
        }
        match (old.is_some(), leader.is_some()) {
            (true, false) => q.forest.transfer(&mut q.followers, &mut q.heads, node),
            (false, true) => q.forest.transfer(&mut q.heads, &mut q.followers, node),
            _ => {}
        }
        let w = q.forest.get_mut(node);
        w.leader = leader;
        w.blockers = blockers;
    }

    /// The queued conversion of DLM lock `handle`, if any. O(1).
    pub fn conversion_of(&self, handle: LockHandle) -> Option<WaitId> {
        self.inner.as_ref()?.conversions.get(&handle).copied()
    }

    pub fn get(&self, id: WaitId) -> Option<(&Waiter, Range)> {
        let q = self.inner.as_ref()?;
        let &node = q.by_id.get(&id)?;
        Some((q.forest.get(node), q.range(node)))
    }

    pub fn get_mut(&mut self, id: WaitId) -> Option<&mut Waiter> {
        let q = self.inner.as_mut()?;
        let &node = q.by_id.get(&id)?;
        Some(q.forest.get_mut(node))
    }

    /// The waits of `owner` here. O(1).
    pub fn of_owner(&self, owner: Owner) -> &[WaitId] {
        self.inner.as_ref().and_then(|q| q.by_owner.get(&owner)).map_or(&[], |v| v.as_slice())
    }

    /// Calls `f` on each head overlapping `range`. O(log n + k).
    pub fn each_head_overlapping(&self, range: Range, mut f: impl FnMut(&Waiter)) {
        let Some(q) = &self.inner else { return };
        let _ = q.forest.overlaps(q.heads, range.start(), range.end(), &mut |_, w: &Waiter| {
            f(w);
            std::ops::ControlFlow::<()>::Continue(())
        });
    }

    /// Calls `f` on each waiter overlapping `range` until it returns true;
    /// returns whether it did. O(log n + k).
    pub fn any_overlapping(&self, range: Range, mut f: impl FnMut(&Waiter) -> bool) -> bool {
        let Some(q) = &self.inner else { return false };
        [q.heads, q.followers].into_iter().any(|root| {
            q.forest
                .overlaps(root, range.start(), range.end(), &mut |_, w: &Waiter| {
                    if f(w) { std::ops::ControlFlow::Break(()) } else { std::ops::ControlFlow::Continue(()) }
                })
                .is_break()
        })
    }

    /// The waiters ahead of position `ticket` that overlap `range`, each
    /// with its range. O(log n + k), or less when they are near.
    pub fn earlier_overlapping(&self, range: Range, ticket: u64) -> Vec<(&Waiter, Range)> {
        let Some(q) = &self.inner else { return Vec::new() };
        q.earlier_overlapping(range, ticket).into_iter().map(|n| (q.forest.get(n), q.range(n))).collect()
    }

    /// The latest waiter ahead of position `ticket` that overlaps `range`
    /// and satisfies `pred`. In a queue of contenders for the same bytes
    /// it is the one just ahead: O(log n); else O(log n + k).
    pub fn nearest_earlier(
        &self,
        range: Range,
        ticket: u64,
        mut pred: impl FnMut(&Waiter) -> bool,
    ) -> Option<(&Waiter, Range)> {
        let q = self.inner.as_ref()?;
        let mut walk = q.by_ticket.range(..ticket).rev();
        for _ in 0..SCAN_BUDGET {
            let (_, &node) = walk.next()?;
            let w = q.forest.get(node);
            if q.range(node).overlaps(range) && pred(w) {
                return Some((w, q.range(node)));
            }
        }
        q.earlier_in_trees(range, ticket)
            .into_iter()
            .filter(|&n| pred(q.forest.get(n)))
            .max_by_key(|&n| q.forest.get(n).ticket)
            .map(|n| (q.forest.get(n), q.range(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: WaitId, ticket: u64, owner: Owner) -> Waiter {
        Waiter {
            id,
            owner,
            kind: LockKind::Ofd,
            mode: Mode::EX,
            ticket,
            convert: None,
            blockers: Vec::new(),
            overtakes: false,
            leader: None,
            followers: SmallVec::new(),
            notified: Vec::new(),
        }
    }

    /// The searches agree with a scan of every waiter, both when the walk
    /// in queue order ends within its budget and when the trees answer.
    #[test]
    fn earlier_searches_match_a_full_scan() {
        let mut q = WaitQueue::default();
        let mut all: Vec<(WaitId, u64, Range)> = Vec::new();
        let mut seed = 0x2545_F491u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for id in 0..300u64 {
            let ticket = q.ticket(NEW_CLASS);
            let start = next() % 200;
            let range = Range::new(start, start + next() % 20).unwrap();
            // A third follow the waiter before them: both trees are searched.
            let mut w = waiter(id, ticket, next() % 7);
            w.leader = (id % 3 == 1).then(|| id - 1);
            q.push(w, range);
            all.push((id, ticket, range));
        }
        for &(_, ticket, _) in all.iter().step_by(7) {
            let start = next() % 200;
            let probe = Range::new(start, start + next() % 30).unwrap();
            let mut want: Vec<WaitId> =
                all.iter().filter(|(_, t, r)| *t < ticket && r.overlaps(probe)).map(|(id, _, _)| *id).collect();
            let mut got: Vec<WaitId> = q.earlier_overlapping(probe, ticket).iter().map(|(w, _)| w.id).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want);
            let owner = next() % 7;
            let nearest = all
                .iter()
                .filter(|(id, t, r)| *t < ticket && r.overlaps(probe) && q.get(*id).unwrap().0.owner == owner)
                .max_by_key(|(_, t, _)| *t)
                .map(|(id, _, _)| *id);
            assert_eq!(q.nearest_earlier(probe, ticket, |w| w.owner == owner).map(|(w, _)| w.id), nearest);
        }
    }
}
