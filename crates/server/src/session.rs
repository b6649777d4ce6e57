//! Sessions: what each client holds and waits for, its connection, its
//! lease, its secret.
//!
//! One mutex guards the table; it is held only for map updates and O(1)
//! engine look-ups (never across I/O or an engine call that changes
//! locks). Time is passed in (`now`), so leases are tested without sleeps.
//!
//! Resuming a session takes its secret (128 random bits, issued in the
//! welcome): a hello that names a live session with the wrong secret is
//! refused and the session is untouched. Nothing the server discloses (a
//! conflict names the holder's session) lets another client act on it.

use foldhash::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use interlock_core::{LockKind, Range, WaitId};
use interlock_proto::owner::SESSION_BITS;
use interlock_proto::{GrantInfo, Kind, Secret, ServerMsg, Target};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use crate::budget::Budget;
use crate::wire::Wire;
use crate::{Limits, Shared};

/// Something a session must give back when it ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Track {
    /// Locks of an owner on a resource (POSIX, OFD, flock).
    Owned { resource: Vec<u8>, kind: LockKind, owner: u64 },
    /// A DLM lock.
    Dlm { resource: Vec<u8>, owner: u64, handle: u64 },
    /// A queued request of `owner`.
    Wait { resource: Vec<u8>, kind: LockKind, wait: WaitId, owner: u64 },
}

impl Track {
    /// What a grant of `target` to `owner` leaves to give back.
    pub fn held(target: &Target, owner: u64, handle: Option<u64>) -> Track {
        match (target.kind, handle) {
            (Kind::Dlm, Some(handle)) => Track::Dlm { resource: target.resource.clone(), owner, handle },
            (k, _) => Track::Owned { resource: target.resource.clone(), kind: k.into(), owner },
        }
    }

    pub fn resource(&self) -> &[u8] {
        match self {
            Track::Owned { resource, .. } | Track::Dlm { resource, .. } | Track::Wait { resource, .. } => resource,
        }
    }
}

struct Waiting {
    track: Track,
    target: Target,
    owner: u64,
    /// When it was queued.
    since: Instant,
}

/// What a [`Track`] holds: the engine's count of locks in it, and since
/// when it has held any.
struct Holding {
    count: usize,
    since: Instant,
}

/// A withdrawn wait that the engine had granted just before the withdrawal
/// (its cancel answered `NotQueued`): the lock is released as soon as its
/// grant is reported, which may be before or after the withdrawal sees it.
/// The server gives it back itself: the client abandoned the request, and
/// a grant pushed after the cancel's reply would find it forgotten.
pub(crate) struct Raced {
    pub resource: Vec<u8>,
    pub kind: LockKind,
    pub owner: u64,
    /// The bytes the request asked for; `None`: every lock of the owner
    /// here (its session ended).
    pub range: Option<Range>,
}

struct Session {
    /// What resuming it takes.
    secret: Secret,
    /// Its stream to the client, across connections.
    wire: Arc<Wire>,
    /// Held by the connection that serves the session's requests, for its
    /// life: so one connection at a time does. It counts the bytes of the
    /// client's stream served (see [`Attached`]).
    turn: Arc<tokio::sync::Mutex<u64>>,
    /// Cancels the connection that serves the session: a newer one took
    /// over, or the session ended.
    stop: CancellationToken,
    last_seen: Instant,
    /// What it holds, with the engine's count of locks in each (an owner's
    /// ranges on a resource after merges and splits; 1 for a DLM lock).
    held: HashMap<Track, Holding>,
    /// The sum of the counts in `held`: what `max_locks` bounds.
    locks: usize,
    /// Request id -> its queued wait.
    waits: HashMap<u64, Waiting>,
}

impl Session {
    /// Sets what `t` holds to `count` locks at `now` (0: nothing,
    /// forgotten).
    fn set_count(&mut self, t: Track, count: usize, now: Instant) {
        let old = if count == 0 {
            self.held.remove(&t).map_or(0, |h| h.count)
        } else {
            let h = self.held.entry(t).or_insert(Holding { count: 0, since: now });
            std::mem::replace(&mut h.count, count)
        };
        self.locks = self.locks + count - old;
    }
}

/// A hello named a live session with the wrong secret.
#[derive(Debug)]
pub(crate) struct BadResume;

#[derive(Default)]
struct State {
    sessions: HashMap<u64, Session>,
    /// Engine wait id -> (session, request id).
    waits: HashMap<WaitId, (u64, u64)>,
    /// Grants that the engine reported before the request's `Queued` was
    /// recorded (another connection's unlock raced it), or before the
    /// withdrawal of their wait claimed them.
    early: HashMap<WaitId, GrantInfo>,
    /// Withdrawn waits whose grant has yet to be reported.
    raced: HashMap<WaitId, Raced>,
    counter: u64,
}

#[derive(Default)]
pub(crate) struct Sessions {
    state: Shared<State>,
    ids: RandomState,
    /// What the sessions' streams may take together.
    budget: Arc<Budget>,
}

impl Sessions {
    /// Sessions whose streams may take `budget` together.
    pub fn new(budget: Budget) -> Sessions {
        Sessions { budget: Arc::new(budget), ..Sessions::default() }
    }

    /// Bytes the sessions' streams take together, to 64 KiB. O(1).
    pub fn output(&self) -> usize {
        self.budget.used()
    }

    pub fn len(&self) -> usize {
        self.state.lock().sessions.len()
    }

    /// Takes over session `want` for a new connection if it is alive and
    /// `secret` is its secret (resumed: the connection serving it is
    /// stopped), else opens a new session with a fresh id and secret (a
    /// session that ended, by its lease or a restart, is never resumed).
    /// A live session named with the wrong secret is refused and left as
    /// it was. `fresh` is called for a new session's secret; a new
    /// session's id is none that `taken` names (an evicted session's,
    /// which its client may still name after a restart: see `datadir`).
    pub fn attach(
        &self,
        want: Option<u64>,
        secret: &Secret,
        now: Instant,
        fresh: impl FnOnce() -> Secret,
        mut taken: impl FnMut(u64) -> bool,
    ) -> Result<Attached, BadResume> {
        let mut st = self.state.lock();
        if let Some(sid) = want
            && let Some(s) = st.sessions.get_mut(&sid)
        {
            if !same_secret(&s.secret, secret) {
                return Err(BadResume);
            }
            s.stop.cancel();
            s.stop = CancellationToken::new();
            s.last_seen = now;
            return Ok(Attached::of(sid, true, s));
        }
        let sid = loop {
            st.counter += 1;
            let c = st.counter;
            let sid = self.ids.hash_one(c) & ((1 << SESSION_BITS) - 1);
            if sid != 0 && !st.sessions.contains_key(&sid) && !taken(sid) {
                break sid;
            }
        };
        let session = Session {
            secret: fresh(),
            wire: Arc::new(Wire::new(self.budget.clone())),
            turn: Arc::default(),
            stop: CancellationToken::new(),
            last_seen: now,
            held: HashMap::default(),
            locks: 0,
            waits: HashMap::default(),
        };
        let attached = Attached::of(sid, false, &session);
        st.sessions.insert(sid, session);
        Ok(attached)
    }

    /// The client took in the session's stream up to `received`.
    pub fn ack(&self, sid: u64, received: u64) -> Result<(), String> {
        let st = self.state.lock();
        st.sessions.get(&sid).map_or(Ok(()), |s| s.wire.ack(received))
    }

    /// The client was heard from at `now`: renews its lease. Whether the
    /// session is still alive (the reaper may have ended it).
    pub fn touch(&self, sid: u64, now: Instant) -> bool {
        match self.state.lock().sessions.get_mut(&sid) {
            Some(s) => {
                s.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// Sessions not heard from for `lease` at `now`, counting silence
    /// from `since` at the earliest (the end of the recovery window,
    /// during which the server holds their requests back). O(sessions).
    pub fn expired(&self, lease: Duration, since: Instant, now: Instant) -> Vec<u64> {
        let st = self.state.lock();
        let silent = |s: &Session| now.saturating_duration_since(s.last_seen.max(since)) > lease;
        st.sessions.iter().filter(|(_, s)| silent(s)).map(|(&id, _)| id).collect()
    }

    /// Forgets a session; returns everything it must give back.
    pub fn remove(&self, sid: u64) -> Option<Vec<Track>> {
        let mut st = self.state.lock();
        let s = st.sessions.remove(&sid)?;
        s.stop.cancel();
        let mut out: Vec<Track> = Vec::new();
        for w in s.waits.into_values() {
            if let Track::Wait { wait, .. } = &w.track {
                st.waits.remove(wait);
            }
            out.push(w.track);
        }
        out.extend(s.held.into_keys());
        Some(out)
    }

    /// Refuses a request that could take the session, or the server (which
    /// holds `table` locks and queued requests in all), past a limit:
    /// `adds` is the most locks it can add (a POSIX lock inside another
    /// of another mode splits it in three: 2). An unlock too (it may
    /// split a range), as POSIX allows (`ENOLCK`).
    pub fn check_limits(
        &self,
        sid: u64,
        limits: &Limits,
        (wait, adds): (bool, usize),
        table: usize,
    ) -> Result<(), String> {
        if table + adds > limits.max_total_locks {
            return Err(format!(
                "server limit reached: {table} locks held and requests queued in all sessions (max-total-locks {})",
                limits.max_total_locks
            ));
        }
        let st = self.state.lock();
        let Some(s) = st.sessions.get(&sid) else { return Err("session ended".into()) };
        if s.locks + adds > limits.max_locks {
            return Err(format!(
                "session limit reached: {} locks held, and this request could add {adds} (max-locks {})",
                s.locks, limits.max_locks
            ));
        }
        if wait && s.waits.len() >= limits.max_waiters {
            return Err(format!("session limit reached: {} requests queued (max-waiters)", limits.max_waiters));
        }
        Ok(())
    }

    /// Records what `t` holds now, as `count` says (the engine's count,
    /// asked under the table's lock, so a grant to the same owner racing
    /// this, which the engine makes and then `granted` records under this
    /// lock, is either counted here or recorded after). If the session has
    /// ended meanwhile, hands `t` back for the caller to give back.
    pub fn set_held(&self, sid: u64, t: Track, now: Instant, count: impl FnOnce(&Track) -> usize) -> Result<(), Track> {
        match self.state.lock().sessions.get_mut(&sid) {
            Some(s) => {
                let n = count(&t);
                s.set_count(t, n, now);
                Ok(())
            }
            None => Err(t),
        }
    }

    /// Records request `id` as queued; if its grant already came (a race
    /// with another connection), returns it instead. If the session has
    /// ended meanwhile, hands back what the caller must give back: the
    /// wait, or the lock its early grant left.
    /// `count` is the engine's count of what a grant left (see
    /// [`Sessions::set_held`]).
    pub fn queued(
        &self,
        (sid, id): (u64, u64),
        track: Track,
        target: &Target,
        owner: u64,
        now: Instant,
        count: impl FnOnce(&Track) -> usize,
    ) -> Result<Option<GrantInfo>, Track> {
        let mut st = self.state.lock();
        let Track::Wait { wait, .. } = &track else { unreachable!("queued takes a wait") };
        let wait = *wait;
        if !st.sessions.contains_key(&sid) {
            return Err(match st.early.remove(&wait) {
                Some(g) => Track::held(target, owner, g.handle),
                None => track,
            });
        }
        if let Some(g) = st.early.remove(&wait) {
            if let Some(s) = st.sessions.get_mut(&sid) {
                let t = Track::held(target, owner, g.handle);
                let n = count(&t);
                s.set_count(t, n, now);
            }
            return Ok(Some(g));
        }
        st.waits.insert(wait, (sid, id));
        if let Some(s) = st.sessions.get_mut(&sid) {
            s.waits.insert(id, Waiting { track, target: target.clone(), owner, since: now });
        }
        Ok(None)
    }

    /// A queued request was granted: track it (`count`: see
    /// [`Sessions::set_held`]) and push the grant.
    pub fn granted(
        &self,
        wait: WaitId,
        grant: GrantInfo,
        now: Instant,
        count: impl FnOnce(&Track) -> usize,
    ) -> Delivered {
        let mut st = self.state.lock();
        let Some((sid, id)) = st.waits.remove(&wait) else {
            if let Some(r) = st.raced.remove(&wait) {
                return Delivered::Release(r, grant);
            }
            st.early.insert(wait, grant);
            return Delivered::Kept;
        };
        let Some(s) = st.sessions.get_mut(&sid) else { return Delivered::Kept };
        if let Some(w) = s.waits.remove(&id) {
            let t = Track::held(&w.target, w.owner, grant.handle);
            let n = count(&t);
            s.set_count(t, n, now);
        }
        send(s, ServerMsg::Granted { id, grant })
    }

    /// A withdrawn wait that the engine had granted already (its cancel
    /// answered `NotQueued`): returns its grant to release now if it was
    /// reported already; else `granted` returns it when it is.
    pub fn raced(&self, wait: WaitId, r: Raced) -> Option<(Raced, GrantInfo)> {
        let mut st = self.state.lock();
        match st.early.remove(&wait) {
            Some(grant) => Some((r, grant)),
            None => {
                st.raced.insert(wait, r);
                None
            }
        }
    }

    /// Withdraws request `id`'s wait, if it still waits.
    /// Returns the wait and the bytes it asked for.
    pub fn take_wait(&self, sid: u64, id: u64) -> Option<(Track, Option<Range>)> {
        let mut st = self.state.lock();
        let w = st.sessions.get_mut(&sid)?.waits.remove(&id)?;
        if let Track::Wait { wait, .. } = &w.track {
            st.waits.remove(wait);
        }
        Some((w.track, Range::new(w.target.start, w.target.end).ok()))
    }

    /// Since when session `sid` has held what `t` holds. O(1).
    pub fn held_since(&self, sid: u64, t: &Track) -> Option<Instant> {
        self.state.lock().sessions.get(&sid)?.held.get(t).map(|h| h.since)
    }

    /// Since when the engine's wait `wait` has been queued. O(1).
    pub fn waiting_since(&self, wait: WaitId) -> Option<Instant> {
        let st = self.state.lock();
        let (sid, id) = st.waits.get(&wait)?;
        st.sessions.get(sid)?.waits.get(id).map(|w| w.since)
    }

    /// Session `sid`'s way out, while the session lives. O(1).
    pub fn wire(&self, sid: u64) -> Option<Arc<Wire>> {
        self.state.lock().sessions.get(&sid).map(|s| s.wire.clone())
    }

    /// Wakes every session's connection task (a clean stop begins).
    /// O(sessions).
    pub fn wake_all(&self) {
        for s in self.state.lock().sessions.values() {
            s.wire.wake();
        }
    }
}

/// A connection's hold on a session: see [`Sessions::attach`].
pub(crate) struct Attached {
    pub sid: u64,
    pub resumed: bool,
    pub secret: Secret,
    pub wire: Arc<Wire>,
    /// Lock it before serving requests (the previous connection may
    /// still be stopping); it holds the bytes of the client's stream
    /// served so far, and the server must add each request's bytes as it
    /// serves it, so a resumed client sends again exactly what was not.
    pub turn: Arc<tokio::sync::Mutex<u64>>,
    /// Cancelled when the connection must stop.
    pub stop: CancellationToken,
}

impl Attached {
    fn of(sid: u64, resumed: bool, s: &Session) -> Attached {
        Attached { sid, resumed, secret: s.secret, wire: s.wire.clone(), turn: s.turn.clone(), stop: s.stop.clone() }
    }
}

/// What became of a grant or a pushed message.
pub(crate) enum Delivered {
    /// Appended to the session's stream: the caller writes it
    /// ([`Wire::kick`]) once the table's lock is released.
    Kick(Arc<Wire>),
    /// Kept for later, as an early grant, or the session is gone.
    Kept,
    /// The grant of a withdrawn wait (see [`Raced`]): the caller releases
    /// it.
    Release(Raced, GrantInfo),
}

/// Constant-time comparison of secrets, so timing tells nothing.
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Appends to the session's stream. No I/O here: the caller kicks the
/// wire after the table's lock.
fn send(s: &mut Session, msg: ServerMsg) -> Delivered {
    s.wire.append(&msg);
    Delivered::Kick(s.wire.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new session's id is none the caller says is taken; a session
    /// named that is not alive is not resumed.
    #[test]
    fn a_new_session_takes_no_id_said_to_be_taken() {
        let sessions = Sessions::default();
        let mut offered = Vec::new();
        let taken = |sid| {
            offered.push(sid);
            offered.len() < 3
        };
        let a = sessions.attach(Some(5), &Secret::default(), Instant::now(), Secret::default, taken).unwrap();
        assert!(!a.resumed);
        assert_eq!(offered.len(), 3);
        assert_eq!(a.sid, offered[2]);
    }
}
