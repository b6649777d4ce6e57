//! Each session's client (its `origin`, from its hello), and how long the
//! client's replay cache (`interlock_meta::Replies`) is kept once it has
//! no session.
//!
//! A client has two sessions for a while when its session could not
//! resume (see `connection::take_over`): the old one keeps its locks
//! until its lease runs out (and one more if the new one's welcome was
//! lost, and it asked to resume the old one again). Its cache is the
//! client's, not a session's: the new session's requests let go of the
//! old one's entries as they settle them.
//!
//! When a client's last session ends:
//!
//! - by its `Bye`, the cache goes at once: the client is gone, and asks
//!   about nothing again;
//! - by its lease running out (a partition, a stopped process), or an
//!   evict, the cache is kept a while (`Config::replay_keep`, 15 minutes
//!   unless told; the [`MAX_LAPSED`] most recent such clients): a client cut off with changes on their way
//!   comes back with a new session and asks about them again (its new
//!   hello stopped its old connections first: see `supersede`). Until
//!   session 53 the cache went with the session, and such changes failed
//!   with `EIO` once a partition outlasted the lease.
//!
//! After a restart, the clients that do not come back within the
//! recovery window are let go of ([`Origins::retain_live`]).
//!
//! A cache is let go of under the lock that a hello's
//! [`set`](Origins::set) takes, so a hello either counts its client live
//! before the cache could go, or finds it gone (`Welcome.kept` false).
//!
//! Costs: O(1) expected per session start and end; O(clients) to retain;
//! O(1) amortized per lapsed client to expire it.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use interlock_meta::Replies;
use parking_lot::Mutex;

/// The most lapsed clients whose caches are kept; past it, the oldest go
/// first (each is a few entries, its changes on their way).
pub(crate) const MAX_LAPSED: usize = 1 << 16;

/// How a session ended, for its client's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Its client said `Bye`.
    Bye,
    /// Its lease ran out, or an operator evicted it.
    Lapsed,
}

pub(crate) struct Origins {
    /// How long a client whose last session lapsed keeps its cache.
    keep: Duration,
    /// Session -> its client.
    of: scc::HashMap<u64, u64, foldhash::fast::RandomState>,
    /// Held while a cache is let go of.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Client -> how many sessions it has.
    sessions: HashMap<u64, usize>,
    /// Clients whose last session lapsed, and when, oldest first (a
    /// client may be listed more than once): see
    /// [`expire`](Origins::expire).
    lapsed: VecDeque<(Instant, u64)>,
    /// Each lapsed client's latest lapse: an earlier listing of it lets
    /// go of nothing.
    latest: HashMap<u64, Instant>,
}

impl State {
    /// The oldest listing of a lapsed client leaves the list; the client's
    /// cache goes if that was its latest lapse and it has no session now.
    fn pop_lapsed(&mut self, forget: &mut impl FnMut(u64)) {
        let Some((at, origin)) = self.lapsed.pop_front() else { return };
        if self.latest.get(&origin) == Some(&at) {
            self.latest.remove(&origin);
            if !self.sessions.contains_key(&origin) {
                forget(origin);
            }
        }
    }
}

impl Origins {
    /// Clients whose last session lapsed keep their caches `keep`.
    pub fn new(keep: Duration) -> Origins {
        Origins { keep, of: scc::HashMap::default(), state: Mutex::default() }
    }

    /// Session `sid` is client `origin`'s (again, on a resumed
    /// session's new connection). O(1) expected.
    pub fn set(&self, sid: u64, origin: u64) {
        let mut state = self.state.lock();
        if self.of.insert_sync(sid, origin).is_ok() {
            *state.sessions.entry(origin).or_default() += 1;
        }
    }

    /// The client of session `sid`. O(1) expected.
    pub fn of(&self, sid: u64) -> Option<u64> {
        self.of.read_sync(&sid, |_, o| *o)
    }

    /// Session `sid` ended (`ending`): if its client has no other, its
    /// cache goes now (`forget`, on a `Bye`) or is kept a while (see the
    /// module's docs). O(1) expected; past [`MAX_LAPSED`] listed, the
    /// oldest listing leaves first.
    pub fn end(&self, sid: u64, ending: Ending, now: Instant, mut forget: impl FnMut(u64)) {
        let Some((_, origin)) = self.of.remove_sync(&sid) else { return };
        let mut state = self.state.lock();
        let n = state.sessions.entry(origin).or_insert(1);
        *n -= 1;
        if *n > 0 {
            return;
        }
        state.sessions.remove(&origin);
        match ending {
            Ending::Bye => forget(origin),
            Ending::Lapsed if self.keep.is_zero() => forget(origin),
            Ending::Lapsed => {
                state.lapsed.push_back((now, origin));
                state.latest.insert(origin, now);
                if state.lapsed.len() > MAX_LAPSED {
                    state.pop_lapsed(&mut forget);
                }
            }
        }
    }

    /// Lets go of (`forget`) the caches of the clients whose last
    /// session lapsed the time to keep them before `now` and that have
    /// had none since. O(1) amortized per lapse.
    pub fn expire(&self, now: Instant, mut forget: impl FnMut(u64)) {
        let mut state = self.state.lock();
        while state.lapsed.front().is_some_and(|&(at, _)| now.saturating_duration_since(at) >= self.keep) {
            state.pop_lapsed(&mut forget);
        }
    }

    /// After a restart's recovery window: lets go of the caches of the
    /// clients with no session now (they did not come back in time).
    /// O(clients).
    pub fn retain_live(&self, replies: &Replies) {
        let state = self.state.lock();
        replies.retain(|origin| state.sessions.contains_key(&origin));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    const LAPSED_KEPT: Duration = Duration::from_secs(15 * 60);

    /// A `Bye` lets go of the cache at once; a lapse keeps it
    /// `LAPSED_KEPT`, longer if the client lapses again, and for good
    /// while it has a session; a client with two sessions keeps it until
    /// the second ends.
    #[test]
    fn a_lapsed_clients_cache_is_kept_a_while_and_a_byes_is_not() {
        let o = Origins::new(LAPSED_KEPT);
        let gone = RefCell::new(Vec::new());
        let forget = |origin| gone.borrow_mut().push(origin);
        let t0 = Instant::now();
        o.set(1, 10);
        o.set(2, 10);
        o.end(1, Ending::Bye, t0, forget);
        assert!(gone.borrow().is_empty(), "client 10 has another session");
        o.end(2, Ending::Bye, t0, forget);
        assert_eq!(*gone.borrow(), [10]);
        // Client 20 lapses, comes back, lapses again; client 30 lapses
        // and comes back for good.
        o.set(3, 20);
        o.set(4, 30);
        o.end(3, Ending::Lapsed, t0, forget);
        o.end(4, Ending::Lapsed, t0, forget);
        let later = t0 + Duration::from_secs(60);
        o.set(5, 20);
        o.end(5, Ending::Lapsed, later, forget);
        o.set(6, 30);
        o.expire(t0 + LAPSED_KEPT, forget);
        assert_eq!(*gone.borrow(), [10], "20 lapsed again since; 30 is back");
        o.expire(later + LAPSED_KEPT, forget);
        assert_eq!(*gone.borrow(), [10, 20]);
        o.end(6, Ending::Lapsed, later, forget);
        o.expire(later + LAPSED_KEPT * 2, forget);
        assert_eq!(*gone.borrow(), [10, 20, 30]);
    }

    /// Past [`MAX_LAPSED`] lapsed clients, the oldest goes first.
    #[test]
    fn lapsed_clients_are_bounded() {
        let o = Origins::new(LAPSED_KEPT);
        let gone = RefCell::new(Vec::new());
        let forget = |origin| gone.borrow_mut().push(origin);
        let now = Instant::now();
        for client in 0..=MAX_LAPSED as u64 {
            o.set(client, client);
            o.end(client, Ending::Lapsed, now, forget);
        }
        assert_eq!(*gone.borrow(), [0]);
    }
}
