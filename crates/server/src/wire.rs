//! A session's way out: its stream of frames (replies and pushes) in the
//! order they were made, written to whichever connection the session has,
//! and kept until the client acknowledges them, so that after a lost
//! connection the next one sends again what the client never got.
//!
//! The buffer is shared by the connection's own task (its replies) and by
//! every task that pushes to the session (grants, blocking callbacks). A
//! push to a connection with nothing queued ahead of it is written at
//! once by the pushing task, with no hand-off to the connection's task: a
//! lock hand-over to a client on another connection is one task switch
//! and one write shorter. Otherwise the push waits in the buffer behind
//! what is ahead of it, and the connection's task writes it.
//!
//! Invariants:
//! - Frames are appended under the buffer's lock, in the order their
//!   messages were made, and leave in that order: a push made before a
//!   reply goes ahead of it (a grant that raced a cancel reaches the
//!   client before the cancel's reply).
//! - The stream is counted in bytes from the session's start; `unacked`
//!   then `pending` run without a gap to its end. Bytes move from
//!   `pending` to `unacked` before they are written, so a write cut short
//!   (by a failed connection or a cancelled task) loses nothing.
//! - Bytes go to the socket only under the lock with `writing` unset, or
//!   from the connection's task while it has `writing` set, so two writers
//!   never interleave.
//! - Appending never does I/O: whoever appends (the session table, under
//!   its own lock, for grants; the connection's task and the syncing
//!   thread under the buffer's alone) writes (`kick`) after releasing
//!   the locks.

use std::borrow::Borrow;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use interlock_proto::{self as proto, Reply, ServerMsg, Unacked};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::budget::Budget;
use crate::transport::Writer;

/// Unacknowledged bytes a session may pile up. Past it the session can no
/// longer be resumed: see [`Wire::attach`]. The client acknowledges every
/// 16 KiB it takes in, but its acknowledgements come behind the requests
/// it sent before them, and what the sockets hold on its way counts too
/// (Linux lets a receive buffer grow to `tcp_rmem`'s maximum, 6 MiB by
/// default, 32 MiB on some machines). So the connection's task holds
/// requests back while [`FULL`] bytes are kept, reading on for the
/// acknowledgements (see `connection`), and only a client that
/// acknowledges nothing, or a session without a connection that is
/// pushed to for long, reaches this. (It was 4 MiB, with nothing held
/// back, until session 39: a mount's 32 parallel readers passed it in
/// one batch of answers, and their session ended.)
const MAX_UNACKED: usize = 64 << 20;

/// Bytes kept (written and unacknowledged, or waiting to be written) past
/// which the connection's task serves no more requests until the client
/// acknowledges some.
const FULL: usize = 16 << 20;

/// Bytes of requests a connection holds back while its session's stream
/// is full, past which it serves them anyway (as past `max_in_flight` of
/// them). Without it, a client that takes in its answers but never
/// acknowledges them, then sends 1 MiB writes, made the server hold every
/// write it sent: one connection held 2.3 GB in session 47's probe.
/// With it a connection holds at most this and its stream's bound.
const HELD: usize = FULL;

#[derive(Default)]
struct Out {
    /// Made, not yet taken for writing.
    pending: BytesMut,
    /// Taken for writing, not yet acknowledged.
    unacked: Unacked,
    /// The session's connection, if it has one.
    wr: Option<Arc<Writer>>,
    /// A task is writing a batch it took (or the welcome is going out).
    writing: bool,
    /// More than [`MAX_UNACKED`] piled up and was dropped.
    broken: bool,
    /// Bytes of answers being made on other threads (reads from the
    /// disk), to be pushed.
    promised: usize,
    /// Bytes of requests the connection holds back (see [`Wire::admit`]).
    held: usize,
    /// What the session's stream is charged in the server's [`Budget`].
    charged: usize,
}

impl Out {
    /// Moves the first `n` bytes of `pending` to `unacked`.
    fn take(&mut self, n: usize) -> Bytes {
        let chunk = self.pending.split_to(n).freeze();
        self.unacked.push(chunk.clone());
        chunk
    }

    /// Bytes kept, written or not.
    fn kept(&self) -> usize {
        (self.unacked.end() - self.unacked.start()) as usize + self.pending.len()
    }

    /// Whether the connection should serve no more requests: [`FULL`]
    /// bytes kept or promised, or, while the server's streams together
    /// are past their budget, this stream's `share` of it taken.
    fn full(&self, share: Option<usize>) -> bool {
        self.kept() + self.promised >= FULL || share.is_some_and(|s| self.footprint() >= s)
    }

    /// Bytes the stream takes: kept, promised and held back.
    fn footprint(&self) -> usize {
        self.kept() + self.promised + self.held
    }
}

/// What the connection does with the first request it holds back (see
/// [`Wire::admit`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Serves it.
    Serve,
    /// Holds it (and those behind it) until the client acknowledges more.
    Hold,
    /// Closes: the stream was cut, the client holding back too much while
    /// the server's streams are past their budget.
    Cut,
}

#[derive(Default)]
pub(crate) struct Wire {
    out: Mutex<Out>,
    /// Tells the connection's task that bytes wait in the buffer.
    ready: Notify,
    /// What all sessions' streams may take together.
    budget: Arc<Budget>,
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.budget.charge(self.out.get_mut().charged, 0);
    }
}

impl Wire {
    /// A stream charged to `budget`.
    pub fn new(budget: Arc<Budget>) -> Wire {
        Wire { out: Mutex::default(), ready: Notify::new(), budget }
    }

    /// Charges the stream for what it takes now. O(1).
    fn settle(&self, out: &mut Out) {
        out.charged = self.budget.charge(out.charged, out.footprint());
    }

    /// Drops what the stream keeps: it can no longer resume, and its
    /// connection's task closes the connection.
    fn cut(&self, out: &mut Out, why: &str) {
        tracing::warn!("{why}; the session can no longer resume");
        self.budget.charge(out.charged, 0);
        *out = Out { broken: true, ..Out::default() };
        self.ready.notify_one();
    }

    /// Gives the session connection `wr`, whose client took in the stream
    /// up to `received`: what follows is written to `wr` (after
    /// [`Wire::open`]). `false` if that cannot be: the bytes after
    /// `received` are gone (dropped past [`MAX_UNACKED`], or acknowledged
    /// already), or were never written. O(bytes after `received`).
    pub fn attach(&self, wr: Arc<Writer>, received: u64) -> bool {
        let mut out = self.out.lock();
        let out = &mut *out;
        if out.broken {
            return false;
        }
        let Some(again) = out.unacked.replay(received, &out.pending) else { return false };
        out.pending = again;
        out.wr = Some(wr);
        out.writing = true;
        // The requests held back were the last connection's.
        out.held = 0;
        self.settle(out);
        true
    }

    /// Whether the connection, holding back `held` bytes of requests
    /// (`many`: more of them than it may), serves the first of them now.
    /// It holds them while the stream is full: [`FULL`] bytes kept
    /// (written and not acknowledged, or waiting to be written) or
    /// promised, or its share of the [`Budget`] taken while all streams
    /// are past it. Past [`HELD`] bytes held, or `many`, it serves them
    /// anyway; but while the streams are past their budget, holding more
    /// than a share cuts the stream. O(1).
    pub fn admit(&self, held: usize, many: bool) -> Admit {
        let mut out = self.out.lock();
        let share = self.budget.share();
        let over = many || held > share.map_or(HELD, |s| s.min(HELD));
        let admit = match (out.full(share), over) {
            (false, _) => Admit::Serve,
            (true, false) => Admit::Hold,
            (true, true) if share.is_some() => Admit::Cut,
            (true, true) => Admit::Serve,
        };
        match admit {
            Admit::Cut => self.cut(&mut out, "a session held back past its share of max-output-memory"),
            Admit::Hold => out.held = held,
            // What remains held is told again before it is held.
            Admit::Serve => out.held = 0,
        }
        self.settle(&mut out);
        admit
    }

    /// An answer of up to `bytes` is being made elsewhere, to be pushed.
    pub fn promise(&self, bytes: usize) {
        let mut out = self.out.lock();
        out.promised += bytes;
        self.settle(&mut out);
    }

    /// The answer promised with `bytes` was pushed.
    pub fn fulfil(&self, bytes: usize) {
        let mut out = self.out.lock();
        out.promised = out.promised.saturating_sub(bytes);
        self.settle(&mut out);
    }

    /// The welcome is out: bytes may go.
    pub fn open(&self) {
        self.out.lock().writing = false;
    }

    /// The connection `wr` is gone (if it is still the session's).
    pub fn detach(&self, wr: &Arc<Writer>) {
        let mut out = self.out.lock();
        if out.wr.as_ref().is_some_and(|w| Arc::ptr_eq(w, wr)) {
            out.wr = None;
            out.writing = false;
            out.held = 0;
            self.settle(&mut out);
        }
    }

    /// Appends a message to the stream. O(size of the message).
    pub fn append(&self, msg: &ServerMsg) {
        self.append_all([msg]);
    }

    /// Appends messages to the stream, in order, under one hold of the
    /// buffer's lock. O(their size).
    pub fn append_all<M: Borrow<ServerMsg>>(&self, msgs: impl IntoIterator<Item = M>) {
        let mut out = self.out.lock();
        for msg in msgs {
            if out.broken {
                return;
            }
            put(&mut out.pending, msg.borrow());
            if out.kept() > MAX_UNACKED {
                self.cut(&mut out, &format!("a session's unacknowledged output passed {MAX_UNACKED} bytes"));
                return;
            }
        }
        self.settle(&mut out);
    }

    /// The client took in the stream up to `received`: what is before it
    /// is dropped. O(chunks dropped).
    pub fn ack(&self, received: u64) -> Result<(), String> {
        let mut out = self.out.lock();
        let sent = out.unacked.end();
        if received > sent {
            return Err(format!("acknowledges {received} bytes; {sent} were sent"));
        }
        out.unacked.ack(received);
        self.settle(&mut out);
        Ok(())
    }

    /// Writes what waits, from the calling task, unless the connection's
    /// task is writing (it writes it next). What the socket does not take
    /// now is left to the connection's task.
    pub fn kick(&self) {
        let mut out = self.out.lock();
        if out.writing || out.pending.is_empty() {
            return;
        }
        let Some(wr) = out.wr.clone() else { return };
        if let Ok(n) = wr.try_write(&out.pending) {
            out.take(n);
        }
        let left = !out.pending.is_empty() || wr.backlog();
        drop(out);
        if left {
            self.ready.notify_one();
        }
    }

    /// Wakes the connection's task as bytes in the buffer would (it then
    /// looks whether the server stops).
    pub fn wake(&self) {
        self.ready.notify_one();
    }

    /// Waits until bytes wait in the buffer (for the connection's task),
    /// or it is woken ([`wake`](Wire::wake)).
    pub async fn ready(&self) {
        self.ready.notified().await
    }

    /// Writes everything in the buffer, including what is appended while
    /// it writes (for the connection's task). Fails when the connection
    /// fails, or the session can no longer be resumed (then the client
    /// must reconnect to learn it).
    pub async fn flush(&self) -> std::io::Result<()> {
        loop {
            let (chunk, wr) = {
                let mut out = self.out.lock();
                if out.broken {
                    return Err(std::io::ErrorKind::OutOfMemory.into());
                }
                let Some(wr) = out.wr.clone() else { return Err(std::io::ErrorKind::NotConnected.into()) };
                if out.pending.is_empty() && !wr.backlog() {
                    out.writing = false;
                    return Ok(());
                }
                out.writing = true;
                let n = out.pending.len();
                (out.take(n), wr)
            };
            write_all(&wr, &chunk).await?;
        }
    }
}

/// Writes all of `bytes` (and any TLS backlog) to a write half shared
/// with pushing tasks.
pub(crate) async fn write_all(wr: &Writer, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() || wr.backlog() {
        wr.writable().await?;
        match wr.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes one message, for the exchanges before the session's stream is
/// attached (refusals).
pub(crate) async fn send(wr: &Writer, msg: &ServerMsg) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    put(&mut out, msg);
    write_all(wr, &out).await
}

/// Appends a message's frame. Every server message is far below the frame
/// limit (names, values and error texts are bounded), so one over it is a
/// bug; it is logged and left out, and a reply's request is answered with
/// an error instead, so that its caller does not wait forever (as a
/// mount's `listxattr` did until session 42, its list unbounded).
pub(crate) fn put(out: &mut BytesMut, msg: &ServerMsg) {
    if let Err(e) = proto::write_frame(msg, out) {
        tracing::error!(error = %e, "server message not sent");
        if let &ServerMsg::Reply { id, .. } = msg {
            let failed = ServerMsg::Reply { id, reply: Reply::Error(format!("the answer was not sent: {e}")) };
            let _ = proto::write_frame(&failed, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use interlock_proto::GrantInfo;

    /// A reply too large for a frame goes out as an error for its
    /// request, which would otherwise never be answered.
    #[test]
    fn a_reply_over_the_frame_limit_goes_out_as_an_error() {
        use tokio_util::codec::Decoder;
        let huge = Reply::Error("x".repeat(proto::MAX_FRAME));
        let mut out = BytesMut::new();
        put(&mut out, &ServerMsg::Reply { id: 7, reply: huge });
        let sent = proto::Reader::<ServerMsg>::default().decode(&mut out).unwrap().unwrap();
        assert!(
            matches!(&sent, ServerMsg::Reply { id: 7, reply: Reply::Error(e) } if e.contains("not sent")),
            "{sent:?}"
        );
        assert!(out.is_empty());
    }

    fn granted(id: u64) -> ServerMsg {
        ServerMsg::Granted { id, grant: GrantInfo { fence: id, lvb: None, handle: None } }
    }

    fn reply(id: u64) -> ServerMsg {
        ServerMsg::Reply { id, reply: Reply::Done }
    }

    type Frames = tokio_util::codec::FramedRead<tokio::net::TcpStream, proto::Reader<ServerMsg>>;

    /// A connection: the server's halves, the client's reader.
    async fn connection() -> (Arc<Writer>, crate::transport::Reader, Frames) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (rd, wr) = crate::transport::plain(server);
        (wr, rd, proto::reader(client))
    }

    async fn read(frames: &mut Frames, n: usize) -> Vec<ServerMsg> {
        let mut got = Vec::new();
        for _ in 0..n {
            got.push(frames.next().await.unwrap().unwrap());
        }
        got
    }

    fn frame(msg: &ServerMsg) -> BytesMut {
        let mut b = BytesMut::new();
        put(&mut b, msg);
        b
    }

    /// Frames leave in the order they were made, whoever writes them:
    /// the welcome ahead of what was pushed before it, and a push behind
    /// the replies made before it.
    #[tokio::test]
    async fn frames_leave_in_the_order_they_were_made() {
        let (wr, _rd, mut frames) = connection().await;
        let wire = Wire::default();
        wire.append(&granted(1));
        assert!(wire.attach(wr.clone(), 0));
        // Held until opened: a kick writes nothing, the welcome goes first.
        wire.kick();
        let welcome = ServerMsg::Refused { reason: "first".into(), auth: false, busy: false };
        write_all(&wr, &frame(&welcome)).await.unwrap();
        wire.open();
        wire.flush().await.unwrap();
        // A reply not yet flushed, then a push from elsewhere, kicked: it
        // goes out behind the reply, in the pushing task's write.
        wire.append(&reply(2));
        wire.append(&granted(3));
        wire.kick();
        assert_eq!(read(&mut frames, 4).await, [welcome, granted(1), reply(2), granted(3)]);
    }

    /// A batch appended at once leaves whole and in order with one kick;
    /// a batch that takes the kept bytes past the bound breaks the stream
    /// there (nothing after it is kept, and it can no longer resume).
    #[tokio::test]
    async fn a_batch_leaves_in_order_and_one_past_the_bound_breaks_the_stream() {
        let (wr, _rd, mut frames) = connection().await;
        let wire = Wire::default();
        assert!(wire.attach(wr.clone(), 0));
        wire.open();
        wire.append_all((1..=3).map(reply));
        wire.kick();
        assert_eq!(read(&mut frames, 3).await, [reply(1), reply(2), reply(3)]);
        wire.detach(&wr);
        let big = ServerMsg::Reply { id: 9, reply: Reply::Error("x".repeat(64 << 10)) };
        wire.append_all(std::iter::repeat_n(&big, MAX_UNACKED / (64 << 10) + 8));
        assert!(wire.out.lock().broken);
        assert_eq!(wire.out.lock().kept(), 0, "nothing kept past the break");
        let (wr2, _rd2, _frames) = connection().await;
        assert!(!wire.attach(wr2, 0));
    }

    /// Past the budget of all streams, a stream at its share holds its
    /// requests back and is cut when it would hold more than a share,
    /// which gives its charge back; under the budget, it serves.
    #[test]
    fn past_the_budget_a_stream_is_held_to_its_share() {
        let budget = Arc::new(Budget::new(1 << 20));
        let (a, b) = (Wire::new(budget.clone()), Wire::new(budget.clone()));
        let big = ServerMsg::Reply { id: 9, reply: Reply::Error("x".repeat(64 << 10)) };
        // No connection: what is appended stays.
        a.append_all(std::iter::repeat_n(&big, 12));
        assert_eq!(a.admit(1000, false), Admit::Serve, "768 KiB of a budget of 1 MiB");
        b.append_all(std::iter::repeat_n(&big, 8));
        // 1.25 MiB together: a share is 512 KiB.
        assert_eq!(a.admit(1000, false), Admit::Hold);
        assert_eq!(b.admit(1000, false), Admit::Hold);
        assert_eq!(a.admit(600 << 10, false), Admit::Cut, "holding more than its share");
        assert!(a.out.lock().broken);
        assert_eq!(b.admit(1000, false), Admit::Serve, "the cut stream gave its charge back");
        drop(b);
        assert_eq!(budget.used(), 0, "a dropped stream gives its charge back");
    }

    /// The requests a connection held back are charged while it holds
    /// them, and no longer once it is gone or another connection takes
    /// the session over (they were that connection's to serve).
    #[tokio::test]
    async fn held_requests_stop_counting_when_their_connection_goes() {
        let budget = Arc::new(Budget::new(1 << 20));
        let wire = Wire::new(budget.clone());
        let big = ServerMsg::Reply { id: 9, reply: Reply::Error("x".repeat(64 << 10)) };
        let (wr, _rd, _frames) = connection().await;
        assert!(wire.attach(wr.clone(), 0));
        wire.append_all(std::iter::repeat_n(&big, 20));
        // Past the budget alone: its share is the whole of it.
        assert_eq!(wire.admit(128 << 10, false), Admit::Hold);
        let holding = budget.used();
        wire.detach(&wr);
        assert_eq!(budget.used(), holding - (128 << 10), "gone with its connection");
        let (wr2, _rd2, _frames2) = connection().await;
        assert!(wire.attach(wr2.clone(), 0));
        assert_eq!(wire.admit(128 << 10, false), Admit::Hold);
        assert!(wire.attach(wr2, 0));
        assert_eq!(budget.used(), holding - (128 << 10), "gone when another connection takes over");
    }

    /// A new connection gets again what the client had not taken in,
    /// from where it stopped; acknowledged bytes are gone for good.
    #[tokio::test]
    async fn a_new_connection_resends_from_where_the_client_stopped() {
        let (wr, _rd, _lost) = connection().await;
        let wire = Wire::default();
        assert!(wire.attach(wr.clone(), 0));
        wire.open();
        for id in 1..=4 {
            wire.append(&reply(id));
        }
        wire.flush().await.unwrap();
        let frame = frame(&reply(1)).len() as u64;
        // The client read two frames and acknowledged one.
        wire.ack(frame).unwrap();
        wire.detach(&wr);
        wire.append(&granted(5));
        let (wr2, _rd2, mut frames) = connection().await;
        assert!(!wire.attach(wr2.clone(), 0), "the first frame was acknowledged: gone");
        assert!(!wire.attach(wr2.clone(), 6 * frame), "never sent");
        assert!(wire.attach(wr2, 2 * frame));
        wire.open();
        wire.flush().await.unwrap();
        assert_eq!(read(&mut frames, 3).await, [reply(3), reply(4), granted(5)]);
        assert!(wire.ack(7 * frame).is_err(), "acknowledges bytes never sent");
    }
}
