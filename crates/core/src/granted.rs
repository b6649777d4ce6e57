//! The granted locks of one resource.
//!
//! Locks are indexed twice, and every operation below touches only what it
//! must:
//!
//! - one interval tree per [`Mode`], so that a conflict query for mode `m`
//!   searches only the trees of modes incompatible with `m`: a read request
//!   never walks the other readers, which is what keeps the `same-range`
//!   benchmark (N readers on one range) linear instead of quadratic;
//! - one ordered map per owner (POSIX, OFD, flock), where that owner's
//!   locks are disjoint and never adjacent with the same mode, so that
//!   merge and split find the owner's neighbours of a range in
//!   O(log n + k) and never rescan the resource (seed 000's failure).
//!
//! DLM locks are not merged; a DLM handle carries its node id, so it is
//! found without a map.

use crate::Map;
use std::ops::ControlFlow;

use crate::owner_locks::OwnerLocks;
use crate::tree::{Forest, NodeId, Root};
use crate::types::{Conflict, HeldLock, LockHandle, LockKind, Owner};
use crate::{Mode, Range};

/// One granted lock; its range lives in the tree node.
#[derive(Debug)]
pub(crate) struct Held {
    pub owner: Owner,
    pub kind: LockKind,
    pub mode: Mode,
    /// The DLM handle: a 32-bit tag from the lock space over the node id;
    /// 0 for the owner-merging kinds.
    pub handle: LockHandle,
}

/// Which granted locks a request does not conflict with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Exempt {
    /// The requester's own locks (POSIX, OFD, flock).
    Owner(Owner),
    /// The DLM lock being converted.
    Lock(LockHandle),
    /// Nothing: a new DLM lock conflicts even with its owner's others.
    Nothing,
}

impl Exempt {
    fn covers(self, held: &Held) -> bool {
        match self {
            Exempt::Owner(o) => held.owner == o,
            Exempt::Lock(h) => held.handle == h,
            Exempt::Nothing => false,
        }
    }
}

/// Whether replacing `old` by `new` on some bytes can let a waiter in: some
/// mode is compatible with `new` but was not with `old`.
pub(crate) fn weakens(old: Mode, new: Mode) -> bool {
    Mode::ALL.iter().any(|&m| new.compatible(m) && !old.compatible(m))
}

#[derive(Debug, Default)]
pub(crate) struct Granted {
    forest: Forest<Held>,
    roots: [Root; 6],
    /// Boxed: DLM resources never use it, and most files have few owners.
    by_owner: Option<Box<Map<Owner, OwnerEntry>>>,
    /// The arrival number of the next owner to go from no locks to some.
    next_arrival: u64,
}

/// An owner's locks, and when the owner arrived: Linux keeps a file's
/// POSIX and OFD locks in one list where an owner's locks stand together,
/// sorted by start, and an owner with no locks joins at the end. `F_GETLK`
/// reports the first conflicting lock in that list, so the arrival orders
/// owners as the list does.
#[derive(Debug)]
struct OwnerEntry {
    arrival: u64,
    locks: OwnerLocks,
}

impl Granted {
    pub fn is_empty(&self) -> bool {
        self.forest.is_empty()
    }

    pub fn len(&self) -> usize {
        self.forest.len()
    }

    /// Heap bytes held (approximate: the arena, and the owner and handle
    /// maps' entries).
    pub fn heap_bytes(&self) -> usize {
        self.forest.capacity_bytes()
            + self.by_owner.as_ref().map_or(0, |o| {
                o.capacity() * (std::mem::size_of::<(Owner, OwnerEntry)>() + 1)
                    + o.values().map(|e| e.locks.heap_bytes()).sum::<usize>()
            })
    }

    pub fn held(&self, id: NodeId) -> &Held {
        self.forest.get(id)
    }

    pub fn range(&self, id: NodeId) -> Range {
        let (s, e) = self.forest.interval(id);
        Range::new(s, e).expect("stored ranges are valid")
    }

    pub fn conflict(&self, id: NodeId) -> Conflict {
        let h = self.held(id);
        Conflict { owner: h.owner, kind: h.kind, mode: h.mode, range: self.range(id) }
    }

    /// Calls `f` on each granted lock that a `mode` lock on `range` would
    /// conflict with, until `f` breaks. O(log n + k) over the trees of the
    /// incompatible modes; stopping at the first is O(log n).
    pub fn conflicts<B>(
        &self,
        mode: Mode,
        range: Range,
        exempt: Exempt,
        mut f: impl FnMut(NodeId, &Held) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        for m in Mode::ALL {
            if mode.compatible(m) {
                continue;
            }
            self.forest.overlaps(self.roots[m as usize], range.start(), range.end(), &mut |id, h: &Held| {
                if exempt.covers(h) { ControlFlow::Continue(()) } else { f(id, h) }
            })?;
        }
        ControlFlow::Continue(())
    }

    /// The first conflicting lock, if any. O(log n) plus the exempt locks
    /// passed over (the requester's own, which a grant would touch anyway).
    pub fn first_conflict(&self, mode: Mode, range: Range, exempt: Exempt) -> Option<NodeId> {
        match self.conflicts(mode, range, exempt, |id, _| ControlFlow::Break(id)) {
            ControlFlow::Break(id) => Some(id),
            ControlFlow::Continue(()) => None,
        }
    }

    /// Adds a lock of an owner-merging kind. O(log n).
    pub fn insert(&mut self, held: Held, range: Range) -> NodeId {
        debug_assert!(held.kind.owner_merges());
        let owner = held.owner;
        let root = &mut self.roots[held.mode as usize];
        let id = self.forest.insert(root, range.start(), range.end(), held);
        match self.by_owner.get_or_insert_default().entry(owner) {
            std::collections::hash_map::Entry::Occupied(mut o) => o.get_mut().locks.insert(range.start(), id),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(OwnerEntry { arrival: self.next_arrival, locks: OwnerLocks::One(range.start(), id) });
                self.next_arrival += 1;
            }
        }
        id
    }

    /// Adds a DLM lock; its handle is `tag` over the node id. O(log n).
    pub fn insert_dlm(&mut self, owner: Owner, mode: Mode, range: Range, tag: u32) -> LockHandle {
        let held = Held { owner, kind: LockKind::Dlm, mode, handle: 0 };
        let id = self.forest.insert(&mut self.roots[mode as usize], range.start(), range.end(), held);
        let handle = (u64::from(tag) << 32) | u64::from(id);
        self.forest.get_mut(id).handle = handle;
        handle
    }

    /// Changes the mode of a DLM lock, keeping its handle. O(log n).
    pub fn set_mode(&mut self, id: NodeId, mode: Mode) {
        let old = self.held(id).mode;
        if old != mode {
            let [from, to] = self.roots.get_disjoint_mut([old as usize, mode as usize]).expect("distinct modes");
            self.forest.transfer(from, to, id);
            self.forest.get_mut(id).mode = mode;
        }
    }

    /// Removes a lock. O(log n).
    pub fn remove(&mut self, id: NodeId) -> (Held, Range) {
        let range = self.range(id);
        let mode = self.held(id).mode;
        let held = self.forest.remove(&mut self.roots[mode as usize], id);
        if held.kind.owner_merges() {
            let owners = self.by_owner.as_mut().expect("owner view has the lock");
            let entry = owners.get_mut(&held.owner).expect("owner view has the lock");
            if entry.locks.remove(range.start()) {
                // The emptied map is kept: the next lock on this file, the
                // common case, would allocate it again. It goes with the
                // resource when that is reclaimed.
                owners.remove(&held.owner);
            }
        }
        (held, range)
    }

    /// The node of a DLM lock. O(1).
    pub fn by_handle(&self, handle: LockHandle) -> Option<NodeId> {
        let id = handle as u32;
        (self.forest.is_live(id) && self.held(id).handle == handle).then_some(id)
    }

    fn owner_map(&self, owner: Owner) -> Option<&OwnerLocks> {
        self.by_owner.as_ref()?.get(&owner).map(|e| &e.locks)
    }

    /// When the owner arrived (see [`OwnerEntry`]); owners without locks
    /// (DLM) all count as equal.
    fn arrival(&self, owner: Owner) -> u64 {
        self.by_owner.as_ref().and_then(|o| o.get(&owner)).map_or(0, |e| e.arrival)
    }

    /// How many locks the owner holds here. O(1).
    pub fn owner_lock_count(&self, owner: Owner) -> usize {
        self.owner_map(owner).map_or(0, OwnerLocks::len)
    }

    /// The conflicting lock Linux's `F_GETLK` reports: the first in its
    /// list (see [`OwnerEntry`]), i.e. of the earliest-arrived owner, the
    /// lowest start. O(log n + k) for the k conflicts.
    pub fn kernel_first_conflict(&self, mode: Mode, range: Range, exempt: Exempt) -> Option<NodeId> {
        let mut best: Option<((u64, u64), NodeId)> = None;
        let _ = self.conflicts(mode, range, exempt, |id, h| {
            let key = (self.arrival(h.owner), self.range(id).start());
            if best.is_none_or(|(b, _)| key < b) {
                best = Some((key, id));
            }
            ControlFlow::<()>::Continue(())
        });
        best.map(|(_, id)| id)
    }

    /// The owner's locks that overlap or touch `range`, in order.
    /// O(log n + k).
    fn owner_neighbours(&self, owner: Owner, range: Range) -> Vec<NodeId> {
        let Some(locks) = self.owner_map(owner) else { return Vec::new() };
        locks.neighbours(range, |id| self.range(id).touches(range))
    }

    /// The owner's lock of lowest start that overlaps `range`: what
    /// Linux's `F_OFD_GETLK` with `F_UNLCK` reports (since 6.3), the first
    /// of the owner's locks there in its list. O(log n + k).
    pub fn owner_first_overlap(&self, owner: Owner, range: Range) -> Option<NodeId> {
        self.owner_neighbours(owner, range).into_iter().find(|&id| self.range(id).overlaps(range))
    }

    /// Sets the owner's lock on `range` to `mode`, or removes it there when
    /// `mode` is `None`, with the merge and split rules of Linux
    /// `posix_lock_inode`: same-mode locks that overlap or touch the range
    /// merge into one; a lock of another mode keeps the parts outside the
    /// range. Returns the sub-ranges where the owner's hold got weaker (to
    /// recheck waiters there). O(log n + k) for k neighbours touched.
    pub fn set_owner_range(
        &mut self,
        owner: Owner,
        kind: LockKind,
        mode: Option<Mode>,
        range: Range,
        weakened: &mut Vec<Range>,
    ) {
        let (mut start, mut end) = (range.start(), range.end());
        // The owner keeps its place in Linux's list through one call even
        // if every lock it had is replaced on the way.
        let arrival = self.by_owner.as_ref().and_then(|o| o.get(&owner)).map(|e| e.arrival);
        for id in self.owner_neighbours(owner, range) {
            let (old, r) = (self.held(id).mode, self.range(id));
            if Some(old) == mode {
                start = start.min(r.start());
                end = end.max(r.end());
                self.remove(id);
                continue;
            }
            let Some(common) = r.intersection(range) else { continue };
            self.remove(id);
            if mode.is_none_or(|new| weakens(old, new)) {
                weakened.push(common);
            }
            let held = |mode| Held { owner, kind, mode, handle: 0 };
            if r.start() < range.start() {
                self.insert(held(old), Range::new(r.start(), range.start() - 1).expect("left part"));
            }
            if r.end() > range.end() {
                self.insert(held(old), Range::new(range.end() + 1, r.end()).expect("right part"));
            }
        }
        if let Some(mode) = mode {
            let merged = Range::new(start, end).expect("union of valid ranges");
            self.insert(Held { owner, kind, mode, handle: 0 }, merged);
        }
        if let (Some(arrival), Some(e)) = (arrival, self.by_owner.as_mut().and_then(|o| o.get_mut(&owner))) {
            e.arrival = arrival;
        }
    }

    /// Removes every lock of `owner`; their ranges go to `weakened`.
    /// O(k log n) for the owner's k locks.
    pub fn release_owner(&mut self, owner: Owner, weakened: &mut Vec<Range>) {
        let Some(locks) = self.owner_map(owner) else { return };
        for id in locks.ids() {
            weakened.push(self.remove(id).1);
        }
    }

    /// Whether the owner holds any lock here. O(1).
    pub fn owner_holds(&self, owner: Owner) -> bool {
        self.owner_map(owner).is_some()
    }

    /// The mode of the owner's single lock (flock), if it has one. O(1).
    pub fn owner_whole_mode(&self, owner: Owner) -> Option<Mode> {
        self.owner_map(owner)?.first().map(|id| self.held(id).mode)
    }

    /// Every granted lock, sorted by owner then start. O(n log n).
    pub fn all(&self) -> Vec<HeldLock> {
        let mut out: Vec<HeldLock> = self
            .roots
            .iter()
            .flat_map(|&root| self.forest.iter(root))
            .map(|id| {
                let h = self.held(id);
                HeldLock { owner: h.owner, range: self.range(id), mode: h.mode, handle: h.handle }
            })
            .collect();
        out.sort();
        out
    }
}
