//! The queue of blocked requests on one resource.
//!
//! Waiters are kept in an interval tree by range, so that a release of
//! `[0, 9]` finds only the waiters that overlap `[0, 9]` (O(log n + k))
//! instead of waking every waiter into a recheck. Order among waiters is
//! their ticket: DLM conversions come before new requests (as in the VMS
//! DLM), otherwise first come, first served.

use std::collections::HashMap;

use crate::tree::{Forest, NodeId, Root};
use crate::types::{LockHandle, LockKind, Owner, WaitId};
use crate::{Mode, Range};

/// Conversions are served before new requests: their tickets sort first.
pub(crate) const CONVERT_CLASS: u64 = 0;
pub(crate) const NEW_CLASS: u64 = 1 << 63;

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
    /// Owners whose granted locks block this waiter now; kept current on
    /// every change to the bytes the waiter covers.
    pub blockers: Vec<Owner>,
}

#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    forest: Forest<Waiter>,
    root: Root,
    by_id: HashMap<WaitId, NodeId>,
    /// DLM lock handle -> its queued conversion.
    conversions: HashMap<LockHandle, WaitId>,
    next_ticket: u64,
}

impl WaitQueue {
    pub fn is_empty(&self) -> bool {
        self.forest.is_empty()
    }

    pub fn len(&self) -> usize {
        self.forest.len()
    }

    pub fn heap_bytes(&self) -> usize {
        self.forest.capacity_bytes() + self.by_id.capacity() * (std::mem::size_of::<(WaitId, NodeId)>() + 1)
    }

    pub fn ticket(&mut self, class: u64) -> u64 {
        self.next_ticket += 1;
        class | self.next_ticket
    }

    /// Parks a waiter. O(log n).
    pub fn push(&mut self, waiter: Waiter, range: Range) {
        let id = waiter.id;
        if let Some(h) = waiter.convert {
            self.conversions.insert(h, id);
        }
        let node = self.forest.insert(&mut self.root, range.start(), range.end(), waiter);
        self.by_id.insert(id, node);
    }

    /// Removes a waiter. O(log n).
    pub fn remove(&mut self, id: WaitId) -> Option<(Waiter, Range)> {
        let node = self.by_id.remove(&id)?;
        let (s, e) = self.forest.interval(node);
        let w = self.forest.remove(&mut self.root, node);
        if let Some(h) = w.convert {
            self.conversions.remove(&h);
        }
        Some((w, Range::new(s, e).expect("stored ranges are valid")))
    }

    /// The queued conversion of DLM lock `handle`, if any. O(1).
    pub fn conversion_of(&self, handle: LockHandle) -> Option<WaitId> {
        self.conversions.get(&handle).copied()
    }

    pub fn get(&self, id: WaitId) -> Option<(&Waiter, Range)> {
        let &node = self.by_id.get(&id)?;
        let (s, e) = self.forest.interval(node);
        Some((self.forest.get(node), Range::new(s, e).expect("stored ranges are valid")))
    }

    pub fn get_mut(&mut self, id: WaitId) -> Option<&mut Waiter> {
        let &node = self.by_id.get(&id)?;
        Some(self.forest.get_mut(node))
    }

    /// Calls `f` on each waiter overlapping `range`, in range order.
    /// O(log n + k).
    pub fn each_overlapping(&self, range: Range, mut f: impl FnMut(&Waiter)) {
        let _ = self.forest.overlaps(self.root, range.start(), range.end(), &mut |_, w: &Waiter| {
            f(w);
            std::ops::ControlFlow::<()>::Continue(())
        });
    }

    /// Calls `f` on each waiter overlapping `range` (any order) until it
    /// returns true; returns whether it did. O(log n + k).
    pub fn any_overlapping(&self, range: Range, mut f: impl FnMut(&Waiter) -> bool) -> bool {
        self.forest
            .overlaps(self.root, range.start(), range.end(), &mut |_, w: &Waiter| {
                if f(w) { std::ops::ControlFlow::Break(()) } else { std::ops::ControlFlow::Continue(()) }
            })
            .is_break()
    }
}
