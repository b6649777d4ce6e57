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
}

impl WaitGraph {
    /// Records (or replaces) what `wait` of `owner` waits for. O(b).
    pub fn set(&mut self, owner: Owner, wait: WaitId, blockers: Vec<Owner>) {
        self.edges.entry(owner).or_default().insert(wait, blockers);
    }

    /// Forgets a request that was granted or cancelled. O(1).
    pub fn remove(&mut self, owner: Owner, wait: WaitId) {
        if let Some(waits) = self.edges.get_mut(&owner) {
            waits.remove(&wait);
            if waits.is_empty() {
                self.edges.remove(&owner);
            }
        }
    }

    /// Whether `target` is reachable from any of `from` along waits-for
    /// edges (a path of length 0 counts). O(V + E) of the part reached.
    pub fn reaches(&self, from: &[Owner], target: Owner) -> bool {
        let mut seen: Set<Owner> = Set::default();
        let mut stack: Vec<Owner> = from.to_vec();
        while let Some(o) = stack.pop() {
            if o == target {
                return true;
            }
            if !seen.insert(o) {
                continue;
            }
            if let Some(waits) = self.edges.get(&o) {
                stack.extend(waits.values().flatten().copied());
            }
        }
        false
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
        g.remove(25, 25);
        assert!(!g.reaches(&[1], 50));
        assert!(g.reaches(&[26], 50));
    }
}
