//! The DLM locks a client holds, each under the handle its caller knows
//! it by (its *name*), with the server's handle for it now.
//!
//! A DLM lock's handle is the server's: a tag it counts from 1 at each
//! start, over the lock's slot in the resource. A server that restarts
//! while the client's lease runs grants each reclaimed lock anew, under a
//! handle of its own, and may give a later lock the very handle a
//! reclaimed lock was first granted under. So the caller's name for a
//! lock is not the server's handle once a restart came between:
//! - a lock is named by the handle of its first grant, unless a lock
//!   still held has that name (only after a restart), when it gets a
//!   number no held lock has;
//! - a reclaim moves the lock to its new server handle and keeps its
//!   name;
//! - unlocks and converts wait while the lock's reclaim is unanswered, so
//!   that they name the lock as the new server knows it (sent before, an
//!   unlock named a lock the new server did not have, and the reclaim
//!   after it left the lock held by the session);
//! - a convert that waited across the restart is held back until then
//!   too, and goes again under the new handle (or fails, the lock lost);
//! - a blocking callback names the lock as its caller knows it; one
//!   that overtakes its lock's grant (read before the caller recorded
//!   it) under the name of another lock held waits until the grant is
//!   recorded, and is named as it is (until session 53 it went out
//!   under that name, for the other lock).
//!
//! Until session 52 the client kept only "first handle → new handle" and
//! a lock granted under a reclaimed lock's first handle was unlocked as
//! the reclaimed one: the unlock released neither.

use foldhash::HashMap;

use crate::Blocking;

/// One DLM lock held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DlmLock {
    pub resource: Vec<u8>,
    pub owner: u32,
    pub mode: u8,
    pub start: u64,
    pub end: u64,
    pub at: At,
}

/// Where the server stands on a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    /// Held under this server handle.
    Held(u64),
    /// Being reclaimed in the session of `generation`: the new server
    /// has not answered yet. The dead server called it `was`.
    Reclaiming { generation: u64, was: u64 },
}

/// What the answer to a reclaim did; with the converts of the lock that
/// wait for it (see [`DlmLocks::hold_back`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// The lock is held under server handle `now`.
    Moved { now: u64, converts: Vec<u64> },
    /// The lock is lost.
    Lost { lock: DlmLock, converts: Vec<u64> },
}

/// The DLM locks held, by name, and the names by server handle. Every
/// operation is O(1) expected, but [`DlmLocks::reclaiming`] and
/// [`DlmLocks::take_all`], O(n).
#[derive(Debug, Default)]
pub(crate) struct DlmLocks {
    by_name: HashMap<u64, DlmLock>,
    /// Server handle -> name, for the locks [`At::Held`].
    names: HashMap<u64, u64>,
    /// The dead server's handle -> name, for the locks
    /// [`At::Reclaiming`].
    moving: HashMap<u64, u64>,
    /// Name -> the waiting converts (request ids) of a lock being
    /// reclaimed, to send again once the reclaim is answered.
    held_back: HashMap<u64, Vec<u64>>,
    /// The last name given for want of the server's (counts down from
    /// the top, wrapping).
    spare: u64,
    /// Blocking callbacks for a server handle no recorded lock has but
    /// a held lock's name is, by that handle: for a lock whose grant is
    /// not yet recorded (see [`DlmLocks::callback`]). Dropped with the
    /// session.
    early: HashMap<u64, Vec<Blocking>>,
}

impl DlmLocks {
    /// Records a lock just granted under server handle `server` and
    /// returns its name: `server`, unless a held lock has that name; then
    /// the next number down from the top that no held lock has (server
    /// handles are small tags over small slots, far below).
    pub fn insert(&mut self, server: u64, mut lock: DlmLock) -> u64 {
        let mut name = server;
        while self.by_name.contains_key(&name) {
            self.spare = self.spare.wrapping_sub(1);
            name = self.spare;
        }
        lock.at = At::Held(server);
        self.names.insert(server, name);
        self.by_name.insert(name, lock);
        name
    }

    pub fn get(&self, name: u64) -> Option<&DlmLock> {
        self.by_name.get(&name)
    }

    /// The name of the lock the server calls `server`; `server` itself
    /// for a lock not recorded.
    pub fn name_of(&self, server: u64) -> u64 {
        self.names.get(&server).copied().unwrap_or(server)
    }

    /// Blocking callback `b`, its handle the server's, as its caller is
    /// to see it: under the lock's name. A callback for a lock not
    /// recorded (one that overtook the grant, or came for a lock just
    /// released) keeps the server's handle, which is the name such a
    /// lock gets, unless a held lock has that name: then it is held back
    /// until a grant under that handle is recorded ([`DlmLocks::overtaken`]),
    /// and `None`. O(1) expected.
    pub fn callback(&mut self, mut b: Blocking) -> Option<Blocking> {
        match self.names.get(&b.handle) {
            Some(&name) => b.handle = name,
            None if self.by_name.contains_key(&b.handle) => {
                self.early.entry(b.handle).or_default().push(b);
                return None;
            }
            None => {}
        }
        Some(b)
    }

    /// The callbacks held back ([`DlmLocks::callback`]) for the lock just
    /// recorded under server handle `server`, renamed `name`. O(1)
    /// expected, but for the callbacks.
    pub fn overtaken(&mut self, server: u64, name: u64) -> Vec<Blocking> {
        let mut early = self.early.remove(&server).unwrap_or_default();
        for b in &mut early {
            b.handle = name;
        }
        early
    }

    /// Forgets lock `name` (unlocked, or lost).
    pub fn remove(&mut self, name: u64) -> Option<DlmLock> {
        let lock = self.by_name.remove(&name)?;
        match lock.at {
            At::Held(server) => self.names.remove(&server),
            At::Reclaiming { was, .. } => self.moving.remove(&was),
        };
        self.held_back.remove(&name);
        Some(lock)
    }

    pub fn set_mode(&mut self, name: u64, mode: u8) {
        if let Some(lock) = self.by_name.get_mut(&name) {
            lock.mode = mode;
        }
    }

    /// A new session of `generation` reclaims every lock: each is marked
    /// so, under the handle the dead server knew it by (kept from an
    /// earlier session whose reclaim went unanswered). O(n).
    pub fn reclaiming(&mut self, generation: u64) {
        self.names.clear();
        self.held_back.clear();
        self.early.clear();
        for (name, lock) in &mut self.by_name {
            let was = match lock.at {
                At::Held(server) => server,
                At::Reclaiming { was, .. } => was,
            };
            self.moving.insert(was, *name);
            lock.at = At::Reclaiming { generation, was };
        }
    }

    /// Holds back convert `id`, which waited for the lock the dead
    /// server called `server`, if that lock is being reclaimed: it goes
    /// again once the reclaim is answered, naming the lock as the new
    /// server does. Whether it was held back.
    pub fn hold_back(&mut self, server: u64, id: u64) -> bool {
        let Some(name) = self.moving.get(&server) else { return false };
        self.held_back.entry(*name).or_default().push(id);
        true
    }

    /// The locks to reclaim in the session of `generation`. O(n).
    pub fn to_reclaim(&self, generation: u64) -> Vec<(u64, DlmLock)> {
        let mut out: Vec<_> = self
            .by_name
            .iter()
            .filter(|(_, l)| matches!(l.at, At::Reclaiming { generation: g, .. } if g == generation))
            .map(|(n, l)| (*n, l.clone()))
            .collect();
        out.sort_unstable_by_key(|(n, _)| *n);
        out
    }

    /// The answer to lock `name`'s reclaim in the session of
    /// `generation`: held under `server` now (`Some`), or refused (the
    /// lock is forgotten, to be reported lost). A later session's reclaim
    /// owns the lock if there is one, and an answer from an earlier one
    /// changes nothing (`None`).
    pub fn reclaimed(&mut self, name: u64, generation: u64, server: Option<u64>) -> Option<Reclaimed> {
        let lock = self.by_name.get_mut(&name)?;
        let At::Reclaiming { generation: g, was } = lock.at else { return None };
        if g != generation {
            return None;
        }
        self.moving.remove(&was);
        let converts = self.held_back.remove(&name).unwrap_or_default();
        match server {
            Some(now) => {
                lock.at = At::Held(now);
                self.names.insert(now, name);
                Some(Reclaimed::Moved { now, converts })
            }
            None => self.by_name.remove(&name).map(|lock| Reclaimed::Lost { lock, converts }),
        }
    }

    /// Forgets every lock (the session is lost), returning each with its
    /// name. O(n).
    pub fn take_all(&mut self) -> Vec<(u64, DlmLock)> {
        self.names.clear();
        self.moving.clear();
        self.held_back.clear();
        self.early.clear();
        let mut out: Vec<_> = self.by_name.drain().collect();
        out.sort_unstable_by_key(|(n, _)| *n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(resource: &str) -> DlmLock {
        DlmLock { resource: resource.into(), owner: 1, mode: 5, start: 0, end: 9, at: At::Held(0) }
    }

    #[test]
    fn a_reclaimed_lock_keeps_its_name_and_a_new_lock_under_it_gets_another() {
        let mut t = DlmLocks::default();
        assert_eq!(t.insert(7, lock("a")), 7);
        t.reclaiming(2);
        assert_eq!(t.to_reclaim(2).len(), 1);
        assert!(!t.hold_back(8, 100), "no lock of that handle is reclaimed");
        assert!(t.hold_back(7, 101));
        assert_eq!(t.reclaimed(7, 1, Some(3)), None, "an earlier session's answer is ignored");
        assert_eq!(t.get(7).unwrap().at, At::Reclaiming { generation: 2, was: 7 });
        assert_eq!(t.reclaimed(7, 2, Some(3)), Some(Reclaimed::Moved { now: 3, converts: vec![101] }));
        assert_eq!((t.get(7).unwrap().at, t.name_of(3), t.hold_back(7, 102)), (At::Held(3), 7, false));
        // The restarted server grants another lock under 7.
        let other = t.insert(7, lock("b"));
        assert_ne!(other, 7);
        assert_eq!((t.name_of(7), t.name_of(3)), (other, 7));
        assert_eq!(t.remove(other).unwrap().resource, b"b");
        assert_eq!(t.remove(7).unwrap().resource, b"a");
        assert_eq!(t.name_of(3), 3, "forgotten with its lock");
    }

    #[test]
    fn a_refused_reclaim_forgets_the_lock_and_a_loss_forgets_all() {
        let mut t = DlmLocks::default();
        t.insert(1, lock("a"));
        t.insert(2, lock("b"));
        t.reclaiming(4);
        // A second restart before the first reclaims are answered: the
        // locks are still known by the first server's handles.
        t.reclaiming(5);
        assert_eq!(t.get(2).unwrap().at, At::Reclaiming { generation: 5, was: 2 });
        assert!(t.hold_back(1, 100));
        let Some(Reclaimed::Lost { lock, converts }) = t.reclaimed(1, 5, None) else { panic!("lost") };
        assert_eq!((lock.resource.as_slice(), converts), (&b"a"[..], vec![100]));
        assert_eq!(t.reclaimed(1, 5, Some(9)), None, "gone");
        assert!(t.get(1).is_none());
        let all = t.take_all();
        assert_eq!(all.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [2]);
        assert!(t.to_reclaim(5).is_empty() && !t.hold_back(2, 100));
    }

    /// A callback for a handle no lock has keeps it, unless a held lock
    /// is named so: then it waits for the grant under that handle, and
    /// takes the name that grant gets; the session's end drops it.
    #[test]
    fn a_callback_under_a_held_name_waits_for_its_grant() {
        let callback = |handle| Blocking { resource: b"e".to_vec(), handle, owner: 1, held: 5, wanted: 5 };
        let mut t = DlmLocks::default();
        t.insert(7, lock("a"));
        t.reclaiming(2);
        t.reclaimed(7, 2, Some(3));
        assert_eq!(t.callback(callback(3)), Some(callback(7)), "a held lock, by its name");
        assert_eq!(t.callback(callback(8)), Some(callback(8)), "no lock named 8: it keeps the handle");
        assert_eq!(t.callback(callback(7)), None, "7 names the held lock: not this one's");
        let name = t.insert(7, lock("e"));
        assert_ne!(name, 7);
        assert_eq!(t.overtaken(7, name), [callback(name)]);
        assert!(t.overtaken(7, name).is_empty(), "delivered once");
        assert_eq!(t.callback(callback(7)), Some(callback(name)), "recorded now");
        t.remove(name);
        assert_eq!(t.callback(callback(7)), None, "a late one, for the lock released");
        t.take_all();
        assert!(t.early.is_empty(), "dropped with the session");
    }

    #[test]
    fn names_stay_distinct_whatever_the_server_hands_out() {
        let mut t = DlmLocks::default();
        let mut names = std::collections::HashSet::new();
        for round in 0..4u64 {
            t.reclaiming(round);
            for (name, _) in t.to_reclaim(round) {
                t.reclaimed(name, round, Some(name ^ 0xFF));
            }
            // A server that hands out handles already used as names.
            for server in 0..20 {
                names.insert(t.insert(server, lock("x")));
            }
            let held: Vec<_> = t.by_name.keys().copied().collect();
            assert_eq!(held.len(), names.len(), "every name names one lock");
        }
    }
}
