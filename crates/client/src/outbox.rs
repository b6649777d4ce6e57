//! The way out to the server: callers encode their requests straight into
//! one shared buffer, and the connection's writer takes the whole buffer
//! and writes it in one system call.
//!
//! No request is copied, boxed or queued on its own: `send` appends a
//! frame under a short lock and wakes the writer. Requests sent while the
//! writer is busy writing simply gather for the next write, so pipelined
//! callers share system calls without anyone waiting for a batch to fill.

use std::sync::Arc;

use bytes::BytesMut;
use interlock_proto::{self as proto, ClientMsgRef};
use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use crate::ClientError;

#[derive(Default)]
struct Out {
    buf: BytesMut,
    /// A connection is up to take what is sent.
    open: bool,
}

/// Requests on their way to the server.
#[derive(Default)]
pub(crate) struct Outbox {
    out: Mutex<Out>,
    ready: Notify,
}

impl Outbox {
    /// Appends a request for the writer; fails when no connection is up
    /// (its reply would never come) or the request is over the frame
    /// limit. O(size of the request).
    pub fn send(&self, msg: &ClientMsgRef<'_>) -> Result<(), ClientError> {
        let mut out = self.out.lock();
        if !out.open {
            return Err(ClientError::ConnectionLost);
        }
        proto::write_frame(msg, &mut out.buf).map_err(|e| ClientError::Invalid(e.to_string()))?;
        drop(out);
        self.ready.notify_one();
        Ok(())
    }

    /// A new connection is up: what is sent from now on goes to it.
    pub fn open(&self) {
        let mut out = self.out.lock();
        out.buf.clear();
        out.open = true;
    }

    /// The connection is gone: requests fail until the next one is up.
    /// Whatever was not written is dropped with it (its callers learn of
    /// the loss as their replies are cleared).
    pub fn close(&self) {
        let mut out = self.out.lock();
        out.buf.clear();
        out.open = false;
    }

    /// Writes what callers send to `wr`, until a write fails or the task
    /// is aborted. While `busy()` says other requests are outstanding (so
    /// their callers are about to send more), it lets the ready callers
    /// run first, a few rounds at most, while they keep adding: many then
    /// share one write. A lone request goes out at once.
    pub async fn write_to(self: Arc<Self>, mut wr: impl AsyncWrite + Unpin, busy: impl Fn() -> bool) {
        let mut batch = BytesMut::with_capacity(8 << 10);
        loop {
            self.ready.notified().await;
            for _ in 0..3 {
                if !busy() {
                    break;
                }
                let before = self.out.lock().buf.len();
                tokio::task::yield_now().await;
                if self.out.lock().buf.len() == before {
                    break;
                }
            }
            std::mem::swap(&mut self.out.lock().buf, &mut batch);
            if batch.is_empty() {
                continue;
            }
            if wr.write_all(&batch).await.is_err() {
                return;
            }
            batch.clear();
        }
    }
}
