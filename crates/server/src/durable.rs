//! Answers that wait for the journal. A namespace change is acknowledged
//! only once its record is durable, but a tokio worker must not wait for
//! the disk: a change whose record is already durable is answered at
//! once; any other is parked here, and the thread that syncs it, right
//! after the sync, pushes the answer into its session's stream (as pushed
//! grants go) through the hook [`Acker::hook`] gives the journal. That
//! thread is the last worker to run out of work, before it sleeps (see
//! `config::runtime`), or the journal's flusher when no worker went idle
//! for a while. One fsync thus answers every change it covers, whatever
//! connections they came on, and no thread stands between the sync and
//! the answer: a thread of our own woken by the flusher cost a wake-up
//! (tens of µs on two busy cores) on every change's latency.
//!
//! Costs: O(1) to park an answer; O(parked) per watermark move, on the
//! syncing thread.

use std::sync::Arc;

use foldhash::HashMap;

use interlock_journal::{DurableHook, Journal};
use interlock_meta::Seq;
use interlock_proto::{Reply, ServerMsg};
use parking_lot::Mutex;

use crate::session::Sessions;

/// An answer waiting for its record.
struct Pending {
    seq: Seq,
    sid: u64,
    id: u64,
    reply: Reply,
}

#[derive(Default)]
pub(crate) struct Acker {
    pending: Mutex<Vec<Pending>>,
}

impl Acker {
    /// The journal's durable hook: answers what each sync made durable, and
    /// everything with `EIO` once the journal has failed (the change is
    /// applied in memory but would not survive a restart).
    pub fn hook(self: &Arc<Self>, sessions: Arc<Sessions>) -> DurableHook {
        let me = self.clone();
        Box::new(move |end, failed| me.drain(&*sessions, end, failed))
    }

    /// The answer to request `id` of session `sid`, whose change has the
    /// record `seq`: now if that is durable (or there is none), else
    /// `None` and the durable hook pushes it once it is.
    pub fn answer(
        &self,
        journal: &impl Durability,
        to: &impl Deliver,
        (seq, sid, id): (Seq, u64, u64),
        reply: Reply,
    ) -> Option<Reply> {
        if seq == 0 || journal.durable_end() > seq {
            return Some(reply);
        }
        self.pending.lock().push(Pending { seq, sid, id, reply });
        // Someone waits for this record: the worker syncs it before it
        // sleeps (and the flusher must not linger over it).
        journal.want(seq + 1);
        // The sync covering `seq` may have ended, and its hook run, between
        // the check above and the push: then nothing else would answer.
        // The hook drains under the same lock after storing the watermark,
        // so one of the two sees the answer.
        let (end, failed) = (journal.durable_end(), journal.failed());
        if end > seq || failed {
            self.drain(to, end, failed);
        }
        None
    }

    /// Whether the answer to request `id` of session `sid` waits here.
    #[cfg(test)]
    pub fn is_parked(&self, sid: u64, id: u64) -> bool {
        self.pending.lock().iter().any(|p| (p.sid, p.id) == (sid, id))
    }

    /// Delivers every parked answer whose record is below `end`, each
    /// once: they leave the list under its lock. A session's answers go
    /// together, so that one sync's answers to one connection leave in
    /// one write (the creators of one mount share its connection: a write
    /// each cost them a sixth of their rate); each session's in the order
    /// they were parked (its requests' order), the sessions in the order
    /// of their first answer (first parked, first answered). O(r log r)
    /// for r answers.
    fn drain(&self, to: &impl Deliver, end: u64, failed: bool) {
        // One pass; the answers still waiting keep their place.
        let mut ready: Vec<Pending> = self.pending.lock().extract_if(.., |x| failed || x.seq < end).collect();
        if ready.is_empty() {
            return;
        }
        if ready.iter().any(|x| x.sid != ready[0].sid) {
            let mut rank = HashMap::default();
            for x in &ready {
                let next = rank.len();
                rank.entry(x.sid).or_insert(next);
            }
            // Stable: each session's answers keep their order.
            ready.sort_by_key(|x| rank[&x.sid]);
        }
        let mut ready = ready.into_iter().peekable();
        while let Some(first) = ready.next() {
            let sid = first.sid;
            let run = std::iter::once(first).chain(std::iter::from_fn(|| ready.next_if(|x| x.sid == sid)));
            to.deliver(sid, run.map(|x| (x.id, if failed { Reply::Errno(libc::EIO) } else { x.reply })));
        }
    }
}

/// What the acker reads of the journal. A seam: the tests below play a
/// sync that ends at each point of [`Acker::answer`].
pub(crate) trait Durability {
    /// Every record below this is durable.
    fn durable_end(&self) -> u64;
    /// The journal has failed: nothing more becomes durable.
    fn failed(&self) -> bool;
    /// Someone waits for every record below `end`.
    fn want(&self, end: u64);
}

impl Durability for Journal {
    fn durable_end(&self) -> u64 {
        Journal::durable_end(self)
    }
    fn failed(&self) -> bool {
        Journal::failed(self)
    }
    fn want(&self, end: u64) {
        Journal::want(self, end)
    }
}

/// Where answers go: the sessions' streams (and a list in the tests).
pub(crate) trait Deliver {
    /// Delivers session `sid`'s answers to requests, in one write where
    /// the connection takes it: (request, answer)s.
    fn deliver(&self, sid: u64, answers: impl Iterator<Item = (u64, Reply)>);
}

impl Deliver for Sessions {
    fn deliver(&self, sid: u64, answers: impl Iterator<Item = (u64, Reply)>) {
        // Appended outside the table's lock: one session's answers do
        // not hold up every other session's requests.
        if let Some(wire) = self.wire(sid) {
            wire.append_all(answers.map(|(id, reply)| ServerMsg::Reply { id, reply }));
            wire.kick();
        }
    }
}

/// Pushes an answer into its session's stream (dropped if the session
/// has ended).
pub(crate) fn push(sessions: &Sessions, sid: u64, id: u64, reply: Reply) {
    sessions.deliver(sid, std::iter::once((id, reply)));
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    use super::*;

    /// A journal whose watermark reads, one after another, the values
    /// given (the last one for good): a sync that ends between two reads.
    struct Script {
        ends: RefCell<VecDeque<u64>>,
        failed: bool,
        wanted: Cell<u64>,
    }

    impl Script {
        fn new(ends: &[u64], failed: bool) -> Script {
            Script { ends: RefCell::new(ends.iter().copied().collect()), failed, wanted: Cell::new(0) }
        }
    }

    impl Durability for Script {
        fn durable_end(&self) -> u64 {
            let mut ends = self.ends.borrow_mut();
            if ends.len() > 1 { ends.pop_front().expect("non-empty") } else { ends[0] }
        }
        fn failed(&self) -> bool {
            self.failed
        }
        fn want(&self, end: u64) {
            self.wanted.set(self.wanted.get().max(end));
        }
    }

    /// The answers delivered, as (session, request, errno or 0), and
    /// each delivery (one write to a connection) as (session, requests).
    #[derive(Default)]
    struct Outbox(RefCell<Vec<(u64, u64, i32)>>, RefCell<Vec<(u64, Vec<u64>)>>);

    impl Deliver for Outbox {
        fn deliver(&self, sid: u64, answers: impl Iterator<Item = (u64, Reply)>) {
            let mut ids = Vec::new();
            for (id, reply) in answers {
                let errno = if let Reply::Errno(e) = reply { e } else { 0 };
                self.0.borrow_mut().push((sid, id, errno));
                ids.push(id);
            }
            self.1.borrow_mut().push((sid, ids));
        }
    }

    fn done() -> Reply {
        Reply::Meta(interlock_proto::meta::MetaReply::Done)
    }

    #[test]
    fn an_answer_whose_record_is_durable_or_absent_goes_at_once() {
        let (acker, out) = (Acker::default(), Outbox::default());
        assert!(acker.answer(&Script::new(&[8], false), &out, (7, 1, 10), done()).is_some());
        assert!(acker.answer(&Script::new(&[1], false), &out, (0, 1, 11), done()).is_some());
        assert!(out.0.borrow().is_empty());
    }

    #[test]
    fn a_sync_that_ends_after_the_answer_is_parked_delivers_it_once() {
        let (acker, out) = (Acker::default(), Outbox::default());
        let journal = Script::new(&[7], false);
        assert!(acker.answer(&journal, &out, (7, 1, 10), done()).is_none());
        assert_eq!(journal.wanted.get(), 8, "the journal is told someone waits");
        assert!(out.0.borrow().is_empty(), "not durable yet");
        acker.drain(&out, 7, false);
        assert!(out.0.borrow().is_empty(), "a sync below the record answers nothing");
        acker.drain(&out, 8, false);
        acker.drain(&out, 9, false);
        assert_eq!(*out.0.borrow(), vec![(1, 10, 0)]);
    }

    /// The race the second look in `answer` closes: the sync covering the
    /// record ends, and its hook drains (finding nothing), between the
    /// first look at the watermark and the park. Without the second look
    /// the answer would wait forever.
    #[test]
    fn a_sync_that_ends_between_the_look_and_the_park_still_delivers_it() {
        let (acker, out) = (Acker::default(), Outbox::default());
        let journal = Script::new(&[7, 8], false);
        acker.drain(&out, 8, false); // the hook, before the park
        assert!(acker.answer(&journal, &out, (7, 1, 10), done()).is_none());
        assert_eq!(*out.0.borrow(), vec![(1, 10, 0)]);
        acker.drain(&out, 8, false); // a later hook finds it gone
        assert_eq!(out.0.borrow().len(), 1, "delivered once");
    }

    /// One sync's answers to one session leave in one delivery, in its
    /// requests' order, the sessions in the order of their first answer;
    /// answers the sync did not cover stay.
    #[test]
    fn one_syncs_answers_to_a_session_leave_together_in_request_order() {
        let (acker, out) = (Acker::default(), Outbox::default());
        let journal = Script::new(&[1], false);
        for (seq, sid, id) in [(1, 2, 20), (2, 1, 10), (3, 2, 21), (4, 1, 11), (5, 2, 22), (9, 2, 23), (6, 3, 30)] {
            assert!(acker.answer(&journal, &out, (seq, sid, id), done()).is_none());
        }
        acker.drain(&out, 7, false);
        assert_eq!(*out.1.borrow(), vec![(2, vec![20, 21, 22]), (1, vec![10, 11]), (3, vec![30])]);
        acker.drain(&out, 10, false);
        assert_eq!(out.1.borrow().last(), Some(&(2, vec![23])));
        assert_eq!(out.0.borrow().len(), 7, "each once");
    }

    #[test]
    fn a_failed_journal_answers_everything_parked_with_eio() {
        let (acker, out) = (Acker::default(), Outbox::default());
        assert!(acker.answer(&Script::new(&[3], false), &out, (5, 2, 20), done()).is_none());
        assert!(acker.answer(&Script::new(&[3], true), &out, (6, 2, 21), done()).is_none());
        let mut got = out.0.borrow().clone();
        got.sort();
        assert_eq!(got, vec![(2, 20, libc::EIO), (2, 21, libc::EIO)]);
    }
}
