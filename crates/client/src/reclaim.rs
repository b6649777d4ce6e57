//! What becomes of the client's locks when its session ends without
//! being resumed: after a server restart within the lease, each is
//! claimed back ([`reclaim`]); otherwise each is reported lost
//! ([`lose_all`]).
//!
//! A reclaim's answer is taken in as it is read ([`answered`], called by
//! the connection's dispatch), in the session that asked for it, before
//! a later session can begin. A reclaim that gets no answer (the server
//! died again, or stopped before reading it) is left to the next
//! session: a reclaim again if that session can, a loss otherwise; it is
//! not a refusal. Until session 53 the answers were awaited on a task,
//! and a record lock whose reclaim went unanswered was reported lost,
//! though the next server let the client reclaim it (and, reclaimed
//! meanwhile, it stayed held by the session with no one to release it);
//! a refusal seen only after the next session began was ignored.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use interlock_core::{HeldLock, Namespace};
use interlock_proto::{Kind, Op, Reply, Target, owner};

use crate::dlm::{DlmLock, Reclaimed};
use crate::tables::ReplyTo;
use crate::{Inner, LostLock, local_effects};

/// A reclaim on its way: the lock it claims back, and for a DLM lock its
/// name and the session (generation) that asked.
pub(crate) struct Reclaim {
    target: Target,
    dlm: Option<(u64, u64)>,
}

/// Each kind's POSIX, OFD and flock locks the client holds on each
/// resource (from the local table).
fn held_records(inner: &Inner) -> Vec<(Kind, Vec<u8>, Vec<HeldLock>)> {
    let t = inner.tables.lock();
    let mut records = Vec::new();
    for (kind, resource) in &t.local_resources {
        let ns = if *kind == Kind::Flock { Namespace::Flock } else { Namespace::Record };
        // POSIX and OFD locks share a namespace: each kind takes its own.
        let mine = inner.local.locks(resource, ns).unwrap_or_default();
        let mine = mine.into_iter().filter(|l| owner::kind(l.owner) == *kind).collect();
        records.push((*kind, resource.clone(), mine));
    }
    records
}

/// The session ended without the server vouching for our locks: each is
/// reported lost and dropped from the client's tables (local owners
/// waiting behind a lost lock go on to the server).
pub(crate) fn lose_all(inner: &Inner) {
    let mut lost = Vec::new();
    for (kind, resource, locks) in held_records(inner) {
        let mut owners: Vec<u32> = locks.iter().map(|l| owner::number(l.owner)).collect();
        owners.dedup();
        for number in owners {
            lose_record(inner, kind, &resource, number);
            lost.push(LostLock { resource: resource.clone(), kind, owner: number, handle: None });
        }
    }
    let dlm = {
        let mut t = inner.tables.lock();
        t.local_resources.clear();
        t.dlm.take_all()
    };
    // An unlock or convert waiting for a reclaim's answer learns that
    // the lock is gone.
    inner.reclaim_answered.notify_waiters();
    for (name, lock) in dlm {
        lost.push(LostLock { resource: lock.resource, kind: Kind::Dlm, owner: lock.owner, handle: Some(name) });
    }
    inner.losses.report(lost);
}

/// Drops an owner's locks on a resource from the local table.
fn lose_record(inner: &Inner, kind: Kind, resource: &[u8], number: u32) {
    let local = owner::id(kind, 0, number);
    if let Ok(resp) = inner.local.release_owner(resource, local, kind.into()) {
        local_effects(inner, resp.effects);
    }
}

/// After a server restart within our lease: claim back every lock we
/// hold, each answered ([`answered`]); a refused reclaim (someone else
/// holds it now, or the window closed) is a lost lock. The caller then
/// asks again for what we waited for: during the recovery window the
/// server holds back a connection's new requests, and the reclaims
/// behind them with them. The DLM locks were marked as reclaimed in this
/// session (`generation`) as it began. O(locks held).
pub(crate) fn reclaim(inner: &Arc<Inner>, generation: u64) {
    for (kind, resource, locks) in held_records(inner) {
        for l in locks {
            let target = Target {
                resource: resource.clone(),
                kind,
                owner: owner::number(l.owner),
                start: l.range.start(),
                end: l.range.end(),
            };
            reclaim_one(inner, target, l.mode as u8, None);
        }
    }
    let dlm = inner.tables.lock().dlm.to_reclaim(generation);
    for (name, lock) in dlm {
        let DlmLock { resource, owner, mode, start, end, .. } = lock;
        let target = Target { resource, kind: Kind::Dlm, owner, start, end };
        reclaim_one(inner, target, mode, Some((name, generation)));
    }
}

/// Sends one reclaim, its answer routed to [`answered`]. Not sent if the
/// session is already over: the next one sees to the lock.
fn reclaim_one(inner: &Inner, target: Target, mode: u8, dlm: Option<(u64, u64)>) {
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    let op = Op::Lock { target: target.clone(), mode, wait: false, reclaim: true };
    let _ = inner.tables.lock().list(&inner.outbox, id, &op, ReplyTo::Reclaim(Reclaim { target, dlm }));
}

/// A reclaim's answer, read in the session that asked for it: a granted
/// DLM lock moves to its new server handle, and its held-back converts
/// go; a refused lock is reported lost, then its converts fail. O(1)
/// but for the converts.
pub(crate) fn answered(inner: &Inner, reclaim: Reclaim, reply: Reply) {
    let Reclaim { target, dlm } = reclaim;
    let server = match &reply {
        Reply::Granted(g) => Some(g.handle),
        _ => None,
    };
    // The lock lost (a DLM lock's name), and its converts to fail once
    // the loss is reported.
    let (lost, fail) = match (dlm, server) {
        (Some((name, generation)), server) => {
            let mut t = inner.tables.lock();
            // None if it was lost meanwhile.
            let out = match t.dlm.reclaimed(name, generation, server.flatten()) {
                Some(Reclaimed::Moved { now, converts }) => {
                    t.converts_reclaimed(&inner.outbox, converts, Some(now), generation);
                    (None, None)
                }
                Some(Reclaimed::Lost { converts, .. }) => (Some(Some(name)), Some((converts, generation))),
                None => (None, None),
            };
            drop(t);
            out
        }
        (None, Some(_)) => (None, None),
        (None, None) => {
            lose_record(inner, target.kind, &target.resource, target.owner);
            (Some(None), None)
        }
    };
    if let Some(handle) = lost {
        tracing::warn!(resource = %String::from_utf8_lossy(&target.resource), "reclaim refused");
        inner.losses.report([LostLock { resource: target.resource, kind: target.kind, owner: target.owner, handle }]);
    }
    // Callers learn of a lost lock after it is reported.
    if let Some((converts, generation)) = fail {
        inner.tables.lock().converts_reclaimed(&inner.outbox, converts, None, generation);
    }
    if dlm.is_some() {
        inner.reclaim_answered.notify_waiters();
    }
}
