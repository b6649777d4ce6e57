//! The queue of blocked requests on one resource.
//!
//! Waiters are kept in an interval tree by range, so that a release of
//! `[0, 9]` finds only the waiters that overlap `[0, 9]` (O(log n + k))
//! instead of waking every waiter into a recheck. Order among waiters is
//! their ticket: DLM conversions come before new requests (as in the VMS
//! DLM), otherwise first come, first served.

use crate::Map;

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
    /// Owners this waiter waits for now (holders of conflicting locks and
    /// owners of earlier conflicting waiters), sorted, without repeats;
    /// kept current on every change to the bytes the waiter covers.
    pub blockers: Vec<Owner>,
    /// DLM: the granted locks already sent a blocking callback for this
    /// waiter, so that each gets one, once.
    pub notified: Vec<LockHandle>,
}

/// The queue; it allocates only while someone waits, since most resources
/// never have a waiter.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    inner: Option<Box<Queue>>,
}

#[derive(Debug, Default)]
struct Queue {
    forest: Forest<Waiter>,
    root: Root,
    by_id: Map<WaitId, NodeId>,
    /// DLM lock handle -> its queued conversion.
    conversions: Map<LockHandle, WaitId>,
    next_ticket: u64,
}

impl WaitQueue {
    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }

    pub fn len(&self) -> usize {
        self.inner.as_ref().map_or(0, |q| q.forest.len())
    }

    pub fn heap_bytes(&self) -> usize {
        self.inner.as_ref().map_or(0, |q| {
            std::mem::size_of::<Queue>()
                + q.forest.capacity_bytes()
                + q.by_id.capacity() * (std::mem::size_of::<(WaitId, NodeId)>() + 1)
        })
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

    /// Parks a waiter. O(log n).
    pub fn push(&mut self, waiter: Waiter, range: Range) {
        let q = self.inner.get_or_insert_with(|| Box::new(Queue { next_ticket: 1, ..Queue::default() }));
        let id = waiter.id;
        if let Some(h) = waiter.convert {
            q.conversions.insert(h, id);
        }
        let node = q.forest.insert(&mut q.root, range.start(), range.end(), waiter);
        q.by_id.insert(id, node);
    }

    /// Removes a waiter. O(log n).
    pub fn remove(&mut self, id: WaitId) -> Option<(Waiter, Range)> {
        let q = self.inner.as_mut()?;
        let node = q.by_id.remove(&id)?;
        let (s, e) = q.forest.interval(node);
        let w = q.forest.remove(&mut q.root, node);
        if let Some(h) = w.convert {
            q.conversions.remove(&h);
        }
        if q.forest.is_empty() {
            self.inner = None;
        }
        Some((w, Range::new(s, e).expect("stored ranges are valid")))
    }

    /// The queued conversion of DLM lock `handle`, if any. O(1).
    pub fn conversion_of(&self, handle: LockHandle) -> Option<WaitId> {
        self.inner.as_ref()?.conversions.get(&handle).copied()
    }

    pub fn get(&self, id: WaitId) -> Option<(&Waiter, Range)> {
        let q = self.inner.as_ref()?;
        let &node = q.by_id.get(&id)?;
        let (s, e) = q.forest.interval(node);
        Some((q.forest.get(node), Range::new(s, e).expect("stored ranges are valid")))
    }

    pub fn get_mut(&mut self, id: WaitId) -> Option<&mut Waiter> {
        let q = self.inner.as_mut()?;
        let &node = q.by_id.get(&id)?;
        Some(q.forest.get_mut(node))
    }

    /// Calls `f` on each waiter overlapping `range`, in range order.
    /// O(log n + k).
    pub fn each_overlapping(&self, range: Range, mut f: impl FnMut(&Waiter)) {
        self.any_overlapping(range, |w| {
            f(w);
            false
        });
    }

    /// Calls `f` on each waiter overlapping `range` (in range order) until
    /// it returns true; returns whether it did. O(log n + k).
    pub fn any_overlapping(&self, range: Range, mut f: impl FnMut(&Waiter) -> bool) -> bool {
        let Some(q) = &self.inner else { return false };
        q.forest
            .overlaps(q.root, range.start(), range.end(), &mut |_, w: &Waiter| {
                if f(w) { std::ops::ControlFlow::Break(()) } else { std::ops::ControlFlow::Continue(()) }
            })
            .is_break()
    }
}
