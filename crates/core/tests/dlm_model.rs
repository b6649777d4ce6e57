//! DLM locks against a plain-list reference model: new requests, no-queue
//! requests, conversions up and down, unlocks and cancels, with the grants,
//! blocking callbacks, value block and fencing token the engine reports.

use interlock_core::{Effect, LockKind, LockRequest, LockSpace, Mode, Namespace, Outcome, Range, WaitId};
use proptest::prelude::*;

mod common;

const RES: &[u8] = b"dlm";

#[derive(Clone, Debug)]
struct MLock {
    handle: u64,
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
    /// The lock being converted.
    convert: Option<u64>,
}

#[derive(Default)]
struct Model {
    locks: Vec<MLock>,
    /// Conversions first, each class in arrival order.
    waiters: Vec<MWaiter>,
    lvb: Option<Vec<u8>>,
    fence: u64,
}

impl Model {
    fn held_conflict(&self, mode: Mode, range: Range, except: Option<u64>) -> Vec<&MLock> {
        self.locks
            .iter()
            .filter(|l| Some(l.handle) != except && !l.mode.compatible(mode) && l.range.overlaps(range))
            .collect()
    }

    fn can_go(&self, idx: usize) -> bool {
        let w = &self.waiters[idx];
        self.held_conflict(w.mode, w.range, w.convert).is_empty()
            && !self.waiters[..idx].iter().any(|u| !u.mode.compatible(w.mode) && u.range.overlaps(w.range))
    }

    fn queue(&mut self, w: MWaiter) {
        let at = if w.convert.is_some() {
            self.waiters.iter().position(|u| u.convert.is_none()).unwrap_or(self.waiters.len())
        } else {
            self.waiters.len()
        };
        self.waiters.insert(at, w);
    }

    /// Grants what can go, earliest first, until nothing can.
    fn settle(&mut self, effects: &[Effect]) -> Result<(), TestCaseError> {
        let mut want: Vec<WaitId> = Vec::new();
        while let Some(i) = (0..self.waiters.len()).find(|&i| self.can_go(i)) {
            let w = self.waiters.remove(i);
            if w.mode.is_write() {
                self.fence += 1;
            }
            match w.convert {
                Some(h) => self.locks.iter_mut().find(|l| l.handle == h).unwrap().mode = w.mode,
                None => {
                    let handle = effects
                        .iter()
                        .find_map(|e| match e {
                            Effect::Granted { wait, grant, .. } if *wait == w.id => grant.lock,
                            _ => None,
                        })
                        .ok_or_else(|| TestCaseError::fail(format!("no grant for waiter {}", w.id)))?;
                    self.locks.push(MLock { handle, owner: w.owner, mode: w.mode, range: w.range });
                }
            }
            want.push(w.id);
        }
        let mut got: Vec<WaitId> = effects
            .iter()
            .filter_map(|e| if let Effect::Granted { wait, .. } = e { Some(*wait) } else { None })
            .collect();
        got.sort_unstable();
        want.sort_unstable();
        prop_assert_eq!(got, want);
        Ok(())
    }
}

#[derive(Clone, Debug)]
enum Op {
    Lock { owner: u64, mode: usize, start: u64, len: u64, wait: bool },
    Convert { pick: prop::sample::Index, mode: usize, wait: bool, lvb: u8 },
    Unlock { pick: prop::sample::Index, lvb: u8 },
    Cancel { pick: prop::sample::Index },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..4, 0usize..6, 0u64..30, 0u64..10, any::<bool>())
            .prop_map(|(owner, mode, start, len, wait)| Op::Lock { owner, mode, start, len, wait }),
        3 => (any::<prop::sample::Index>(), 0usize..6, any::<bool>(), any::<u8>())
            .prop_map(|(pick, mode, wait, lvb)| Op::Convert { pick, mode, wait, lvb }),
        2 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(pick, lvb)| Op::Unlock { pick, lvb }),
        1 => any::<prop::sample::Index>().prop_map(|pick| Op::Cancel { pick }),
    ]
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let space = LockSpace::default();
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::Lock { owner, mode, start, len, wait } => {
                let mode = Mode::ALL[mode];
                let range = Range::from_posix(start as i64, len as i64).unwrap();
                let resp =
                    space.lock(&LockRequest { resource: RES, owner, kind: LockKind::Dlm, mode, range, wait }).unwrap();
                let blocked = !m.held_conflict(mode, range, None).is_empty()
                    || m.waiters.iter().any(|u| !u.mode.compatible(mode) && u.range.overlaps(range));
                match resp.outcome {
                    Outcome::Granted(g) => {
                        prop_assert!(!blocked, "granted over a conflict");
                        if mode.is_write() {
                            m.fence += 1;
                        }
                        prop_assert_eq!(g.fence, m.fence);
                        prop_assert_eq!(&g.lvb, &m.lvb);
                        m.locks.push(MLock { handle: g.lock.unwrap(), owner, mode, range });
                        prop_assert!(resp.effects.is_empty(), "{:?}", resp.effects);
                    }
                    Outcome::WouldBlock => prop_assert!(blocked && !wait),
                    Outcome::Queued(id) => {
                        prop_assert!(blocked && wait);
                        // One blocking callback per conflicting holder.
                        let mut want: Vec<u64> = m.held_conflict(mode, range, None).iter().map(|l| l.handle).collect();
                        let mut got: Vec<u64> = resp
                            .effects
                            .iter()
                            .map(|e| match e {
                                Effect::Blocking { lock, wanted, .. } if *wanted == mode => *lock,
                                other => panic!("unexpected effect {other:?}"),
                            })
                            .collect();
                        want.sort_unstable();
                        got.sort_unstable();
                        prop_assert_eq!(got, want);
                        m.queue(MWaiter { id, owner, mode, range, convert: None });
                    }
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
            Op::Convert { pick, mode, wait, lvb } => {
                if m.locks.is_empty() {
                    continue;
                }
                let l = m.locks[pick.index(m.locks.len())].clone();
                let mode = Mode::ALL[mode];
                let resp = space.dlm_convert(RES, l.owner, l.handle, mode, wait, Some(&[lvb])).unwrap();
                let pending = m.waiters.iter().any(|w| w.convert == Some(l.handle));
                let down = Mode::ALL.iter().all(|&x| !l.mode.compatible(x) || mode.compatible(x));
                if pending {
                    prop_assert_eq!(resp.outcome, Outcome::WouldBlock);
                    continue;
                }
                let weakens = Mode::ALL.iter().any(|&x| mode.compatible(x) && !l.mode.compatible(x));
                if weakens && matches!(l.mode, Mode::PW | Mode::EX) {
                    m.lvb = Some(vec![lvb]);
                }
                let blocked = !down
                    && (!m.held_conflict(mode, l.range, Some(l.handle)).is_empty()
                        || m.waiters
                            .iter()
                            .any(|u| u.convert.is_some() && !u.mode.compatible(mode) && u.range.overlaps(l.range)));
                match resp.outcome {
                    Outcome::Granted(g) => {
                        prop_assert!(!blocked, "converted over a conflict");
                        if mode.is_write() {
                            m.fence += 1;
                        }
                        prop_assert_eq!(g.fence, m.fence);
                        m.locks.iter_mut().find(|x| x.handle == l.handle).unwrap().mode = mode;
                        m.settle(&resp.effects)?;
                    }
                    Outcome::WouldBlock => prop_assert!(blocked && !wait),
                    Outcome::Queued(id) => {
                        prop_assert!(blocked && wait);
                        m.queue(MWaiter { id, owner: l.owner, mode, range: l.range, convert: Some(l.handle) });
                    }
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
            Op::Unlock { pick, lvb } => {
                if m.locks.is_empty() {
                    continue;
                }
                let l = m.locks.remove(pick.index(m.locks.len()));
                let resp = space.dlm_unlock(RES, l.owner, l.handle, Some(&[lvb])).unwrap();
                if matches!(l.mode, Mode::PW | Mode::EX) {
                    m.lvb = Some(vec![lvb]);
                }
                m.waiters.retain(|w| w.convert != Some(l.handle));
                m.settle(&resp.effects)?;
            }
            Op::Cancel { pick } => {
                if m.waiters.is_empty() {
                    continue;
                }
                let w = m.waiters.remove(pick.index(m.waiters.len()));
                let resp = space.cancel(RES, LockKind::Dlm, w.id).unwrap();
                m.settle(&resp.effects)?;
            }
        }
        let mut got: Vec<(u64, Mode, Range)> =
            space.locks(RES, Namespace::Dlm).unwrap().into_iter().map(|l| (l.owner, l.mode, l.range)).collect();
        let mut want: Vec<(u64, Mode, Range)> = m.locks.iter().map(|l| (l.owner, l.mode, l.range)).collect();
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
        prop_assert_eq!(space.stats().waiters, m.waiters.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::config(4096))]

    #[test]
    fn dlm_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}
