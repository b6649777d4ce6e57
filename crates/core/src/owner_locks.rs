//! One owner's locks on one resource, ordered by start.
//!
//! The owner's POSIX, OFD or flock locks on a resource are disjoint, so the
//! start alone orders them. Most owners hold a single lock on a file (a
//! process locking a record, every flock holder); that case is stored inline
//! instead of in a B-tree node, which is most of a lock's memory and cache
//! misses when a million owners each hold one.

use std::collections::BTreeMap;

use crate::Range;
use crate::tree::NodeId;

#[derive(Debug)]
pub(crate) enum OwnerLocks {
    One(u64, NodeId),
    Many(BTreeMap<u64, NodeId>),
}

impl OwnerLocks {
    /// Adds the lock `id` starting at `start`. O(log k) for k locks.
    pub fn insert(&mut self, start: u64, id: NodeId) {
        match self {
            OwnerLocks::One(s, i) => *self = OwnerLocks::Many(BTreeMap::from([(*s, *i), (start, id)])),
            OwnerLocks::Many(m) => {
                m.insert(start, id);
            }
        }
    }

    /// Removes the lock starting at `start`; returns whether none is left.
    /// O(log k).
    pub fn remove(&mut self, start: u64) -> bool {
        match self {
            OwnerLocks::One(s, _) => {
                debug_assert_eq!(*s, start);
                true
            }
            OwnerLocks::Many(m) => {
                m.remove(&start);
                if let (1, Some((&s, &i))) = (m.len(), m.first_key_value()) {
                    *self = OwnerLocks::One(s, i);
                }
                false
            }
        }
    }

    /// The locks that overlap or touch `range`, in order, where `touches`
    /// says whether a lock starting before `range` reaches it. O(log k + j)
    /// for j found.
    pub fn neighbours(&self, range: Range, touches: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
        let mut out = Vec::new();
        let mut visit = |start: u64, id: NodeId| {
            if start >= range.start() || touches(id) {
                out.push(id);
            }
            start >= range.start()
        };
        match self {
            OwnerLocks::One(s, i) => {
                if *s <= range.end() + 1 {
                    visit(*s, *i);
                }
            }
            // Walk back from the last lock starting at or before `end + 1`:
            // once one starts before `range`, none earlier can reach it.
            OwnerLocks::Many(m) => {
                for (&s, &i) in m.range(..=range.end() + 1).rev() {
                    if !visit(s, i) {
                        break;
                    }
                }
            }
        }
        out.reverse();
        out
    }

    /// How many locks. O(1).
    pub fn len(&self) -> usize {
        match self {
            OwnerLocks::One(..) => 1,
            OwnerLocks::Many(m) => m.len(),
        }
    }

    /// Every lock, in order. O(k).
    pub fn ids(&self) -> Vec<NodeId> {
        match self {
            OwnerLocks::One(_, i) => vec![*i],
            OwnerLocks::Many(m) => m.values().copied().collect(),
        }
    }

    /// The first lock. O(1) for one, O(log k) otherwise.
    pub fn first(&self) -> Option<NodeId> {
        match self {
            OwnerLocks::One(_, i) => Some(*i),
            OwnerLocks::Many(m) => m.values().next().copied(),
        }
    }

    /// Heap bytes beyond the enum itself (approximate for the B-tree).
    pub fn heap_bytes(&self) -> usize {
        match self {
            OwnerLocks::One(..) => 0,
            OwnerLocks::Many(m) => m.len() * 16,
        }
    }
}
