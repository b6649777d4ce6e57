//! Answers that wait for the journal. A namespace change is acknowledged
//! only once its record is durable, but a tokio worker must not wait for
//! the disk: a change whose record is already durable is answered at
//! once; any other is handed to the acker, one thread that waits on the
//! journal's durable watermark and pushes each answer into its session's
//! stream as the watermark passes it (as pushed grants go). One fsync
//! thus answers every change it covers, whatever connections they came
//! on.
//!
//! Costs: O(1) to hand an answer over; the acker does O(pending) per
//! watermark move.

use std::sync::Weak;
use std::time::Duration;

use interlock_meta::{Seq, Store};
use interlock_proto::{Reply, ServerMsg};
use parking_lot::{Condvar, Mutex};

use crate::Inner;
use crate::session::Delivered;

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
    arrived: Condvar,
}

impl Acker {
    /// The answer to request `id` of session `sid`, whose change has the
    /// record `seq`: now if that is durable (or there is none), else
    /// `None` and the acker pushes it once it is.
    pub fn answer(&self, store: &Store, seq: Seq, sid: u64, id: u64, reply: Reply) -> Option<Reply> {
        if seq == 0 || store.changelog().journal().durable_end() > seq {
            return Some(reply);
        }
        self.pending.lock().push(Pending { seq, sid, id, reply });
        self.arrived.notify_one();
        None
    }
}

/// Pushes an answer into its session's stream (dropped if the session
/// has ended).
pub(crate) fn push(inner: &Inner, sid: u64, id: u64, reply: Reply) {
    if let Delivered::Kick(wire) = inner.sessions.push(sid, ServerMsg::Reply { id, reply }) {
        wire.kick();
    }
}

/// The acker's thread: runs until the server is gone.
pub(crate) fn run(inner: Weak<Inner>) {
    loop {
        let Some(server) = inner.upgrade() else { return };
        let acker = &server.acker;
        let journal = server.store.changelog().journal();
        let highest = {
            let mut p = acker.pending.lock();
            if p.is_empty() {
                // Woken by an arrival, or now and then to see whether the
                // server is still there.
                acker.arrived.wait_for(&mut p, Duration::from_millis(200));
            }
            p.iter().map(|x| x.seq).max()
        };
        let Some(highest) = highest else { continue };
        let failed = journal.wait_for(highest + 1, Some(Duration::from_millis(200))).is_err();
        let durable = journal.durable_end();
        let ready: Vec<Pending> = {
            let mut p = acker.pending.lock();
            let (ready, waiting) = std::mem::take(&mut *p).into_iter().partition(|x| failed || x.seq < durable);
            *p = waiting;
            ready
        };
        for x in ready {
            // A journal that failed acknowledges nothing more: the change
            // is applied in memory but would not survive a restart.
            let reply = if failed { Reply::Errno(libc::EIO) } else { x.reply };
            push(&server, x.sid, x.id, reply);
        }
    }
}
