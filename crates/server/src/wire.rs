//! A connection's way out: one buffer of frames in the order they were
//! made, shared by the connection's own task (its replies) and by every
//! task that pushes to its session (grants, blocking callbacks).
//!
//! A push to a connection with nothing queued ahead of it is written at
//! once by the pushing task, with no hand-off to the connection's task:
//! a lock hand-over to a client on another connection is one task switch
//! and one write shorter. Otherwise the push waits in the buffer behind
//! what is ahead of it, and the connection's task writes it.
//!
//! Invariants:
//! - Frames are appended under the buffer's lock, in the order their
//!   messages were made, and leave in that order: a push made before a
//!   reply goes ahead of it (a grant that raced a cancel reaches the
//!   client before the cancel's reply).
//! - Bytes go to the socket only under the lock with `writing` unset, or
//!   from the connection's task while it has `writing` set, so two writers
//!   never interleave.
//! - Appending never does I/O: the session table appends under its own
//!   lock and writes (`kick`) after releasing it.

use bytes::{Buf, BytesMut};
use interlock_proto::{self as proto, ServerMsg};
use parking_lot::Mutex;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

#[derive(Default)]
struct Out {
    buf: BytesMut,
    /// The connection's task is writing a batch it took from `buf`.
    writing: bool,
    /// The connection is gone: pushes go to the session's backlog.
    closed: bool,
}

pub(crate) struct Wire {
    out: Mutex<Out>,
    wr: OwnedWriteHalf,
    /// Tells the connection's task that bytes wait in the buffer.
    ready: Notify,
}

impl Wire {
    /// A wire that holds everything back until [`Wire::open`].
    pub fn new(wr: OwnedWriteHalf) -> Wire {
        Wire { out: Mutex::new(Out { writing: true, ..Out::default() }), wr, ready: Notify::new() }
    }

    /// Puts `first` ahead of whatever was pushed so far and lets bytes go.
    pub fn open(&self, first: &ServerMsg) {
        let mut out = self.out.lock();
        let pushed = std::mem::take(&mut out.buf);
        put(&mut out.buf, first);
        out.buf.extend_from_slice(&pushed);
        out.writing = false;
    }

    /// Appends a message. `false` if the connection is gone.
    pub fn append(&self, msg: &ServerMsg) -> bool {
        let mut out = self.out.lock();
        if !out.closed {
            put(&mut out.buf, msg);
        }
        !out.closed
    }

    /// Writes what waits, from the calling task, unless the connection's
    /// task is writing (it writes it next). What the socket does not take
    /// now is left to the connection's task.
    pub fn kick(&self) {
        let mut out = self.out.lock();
        if out.writing || out.buf.is_empty() {
            return;
        }
        if let Ok(n) = self.wr.try_write(&out.buf) {
            out.buf.advance(n);
        }
        let left = !out.buf.is_empty();
        drop(out);
        if left {
            self.ready.notify_one();
        }
    }

    /// Waits until bytes wait in the buffer (for the connection's task).
    pub async fn ready(&self) {
        self.ready.notified().await
    }

    /// Writes everything in the buffer, including what is appended while
    /// it writes (for the connection's task; `spare` is its buffer to
    /// swap in).
    pub async fn flush(&self, spare: &mut BytesMut) -> std::io::Result<()> {
        loop {
            {
                let mut out = self.out.lock();
                if out.buf.is_empty() {
                    out.writing = false;
                    return Ok(());
                }
                std::mem::swap(&mut out.buf, spare);
                out.writing = true;
            }
            while !spare.is_empty() {
                self.wr.writable().await?;
                match self.wr.try_write(spare) {
                    Ok(n) => spare.advance(n),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            spare.clear();
        }
    }

    /// The connection is gone: nothing more is appended or written.
    pub fn close(&self) {
        let mut out = self.out.lock();
        out.closed = true;
        out.buf.clear();
    }
}

/// Appends a message's frame. Every server message is far below the frame
/// limit (names, values and error texts are bounded), so one over it is a
/// bug; it is logged and left out rather than sent.
pub(crate) fn put(out: &mut BytesMut, msg: &ServerMsg) {
    if let Err(e) = proto::write_frame(msg, out) {
        tracing::error!(error = %e, "server message not sent");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use interlock_proto::{GrantInfo, Reply};

    fn granted(id: u64) -> ServerMsg {
        ServerMsg::Granted { id, grant: GrantInfo { fence: id, lvb: None, handle: None } }
    }

    fn reply(id: u64) -> ServerMsg {
        ServerMsg::Reply { id, reply: Reply::Done }
    }

    /// Frames leave in the order they were made, whoever writes them: the
    /// welcome ahead of what was pushed before it, and a push behind the
    /// replies made before it.
    #[tokio::test]
    async fn frames_leave_in_the_order_they_were_made() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_rd, wr) = server.into_split();
        let wire = Wire::new(wr);
        let mut spare = BytesMut::new();

        // Held until opened: a push made now is not written, even kicked.
        assert!(wire.append(&granted(1)));
        wire.kick();
        let welcome = ServerMsg::Refused { reason: "first".into() };
        wire.open(&welcome);
        wire.flush(&mut spare).await.unwrap();

        // A reply not yet flushed, then a push from elsewhere, kicked: it
        // goes out behind the reply, in the pushing task's write.
        assert!(wire.append(&reply(2)));
        assert!(wire.append(&granted(3)));
        wire.kick();

        let mut frames = interlock_proto::reader::<ServerMsg, _>(client);
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(frames.next().await.unwrap().unwrap());
        }
        assert_eq!(got, [welcome, granted(1), reply(2), granted(3)]);

        // Once closed, nothing more is taken: pushes go to the backlog.
        wire.close();
        assert!(!wire.append(&granted(4)));
    }
}
