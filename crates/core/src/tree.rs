//! An augmented interval treap: the index that keeps every lock operation
//! O(log n + k).
//!
//! Seed 000 (LU-17276) is a list of locks scanned on every enqueue; this is
//! its replacement. Intervals are closed `[start, end]` over `u64`. Each node
//! is keyed by `(start, id)` so that equal starts (many readers on one range)
//! are distinct keys, and carries the largest `end` in its subtree. An overlap
//! query prunes every subtree whose largest end lies before the query and
//! every right subtree whose keys start after it, so it visits the O(log n)
//! nodes of two search paths plus the subtrees that hold answers.
//!
//! Several trees share one arena (a [`Forest`]): a resource keeps one tree per
//! lock mode and pays for one allocation, not six. Node ids are arena indices
//! and stay valid until the node is removed, so callers may hold them as
//! handles.
//!
//! Balance comes from random priorities (a treap): the expected depth is
//! O(log n) for any insertion order, including the sorted order that the
//! `flocks` benchmark and real applications produce. The priorities come
//! from a xorshift generator seeded per forest: no clock, no global state.

use std::ops::ControlFlow;

/// Index of a node in a [`Forest`].
pub type NodeId = u32;

const NIL: NodeId = u32::MAX;

/// The root of one tree inside a [`Forest`]. Empty by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Root(NodeId);

impl Default for Root {
    fn default() -> Self {
        Root(NIL)
    }
}

impl Root {
    /// Whether the tree holds no interval.
    pub fn is_empty(self) -> bool {
        self.0 == NIL
    }
}

#[derive(Debug)]
struct Node<T> {
    start: u64,
    end: u64,
    max_end: u64,
    left: NodeId,
    right: NodeId,
    prio: u32,
    /// `None` only while the slot is on the free list.
    value: Option<T>,
}

/// An arena of interval-tree nodes shared by any number of [`Root`]s.
#[derive(Debug)]
pub struct Forest<T> {
    nodes: Vec<Node<T>>,
    /// Head of the free list, threaded through `left`.
    free: NodeId,
    live: usize,
    rng: u32,
}

impl<T> Default for Forest<T> {
    fn default() -> Self {
        Forest { nodes: Vec::new(), free: NIL, live: 0, rng: 0x9E37_79B9 }
    }
}

impl<T> Forest<T> {
    /// Number of live nodes over all trees of the forest.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the forest holds no node.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Bytes held by the arena (for the memory figures of `bench rsb`).
    pub fn capacity_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node<T>>()
    }

    /// The interval of a live node. O(1).
    pub fn interval(&self, id: NodeId) -> (u64, u64) {
        let n = &self.nodes[id as usize];
        (n.start, n.end)
    }

    /// The value of a live node. O(1).
    pub fn get(&self, id: NodeId) -> &T {
        self.nodes[id as usize].value.as_ref().expect("live node")
    }

    /// The value of a live node, mutably. O(1). The interval cannot change
    /// this way: remove and insert again to move a node.
    pub fn get_mut(&mut self, id: NodeId) -> &mut T {
        self.nodes[id as usize].value.as_mut().expect("live node")
    }

    fn next_prio(&mut self) -> u32 {
        // xorshift32: cheap, and good enough to balance a treap.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.rng = x;
        x
    }

    fn alloc(&mut self, start: u64, end: u64, value: T) -> NodeId {
        let prio = self.next_prio();
        let node = Node { start, end, max_end: end, left: NIL, right: NIL, prio, value: Some(value) };
        self.live += 1;
        if self.free != NIL {
            let id = self.free;
            self.free = self.nodes[id as usize].left;
            self.nodes[id as usize] = node;
            id
        } else {
            if self.nodes.capacity() == 0 {
                // Most resources hold one lock: start with room for one.
                self.nodes.reserve_exact(1);
            }
            let id = NodeId::try_from(self.nodes.len()).expect("fewer than 2^32 - 1 nodes per forest");
            assert!(id != NIL, "fewer than 2^32 - 1 nodes per forest");
            self.nodes.push(node);
            id
        }
    }

    fn release(&mut self, id: NodeId) -> T {
        let n = &mut self.nodes[id as usize];
        let value = n.value.take().expect("live node");
        n.left = self.free;
        n.right = NIL;
        self.free = id;
        self.live -= 1;
        if self.live == 0 {
            // An idle resource gives its memory back; the next lock on it
            // starts from an empty arena.
            self.nodes = Vec::new();
            self.free = NIL;
        }
        value
    }

    fn key(&self, id: NodeId) -> (u64, NodeId) {
        (self.nodes[id as usize].start, id)
    }

    fn max_end(&self, id: NodeId) -> Option<u64> {
        (id != NIL).then(|| self.nodes[id as usize].max_end)
    }

    fn update(&mut self, id: NodeId) {
        let n = &self.nodes[id as usize];
        let mut m = n.end;
        if let Some(l) = self.max_end(n.left) {
            m = m.max(l);
        }
        if let Some(r) = self.max_end(n.right) {
            m = m.max(r);
        }
        self.nodes[id as usize].max_end = m;
    }

    /// Splits subtree `t` into keys `< key` and keys `>= key`.
    fn split(&mut self, t: NodeId, key: (u64, NodeId)) -> (NodeId, NodeId) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.key(t) < key {
            let (l, r) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = l;
            self.update(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = r;
            self.update(t);
            (l, t)
        }
    }

    /// Joins two subtrees where every key of `a` is below every key of `b`.
    fn merge(&mut self, a: NodeId, b: NodeId) -> NodeId {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].prio > self.nodes[b as usize].prio {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.update(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.update(b);
            b
        }
    }

    fn insert_at(&mut self, t: NodeId, n: NodeId) -> NodeId {
        if t == NIL {
            return n;
        }
        if self.nodes[n as usize].prio > self.nodes[t as usize].prio {
            let (l, r) = self.split(t, self.key(n));
            let node = &mut self.nodes[n as usize];
            node.left = l;
            node.right = r;
            self.update(n);
            return n;
        }
        if self.key(n) < self.key(t) {
            let l = self.insert_at(self.nodes[t as usize].left, n);
            self.nodes[t as usize].left = l;
        } else {
            let r = self.insert_at(self.nodes[t as usize].right, n);
            self.nodes[t as usize].right = r;
        }
        self.update(t);
        t
    }

    fn remove_at(&mut self, t: NodeId, key: (u64, NodeId)) -> NodeId {
        assert!(t != NIL, "removed node is in the tree");
        let k = self.key(t);
        if k == key {
            let n = &self.nodes[t as usize];
            return self.merge(n.left, n.right);
        }
        if key < k {
            let l = self.remove_at(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = l;
        } else {
            let r = self.remove_at(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = r;
        }
        self.update(t);
        t
    }

    /// Adds `[start, end]` with `value` to the tree at `root`. O(log n)
    /// expected.
    pub fn insert(&mut self, root: &mut Root, start: u64, end: u64, value: T) -> NodeId {
        debug_assert!(start <= end);
        let id = self.alloc(start, end, value);
        root.0 = self.insert_at(root.0, id);
        id
    }

    /// Moves node `id` from the tree at `from` to the tree at `to`, keeping
    /// its id (a DLM lock changing mode keeps its handle). O(log n).
    pub fn transfer(&mut self, from: &mut Root, to: &mut Root, id: NodeId) {
        from.0 = self.remove_at(from.0, self.key(id));
        let n = &mut self.nodes[id as usize];
        n.left = NIL;
        n.right = NIL;
        n.max_end = n.end;
        to.0 = self.insert_at(to.0, id);
    }

    /// Whether `id` names a live node. O(1).
    pub fn is_live(&self, id: NodeId) -> bool {
        self.nodes.get(id as usize).is_some_and(|n| n.value.is_some())
    }

    /// Removes node `id` from the tree at `root` (it must be in that tree)
    /// and returns its value. O(log n) expected.
    pub fn remove(&mut self, root: &mut Root, id: NodeId) -> T {
        root.0 = self.remove_at(root.0, self.key(id));
        self.release(id)
    }

    /// Calls `f` on every node of the tree at `root` whose interval overlaps
    /// `[start, end]`, in key order, until `f` breaks. O(log n + k·log(n/k))
    /// for k reported nodes; a query that stops at the first answer is
    /// O(log n).
    pub fn overlaps<B>(
        &self,
        root: Root,
        start: u64,
        end: u64,
        f: &mut impl FnMut(NodeId, &T) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        self.overlaps_at(root.0, start, end, f)
    }

    fn overlaps_at<B>(
        &self,
        t: NodeId,
        start: u64,
        end: u64,
        f: &mut impl FnMut(NodeId, &T) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        if t == NIL {
            return ControlFlow::Continue(());
        }
        let n = &self.nodes[t as usize];
        if n.max_end < start {
            return ControlFlow::Continue(());
        }
        self.overlaps_at(n.left, start, end, f)?;
        if n.start > end {
            // Every key to the right starts later still.
            return ControlFlow::Continue(());
        }
        if n.end >= start {
            f(t, n.value.as_ref().expect("live node"))?;
        }
        self.overlaps_at(n.right, start, end, f)
    }

    /// Collects the ids of the nodes of `root` overlapping `[start, end]`.
    pub fn overlapping(&self, root: Root, start: u64, end: u64) -> Vec<NodeId> {
        let mut out = Vec::new();
        let _ = self.overlaps(root, start, end, &mut |id, _| {
            out.push(id);
            ControlFlow::<()>::Continue(())
        });
        out
    }

    /// Every node of `root` in key order. O(n); for dumps and tests.
    pub fn iter(&self, root: Root) -> Vec<NodeId> {
        self.overlapping(root, 0, u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_invariants<T>(f: &Forest<T>, t: NodeId) -> Option<(u64, usize)> {
        if t == NIL {
            return None;
        }
        let n = &f.nodes[t as usize];
        let mut m = n.end;
        let mut count = 1;
        for c in [n.left, n.right] {
            if c != NIL {
                assert!(f.nodes[c as usize].prio <= n.prio, "heap order");
            }
            if let Some((cm, cc)) = check_invariants(f, c) {
                m = m.max(cm);
                count += cc;
            }
        }
        if n.left != NIL {
            assert!(f.key(n.left) < f.key(t), "left key order");
        }
        if n.right != NIL {
            assert!(f.key(n.right) > f.key(t), "right key order");
        }
        assert_eq!(m, n.max_end, "augmented max_end");
        Some((m, count))
    }

    proptest! {
        /// The tree answers overlap queries exactly as a plain list does,
        /// through any mix of inserts and removes, and keeps its invariants.
        #[test]
        fn overlaps_match_a_list(
            ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..40, any::<prop::sample::Index>()), 1..300),
            queries in proptest::collection::vec((0u64..250, 0u64..60), 1..20),
        ) {
            let mut forest = Forest::default();
            let mut root = Root::default();
            let mut list: Vec<(NodeId, u64, u64)> = Vec::new();
            for (insert, start, len, pick) in ops {
                if insert || list.is_empty() {
                    let id = forest.insert(&mut root, start, start + len, start);
                    list.push((id, start, start + len));
                } else {
                    let (id, s, _) = list.swap_remove(pick.index(list.len()));
                    prop_assert_eq!(forest.remove(&mut root, id), s);
                }
                let count = check_invariants(&forest, root.0).map_or(0, |c| c.1);
                prop_assert_eq!(count, list.len());
                prop_assert_eq!(forest.len(), list.len());
            }
            for (qs, ql) in queries {
                let qe = qs + ql;
                let mut got = forest.overlapping(root, qs, qe);
                got.sort_unstable();
                let mut want: Vec<NodeId> =
                    list.iter().filter(|&&(_, s, e)| s <= qe && e >= qs).map(|&(id, _, _)| id).collect();
                want.sort_unstable();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn extremes_do_not_overflow() {
        let mut forest = Forest::default();
        let mut root = Root::default();
        let a = forest.insert(&mut root, 0, u64::MAX, ());
        let b = forest.insert(&mut root, u64::MAX, u64::MAX, ());
        assert_eq!(forest.overlapping(root, u64::MAX, u64::MAX), vec![a, b]);
        assert_eq!(forest.overlapping(root, 0, 0), vec![a]);
        forest.remove(&mut root, a);
        forest.remove(&mut root, b);
        assert!(root.is_empty() && forest.is_empty());
    }

    #[test]
    fn sorted_inserts_stay_shallow() {
        fn depth<T>(f: &Forest<T>, t: NodeId) -> usize {
            if t == NIL { 0 } else { 1 + depth(f, f.nodes[t as usize].left).max(depth(f, f.nodes[t as usize].right)) }
        }
        let mut forest = Forest::default();
        let mut root = Root::default();
        for i in 0..100_000u64 {
            forest.insert(&mut root, 3 * i, 3 * i, ());
        }
        // A list would be 100,000 deep; a treap stays near 2·ln(n) ≈ 23.
        assert!(depth(&forest, root.0) < 80, "depth {}", depth(&forest, root.0));
    }
}
