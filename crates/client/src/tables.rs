//! What a client keeps about its requests under one lock: where each
//! reply goes, the blocking waits, the DLM handles, the open files, and
//! the changes that may not be made twice.

use foldhash::{HashMap, HashSet};
use std::collections::BTreeSet;

use interlock_proto::{ClientMsgRef, Kind, Op, Reply};
use tokio::sync::oneshot;

use crate::dlm::DlmLocks;
use crate::outbox::Outbox;
use crate::reclaim::Reclaim;
use crate::{ClientError, opens};

/// What comes back for a request: its reply, or why none will come in
/// its session.
pub(crate) type Replied = Result<Reply, NoReply>;

/// Why a request got no reply in the session it was sent in.
#[derive(Debug)]
pub(crate) enum NoReply {
    /// The server never read it: it stopped cleanly first (its
    /// `Goodbye`), so the request had no effect.
    Unread,
    /// A change that may not be made twice (`Once`), in flight when the
    /// server restarted: the client is back within the recovery window,
    /// so the server still knows whether it made the change. Ask again,
    /// with the same id.
    AskAgain,
}

impl From<NoReply> for ClientError {
    fn from(n: NoReply) -> ClientError {
        match n {
            NoReply::Unread => ClientError::Unread,
            NoReply::AskAgain => ClientError::ConnectionLost,
        }
    }
}

/// A request awaiting its reply.
pub(crate) struct Pending {
    /// Where the request ends in the session's stream.
    pub(crate) end: u64,
    pub(crate) to: ReplyTo,
    /// A change that may not be made twice: listed in `Tables::once`.
    pub(crate) once: bool,
}

/// Where a request's reply goes.
pub(crate) enum ReplyTo {
    /// To its caller, who awaits it.
    Caller(oneshot::Sender<Replied>),
    /// To [`answered`](crate::reclaim::answered), as it is read: in the session that
    /// asked, before a later one begins.
    Reclaim(Reclaim),
}

impl ReplyTo {
    /// Tells the caller its request got no reply in its session (`why`);
    /// false if no one awaits it. A reclaim's answer is left to the next
    /// session, which reclaims the lock again or reports it lost.
    fn no_reply(self, why: NoReply) -> bool {
        match self {
            ReplyTo::Caller(tx) => tx.send(Err(why)).is_ok(),
            ReplyTo::Reclaim(_) => false,
        }
    }
}

#[derive(Default)]
pub(crate) struct Tables {
    /// Request id -> where its reply goes.
    pub(crate) pending: HashMap<u64, Pending>,
    /// Changes that may not be made twice, on their way when the session
    /// was given up: see [`park`](Tables::park).
    pub(crate) parked: HashMap<u64, Pending>,
    /// Blocking requests, from sending until their future is done with
    /// them: the request, to send again in a new session, or to give back
    /// a grant that races a drop.
    pub(crate) waits: HashMap<u64, Waiting>,
    /// Queued requests whose future was dropped: a grant that still comes
    /// is given back.
    pub(crate) abandoned: HashMap<u64, Op>,
    /// Cancel request id -> the request it withdraws. Its reply comes after
    /// any grant that raced it, so the request is then forgotten.
    pub(crate) cancelling: HashMap<u64, u64>,
    /// Local waits -> who to wake.
    pub(crate) local_waits: HashMap<u64, oneshot::Sender<()>>,
    /// Resources with locks in the local table (for reclaim).
    pub(crate) local_resources: HashSet<(Kind, Vec<u8>)>,
    /// DLM locks held, by the handle their callers know them by.
    pub(crate) dlm: DlmLocks,
    /// Files held open at the server, to open again in a new session.
    pub(crate) opens: opens::Opens,
    /// The ids of the changes that may not be made twice and are not yet
    /// answered (listed in `pending`, or being sent again after a
    /// restart): the lowest is the `settled` each such request carries,
    /// which lets the server forget the ones below it.
    pub(crate) once: BTreeSet<u64>,
}

impl Tables {
    /// Sends request `id` and lists where its reply goes, under the
    /// tables' lock (the caller's), so that no reply arrives unlisted.
    pub(crate) fn send(
        &mut self,
        outbox: &Outbox,
        id: u64,
        op: &Op,
    ) -> Result<oneshot::Receiver<Replied>, ClientError> {
        let (tx, rx) = oneshot::channel();
        self.list(outbox, id, op, ReplyTo::Caller(tx))?;
        Ok(rx)
    }

    /// Sends request `id` and lists where its reply goes (`to`), as
    /// [`send`](Tables::send) does.
    pub(crate) fn list(&mut self, outbox: &Outbox, id: u64, op: &Op, to: ReplyTo) -> Result<(), ClientError> {
        let end = outbox.send(&ClientMsgRef::Request { id, op })?;
        let once = matches!(op, Op::Meta { once: Some(_), .. });
        self.pending.insert(id, Pending { end, to, once });
        Ok(())
    }

    /// Sends again the `converts` (waits) of a DLM lock held back until
    /// its reclaim in the session of `generation` was answered: under its
    /// new server handle `now`, or, the lock lost, fails them. O(converts).
    pub(crate) fn converts_reclaimed(
        &mut self,
        outbox: &Outbox,
        converts: Vec<u64>,
        now: Option<u64>,
        generation: u64,
    ) {
        for id in converts {
            let Some(w) = self.waits.get_mut(&id) else { continue };
            match (now, &mut w.op) {
                (Some(now), Op::DlmConvert { handle, .. }) => {
                    *handle = now;
                    let _ = outbox.send(&ClientMsgRef::Request { id, op: &w.op });
                }
                _ => {
                    if let Some(tx) = w.grant_tx.take() {
                        let reply = Reply::Error("the lock was lost: its reclaim was refused".into());
                        let _ = tx.send(Answer { reply, generation });
                    }
                }
            }
        }
    }

    /// Takes request `id` off the lists: its reply came. O(log once).
    pub(crate) fn resolve(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        if p.once {
            self.once.remove(&id);
        }
        Some(p)
    }

    /// The server stopped cleanly having read the session's stream up to
    /// byte `served`: the requests past it are told they had no effect.
    /// Waits are left listed, to be sent again in the next session as
    /// after any loss of the session. O(pending).
    pub(crate) fn unread_past(&mut self, served: u64) {
        let waits = &self.waits;
        for (id, p) in self.pending.extract_if(|id, p| p.end > served && !waits.contains_key(id)) {
            if p.once {
                self.once.remove(&id);
            }
            p.to.no_reply(NoReply::Unread);
        }
    }

    /// The session is given up ([`give_up`](crate::connection)): the
    /// changes that may not be made twice wait, listed apart, for the next
    /// welcome ([`unpark`](Tables::unpark)); a change on its way when the
    /// server died or the network was cut, one that may have been made,
    /// is asked about again if the next server can tell, instead of
    /// failing with `ConnectionLost`. Until session 50 such changes
    /// failed when a restart outlasted three quarters of the lease, and
    /// until session 53 after any partition that long. O(pending).
    pub(crate) fn park(&mut self) {
        self.parked.extend(self.pending.extract_if(|_, p| p.once));
    }

    /// What the next welcome after a [`park`](Tables::park) says: each
    /// parked change is asked about again (`ask`: see
    /// [`NoReply::AskAgain`]), or it fails with `ConnectionLost`, as
    /// [`session_lost`](Tables::session_lost) fails it. O(parked).
    pub(crate) fn unpark(&mut self, ask: bool) {
        for (id, p) in self.parked.drain() {
            no_reply(&mut self.once, id, p, ask);
        }
    }

    /// The session is gone, and no reply listed will come. If the server
    /// restarted and the client is back within its recovery window
    /// (`reclaim`), each change that may not be made twice is told to ask
    /// again (the server kept whether it made it); every other request is
    /// dropped, and its caller sees [`ClientError::ConnectionLost`].
    /// O(pending).
    pub(crate) fn session_lost(&mut self, reclaim: bool) {
        for (id, p) in self.pending.drain() {
            no_reply(&mut self.once, id, p, reclaim);
        }
    }
}

/// Request `id`, taken out of the tables, gets no reply in its session: a
/// change that may not be made twice is told to ask again if `ask`;
/// otherwise it is dropped (its caller sees
/// [`ClientError::ConnectionLost`]) and leaves `once`.
fn no_reply(once: &mut BTreeSet<u64>, id: u64, p: Pending, ask: bool) {
    let asks = ask && p.once && p.to.no_reply(NoReply::AskAgain);
    if p.once && !asks {
        once.remove(&id);
    }
}

/// A blocking request in `Tables::waits`.
pub(crate) struct Waiting {
    /// Where its grant goes (pushed, or the reply to the request sent
    /// again in a new session), or the refusal of a request sent again;
    /// taken when delivered (the request stays listed until its future is
    /// done with it).
    pub(crate) grant_tx: Option<oneshot::Sender<Answer>>,
    pub(crate) op: Op,
}

/// A blocking request's outcome, and the session (generation) in which it
/// came.
pub(crate) struct Answer {
    pub(crate) reply: Reply,
    pub(crate) generation: u64,
}

/// A request on its way: see [`Inner::submit`](crate::Inner::submit).
pub(crate) struct Submitted {
    pub(crate) reply_rx: oneshot::Receiver<Replied>,
    pub(crate) grant_rx: Option<oneshot::Receiver<Answer>>,
    pub(crate) op: Option<Op>,
    /// The session it was sent in: its reply, if any, comes in it (the
    /// replies awaited are dropped when the session changes).
    pub(crate) generation: u64,
}

#[cfg(test)]
mod tests {
    use interlock_proto::meta::{Asking, Once};

    use super::*;

    /// After a clean stop, the requests past where the server stopped
    /// reading are told they had no effect; those it read, and waits
    /// (sent again in the next session), are not.
    #[test]
    fn requests_past_the_goodbye_are_unread_and_the_rest_are_not() {
        let outbox = Outbox::default();
        outbox.open();
        let mut t = Tables::default();
        let mut rx: Vec<_> = (1..=4).map(|id| t.send(&outbox, id, &Op::Status).unwrap()).collect();
        let ends: Vec<u64> = (1..=4).map(|id| t.pending[&id].end).collect();
        assert!(ends.windows(2).all(|w| w[0] < w[1]), "{ends:?}");
        // Request 4 is a wait.
        t.waits.insert(4, Waiting { grant_tx: None, op: Op::Status });
        // The server read requests 1 and 2.
        t.unread_past(ends[1]);
        assert!(matches!(rx[2].try_recv(), Ok(Err(NoReply::Unread))), "request 3 was not read");
        let listed: Vec<u64> = {
            let mut l: Vec<u64> = t.pending.keys().copied().collect();
            l.sort();
            l
        };
        assert_eq!(listed, [1, 2, 4], "read ones wait for their replies; the wait stays to be sent again");
        assert!(rx[0].try_recv().is_err() && rx[1].try_recv().is_err() && rx[3].try_recv().is_err());
    }

    /// When the session is lost to a restart the client is back in time
    /// for, each change that may not be made twice is told to ask again
    /// and stays listed in `once` (its id holds `settled` down); any other
    /// request is dropped. Otherwise all are dropped and none stays.
    #[test]
    fn only_changes_made_once_are_asked_again_and_only_after_a_reclaim() {
        let outbox = Outbox::default();
        outbox.open();
        let change = |name: &[u8]| Op::Meta {
            cred: interlock_meta::Cred::root(),
            op: interlock_proto::meta::MetaOp::Unlink { parent: 1, name: name.to_vec() },
            once: Some(Once { settled: 0, asking: Asking::First }),
        };
        for reclaim in [true, false] {
            let mut t = Tables::default();
            t.once.extend([1, 3]);
            let mut rx = [t.send(&outbox, 1, &change(b"a")).unwrap(), t.send(&outbox, 2, &Op::Status).unwrap()];
            let gone = t.send(&outbox, 3, &change(b"b")).unwrap();
            drop(gone);
            t.session_lost(reclaim);
            assert!(t.pending.is_empty());
            match rx[0].try_recv() {
                Ok(Err(NoReply::AskAgain)) => assert!(reclaim),
                Err(_) => assert!(!reclaim),
                other => panic!("{other:?}"),
            }
            assert!(rx[1].try_recv().is_err(), "dropped: its caller sees ConnectionLost");
            let listed: Vec<u64> = t.once.iter().copied().collect();
            assert_eq!(
                listed,
                if reclaim { vec![1] } else { vec![] },
                "a change whose caller is gone is not asked again"
            );
        }
    }
}
