//! Requests mapped onto the engine: each answered at once, the engine's
//! effects (grants to push, blocking callbacks) carried out, and what a
//! session holds or waits for tracked, so its end gives it all back.
//!
//! Costs: each request is one engine call, O(log n + k) in the locks of
//! its resource (see `interlock-core`), plus O(1) expected in the session
//! table.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use interlock_core::{Effect, LockKind, LockRequest, Mode, Namespace, Outcome, Range};
use interlock_proto::{self as proto, GrantInfo, Kind, LockInfo, Op, Reply, ResourceInfo, ServerMsg, Target, owner};

use crate::session::{Delivered, Raced, Track};
use crate::{Inner, metrics};

/// Gives back one thing a session held or waited for: releases the locks,
/// withdraws the wait (releasing its grant if the grant won the race).
pub(crate) fn release_track(inner: &Inner, t: Track) {
    let resp = match &t {
        Track::Owned { resource, kind, owner } => inner.space.release_owner(resource, *owner, *kind),
        Track::Dlm { resource, owner, handle } => inner.space.dlm_unlock(resource, *owner, *handle, None),
        Track::Wait { resource, kind, wait, owner } => {
            if let Ok(resp) = inner.space.cancel(resource, *kind, *wait) {
                let granted = resp.outcome == Outcome::NotQueued;
                deliver(inner, resource, resp.effects);
                if granted {
                    let r = Raced { resource: resource.clone(), kind: *kind, owner: *owner, range: None };
                    if let Some((r, g)) = inner.sessions.raced(*wait, r) {
                        release_raced(inner, r, g);
                    }
                }
            }
            return;
        }
    };
    if let Ok(resp) = resp {
        deliver(inner, t.resource(), resp.effects);
    }
}

/// Releases a lock granted to a wait that was withdrawn (see [`Raced`]),
/// so that no grant is orphaned.
fn release_raced(inner: &Inner, r: Raced, grant: GrantInfo) {
    let resp = match (r.kind, grant.handle, r.range) {
        (LockKind::Dlm, Some(handle), _) => inner.space.dlm_unlock(&r.resource, r.owner, handle, None),
        (_, _, Some(range)) => inner.space.unlock(&r.resource, r.owner, r.kind, range),
        _ => inner.space.release_owner(&r.resource, r.owner, r.kind),
    };
    if let Ok(resp) = resp {
        deliver(inner, &r.resource, resp.effects);
    }
}

fn mode(m: u8) -> Result<Mode, String> {
    Mode::ALL.get(m as usize).copied().ok_or_else(|| format!("invalid mode {m}: modes are 0 (NL) to 5 (EX)"))
}

/// Carries out the engine's effects: grants pushed to the sessions whose
/// requests waited, blocking callbacks to DLM holders.
pub(crate) fn deliver(inner: &Inner, resource: &[u8], effects: Vec<Effect>) {
    for e in effects {
        match e {
            Effect::Granted { wait, grant, .. } => {
                if let Some(m) = &inner.metrics {
                    m.granted();
                }
                let info = inner.grant_info(grant);
                match inner.sessions.granted(wait, info, Instant::now(), |t| held_count(inner, t)) {
                    Delivered::Kick(wire) => wire.kick(),
                    Delivered::Release(r, g) => release_raced(inner, r, g),
                    Delivered::Kept => {}
                }
            }
            Effect::Blocking { lock, owner, held, wanted } => {
                let msg = ServerMsg::Blocking {
                    resource: resource.to_vec(),
                    handle: lock,
                    owner: owner as u32,
                    held: held as u8,
                    wanted: wanted as u8,
                };
                if let Some(wire) = inner.sessions.wire(owner::session(owner)) {
                    wire.append(&msg);
                    wire.kick();
                }
            }
        }
    }
}

/// One request, answered at once.
///
/// Renewals are not counted in `requests`: they are the protocol's
/// keep-alives, and a watcher of the request rate would see its own.
/// Serves one request: its answer, or `None` when the answer will be
/// pushed into the session's stream later (a namespace change whose
/// record is not yet durable, a changelog read that waits).
pub(crate) fn handle(inner: &Inner, sid: u64, id: u64, op: Op) -> Option<Reply> {
    if !matches!(op, Op::Renew { .. }) {
        inner.requests.fetch_add(1, Ordering::Relaxed);
    }
    let index = metrics::op_index(&op);
    let serve = || match op {
        Op::Meta { cred, op, once } => crate::meta::request(inner, sid, id, &cred, op, once),
        Op::Changelog(op) => crate::meta::changelog(inner, sid, id, op),
        Op::Evict { session } => evict(inner, sid, id, session),
        op => Some(execute(inner, sid, id, op).unwrap_or_else(Reply::Error)),
    };
    match &inner.metrics {
        None => serve(),
        Some(m) => m.request(index, serve),
    }
}

/// The most locks a request of `kind` can add to its session: a POSIX or
/// OFD lock inside another of another mode splits it in three.
fn most_added(kind: Kind) -> usize {
    match kind {
        Kind::Posix | Kind::Ofd => 2,
        Kind::Flock | Kind::Dlm => 1,
    }
}

/// How many locks a track stands for now, by the engine's count. O(1)
/// expected.
fn held_count(inner: &Inner, t: &Track) -> usize {
    match t {
        Track::Owned { resource, kind, owner } => inner.space.owner_lock_count(resource, *owner, *kind).unwrap_or(0),
        Track::Dlm { .. } => 1,
        Track::Wait { .. } => 0,
    }
}

/// What the recovery window after a restart does to a request: only
/// reclaims, releases and status go through while it lasts; a request
/// that waits waits for its end, one that does not is refused at once.
pub(crate) enum Gate {
    Go,
    /// Served when the window ends, apart from the connection, which
    /// reads on (see [`later`]).
    Later(Duration),
    Refuse(Duration),
}

/// Serves request `id` of session `sid` (one that waits: a lock test, a
/// lock or conversion that waits) when the recovery window ends, `left`
/// from now, from a task of its own, and pushes its answer; the
/// connection reads on meanwhile. Before, the connection slept on it, and
/// every later request of the client with it: a mount's every call, and
/// the reclaims that came after it, which then came too late. Until it is
/// served it is listed in `Inner::deferred`, so that a cancel of it takes
/// it off rather than find no wait to withdraw (and the wait be made
/// after, for no one). O(1).
pub(crate) fn later(inner: &Inner, sid: u64, id: u64, op: Op, left: Duration) {
    let Some(server) = inner.me.upgrade() else { return };
    server.deferred.lock().insert((sid, id));
    tokio::spawn(async move {
        tokio::time::sleep(left).await;
        // Served under the list's lock: a cancel finds the request listed
        // or its wait made.
        let mut deferred = server.deferred.lock();
        if !deferred.remove(&(sid, id)) {
            return;
        }
        let reply = handle(&server, sid, id, op);
        drop(deferred);
        if let Some(reply) = reply {
            crate::durable::push(&server.sessions, sid, id, reply);
        }
    });
}

pub(crate) fn recovery_gate(inner: &Inner, op: &Op) -> Gate {
    let Some(left) = inner.recovering() else { return Gate::Go };
    match op {
        Op::Lock { reclaim: true, .. }
        | Op::Unlock { .. }
        | Op::Close { .. }
        | Op::Cancel { .. }
        | Op::DlmUnlock { .. }
        | Op::Renew { .. }
        | Op::Status
        | Op::Inspect { .. }
        | Op::Evict { .. }
        | Op::Meta { .. }
        | Op::Changelog(_)
        | Op::Bye => Gate::Go,
        Op::Lock { wait: false, .. } | Op::DlmConvert { wait: false, .. } => Gate::Refuse(left),
        Op::Lock { .. } | Op::DlmConvert { .. } | Op::Test { .. } => Gate::Later(left),
    }
}

/// The reply to a lock or conversion request of `owner` on `target`:
/// `on_grant` records a grant made at once; a request that waits is
/// recorded as the session's (or answered `Granted` if its grant came
/// first, from another connection).
fn lock_reply(
    inner: &Inner,
    sid: u64,
    id: u64,
    outcome: Outcome,
    target: &Target,
    owner: u64,
    on_grant: impl FnOnce(&GrantInfo) -> Result<(), Reply>,
) -> Reply {
    match outcome {
        Outcome::Granted(g) => {
            if let Some(m) = &inner.metrics {
                m.granted();
            }
            let info = inner.grant_info(g);
            match on_grant(&info) {
                Ok(()) => Reply::Granted(info),
                Err(reply) => reply,
            }
        }
        Outcome::Queued(wait) => {
            let track = Track::Wait { resource: target.resource.clone(), kind: target.kind.into(), wait, owner };
            match inner.sessions.queued((sid, id), track, target, owner, Instant::now(), |t| held_count(inner, t)) {
                Ok(Some(info)) => Reply::Granted(info),
                Ok(None) => Reply::Queued,
                Err(gone) => session_gone(inner, gone),
            }
        }
        Outcome::WouldBlock => Reply::WouldBlock,
        Outcome::Deadlock => Reply::Deadlock,
        Outcome::Done | Outcome::NotQueued => Reply::Done,
    }
}

/// A request raced the end of its session (the lease ran out while it
/// was read): what it just got is given back at once, or no one would.
fn session_gone(inner: &Inner, t: Track) -> Reply {
    release_track(inner, t);
    Reply::Error("session ended".into())
}

fn range_of(t: &Target) -> Result<Range, String> {
    Range::new(t.start, t.end).map_err(|e| e.to_string())
}

fn execute(inner: &Inner, sid: u64, id: u64, op: Op) -> Result<Reply, String> {
    let err = |e: interlock_core::LockError| e.to_string();
    match op {
        Op::Lock { target, mode: m, wait, reclaim } => {
            if reclaim && inner.recovering().is_none() {
                return Err("reclaim refused: the server is not in a recovery window (a lock is reclaimed only \
                            after a restart, while no one else can have taken it)"
                    .into());
            }
            let k = LockKind::from(target.kind);
            let owner = owner::id(target.kind, sid, target.owner);
            if let Err(why) = inner.sessions.check_limits(
                sid,
                &inner.config.limits,
                (wait, most_added(target.kind)),
                inner.space.held_and_queued(),
            ) {
                return Ok(Reply::Limit(why));
            }
            let req = LockRequest {
                resource: &target.resource,
                owner,
                kind: k,
                mode: mode(m)?,
                range: range_of(&target)?,
                wait,
            };
            let resp = inner.space.lock(&req).map_err(err)?;
            let reply = lock_reply(inner, sid, id, resp.outcome, &target, owner, |info| {
                inner
                    .sessions
                    .set_held(sid, Track::held(&target, owner, info.handle), Instant::now(), |t| held_count(inner, t))
                    .map_err(|gone| session_gone(inner, gone))
            });
            deliver(inner, &target.resource, resp.effects);
            Ok(reply)
        }
        Op::Unlock { target } => {
            let (owner, k) = (owner::id(target.kind, sid, target.owner), LockKind::from(target.kind));
            // Unlocking the middle of a range splits it in two.
            if let Err(why) =
                inner.sessions.check_limits(sid, &inner.config.limits, (false, 1), inner.space.held_and_queued())
            {
                return Ok(Reply::Limit(why));
            }
            let resp = inner.space.unlock(&target.resource, owner, k, range_of(&target)?).map_err(err)?;
            deliver(inner, &target.resource, resp.effects);
            let track = Track::Owned { resource: target.resource, kind: k, owner };
            let _ = inner.sessions.set_held(sid, track, Instant::now(), |t| held_count(inner, t));
            Ok(Reply::Done)
        }
        Op::Test { target, mode: m } => {
            let c = inner
                .space
                .test(
                    &target.resource,
                    owner::id(target.kind, sid, target.owner),
                    LockKind::from(target.kind),
                    mode(m)?,
                    range_of(&target)?,
                )
                .map_err(err)?;
            Ok(Reply::Conflict(c.map(|c| proto::ConflictInfo {
                owner: c.owner,
                mode: c.mode as u8,
                start: c.range.start(),
                end: c.range.end(),
            })))
        }
        Op::Close { resource, kind: k, owner } => {
            let (owner, k) = (owner::id(k, sid, owner), LockKind::from(k));
            let resp = inner.space.release_owner(&resource, owner, k).map_err(err)?;
            let track = Track::Owned { resource: resource.clone(), kind: k, owner };
            let _ = inner.sessions.set_held(sid, track, Instant::now(), |t| held_count(inner, t));
            deliver(inner, &resource, resp.effects);
            Ok(Reply::Done)
        }
        Op::Cancel { request } => {
            // A wait made in the recovery window and not yet served is
            // taken off its list (see `later`); held meanwhile, so that
            // one being served now is seen as the wait it made.
            let mut deferred = inner.deferred.lock();
            if deferred.remove(&(sid, request)) {
                return Ok(Reply::Done);
            }
            if let Some((Track::Wait { resource, kind, wait, owner }, range)) = inner.sessions.take_wait(sid, request) {
                let resp = inner.space.cancel(&resource, kind, wait).map_err(err)?;
                let granted = resp.outcome == Outcome::NotQueued;
                deliver(inner, &resource, resp.effects);
                if granted {
                    // The grant won the race (it was not yet reported, or
                    // it would have been pushed ahead of this reply): the
                    // client gave up the request, so it is given back here.
                    let r = Raced { resource, kind, owner, range };
                    if let Some((r, g)) = inner.sessions.raced(wait, r) {
                        release_raced(inner, r, g);
                    }
                }
            }
            drop(deferred);
            Ok(Reply::Done)
        }
        Op::DlmUnlock { resource, owner, handle, lvb } => {
            let owner = owner::id(Kind::Dlm, sid, owner);
            let resp = inner.space.dlm_unlock(&resource, owner, handle, lvb.as_deref()).map_err(err)?;
            let _ = inner.sessions.set_held(
                sid,
                Track::Dlm { resource: resource.clone(), owner, handle },
                Instant::now(),
                |_| 0,
            );
            deliver(inner, &resource, resp.effects);
            Ok(Reply::Done)
        }
        Op::DlmConvert { resource, owner, handle, mode: m, wait, lvb } => {
            let owner_full = owner::id(Kind::Dlm, sid, owner);
            let resp =
                inner.space.dlm_convert(&resource, owner_full, handle, mode(m)?, wait, lvb.as_deref()).map_err(err)?;
            // The lock is tracked already: a granted conversion changes
            // only its mode.
            let target = Target { resource, kind: Kind::Dlm, owner, start: 0, end: 0 };
            let reply = lock_reply(inner, sid, id, resp.outcome, &target, owner_full, |_| Ok(()));
            deliver(inner, &target.resource, resp.effects);
            Ok(reply)
        }
        Op::Renew { received } => inner.sessions.ack(sid, received).map(|()| Reply::Done),
        Op::Status => Ok(Reply::Status(Box::new(inner.status()))),
        Op::Inspect { resource } => inspect(inner, &resource, Instant::now()).map(Reply::Resource).map_err(err),
        Op::Bye => Ok(Reply::Done),
        Op::Meta { .. } | Op::Changelog(_) | Op::Evict { .. } => Err("a request reached the wrong dispatch".into()),
    }
}

/// Ends session `target` at an operator's word (request `id` of session
/// `sid`), once the evict is on disk: its client, if cut off now, may
/// otherwise reclaim after a crash of the server the locks the evict
/// gives to others (see `datadir`). On a blocking thread, which waits for
/// the write and its syncs; the answer is pushed. A write that fails
/// refuses the evict. O(1) here; the end of the session is O(what it
/// held).
fn evict(inner: &Inner, sid: u64, id: u64, target: u64) -> Option<Reply> {
    let gone = move || Reply::Error(format!("no session {target} (it ended, or never was)"));
    if inner.sessions.wire(target).is_none() {
        return Some(gone());
    }
    // Counted until answered: a clean stop waits for it (`stop`).
    let task = crate::stop::offload(inner.me.upgrade()?);
    tokio::task::spawn_blocking(move || {
        let server = task.server();
        let reply = match server.evictions.record(target, server.config.lease, Instant::now()) {
            Err(e) => Reply::Error(format!("evict refused: it could not be recorded ({e}); the session goes on")),
            // Its lease ran out meanwhile.
            Ok(()) if !crate::end_session(server, target, crate::origins::Ending::Lapsed) => gone(),
            Ok(()) => {
                tracing::warn!(session = target, by = sid, "session evicted by an operator");
                if let Some(m) = &server.metrics {
                    m.evicted();
                }
                Reply::Done
            }
        };
        crate::durable::push(&server.sessions, sid, id, reply);
    });
    None
}

/// Who holds and who waits for `resource`, in every lock map, at `now`.
/// O(n log n) in the resource's locks (its lock list is sorted), plus
/// O(1) per listed entry in the session table.
fn inspect(inner: &Inner, resource: &[u8], now: Instant) -> Result<ResourceInfo, interlock_core::LockError> {
    let info = |owner: u64, mode: Mode, range: Range, since: Option<Instant>| LockInfo {
        session: owner::session(owner),
        kind: owner::kind(owner),
        owner: owner::number(owner),
        mode: mode as u8,
        start: range.start(),
        end: range.end(),
        for_ms: since.map_or(0, |t| now.saturating_duration_since(t).as_millis() as u64),
    };
    let mut out = ResourceInfo::default();
    for ns in [Namespace::Record, Namespace::Flock, Namespace::Dlm] {
        let held = inner.space.locks(resource, ns)?;
        out.holders_total += held.len() as u64;
        for h in held.into_iter().take(ResourceInfo::MAX_LISTED - out.holders.len()) {
            let kind = owner::kind(h.owner);
            let t = match kind {
                Kind::Dlm => Track::Dlm { resource: resource.to_vec(), owner: h.owner, handle: h.handle },
                k => Track::Owned { resource: resource.to_vec(), kind: k.into(), owner: h.owner },
            };
            let since = inner.sessions.held_since(owner::session(h.owner), &t);
            out.holders.push(info(h.owner, h.mode, h.range, since));
        }
        let waiting = inner.space.waiting(resource, ns)?;
        out.waiters_total += waiting.len() as u64;
        for w in waiting.into_iter().take(ResourceInfo::MAX_LISTED - out.waiters.len()) {
            out.waiters.push(info(w.owner, w.mode, w.range, inner.sessions.waiting_since(w.id)));
        }
    }
    Ok(out)
}
