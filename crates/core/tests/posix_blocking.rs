//! Blocking POSIX locks over several files: safety, exact deadlock
//! detection and liveness, checked against graphs the test builds itself
//! from what the engine reported.
//!
//! - Safety: granted locks of different owners never conflict.
//! - No missed deadlock: a request the engine queues closes no cycle of
//!   held-lock waits (the cycles the kernel would see).
//! - No false deadlock: a request refused with `EDEADLK` closes a cycle in
//!   the graph of all waits (held locks and earlier queued requests).
//! - Liveness: releasing every lock, over and over, grants every request.

use std::collections::{BTreeMap, HashSet};

use interlock_core::{Effect, HeldLock, LockKind, LockRequest, LockSpace, Mode, Namespace, Outcome, Range, WaitId};
use proptest::prelude::*;

mod common;

const FILES: [&[u8]; 2] = [b"a", b"b"];
const P: LockKind = LockKind::Posix;

#[derive(Clone, Debug)]
struct Queued {
    id: WaitId,
    owner: u64,
    file: usize,
    mode: Mode,
    range: Range,
}

#[derive(Clone, Debug)]
enum Op {
    Lock { owner: u64, file: usize, write: bool, start: u64, len: u64 },
    Unlock { owner: u64, file: usize, start: u64, len: u64 },
    Close { owner: u64, file: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u64..4, 0usize..2, any::<bool>(), 0u64..20, 1u64..8)
            .prop_map(|(owner, file, write, start, len)| Op::Lock { owner, file, write, start, len }),
        2 => (0u64..4, 0usize..2, 0u64..20, 0u64..8).prop_map(|(owner, file, start, len)| Op::Unlock { owner, file, start, len }),
        1 => (0u64..4, 0usize..2).prop_map(|(owner, file)| Op::Close { owner, file }),
    ]
}

fn held(space: &LockSpace, file: usize) -> Vec<HeldLock> {
    space.locks(FILES[file], Namespace::Record).unwrap()
}

/// Owners whose held locks block a request.
fn held_blockers(space: &LockSpace, q: &Queued) -> Vec<u64> {
    held(space, q.file)
        .into_iter()
        .filter(|l| l.owner != q.owner && !l.mode.compatible(q.mode) && l.range.overlaps(q.range))
        .map(|l| l.owner)
        .collect()
}

/// Whether `from` reaches `to` in `edges`.
fn reaches(edges: &BTreeMap<u64, HashSet<u64>>, from: &[u64], to: u64) -> bool {
    let mut seen = HashSet::new();
    let mut stack = from.to_vec();
    while let Some(o) = stack.pop() {
        if o == to {
            return true;
        }
        if seen.insert(o) {
            stack.extend(edges.get(&o).into_iter().flatten().copied());
        }
    }
    false
}

/// Waits-for edges of the queued requests: held-lock edges, plus (with
/// `fifo`) edges to the owners of earlier conflicting queued requests.
fn graph(space: &LockSpace, queue: &[Queued], fifo: bool) -> BTreeMap<u64, HashSet<u64>> {
    let mut edges: BTreeMap<u64, HashSet<u64>> = BTreeMap::new();
    for (i, q) in queue.iter().enumerate() {
        let e = edges.entry(q.owner).or_default();
        e.extend(held_blockers(space, q));
        if fifo {
            for u in &queue[..i] {
                if u.file == q.file && u.owner != q.owner && !u.mode.compatible(q.mode) && u.range.overlaps(q.range) {
                    e.insert(u.owner);
                }
            }
        }
    }
    edges
}

fn apply_grants(effects: &[Effect], queue: &mut Vec<Queued>) {
    for e in effects {
        let Effect::Granted { wait, .. } = e else { panic!("unexpected effect {e:?}") };
        let at = queue.iter().position(|q| q.id == *wait).expect("a grant names a queued request");
        queue.remove(at);
    }
}

fn check_safety(space: &LockSpace) -> Result<(), TestCaseError> {
    for f in 0..FILES.len() {
        let locks = held(space, f);
        for a in &locks {
            for b in &locks {
                prop_assert!(
                    a.owner == b.owner || a.mode.compatible(b.mode) || !a.range.overlaps(b.range),
                    "conflicting grants {a:?} {b:?}"
                );
            }
        }
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let space = LockSpace::default();
    let mut queue: Vec<Queued> = Vec::new();
    for op in ops {
        match op {
            Op::Lock { owner, file, write, start, len } => {
                // A thread of an owner that already waits is not modelled:
                // each owner blocks on one request at a time, like a
                // single-threaded process.
                if queue.iter().any(|q| q.owner == owner) {
                    continue;
                }
                let mode = if write { Mode::EX } else { Mode::PR };
                let range = Range::new(start, start + len - 1).unwrap();
                let req = LockRequest { resource: FILES[file], owner, kind: P, mode, range, wait: true };
                let resp = space.lock(&req).unwrap();
                let q = Queued { id: 0, owner, file, mode, range };
                match resp.outcome {
                    Outcome::Granted(_) => apply_grants(&resp.effects, &mut queue),
                    Outcome::Queued(id) => {
                        let held_only = graph(&space, &queue, false);
                        prop_assert!(
                            !reaches(&held_only, &held_blockers(&space, &q), owner),
                            "missed a deadlock: {q:?} with {queue:?}"
                        );
                        queue.push(Queued { id, ..q });
                    }
                    Outcome::Deadlock => {
                        let mut all = graph(&space, &queue, true);
                        let mut firsts = held_blockers(&space, &q);
                        for u in &queue {
                            if u.file == q.file
                                && u.owner != owner
                                && !u.mode.compatible(mode)
                                && u.range.overlaps(range)
                            {
                                firsts.push(u.owner);
                            }
                        }
                        all.remove(&owner);
                        prop_assert!(reaches(&all, &firsts, owner), "false deadlock: {q:?} with {queue:?}");
                    }
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
            Op::Unlock { owner, file, start, len } => {
                let range = Range::from_posix(start as i64, len as i64).unwrap();
                let resp = space.unlock(FILES[file], owner, P, range).unwrap();
                apply_grants(&resp.effects, &mut queue);
            }
            Op::Close { owner, file } => {
                let resp = space.release_owner(FILES[file], owner, P).unwrap();
                apply_grants(&resp.effects, &mut queue);
            }
        }
        check_safety(&space)?;
        prop_assert_eq!(space.stats().waiters, queue.len());
    }
    // Liveness: release everything held until nothing waits.
    for _ in 0..100 {
        if queue.is_empty() {
            break;
        }
        for owner in 0..4 {
            for file in FILES {
                let resp = space.release_owner(file, owner, P).unwrap();
                apply_grants(&resp.effects, &mut queue);
            }
        }
        check_safety(&space)?;
    }
    prop_assert!(queue.is_empty(), "requests never granted: {:?}", queue);
    Ok(())
}

proptest! {
    #![proptest_config(common::config(4096))]

    #[test]
    fn posix_blocking_is_safe_live_and_exact_on_deadlock(ops in proptest::collection::vec(op(), 1..50)) {
        run(ops)?;
    }
}
