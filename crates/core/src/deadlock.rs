//! The waits-for graph of blocked POSIX owners, for `EDEADLK`.
//!
//! Linux follows one blocker per owner and gives up after 10 hops
//! (`MAX_DEADLK_ITERATIONS`), so it can miss a cycle. We keep, for every
//! queued POSIX request, the owners it waits for right now (held conflicts
//! and earlier conflicting waiters), updated whenever the bytes it covers
//! change, and search the whole graph: a request is refused exactly when
//! queueing it would close a cycle.
//!
//! One graph spans the lock space because POSIX deadlocks span files. It
//! sits behind a mutex that is taken only when a POSIX request blocks or a
//! POSIX waiter's blockers change, never on the uncontended path; the lock
//! order is always resource, then graph.

use crate::{Map, Set};

use crate::types::{Owner, WaitId};

#[derive(Debug, Default)]
pub(crate) struct WaitGraph {
    /// owner -> its queued requests -> the owners each waits for.
    edges: Map<Owner, Map<WaitId, Vec<Owner>>>,
    /// The same edges reversed: owner -> who waits for it (with how many
    /// edges), so "who waits for X, directly or not" is a search of only
    /// the part of the graph behind X, and O(1) when nobody does.
    rev: Map<Owner, Map<Owner, u32>>,
}

impl WaitGraph {
    fn unlink(&mut self, owner: Owner, blockers: &[Owner]) {
        for b in blockers {
            if let Some(r) = self.rev.get_mut(b)
                && let Some(n) = r.get_mut(&owner)
            {
                *n -= 1;
                if *n == 0 {
                    r.remove(&owner);
                    if r.is_empty() {
                        self.rev.remove(b);
                    }
                }
            }
        }
    }

    /// Records (or replaces) what `wait` of `owner` waits for; `blockers`
    /// is sorted and without repeats (as `Resource::blockers` makes it).
    /// O(b) to compare, and hash work only for the edges that changed:
    /// after a hand-over, a waiter's blockers change by one owner.
    pub fn set(&mut self, owner: Owner, wait: WaitId, blockers: Vec<Owner>) {
        debug_assert!(blockers.windows(2).all(|w| w[0] < w[1]));
        let old = self.edges.entry(owner).or_default().insert(wait, Vec::new()).unwrap_or_default();
        let (mut i, mut j) = (0, 0);
        let mut gone = Vec::new();
        while i < old.len() || j < blockers.len() {
            match (old.get(i), blockers.get(j)) {
                (Some(a), Some(b)) if a == b => {
                    i += 1;
                    j += 1;
                }
                (Some(&a), Some(&b)) if a < b => {
                    gone.push(a);
                    i += 1;
                }
                (Some(&a), None) => {
                    gone.push(a);
                    i += 1;
                }
                (_, Some(&b)) => {
                    *self.rev.entry(b).or_default().entry(owner).or_default() += 1;
                    j += 1;
                }
                (None, None) => unreachable!(),
            }
        }
        self.unlink(owner, &gone);
        self.edges.get_mut(&owner).expect("just inserted").insert(wait, blockers);
    }

    /// Forgets a request that was granted or cancelled. O(b).
    pub fn remove(&mut self, owner: Owner, wait: WaitId) {
        if let Some(waits) = self.edges.get_mut(&owner) {
            let old = waits.remove(&wait);
            if waits.is_empty() {
                self.edges.remove(&owner);
            }
            if let Some(old) = old {
                self.unlink(owner, &old);
            }
        }
    }

    /// Every owner that waits for `target`, directly or through others.
    /// O(1) when nobody waits for it; else O(V + E) of the part behind it.
    pub fn waiting_for(&self, target: Owner) -> Set<Owner> {
        let mut seen: Set<Owner> = Set::default();
        let mut stack = vec![target];
        while let Some(o) = stack.pop() {
            if let Some(r) = self.rev.get(&o) {
                for &w in r.keys() {
                    if seen.insert(w) {
                        stack.push(w);
                    }
                }
            }
        }
        seen
    }

    /// Whether `target` is reachable from any of `from` along waits-for
    /// edges (a path of length 0 counts).
    ///
    /// Searches forward from `from` and backward from `target` by turns
    /// and stops when the two meet or either side runs out, so the cost is
    /// about twice the smaller side: a newcomer at the tail of a long
    /// queue, who holds nothing that anyone waits for, costs O(1) however
    /// long the chain in front of it is.
    pub fn reaches(&self, from: &[Owner], target: Owner) -> bool {
        let mut ahead: Set<Owner> = from.iter().copied().collect();
        if ahead.contains(&target) {
            return true;
        }
        let mut behind: Set<Owner> = Set::default();
        behind.insert(target);
        let mut forward: Vec<Owner> = ahead.iter().copied().collect();
        let mut backward = vec![target];
        loop {
            let Some(o) = forward.pop() else { return false };
            for &n in self.edges.get(&o).into_iter().flat_map(|w| w.values().flatten()) {
                if behind.contains(&n) {
                    return true;
                }
                if ahead.insert(n) {
                    forward.push(n);
                }
            }
            let Some(o) = backward.pop() else { return false };
            for &n in self.rev.get(&o).into_iter().flat_map(|r| r.keys()) {
                if ahead.contains(&n) {
                    return true;
                }
                if behind.insert(n) {
                    backward.push(n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_long_cycles_and_only_cycles() {
        let mut g = WaitGraph::default();
        // A chain of 50 owners, each waiting for the next: longer than the
        // kernel's 10-hop search.
        for o in 0..50u64 {
            g.set(o, o, vec![o + 1]);
        }
        assert!(g.reaches(&[1], 50));
        assert!(!g.reaches(&[1], 0));
        assert_eq!(g.waiting_for(50).len(), 50);
        assert!(g.waiting_for(0).is_empty());
        g.remove(25, 25);
        assert!(!g.reaches(&[1], 50));
        assert!(g.reaches(&[26], 50));
        assert_eq!(g.waiting_for(50).len(), 24, "owners 26..=49 still wait for 50");
        g.set(30, 30, vec![]);
        g.set(31, 31, vec![32, 40]);
        g.set(31, 31, vec![32]);
        assert_eq!(g.waiting_for(50).len(), 19, "a replaced wait drops its old edges");
    }
}
