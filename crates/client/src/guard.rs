//! Futures dropped midway: a lock request withdrawn at the server, a local
//! wait withdrawn from the local table, and any grant that raced the drop
//! given back.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use interlock_proto::{ClientMsgRef, Op, Reply};
use tokio::sync::oneshot;

use crate::connection::give_back;
use crate::tables::Submitted;
use crate::{Answer, Inner, LockSpec, Replied, local_effects};

/// A lock request in flight. Dropped before it is answered, it withdraws
/// the request and gives back a grant that raced the drop: one already in
/// a receiver, or one still to come (then the request is listed as
/// abandoned and the dispatcher gives it back).
pub(crate) struct WaitGuard<'a> {
    pub inner: &'a Arc<Inner>,
    pub id: u64,
    /// A non-blocking request, kept to give back a grant that comes after
    /// a drop; a blocking one is kept in `Tables::waits` (for reclaim).
    pub op: Option<Op>,
    /// Still in flight: a drop withdraws it.
    pub live: bool,
    pub reply_rx: oneshot::Receiver<Replied>,
    /// For a blocking request, where its grant arrives.
    pub grant_rx: Option<oneshot::Receiver<Answer>>,
}

impl<'a> WaitGuard<'a> {
    /// Guards request `id`, just sent as `sent`.
    pub fn new(inner: &'a Arc<Inner>, id: u64, sent: Submitted) -> Self {
        WaitGuard { inner, id, op: sent.op, live: true, reply_rx: sent.reply_rx, grant_rx: sent.grant_rx }
    }

    /// The request is over (granted, refused or failed): nothing to
    /// withdraw.
    pub fn done(&mut self) {
        if self.grant_rx.is_some() {
            self.inner.tables.lock().waits.remove(&self.id);
        }
        self.live = false;
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        {
            // Under one lock, so `dispatch` finds the request either here
            // (and delivers into a receiver) or abandoned.
            let mut t = self.inner.tables.lock();
            t.pending.remove(&self.id);
            let Some(op) = t.waits.remove(&self.id).map(|w| w.op).or_else(|| self.op.take()) else { return };
            t.abandoned.insert(self.id, op);
        }
        let mut pushed = || match self.grant_rx.as_mut().and_then(|rx| rx.try_recv().ok()) {
            Some(Answer { reply: Reply::Granted(g), .. }) => Some(g),
            _ => None,
        };
        let grant = match self.reply_rx.try_recv() {
            Ok(Ok(Reply::Granted(g))) => Some(g),
            Ok(Ok(Reply::Queued)) => pushed(),
            Ok(_) => {
                // Refused, or never read: nothing held, nothing to come.
                self.inner.tables.lock().abandoned.remove(&self.id);
                return;
            }
            // No reply (or `Queued`, consumed): a grant may have come
            // first all the same (the server writes the pushes it made
            // before a request's reply ahead of it), and with the request
            // moved to `abandoned`, what is in the receiver is all there
            // is.
            Err(_) => pushed(),
        };
        let blocking = self.grant_rx.is_some();
        match grant {
            Some(g) => {
                if let Some(op) = self.inner.tables.lock().abandoned.remove(&self.id) {
                    give_back(self.inner, op, g);
                }
            }
            // A blocking request may be queued at the server: withdraw
            // it. A non-blocking one is answered at once, and its reply
            // settles it.
            None if blocking => {
                let cancel = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                self.inner.tables.lock().cancelling.insert(cancel, self.id);
                let op = Op::Cancel { request: self.id };
                let _ = self.inner.outbox.send(&ClientMsgRef::Request { id: cancel, op: &op });
            }
            None => {}
        }
    }
}

/// A local wait, withdrawn if its future is dropped; once granted
/// (`wait: None`), the local grant, given back when dropped.
pub(crate) struct LocalWait {
    pub inner: Arc<Inner>,
    pub spec: LockSpec,
    pub wait: Option<u64>,
}

impl Drop for LocalWait {
    fn drop(&mut self) {
        let s = &self.spec;
        let resp = match self.wait {
            Some(w) => {
                self.inner.tables.lock().local_waits.remove(&w);
                self.inner.local.cancel(&s.resource, s.core_kind(), w)
            }
            None => self.inner.local.unlock(&s.resource, s.local_owner(), s.core_kind(), s.range),
        };
        if let Ok(resp) = resp {
            local_effects(&self.inner, resp.effects);
        }
    }
}
