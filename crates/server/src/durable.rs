//! Answers that wait for the journal. A namespace change is acknowledged
//! only once its record is durable, but a tokio worker must not wait for
//! the disk: a change whose record is already durable is answered at
//! once; any other is parked here, and the journal's flusher, right after
//! the sync that covers it, pushes the answer into its session's stream
//! (as pushed grants go) through the hook [`Acker::hook`] gives it. One
//! fsync thus answers every change it covers, whatever connections they
//! came on, and no thread stands between the sync and the answer: a
//! thread of our own woken by the flusher cost a wake-up (tens of µs on
//! two busy cores) on every change's latency.
//!
//! Costs: O(1) to park an answer; O(parked) per watermark move, on the
//! flusher's thread.

use std::sync::Arc;

use interlock_journal::{DurableHook, Journal};
use interlock_meta::Seq;
use interlock_proto::{Reply, ServerMsg};
use parking_lot::Mutex;

use crate::session::{Delivered, Sessions};

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
    /// The flusher's hook: answers what each sync made durable, and
    /// everything with `EIO` once the journal has failed (the change is
    /// applied in memory but would not survive a restart).
    pub fn hook(self: &Arc<Self>, sessions: Arc<Sessions>) -> DurableHook {
        let me = self.clone();
        Box::new(move |end, failed| me.drain(&sessions, end, failed))
    }

    /// The answer to request `id` of session `sid`, whose change has the
    /// record `seq`: now if that is durable (or there is none), else
    /// `None` and the flusher's hook pushes it once it is.
    pub fn answer(
        &self,
        journal: &Journal,
        sessions: &Sessions,
        (seq, sid, id): (Seq, u64, u64),
        reply: Reply,
    ) -> Option<Reply> {
        if seq == 0 || journal.durable_end() > seq {
            return Some(reply);
        }
        self.pending.lock().push(Pending { seq, sid, id, reply });
        // Someone waits for this record: the flusher must not linger.
        journal.want(seq + 1);
        // The sync covering `seq` may have ended, and its hook run, between
        // the check above and the push: then nothing else would answer.
        // The hook drains under the same lock after storing the watermark,
        // so one of the two sees the answer.
        let (end, failed) = (journal.durable_end(), journal.failed());
        if end > seq || failed {
            self.drain(sessions, end, failed);
        }
        None
    }

    /// Pushes every parked answer whose record is below `end`.
    fn drain(&self, sessions: &Sessions, end: u64, failed: bool) {
        // One pass; the answers still waiting keep their place.
        let ready: Vec<Pending> = self.pending.lock().extract_if(.., |x| failed || x.seq < end).collect();
        for x in ready {
            let reply = if failed { Reply::Errno(libc::EIO) } else { x.reply };
            push(sessions, x.sid, x.id, reply);
        }
    }
}

/// Pushes an answer into its session's stream (dropped if the session
/// has ended).
pub(crate) fn push(sessions: &Sessions, sid: u64, id: u64, reply: Reply) {
    if let Delivered::Kick(wire) = sessions.push(sid, ServerMsg::Reply { id, reply }) {
        wire.kick();
    }
}
