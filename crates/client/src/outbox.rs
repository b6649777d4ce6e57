//! The way out to the server: the session's stream of requests. Callers
//! encode their requests straight into one shared buffer, and the
//! connection's writer takes the whole buffer and writes it in one system
//! call. What was written stays until its reply comes (which says the
//! server took it in), so that after a lost connection the next one sends
//! again what the server never got.
//!
//! No request is copied, boxed or queued on its own: `send` appends a
//! frame under a short lock and wakes the writer. Requests sent while the
//! writer is busy writing simply gather for the next write, so pipelined
//! callers share system calls without anyone waiting for a batch to fill.
//!
//! The stream is counted in bytes from the session's start: `sent` then
//! `buf` run without a gap to `end`.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::BytesMut;
use interlock_proto::{self as proto, ClientMsgRef, Unacked};
use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use crate::ClientError;

#[derive(Default)]
struct Out {
    /// Sent by callers, not yet taken by the writer.
    buf: BytesMut,
    /// Taken by the writer, not yet known to have reached the server.
    sent: Unacked,
    /// The stream offset after the last request.
    end: u64,
    /// Where each request still waiting for its reply ends, oldest
    /// first: replies come in request order.
    replies: VecDeque<u64>,
    /// The client still has a server: it is connected, or reconnecting
    /// (then requests wait here for the next connection).
    open: bool,
}

/// Requests on their way to the server.
#[derive(Default)]
pub(crate) struct Outbox {
    out: Mutex<Out>,
    ready: Notify,
}

impl Outbox {
    /// Appends a request for the writer (or for the next connection, while
    /// the client reconnects); fails when the client gave up its server
    /// or the request is over the frame limit. Returns where in the
    /// session's stream the request ends. O(size of the request).
    pub fn send(&self, msg: &ClientMsgRef<'_>) -> Result<u64, ClientError> {
        let mut out = self.out.lock();
        if !out.open {
            return Err(ClientError::ConnectionLost);
        }
        let before = out.buf.len();
        proto::write_frame(msg, &mut out.buf).map_err(|e| ClientError::Invalid(e.to_string()))?;
        out.end += (out.buf.len() - before) as u64;
        let end = out.end;
        out.replies.push_back(end);
        drop(out);
        self.ready.notify_one();
        Ok(end)
    }

    /// The oldest request's reply came: the server has it and all before
    /// it, which need not be kept. O(1) amortized.
    pub fn replied(&self) {
        let mut out = self.out.lock();
        if let Some(end) = out.replies.pop_front() {
            out.sent.ack(end);
        }
    }

    /// A new session: its stream starts empty, and what the last one did
    /// not send is dropped (its callers learn of the loss as their
    /// replies are cleared).
    pub fn open(&self) {
        *self.out.lock() = Out { open: true, ..Out::default() };
    }

    /// The session was resumed on a new connection whose server took in
    /// the stream up to `received`: the rest goes again, ahead of what is
    /// sent from now on. `false` if the server claims bytes never written
    /// (or dropped already). O(bytes sent again).
    pub fn resume(&self, received: u64) -> bool {
        let mut guard = self.out.lock();
        let out = &mut *guard;
        let Some(again) = out.sent.replay(received, &out.buf) else { return false };
        out.buf = again;
        out.open = true;
        let waiting = !out.buf.is_empty();
        drop(guard);
        if waiting {
            self.ready.notify_one();
        }
        true
    }

    /// The client gave up its server (it was refused, or closed): requests
    /// fail from now on.
    pub fn close(&self) {
        self.out.lock().open = false;
    }

    /// Writes what callers send to `wr`, until a write fails or the task
    /// is aborted. While `busy()` says other requests are outstanding (so
    /// their callers are about to send more), it lets the ready callers
    /// run first, a few rounds at most, while they keep adding: many then
    /// share one write. A lone request goes out at once.
    pub async fn write_to(self: Arc<Self>, mut wr: impl AsyncWrite + Unpin, busy: impl Fn() -> bool) {
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
            let batch = {
                let mut out = self.out.lock();
                if out.buf.is_empty() {
                    continue;
                }
                let batch = out.buf.split().freeze();
                out.sent.push(batch.clone());
                batch
            };
            if wr.write_all(&batch).await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_proto::{ClientMsg, Op};

    fn request(id: u64) -> ClientMsgRef<'static> {
        ClientMsgRef::Request { id, op: &Op::Status }
    }

    /// What a resumed session sends again: every request after what the
    /// server took in, in order, ahead of new ones; and what was replied
    /// to is not kept.
    #[tokio::test]
    async fn a_resumed_stream_sends_again_what_the_server_missed() {
        let outbox = Arc::new(Outbox::default());
        outbox.open();
        let (mut theirs, ours) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(outbox.clone().write_to(ours, || false));
        let mut frame = BytesMut::new();
        proto::write_frame(&request(1), &mut frame).unwrap();
        let len = frame.len() as u64;
        for id in 1..=4 {
            outbox.send(&request(id)).unwrap();
            // One write each, so each is its own chunk.
            let mut got = vec![0u8; len as usize];
            tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut got).await.unwrap();
        }
        outbox.replied();
        writer.abort();
        assert!(!outbox.resume(0), "request 1 was replied to: dropped");
        assert!(!outbox.resume(5 * len), "never written");
        // The server took in requests 1 and 2 (of which 1 was replied).
        assert!(outbox.resume(2 * len));
        outbox.send(&request(5)).unwrap();
        let (mut theirs, ours) = tokio::io::duplex(1 << 16);
        tokio::spawn(outbox.clone().write_to(ours, || false));
        let mut frames = proto::reader::<ClientMsg, _>(&mut theirs);
        let mut ids = Vec::new();
        for _ in 0..3 {
            match futures::StreamExt::next(&mut frames).await.unwrap().unwrap() {
                ClientMsg::Request { id, .. } => ids.push(id),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(ids, [3, 4, 5]);
    }
}
