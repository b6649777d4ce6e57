//! The files this client holds open at the server. A server's opens are
//! a session's, like its locks: they go with the session. So in every new
//! session (after a server restart, or a lease that ran out) the client
//! opens each file again, and a file unlinked while open here outlives a
//! server restart: the server frees the orphans nobody opened again only
//! once its recovery window is over.
//!
//! Each handle is open at the server once: the count changes under the
//! tables' lock, a release as it is sent, an open as its answer is taken,
//! and a new session reads it as it begins (see
//! [`settle`](crate::connection::settle)). An open answered in one
//! session and taken in the next is opened again then.
//!
//! Costs: O(1) expected per open and release; O(files open) per new
//! session.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use foldhash::HashMap;
use interlock_meta::{Cred, Ino};
use interlock_proto::meta::{MetaOp, MetaReply};
use interlock_proto::{Op, Reply};

use crate::Inner;
use crate::tables::Tables;

/// Handles open at the server, by inode.
#[derive(Default)]
pub(crate) struct Opens(HashMap<Ino, u32>);

impl Opens {
    fn add(&mut self, ino: Ino) {
        *self.0.entry(ino).or_default() += 1;
    }

    /// One handle of `ino` fewer (none if it had none).
    pub(crate) fn take(&mut self, ino: Ino) {
        if let Some(n) = self.0.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&ino);
            }
        }
    }
}

/// An open of `ino` answered in session `generation`: counted, and opened
/// again if a new session has begun since (its server does not know it).
pub(crate) fn opened(inner: &Arc<Inner>, ino: Ino, generation: u64) {
    let mut t = inner.tables.lock();
    t.opens.add(ino);
    if inner.generation.load(Ordering::Relaxed) != generation {
        reopen(inner, &mut t, ino);
    }
}

/// A new session begins: every handle is opened again in it. The caller
/// holds the tables' lock, with the session's stream open.
pub(crate) fn reopen_all(inner: &Arc<Inner>, t: &mut Tables) {
    let handles: Vec<(Ino, u32)> = t.opens.0.iter().map(|(&ino, &n)| (ino, n)).collect();
    for (ino, n) in handles {
        for _ in 0..n {
            reopen(inner, t, ino);
        }
    }
}

/// Opens `ino` again. The open was allowed when first made, and a
/// permission taken away since does not take the handle away (as on
/// Linux): it goes as root, asking for no access to check. Refused, the
/// file is gone (it was unlinked while open, and we came back after the
/// server's recovery window): said loudly, and no longer counted.
fn reopen(inner: &Arc<Inner>, t: &mut Tables, ino: Ino) {
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    let op = Op::Meta { cred: Cred::root(), op: MetaOp::Open { ino, want: 0 }, once: None };
    let Ok(rx) = t.send(&inner.outbox, id, &op) else { return };
    let weak = Arc::downgrade(inner);
    tokio::spawn(async move {
        // No answer (or never read): the session changed again, and the
        // next one opens the file again.
        let Ok(Ok(reply)) = rx.await else { return };
        if matches!(reply, Reply::Meta(MetaReply::Attr(_))) {
            return;
        }
        tracing::warn!(
            ino,
            ?reply,
            "a file held open here is gone at the server (unlinked while open, and the server restarted and \
             closed its recovery window before this client was back): its reads and writes fail"
        );
        if let Some(inner) = weak.upgrade() {
            inner.tables.lock().opens.take(ino);
        }
    });
}
