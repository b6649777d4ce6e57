//! The connection's life: hello, the reader that dispatches replies and
//! pushes, reconnection with backoff, and reclaim after the server lost
//! the session.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use interlock_core::Namespace;
use interlock_proto::{self as proto, ClientMsgRef, GrantInfo, Kind, Op, Reply, ServerMsg, Target};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;
use tokio_util::codec::FramedRead;

use crate::{Blocking, ClientError, Inner};

/// A connection that said hello: its frames in, its bytes out.
pub(crate) struct Conn {
    frames: FramedRead<OwnedReadHalf, proto::Reader<ServerMsg>>,
    wr: OwnedWriteHalf,
}

/// A connection's session, as the welcome gave it.
pub(crate) struct Welcomed {
    pub conn: Conn,
    /// The session asked for was resumed; then `received` is how much of
    /// our stream its server took in.
    pub resumed: bool,
    pub received: u64,
}

/// Opens a connection and says hello, resuming the session if there is
/// one.
pub(crate) async fn handshake(inner: &Inner) -> Result<Welcomed, ClientError> {
    let stream = TcpStream::connect(&inner.addr)
        .await
        .map_err(|source| ClientError::Connect { addr: inner.addr.clone(), source })?;
    let _ = stream.set_nodelay(true);
    let (rd, mut wr) = stream.into_split();
    let session = Some(inner.session.load(Ordering::Relaxed)).filter(|&s| s != 0);
    let hello = ClientMsgRef::Hello {
        version: proto::VERSION,
        token: inner.options.token.as_deref(),
        session,
        received: inner.received.load(Ordering::Relaxed),
    };
    proto::send(&mut wr, &hello).await.map_err(|_| ClientError::ConnectionLost)?;
    // The reader is kept: pushes may follow the welcome in the same read.
    let mut frames = proto::reader(rd);
    match frames.next().await.ok_or(ClientError::ConnectionLost)? {
        Ok(ServerMsg::Welcome { session, lease_ms, resumed, received, .. }) => {
            inner.session.store(session, Ordering::Relaxed);
            inner.lease_ms.store(lease_ms, Ordering::Relaxed);
            Ok(Welcomed { conn: Conn { frames, wr }, resumed, received })
        }
        Ok(ServerMsg::Refused { reason }) => Err(ClientError::Refused(reason)),
        Ok(_) => Err(ClientError::Server("unexpected answer to hello".into())),
        Err(_) => Err(ClientError::ConnectionLost),
    }
}

/// Reconnects with exponential backoff (50 ms to 2 s). Gives up when the
/// server refuses the client or the client is dropped.
pub(crate) async fn reconnect(inner: &Arc<Inner>) -> Option<Welcomed> {
    let mut delay = Duration::from_millis(50);
    while !inner.closed() {
        match handshake(inner).await {
            Ok(c) => return Some(c),
            Err(ClientError::Refused(why)) => {
                tracing::error!(reason = %why, "server refused the reconnect");
                return None;
            }
            Err(e) => tracing::debug!(error = %e, "reconnect failed; retrying"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
    None
}

/// Sets up the session's streams on a new connection: a resumed session
/// goes on where the server stopped taking in our stream; a new one
/// (the server restarted, or our lease ran out) starts both streams
/// afresh, and what was in flight is lost. `false` if the server's count
/// is impossible (nothing is sent; the caller reconnects).
pub(crate) fn settle(inner: &Inner, w: &Welcomed) -> bool {
    if w.resumed {
        if inner.outbox.resume(w.received) {
            return true;
        }
        tracing::error!(received = w.received, "the server's count of our stream is impossible; reconnecting");
        return false;
    }
    // Under the tables' lock, which a request holds from its sending to
    // its listing: none is dropped from the stream yet left listed, or
    // sent in the new stream yet forgotten.
    let mut t = inner.tables.lock();
    inner.outbox.open();
    t.pending.clear();
    inner.received.store(0, Ordering::Relaxed);
    true
}

/// Bytes of the server's stream taken in between acknowledgements (the
/// server keeps what is unacknowledged, to send again after a reconnect).
const ACK_EVERY: u64 = 16 << 10;

/// Drives one connection until it drops; [`settle`] has set its streams
/// up.
pub(crate) async fn run(inner: Arc<Inner>, conn: Conn, resumed: bool) {
    let Conn { mut frames, wr } = conn;
    let outbox = inner.outbox.clone();
    let tables = inner.clone();
    let writer = tokio::spawn(outbox.write_to(wr, move || tables.tables.lock().pending.len() > 1));
    if !resumed {
        reclaim(&inner);
    }
    // Where the server's stream stood when this connection began (modulo
    // 2^64: the welcome counts in `consumed` but not in the stream).
    let mut acked = inner.received.load(Ordering::Relaxed);
    let origin = acked.wrapping_sub(frames.decoder().consumed());
    while let Some(read) = frames.next().await {
        match read {
            Ok(msg) => {
                dispatch(&inner, msg);
                let received = origin.wrapping_add(frames.decoder().consumed());
                inner.received.store(received, Ordering::Relaxed);
                if received - acked >= ACK_EVERY {
                    let _ = inner.outbox.send(&ClientMsgRef::Request { id: 0, op: &Op::Renew { received } });
                    acked = received;
                }
            }
            Err(proto::ReadError::Io(_)) => break,
            Err(e) => {
                tracing::warn!(error = %e, "bad message from the server; reconnecting");
                break;
            }
        }
    }
    // Requests sent from now on wait for the next connection.
    writer.abort();
}

/// After the server lost our session (it restarted, or our lease ran
/// out): claim back every lock we hold, then ask again for what we waited
/// for. In that order: during the recovery window the server holds back
/// a connection's new requests, and the reclaims behind them with them.
fn reclaim(inner: &Arc<Inner>) {
    let (resources, dlm) = {
        let t = inner.tables.lock();
        (t.local_resources.iter().cloned().collect::<Vec<_>>(), t.dlm.clone())
    };
    for (kind, resource) in resources {
        let ns = if kind == Kind::Flock { Namespace::Flock } else { Namespace::Record };
        // POSIX and OFD locks share a namespace: each kind replays its own.
        let mine = inner.local.locks(&resource, ns).unwrap_or_default();
        for l in mine.into_iter().filter(|l| l.owner & (3 << 62) == kind.owner_tag()) {
            let target = Target {
                resource: resource.clone(),
                kind,
                owner: l.owner as u32,
                start: l.range.start(),
                end: l.range.end(),
            };
            let op = Op::Lock { target, mode: l.mode as u8, wait: false, reclaim: true };
            let _ = inner.outbox.send(&ClientMsgRef::Request { id: 0, op: &op });
        }
    }
    for (old, (resource, owner, mode, start, end)) in dlm {
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let target = Target { resource, kind: Kind::Dlm, owner, start, end };
        let (tx, rx) = oneshot::channel();
        inner.tables.lock().pending.insert(id, tx);
        let op = Op::Lock { target, mode, wait: false, reclaim: true };
        let _ = inner.outbox.send(&ClientMsgRef::Request { id, op: &op });
        let weak = Arc::downgrade(inner);
        tokio::spawn(async move {
            if let (Ok(Reply::Granted(g)), Some(inner)) = (rx.await, weak.upgrade())
                && let Some(new) = g.handle
            {
                let mut t = inner.tables.lock();
                if let Some(entry) = t.dlm.remove(&old) {
                    t.dlm.insert(new, entry);
                }
                t.alias.insert(old, new);
            }
        });
    }
    for (&id, w) in &inner.tables.lock().waits {
        if w.grant_tx.is_some() {
            let _ = inner.outbox.send(&ClientMsgRef::Request { id, op: &w.op });
        }
    }
}

/// Routes a message from the server to whoever waits for it.
fn dispatch(inner: &Arc<Inner>, msg: ServerMsg) {
    if matches!(msg, ServerMsg::Reply { .. }) {
        inner.outbox.replied();
    }
    match msg {
        ServerMsg::Reply { id: 0, .. } => {}
        ServerMsg::Reply { id, reply } => {
            let mut t = inner.tables.lock();
            if let Some(tx) = t.pending.remove(&id) {
                let _ = tx.send(reply);
            } else if let Some(request) = t.cancelling.remove(&id) {
                t.abandoned.remove(&request);
            } else if t.abandoned.contains_key(&id) {
                // The request's future is gone: a lock granted at once is
                // given back; `Queued` leaves it to the grant or the cancel.
                match reply {
                    Reply::Granted(g) => {
                        let op = t.abandoned.remove(&id).expect("listed");
                        drop(t);
                        give_back(inner, op, g);
                    }
                    Reply::Queued => {}
                    _ => {
                        t.abandoned.remove(&id);
                    }
                }
            }
        }
        ServerMsg::Granted { id, grant } => {
            let mut t = inner.tables.lock();
            if let Some(tx) = t.waits.get_mut(&id).and_then(|w| w.grant_tx.take()) {
                let _ = tx.send(grant);
            } else if let Some(op) = t.abandoned.remove(&id) {
                // The wait was dropped but the grant won the race: give
                // the lock back.
                drop(t);
                give_back(inner, op, grant);
            }
        }
        ServerMsg::Blocking { resource, handle, owner, held, wanted } => {
            if let Some(tx) = inner.blocking.lock().as_ref() {
                let _ = tx.send(Blocking { resource, handle, owner, held, wanted });
            }
        }
        ServerMsg::Welcome { .. } | ServerMsg::Refused { .. } => {}
    }
}

/// Releases a lock granted to a request whose caller is gone.
pub(crate) fn give_back(inner: &Inner, op: Op, grant: GrantInfo) {
    let undo = match (op, grant.handle) {
        (Op::Lock { target, .. }, Some(handle)) if target.kind == Kind::Dlm => {
            Op::DlmUnlock { resource: target.resource, owner: target.owner, handle, lvb: None }
        }
        (Op::Lock { target, .. }, _) => Op::Unlock { target },
        _ => return,
    };
    let _ = inner.outbox.send(&ClientMsgRef::Request { id: 0, op: &undo });
}
