//! The engine against a deliberately simple reference model: a plain list of
//! locks and a plain list of waiters, every rule applied by scanning all of
//! them (O(n)), recomputed from scratch after every step.
//!
//! Random operation sequences run on both; outcomes, grants delivered to
//! waiters, the queue and the final lock maps must be identical.

use interlock_core::{Effect, HeldLock, LockKind, LockRequest, LockSpace, Mode, Outcome, Range, WaitId};
use proptest::prelude::*;

mod common;

const FILE: &[u8] = b"f";

#[derive(Clone, Debug)]
struct MLock {
    owner: u64,
    mode: Mode,
    range: Range,
}

#[derive(Clone, Debug)]
struct MWaiter {
    id: WaitId,
    owner: u64,
    mode: Mode,
    range: Range,
}

/// The reference model of one resource for POSIX/OFD-style or flock
/// owners (owner-merging kinds, no deadlock graph).
#[derive(Default)]
struct Model {
    locks: Vec<MLock>,
    /// In queue order.
    waiters: Vec<MWaiter>,
}

impl Model {
    fn conflict(&self, owner: u64, mode: Mode, range: Range) -> Option<&MLock> {
        self.locks.iter().find(|l| l.owner != owner && !l.mode.compatible(mode) && l.range.overlaps(range))
    }

    /// Byte-wise: remove the owner's hold on `range`, add `mode` there,
    /// then rebuild the owner's locks as maximal runs of one mode.
    fn set(&mut self, owner: u64, mode: Option<Mode>, range: Range) {
        let mut mine: Vec<MLock> = Vec::new();
        let mut rest = Vec::new();
        for l in self.locks.drain(..) {
            if l.owner != owner {
                rest.push(l);
            } else if !l.range.overlaps(range) {
                mine.push(l);
            } else {
                if l.range.start() < range.start() {
                    mine.push(MLock { range: Range::new(l.range.start(), range.start() - 1).unwrap(), ..l });
                }
                if l.range.end() > range.end() {
                    mine.push(MLock { range: Range::new(range.end() + 1, l.range.end()).unwrap(), ..l });
                }
            }
        }
        if let Some(mode) = mode {
            mine.push(MLock { owner, mode, range });
        }
        mine.sort_by_key(|l| l.range.start());
        let mut runs: Vec<MLock> = Vec::new();
        for l in mine {
            match runs.last_mut() {
                Some(p) if p.mode == l.mode && p.range.end() + 1 == l.range.start() => {
                    p.range = Range::new(p.range.start(), l.range.end()).unwrap();
                }
                _ => runs.push(l),
            }
        }
        rest.extend(runs);
        self.locks = rest;
    }

    /// Owners the waiter at `idx` waits for: conflicting holders, and the
    /// owners of earlier conflicting waiters that do not wait for it.
    fn blockers(&self, idx: usize) -> Vec<u64> {
        let w = &self.waiters[idx];
        let mut out: Vec<u64> = self
            .locks
            .iter()
            .filter(|l| l.owner != w.owner && !l.mode.compatible(w.mode) && l.range.overlaps(w.range))
            .map(|l| l.owner)
            .collect();
        for (j, u) in self.waiters[..idx].iter().enumerate() {
            if u.owner != w.owner
                && !u.mode.compatible(w.mode)
                && u.range.overlaps(w.range)
                && !self.blockers(j).contains(&w.owner)
            {
                out.push(u.owner);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether the waiter at `idx` waits for anything: another owner, or
    /// an earlier request of its own owner on overlapping bytes in another
    /// mode (their order decides the owner's locks).
    fn blocked(&self, idx: usize) -> bool {
        let w = &self.waiters[idx];
        !self.blockers(idx).is_empty()
            || self.waiters[..idx].iter().any(|u| u.owner == w.owner && u.mode != w.mode && u.range.overlaps(w.range))
    }

    /// Grants waiters until none can go; returns the granted ids.
    fn settle(&mut self) -> Vec<WaitId> {
        let mut granted = Vec::new();
        while let Some(i) = (0..self.waiters.len()).find(|&i| !self.blocked(i)) {
            let w = self.waiters.remove(i);
            self.set(w.owner, Some(w.mode), w.range);
            granted.push(w.id);
        }
        granted
    }

    fn dump(&self) -> Vec<HeldLock> {
        let mut v: Vec<HeldLock> =
            self.locks.iter().map(|l| HeldLock { owner: l.owner, range: l.range, mode: l.mode, handle: 0 }).collect();
        v.sort();
        v
    }
}

#[derive(Clone, Debug)]
enum Op {
    Set { owner: u64, write: bool, start: u64, len: u64, wait: bool },
    Unlock { owner: u64, start: u64, len: u64 },
    Test { owner: u64, write: bool, start: u64, len: u64 },
    Close { owner: u64 },
    Cancel { pick: prop::sample::Index },
}

/// Operations for `owners` owners; flock ones cover the whole file; with
/// `blocking` false every set is non-blocking.
fn op(owners: u64, flock: bool, blocking: bool) -> impl Strategy<Value = Op> {
    let range = if flock { (Just(0u64), Just(0u64)).boxed() } else { (0u64..40, 0u64..12).boxed() };
    prop_oneof![
        4 => (0..owners, any::<bool>(), range.clone(), any::<bool>())
            .prop_map(move |(owner, write, (start, len), wait)| Op::Set { owner, write, start, len, wait: wait && blocking }),
        2 => (0..owners, range.clone()).prop_map(|(owner, (start, len))| Op::Unlock { owner, start, len }),
        1 => (0..owners, any::<bool>(), range).prop_map(|(owner, write, (start, len))| Op::Test { owner, write, start, len }),
        1 => (0..owners).prop_map(|owner| Op::Close { owner }),
        1 => any::<prop::sample::Index>().prop_map(|pick| Op::Cancel { pick }),
    ]
}

fn to_range(start: u64, len: u64) -> Range {
    // len 0 means to end of file, as in POSIX.
    Range::from_posix(start as i64, len as i64).unwrap()
}

fn granted_ids(effects: &[Effect]) -> Vec<WaitId> {
    let mut ids: Vec<WaitId> = effects
        .iter()
        .map(|e| match e {
            Effect::Granted { wait, .. } => *wait,
            other => panic!("unexpected effect {other:?}"),
        })
        .collect();
    ids.sort_unstable();
    ids
}

fn run(kind: LockKind, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let space = LockSpace::default();
    let mut model = Model::default();
    let ns = kind.namespace();
    for op in ops {
        match op {
            Op::Set { owner, write, start, len, wait } => {
                let mode = if write { Mode::EX } else { Mode::PR };
                let range = to_range(start, len);
                let req = LockRequest { resource: FILE, owner, kind, mode, range, wait };
                let got = space.lock(&req).unwrap();
                let mut want_granted = Vec::new();
                if kind == LockKind::Flock {
                    let held = model.locks.iter().find(|l| l.owner == owner).map(|l| l.mode);
                    if held == Some(mode) {
                        prop_assert!(matches!(got.outcome, Outcome::Granted(_)));
                        continue;
                    }
                    if held.is_some() {
                        model.set(owner, None, range);
                        want_granted = model.settle();
                    }
                }
                if !wait {
                    if model.conflict(owner, mode, range).is_some() {
                        prop_assert_eq!(&got.outcome, &Outcome::WouldBlock);
                    } else {
                        prop_assert!(matches!(got.outcome, Outcome::Granted(_)), "{:?}", got);
                        model.set(owner, Some(mode), range);
                        want_granted.extend(model.settle());
                    }
                } else {
                    match got.outcome {
                        Outcome::Granted(_) => {
                            model.waiters.push(MWaiter { id: u64::MAX, owner, mode, range });
                            let i = model.waiters.len() - 1;
                            prop_assert!(!model.blocked(i), "granted while blocked");
                            model.waiters.pop();
                            model.set(owner, Some(mode), range);
                            want_granted.extend(model.settle());
                        }
                        Outcome::Queued(id) => {
                            model.waiters.push(MWaiter { id, owner, mode, range });
                            let i = model.waiters.len() - 1;
                            prop_assert!(model.blocked(i), "queued with nothing in the way");
                        }
                        other => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                want_granted.sort_unstable();
                prop_assert_eq!(granted_ids(&got.effects), want_granted);
            }
            Op::Unlock { owner, start, len } => {
                let range = if kind == LockKind::Flock { Range::WHOLE } else { to_range(start, len) };
                let got = space.unlock(FILE, owner, kind, range).unwrap();
                model.set(owner, None, range);
                let mut want = model.settle();
                want.sort_unstable();
                prop_assert_eq!(granted_ids(&got.effects), want);
            }
            Op::Test { owner, write, start, len } => {
                let mode = if write { Mode::EX } else { Mode::PR };
                let range = to_range(start, len);
                let got = space.test(FILE, owner, kind, mode, range).unwrap();
                match got {
                    // Any real conflicting lock is a right answer, as with the kernel.
                    Some(c) => prop_assert!(
                        model.locks.iter().any(|l| l.owner == c.owner
                            && l.mode == c.mode
                            && l.range == c.range
                            && l.owner != owner
                            && !l.mode.compatible(mode)
                            && l.range.overlaps(range)),
                        "reported conflict {:?} is not a conflicting lock",
                        c
                    ),
                    None => prop_assert!(model.conflict(owner, mode, range).is_none()),
                }
            }
            Op::Close { owner } => {
                let got = space.release_owner(FILE, owner, kind).unwrap();
                model.set(owner, None, Range::WHOLE);
                let mut want = model.settle();
                want.sort_unstable();
                prop_assert_eq!(granted_ids(&got.effects), want);
            }
            Op::Cancel { pick } => {
                if model.waiters.is_empty() {
                    continue;
                }
                let w = model.waiters.remove(pick.index(model.waiters.len()));
                let got = space.cancel(FILE, kind, w.id).unwrap();
                let mut want = model.settle();
                want.sort_unstable();
                prop_assert_eq!(granted_ids(&got.effects), want);
            }
        }
        prop_assert_eq!(space.locks(FILE, ns).unwrap(), model.dump());
        // Safety: no two granted locks of different owners conflict.
        for a in &model.locks {
            prop_assert!(model.conflict(a.owner, a.mode, a.range).is_none(), "conflicting grants");
        }
        let stats = space.stats();
        prop_assert_eq!(stats.locks, model.locks.len());
        prop_assert_eq!(stats.waiters, model.waiters.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::config(4096))]

    #[test]
    fn ofd_matches_model(ops in proptest::collection::vec(op(4, false, true), 1..80)) {
        run(LockKind::Ofd, ops)?;
    }

    #[test]
    fn flock_matches_model(ops in proptest::collection::vec(op(4, true, true), 1..60)) {
        run(LockKind::Flock, ops)?;
    }

    /// POSIX owners differ from OFD ones only in deadlock detection, which
    /// `posix_blocking.rs` covers; without waiting they must agree exactly.
    #[test]
    fn posix_nonblocking_matches_model(ops in proptest::collection::vec(op(4, false, false), 1..80)) {
        run(LockKind::Posix, ops)?;
    }
}

/// Found by `ofd_matches_model` while followers were new: owner 3 waits
/// behind owner 2 as a follower; when owner 1 is granted a read over owner
/// 3's bytes, owner 3's request waits for owner 1 directly, so owner 1's
/// queued read overtakes it and is granted. The follower's list does not
/// say so; owner 1's heads must be looked at again when its locks change.
#[test]
fn a_grant_lets_the_grantees_waiters_overtake_followers() {
    let set = |owner, write, start, len, wait| Op::Set { owner, write, start, len, wait };
    let ops = vec![
        set(0, false, 0, 0, false),
        set(2, true, 0, 0, true),
        set(3, true, 28, 9, true),
        set(1, false, 27, 2, true),
        set(1, false, 0, 1, false),
        Op::Close { owner: 0 },
        set(1, false, 29, 0, false),
    ];
    run(LockKind::Ofd, ops).unwrap();
}
