//! Behaviours that random sequences reach rarely: deadlock detection, DLM
//! conversions, value blocks and fencing, FIFO order, range-aware wake-ups,
//! reclaim, and bad input.

use interlock_core::{
    Config, Effect, Grant, LockError, LockKind, LockRequest, LockSpace, Mode, Namespace, OFFSET_MAX, Outcome, Range,
    Response,
};

fn r(start: u64, end: u64) -> Range {
    Range::new(start, end).unwrap()
}

fn req(resource: &[u8], owner: u64, kind: LockKind, mode: Mode, range: Range, wait: bool) -> LockRequest<'_> {
    LockRequest { resource, owner, kind, mode, range, wait }
}

fn lock(
    space: &LockSpace,
    resource: &[u8],
    owner: u64,
    kind: LockKind,
    mode: Mode,
    range: Range,
    wait: bool,
) -> Response {
    space.lock(&req(resource, owner, kind, mode, range, wait)).unwrap()
}

fn granted(resp: &Response) -> Grant {
    match &resp.outcome {
        Outcome::Granted(g) => g.clone(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn queued(resp: &Response) -> u64 {
    match resp.outcome {
        Outcome::Queued(id) => id,
        ref other => panic!("expected to queue, got {other:?}"),
    }
}

fn grants(resp: &Response) -> Vec<u64> {
    resp.effects.iter().filter_map(|e| if let Effect::Granted { wait, .. } = e { Some(*wait) } else { None }).collect()
}

#[test]
fn posix_deadlock_two_owners() {
    let s = LockSpace::default();
    let p = LockKind::Posix;
    granted(&lock(&s, b"f", 1, p, Mode::EX, r(0, 0), false));
    granted(&lock(&s, b"f", 2, p, Mode::EX, r(1, 1), false));
    queued(&lock(&s, b"f", 1, p, Mode::EX, r(1, 1), true));
    assert_eq!(lock(&s, b"f", 2, p, Mode::EX, r(0, 0), true).outcome, Outcome::Deadlock);
    // The refused request changed nothing; owner 2 can still unlock and let 1 in.
    let resp = s.unlock(b"f", 2, p, Range::WHOLE).unwrap();
    assert_eq!(grants(&resp).len(), 1);
}

#[test]
fn posix_deadlock_across_files_beyond_ten_hops() {
    // Owner i holds file i and waits for file i+1; the last owner asks for
    // file 0: a cycle of 12 owners over 12 files, longer than the kernel's
    // 10-hop search.
    let s = LockSpace::default();
    let p = LockKind::Posix;
    let n = 12u64;
    let name = |i: u64| format!("file{i}").into_bytes();
    for i in 0..n {
        granted(&lock(&s, &name(i), i, p, Mode::EX, Range::WHOLE, false));
    }
    for i in 0..n - 1 {
        queued(&lock(&s, &name(i + 1), i, p, Mode::EX, Range::WHOLE, true));
    }
    assert_eq!(lock(&s, &name(0), n - 1, p, Mode::EX, Range::WHOLE, true).outcome, Outcome::Deadlock);
    // No false cycle: a fresh owner waiting on file 0 is fine.
    queued(&lock(&s, &name(0), 100, p, Mode::EX, Range::WHOLE, true));
}

#[test]
fn ofd_has_no_deadlock_detection_like_linux() {
    let s = LockSpace::default();
    let o = LockKind::Ofd;
    granted(&lock(&s, b"f", 1, o, Mode::EX, r(0, 0), false));
    granted(&lock(&s, b"f", 2, o, Mode::EX, r(1, 1), false));
    queued(&lock(&s, b"f", 1, o, Mode::EX, r(1, 1), true));
    queued(&lock(&s, b"f", 2, o, Mode::EX, r(0, 0), true));
}

#[test]
fn upgrade_overtakes_waiters_that_wait_for_it() {
    // A reader upgrades while a writer waits for it: the kernel grants the
    // upgrade (no held lock conflicts); FIFO must not turn it into a
    // deadlock.
    let s = LockSpace::default();
    let p = LockKind::Posix;
    granted(&lock(&s, b"f", 1, p, Mode::PR, r(0, 9), false));
    let w = queued(&lock(&s, b"f", 2, p, Mode::EX, r(0, 9), true));
    granted(&lock(&s, b"f", 1, p, Mode::EX, r(0, 9), true));
    let resp = s.unlock(b"f", 1, p, r(0, 9)).unwrap();
    assert_eq!(grants(&resp), vec![w]);
}

#[test]
fn fifo_a_reader_does_not_overtake_a_queued_writer() {
    let s = LockSpace::default();
    let o = LockKind::Ofd;
    granted(&lock(&s, b"f", 1, o, Mode::PR, r(0, 9), false));
    let writer = queued(&lock(&s, b"f", 2, o, Mode::EX, r(0, 9), true));
    // A blocking reader would be compatible with the holder, but it
    // conflicts with the earlier writer: it waits its turn.
    let reader = queued(&lock(&s, b"f", 3, o, Mode::PR, r(5, 5), true));
    // A non-blocking reader follows POSIX: only held locks count.
    granted(&lock(&s, b"f", 4, o, Mode::PR, r(5, 5), false));
    s.unlock(b"f", 4, o, Range::WHOLE).unwrap();
    let resp = s.unlock(b"f", 1, o, Range::WHOLE).unwrap();
    assert_eq!(grants(&resp), vec![writer]);
    let resp = s.unlock(b"f", 2, o, Range::WHOLE).unwrap();
    assert_eq!(grants(&resp), vec![reader]);
}

#[test]
fn release_wakes_only_waiters_on_its_bytes() {
    let s = LockSpace::default();
    let o = LockKind::Ofd;
    granted(&lock(&s, b"f", 1, o, Mode::EX, r(0, 9), false));
    granted(&lock(&s, b"f", 1, o, Mode::EX, r(100, 109), false));
    let low = queued(&lock(&s, b"f", 2, o, Mode::EX, r(0, 9), true));
    let high = queued(&lock(&s, b"f", 3, o, Mode::EX, r(100, 109), true));
    let resp = s.unlock(b"f", 1, o, r(0, 9)).unwrap();
    assert_eq!(grants(&resp), vec![low]);
    // A partial unlock inside a wider waiter's range does not let it in.
    let wide = queued(&lock(&s, b"f", 4, o, Mode::PR, r(95, 120), true));
    let resp = s.unlock(b"f", 1, o, r(100, 104)).unwrap();
    assert!(grants(&resp).is_empty());
    let resp = s.unlock(b"f", 1, o, Range::WHOLE).unwrap();
    assert_eq!(grants(&resp), vec![high]);
    let resp = s.unlock(b"f", 3, o, Range::WHOLE).unwrap();
    assert_eq!(grants(&resp), vec![wide]);
}

#[test]
fn cancel_lets_the_next_waiter_in() {
    let s = LockSpace::default();
    let o = LockKind::Ofd;
    granted(&lock(&s, b"f", 1, o, Mode::PR, r(0, 9), false));
    let writer = queued(&lock(&s, b"f", 2, o, Mode::EX, r(0, 9), true));
    let reader = queued(&lock(&s, b"f", 3, o, Mode::PR, r(0, 9), true));
    let resp = s.cancel(b"f", o, writer).unwrap();
    assert_eq!(resp.outcome, Outcome::Done);
    assert_eq!(grants(&resp), vec![reader]);
    assert_eq!(s.stats().waiters, 0);
    // The reader was granted: cancelling it now (a cancel racing the grant)
    // says so, and changes nothing.
    let late = s.cancel(b"f", o, reader).unwrap();
    assert_eq!(late.outcome, Outcome::NotQueued);
    assert!(late.effects.is_empty());
    assert_eq!(s.stats().locks, 2);
}

#[test]
fn flock_conversion_is_not_atomic_like_linux() {
    // flock(2): "the existing lock is first removed, and then a new lock is
    // established"; a failed non-blocking upgrade leaves nothing held.
    let s = LockSpace::default();
    let f = LockKind::Flock;
    granted(&lock(&s, b"f", 1, f, Mode::PR, Range::WHOLE, false));
    granted(&lock(&s, b"f", 2, f, Mode::PR, Range::WHOLE, false));
    assert_eq!(lock(&s, b"f", 1, f, Mode::EX, Range::WHOLE, false).outcome, Outcome::WouldBlock);
    assert_eq!(s.locks(b"f", Namespace::Flock).unwrap().len(), 1);
    // flock and POSIX locks on one name do not interact.
    granted(&lock(&s, b"f", 3, LockKind::Posix, Mode::EX, Range::WHOLE, false));
}

#[test]
fn dlm_modes_conversions_and_callbacks() {
    let s = LockSpace::default();
    let d = LockKind::Dlm;
    let a = granted(&lock(&s, b"res", 1, d, Mode::PR, Range::WHOLE, false)).lock.unwrap();
    let b = granted(&lock(&s, b"res", 2, d, Mode::CR, Range::WHOLE, false)).lock.unwrap();
    // PW conflicts with PR, not CR: one blocking callback, to the PR holder.
    let resp = lock(&s, b"res", 3, d, Mode::PW, Range::WHOLE, true);
    let pw = queued(&resp);
    assert_eq!(resp.effects, vec![Effect::Blocking { lock: a, owner: 1, held: Mode::PR, wanted: Mode::PW }]);
    // No-queue: a CW request is compatible with what is held but would
    // overtake the queued PW it conflicts with: refused.
    assert_eq!(lock(&s, b"res", 4, d, Mode::CW, Range::WHOLE, false).outcome, Outcome::WouldBlock);
    // A compatible no-queue request (NL) is granted.
    granted(&lock(&s, b"res", 4, d, Mode::NL, Range::WHOLE, false));
    // Down-convert PR -> NL: granted at once, and the PW waiter goes.
    let resp = s.dlm_convert(b"res", 1, a, Mode::NL, false, None).unwrap();
    assert!(matches!(resp.outcome, Outcome::Granted(_)));
    assert_eq!(grants(&resp), vec![pw]);
    let Some(Effect::Granted { grant: Grant { lock: Some(handle3), fence: 1, .. }, owner: 3, .. }) =
        resp.effects.first()
    else {
        panic!("the PW grant carries its handle and the first write fence: {resp:?}")
    };
    // A new PR request queues behind PW...
    let newer = queued(&lock(&s, b"res", 5, d, Mode::PR, Range::WHOLE, true));
    // ...and an up-conversion CR -> EX queues too, but ahead of it.
    let up = queued(&s.dlm_convert(b"res", 2, b, Mode::EX, true, None).unwrap());
    let resp = s.dlm_unlock(b"res", 3, *handle3, None).unwrap();
    assert_eq!(grants(&resp), vec![up]);
    let resp = s.dlm_unlock(b"res", 2, b, None).unwrap();
    assert_eq!(grants(&resp), vec![newer]);
    // Only the owner may release its lock.
    assert!(matches!(s.dlm_unlock(b"res", 9, a, None), Err(LockError::NoSuchLock(_))));
}

#[test]
fn dlm_value_block_and_fencing_token() {
    let s = LockSpace::default();
    let d = LockKind::Dlm;
    let g1 = granted(&lock(&s, b"res", 1, d, Mode::EX, Range::WHOLE, false));
    assert_eq!(g1.fence, 1);
    assert_eq!(g1.lvb, None);
    // The value block is written when a PW/EX holder releases with one.
    s.dlm_unlock(b"res", 1, g1.lock.unwrap(), Some(b"v1")).unwrap();
    let g2 = granted(&lock(&s, b"res", 2, d, Mode::PR, Range::WHOLE, false));
    assert_eq!(g2.lvb.as_deref(), Some(&b"v1"[..]));
    assert_eq!(g2.fence, 1, "a read grant does not move the token");
    // A PR holder cannot write it.
    s.dlm_unlock(b"res", 2, g2.lock.unwrap(), Some(b"nope")).unwrap();
    let g3 = granted(&lock(&s, b"res", 3, d, Mode::PW, Range::WHOLE, false));
    assert_eq!(g3.lvb.as_deref(), Some(&b"v1"[..]));
    assert_eq!(g3.fence, 2, "every write grant moves the token on");
    // Down-conversion from PW writes it too.
    s.dlm_convert(b"res", 3, g3.lock.unwrap(), Mode::CR, false, Some(b"v2")).unwrap();
    let g4 = granted(&lock(&s, b"res", 4, d, Mode::PR, Range::WHOLE, false));
    assert_eq!(g4.lvb.as_deref(), Some(&b"v2"[..]));
    assert_eq!(g4.fence, 2);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = LockSpace::default();
    let long = vec![b'x'; 257];
    assert!(matches!(
        s.lock(&req(&long, 1, LockKind::Ofd, Mode::EX, r(0, 0), false)),
        Err(LockError::NameTooLong(257))
    ));
    assert!(matches!(s.lock(&req(b"f", 1, LockKind::Ofd, Mode::PW, r(0, 0), false)), Err(LockError::InvalidMode(_))));
    assert!(matches!(s.lock(&req(b"f", 1, LockKind::Flock, Mode::EX, r(0, 0), false)), Err(LockError::FlockRange(_))));
    assert!(Range::new(5, 4).is_err() && Range::new(0, OFFSET_MAX + 1).is_err());
    assert!(matches!(s.dlm_unlock(b"f", 1, 12345, None), Err(LockError::NoSuchLock(12345))));
    assert!(matches!(s.dlm_unlock(b"f", 1, 1, Some(&[0; 65])), Err(LockError::LvbTooLong(65))));
    assert_eq!(s.stats().locks, 0);
    assert_eq!(s.stats().resources, 0);
    // Unlocking what is not held is not an error.
    assert_eq!(s.unlock(b"f", 1, LockKind::Posix, r(0, 9)).unwrap().outcome, Outcome::Done);
}

#[test]
fn reclaim_frees_idle_resources_after_the_grace_period() {
    let s = LockSpace::new(Config { grace_epochs: 2 });
    for i in 0..100u64 {
        granted(&lock(&s, &i.to_le_bytes(), 1, LockKind::Ofd, Mode::EX, Range::WHOLE, false));
    }
    for i in 0..50u64 {
        s.unlock(&i.to_le_bytes(), 1, LockKind::Ofd, Range::WHOLE).unwrap();
    }
    assert_eq!(s.stats().resources, 100);
    assert_eq!(s.reclaim(1000), 0, "still within the grace period");
    // A resource that comes back into use is not freed.
    granted(&lock(&s, &0u64.to_le_bytes(), 1, LockKind::Ofd, Mode::EX, Range::WHOLE, false));
    let mut freed = 0;
    for _ in 0..3 {
        freed += s.reclaim(1000);
    }
    assert_eq!(freed, 49);
    assert_eq!(s.stats().resources, 51);
    assert_eq!(s.stats().idle_queued, 0);
    // Budget bounds the work of one call.
    for i in 50..100u64 {
        s.unlock(&i.to_le_bytes(), 1, LockKind::Ofd, Range::WHOLE).unwrap();
    }
    s.reclaim(0);
    s.reclaim(0);
    s.reclaim(0);
    assert_eq!(s.reclaim(10), 10);
}

#[test]
fn holds_says_whether_an_owner_has_any_lock_left() {
    let s = LockSpace::default();
    let o = LockKind::Posix;
    assert!(!s.holds(b"f", 1, o).unwrap(), "no resource yet");
    granted(&lock(&s, b"f", 1, o, Mode::EX, r(0, 9), false));
    s.unlock(b"f", 1, o, r(0, 4)).unwrap();
    assert!(s.holds(b"f", 1, o).unwrap(), "bytes 5-9 are still held");
    assert!(!s.holds(b"f", 2, o).unwrap());
    assert_eq!(s.lock_count(b"f", o.namespace()).unwrap(), 1);
    s.unlock(b"f", 1, o, r(5, 9)).unwrap();
    assert!(!s.holds(b"f", 1, o).unwrap());
    assert_eq!(s.lock_count(b"f", o.namespace()).unwrap(), 0);
}
