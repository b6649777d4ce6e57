//! The connection's life: hello, the reader that dispatches replies and
//! pushes, reconnection with backoff, and, when the server no longer has
//! the session, reclaim (after a restart, within the lease) or the report
//! of every lock as lost (the lease ran out).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use interlock_core::Mode;
use interlock_proto::{self as proto, ClientMsgRef, GrantInfo, Kind, Op, Reply, ServerMsg};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use crate::clock::{self, Moment};
use crate::lease::Lease;
use crate::reclaim;
use crate::tables::{ReplyTo, Tables};
use crate::{Answer, Blocking, ClientError, Inner};

/// A connection's reading half, in clear or TLS.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A connection's writing half, in clear or TLS. Writes end with a flush,
/// which TLS needs to send its records.
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// A connection that said hello: its frames in, its bytes out.
pub(crate) struct Conn {
    frames: FramedRead<ReadHalf, proto::Reader<ServerMsg>>,
    wr: WriteHalf,
}

/// A connection's session, as the welcome gave it.
pub(crate) struct Welcomed {
    pub conn: Conn,
    /// The hello named a session: one not given up ([`give_up`]).
    pub named: bool,
    /// The session asked for was resumed; then `received` is how much of
    /// our stream its server took in.
    pub resumed: bool,
    pub received: u64,
    /// The server restarted since the last welcome.
    pub restarted: bool,
    /// The server's recovery window is open.
    pub recovering: bool,
    /// The server holds changes of this client in its replay cache.
    pub kept: bool,
    /// When the hello went out, and the new session's lease length.
    pub sent: Moment,
    pub lease: Duration,
}

/// Opens a connection and says hello, resuming the session if there is
/// one, within the connect timeout if one is set.
pub(crate) async fn handshake(inner: &Inner) -> Result<Welcomed, ClientError> {
    let addr = &inner.addr;
    let limit = inner.options.connect_timeout;
    let within = |what: &'static str| {
        move |_| {
            let secs = limit.map_or(0.0, |d| d.as_secs_f64());
            ClientError::Timeout(format!("{what} {addr} timed out after {secs} s"))
        }
    };
    let connect = TcpStream::connect(addr);
    let stream = match limit {
        Some(l) => tokio::time::timeout(l, connect).await.map_err(within("connecting to"))?,
        None => connect.await,
    }
    .map_err(|source| ClientError::Connect { addr: addr.clone(), source })?;
    match limit {
        Some(l) => tokio::time::timeout(l, hello(inner, stream))
            .await
            .map_err(within("the handshake with (connected, but no welcome from)"))?,
        None => hello(inner, stream).await,
    }
}

/// Splits a connection, after the TLS handshake if the client speaks TLS.
async fn halves(inner: &Inner, stream: TcpStream) -> Result<(ReadHalf, WriteHalf), ClientError> {
    let _ = stream.set_nodelay(true);
    let Some(config) = &inner.options.tls else {
        let (rd, wr) = stream.into_split();
        return Ok((Box::new(rd), Box::new(wr)));
    };
    let addr = &inner.addr;
    let failed = |reason: String| ClientError::Tls { addr: addr.clone(), reason };
    let name = proto::tls::server_name(addr).map_err(|e| failed(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, stream)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let (rd, wr) = tokio::io::split(tls);
    Ok((Box::new(rd), Box::new(wr)))
}

async fn hello(inner: &Inner, stream: TcpStream) -> Result<Welcomed, ClientError> {
    let (rd, mut wr) = halves(inner, stream).await?;
    let session = Some(inner.session.load(Ordering::Relaxed)).filter(|&s| s != 0);
    let named = session.is_some();
    let secret = *inner.secret.lock();
    let hello = ClientMsgRef::Hello {
        version: proto::VERSION,
        token: inner.options.token.as_deref(),
        session,
        received: inner.received.load(Ordering::Relaxed),
        secret,
        origin: inner.origin,
    };
    let sent = Moment::now();
    proto::send(&mut wr, &hello).await.map_err(|_| ClientError::ConnectionLost)?;
    // The reader is kept: pushes may follow the welcome in the same read.
    let mut frames = proto::reader(rd);
    let not_welcomed = || ClientError::Closed(inner.addr.clone());
    match frames.next().await.ok_or_else(not_welcomed)? {
        Ok(ServerMsg::Welcome {
            session,
            lease_ms,
            resumed,
            received,
            secret,
            boot,
            recovering_ms,
            verifier,
            namespace,
            kept,
            ..
        }) => {
            // Inode numbers, handles and locks are the first namespace's:
            // in another one (a fresh or other data directory at the same
            // address) the same numbers name other files, and a write
            // through an open file would land in one of them.
            match inner.namespace.compare_exchange(0, namespace, Ordering::Relaxed, Ordering::Relaxed) {
                Err(known) if known != namespace => {
                    return Err(ClientError::OtherNamespace { addr: inner.addr.clone(), known, now: namespace });
                }
                _ => {}
            }
            inner.session.store(session, Ordering::Relaxed);
            *inner.secret.lock() = secret;
            let before = inner.boot.swap(boot, Ordering::Relaxed);
            inner.verifier.store(verifier, Ordering::Release);
            inner.lease_ms.store(lease_ms, Ordering::Relaxed);
            Ok(Welcomed {
                conn: Conn { frames, wr },
                named,
                resumed,
                received,
                restarted: before != 0 && before != boot,
                recovering: recovering_ms > 0,
                kept,
                sent,
                lease: Duration::from_millis(lease_ms),
            })
        }
        Ok(ServerMsg::Refused { reason, auth: true, .. }) => Err(ClientError::Auth(reason)),
        Ok(ServerMsg::Refused { reason, busy: true, .. }) => Err(ClientError::Busy(reason)),
        Ok(ServerMsg::Refused { reason, .. }) => Err(ClientError::Refused(reason)),
        Ok(_) => Err(ClientError::Server("unexpected answer to hello".into())),
        Err(_) => Err(not_welcomed()),
    }
}

/// How often an outage that goes on is logged again.
const OUTAGE_TOLD_EVERY: Duration = Duration::from_secs(60);

/// Reconnects with exponential backoff (50 ms to 2 s). Gives up when the
/// server refuses the client (`Err` with the refusal: see [`refused`]) or
/// the client is dropped (`Err(None)`). While it has a session, no
/// attempt or pause outlasts the point its lease is trusted until: there
/// the session is given up ([`give_up`], which takes the last server's
/// `goodbye`), and the attempts go on for a new one.
///
/// An outage is logged as it begins, every [`OUTAGE_TOLD_EVERY`] while it
/// lasts and when it ends, so that whoever reads a mount's log sees why
/// its calls wait and when they went on.
pub(crate) async fn reconnect(inner: &Arc<Inner>, goodbye: &mut Option<u64>) -> Result<Welcomed, Option<ClientError>> {
    let mut delay = Duration::from_millis(50);
    let began = std::time::Instant::now();
    let (mut failed, mut told) = (0u64, None::<std::time::Instant>);
    let down_ms = || began.elapsed().as_millis() as u64;
    while !inner.closed() {
        let until = (inner.session.load(Ordering::Relaxed) != 0).then(|| inner.lease.lock().trusted_until());
        let Ok(attempt) = within(until, handshake(inner)).await else {
            give_up(inner, goodbye.take());
            continue;
        };
        match attempt {
            Ok(c) => {
                if failed > 0 {
                    tracing::info!(addr = %inner.addr, down_ms = down_ms(), attempts = failed + 1, "reached the server again");
                }
                return Ok(c);
            }
            Err(e) if e.is_refusal() => {
                tracing::error!(error = %e, "server refused the reconnect");
                return Err(Some(e));
            }
            Err(e) => {
                failed += 1;
                if told.is_none_or(|t| t.elapsed() >= OUTAGE_TOLD_EVERY) {
                    told = Some(std::time::Instant::now());
                    tracing::warn!(addr = %inner.addr, error = %e, down_ms = down_ms(), "cannot reach the server; calls wait for it, trying again");
                } else {
                    tracing::debug!(error = %e, "reconnect failed; retrying");
                }
            }
        }
        if within(until, tokio::time::sleep(delay)).await.is_err() {
            give_up(inner, goodbye.take());
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
    Err(None)
}

/// Ends the client for good on the server's refusal `e` (the driver has
/// stopped and failed what was in flight): no later session will hold
/// the locks, and the server may give them away (a new token's server at
/// the end of its recovery window, another namespace's at once), so they
/// are lost now, before anyone is told why; then every later request
/// fails with `e`. Until session 44 the locks were never reported lost:
/// `interlock lock` ran its command on.
pub(crate) fn refused(inner: &Inner, e: ClientError) {
    reclaim::lose_all(inner);
    inner.refused.send_replace(Some(Arc::new(e)));
}

/// `f`, unless the boot clock passes `until` first (`Err`).
async fn within<F: std::future::Future>(until: Option<Moment>, f: F) -> Result<F::Output, ()> {
    let Some(t) = until else { return Ok(f.await) };
    tokio::select! {
        out = f => Ok(out),
        () = clock::until(t) => Err(()),
    }
}

/// The lease ran out as far as the client can tell (it is past
/// [`Lease::trusted_until`] with no renewal answered): the server may end
/// the session a notice from now and give its locks to others. So the
/// client gives the session up while still cut off, and begins the next
/// one's streams ([`begin`]): every lock is reported lost now, requests
/// in flight fail ([`ClientError::ConnectionLost`]), and a request fenced
/// to the old session ([`Client::within`](crate::Client::within)) or a
/// grant answered in it is refused from now on. What is sent from now on
/// waits for the new session, which the next hello opens (the old one is
/// never resumed: a server that kept it ends it by its lease). The
/// caller no longer uses the old session's connection. If the last
/// server stopped cleanly, the requests past where it stopped reading
/// (`goodbye`) had no effect and are told so (`NoReply::Unread`), as
/// [`settle`] tells them: a change among them may be made again. Until
/// session 50 they failed with `ConnectionLost` (a mount's `EIO`) when
/// the next server took more than three quarters of a lease to answer.
/// The changes that may not be made twice and may have been made wait
/// for the next welcome ([`Tables::park`]), which says whether they can
/// be asked about.
fn give_up(inner: &Arc<Inner>, goodbye: Option<u64>) {
    let mut t = inner.tables.lock();
    inner.session.store(0, Ordering::Relaxed);
    tracing::warn!("no answer from the server for three quarters of the lease: the session's locks are lost");
    if let Some(served) = goodbye {
        t.unread_past(served);
    }
    t.park();
    begin(inner, t, false);
    resend_waits(inner);
}

/// What a new connection does with the session's locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The session goes on: the locks are still held.
    Resumed,
    /// The server restarted while our lease still ran, and is in its
    /// recovery window: claim the locks back.
    Reclaim,
    /// The session is gone and the server cannot vouch that no one else
    /// took our locks (our lease ran out, or the window is closed): they
    /// are lost.
    Lost,
    /// A new session after the client gave up the last one
    /// ([`give_up`]), which began the new one's streams then: what was
    /// sent since goes out in it.
    Begun,
}

/// Sets up the session's streams on a new connection: a resumed session
/// goes on where the server stopped taking in our stream; a new one
/// starts both streams afresh, and what was in flight is lost, but for
/// what the last server said it never read (`goodbye`: where it stopped
/// reading, if it stopped cleanly), which is told so. `now` is when the
/// old session was last known to be needed (the lease rule in `lease`).
/// `None` if the server's count is impossible (nothing is sent; the
/// caller reconnects).
pub(crate) fn settle(inner: &Arc<Inner>, w: &Welcomed, now: Moment, goodbye: Option<u64>) -> Option<Settled> {
    if w.resumed {
        if inner.outbox.resume(w.received) {
            // The server renewed the lease as it took the session back.
            inner.lease.lock().confirm(w.sent);
            return Some(Settled::Resumed);
        }
        tracing::error!(received = w.received, "the server's count of our stream is impossible; reconnecting");
        return None;
    }
    // Under the tables' lock, which a request holds from its sending to
    // its listing, and a grant holds while it is recorded: none is dropped
    // from the stream yet left listed, or sent in the new stream yet
    // forgotten, or recorded as held after the loss below.
    let mut t = inner.tables.lock();
    if !w.named {
        *inner.lease.lock() = Lease::new(w.lease, w.sent);
        // The changes parked when the session was given up may be asked
        // about if the server's replay cache holds this client's changes
        // (so it let go of none of them): no copy of one still on its way
        // can be served after this welcome (the server died, or stopped
        // this client's other connections first; protocol 24).
        t.unpark(w.kept);
        return Some(Settled::Begun);
    }
    let in_time = inner.lease.lock().holds_at(now);
    let settled = if w.restarted && w.recovering && in_time { Settled::Reclaim } else { Settled::Lost };
    *inner.lease.lock() = Lease::new(w.lease, w.sent);
    if let Some(served) = goodbye {
        t.unread_past(served);
    }
    begin(inner, t, settled == Settled::Reclaim);
    Some(settled)
}

/// Begins a new session's streams, under the tables' lock `t`: the
/// requests in flight in the old one are dropped, but for the changes
/// asked again after a `reclaim` ([`Tables::session_lost`]); the files
/// held open are opened again; without a reclaim, every lock is reported
/// lost. Then the new session counts as settled.
fn begin(inner: &Arc<Inner>, mut t: parking_lot::MutexGuard<'_, Tables>, reclaim: bool) {
    let generation = inner.generation.fetch_add(1, Ordering::Relaxed) + 1;
    inner.outbox.open();
    t.session_lost(reclaim);
    if reclaim {
        t.dlm.reclaiming(generation);
    }
    inner.received.store(0, Ordering::Relaxed);
    crate::opens::reopen_all(inner, &mut t);
    drop(t);
    if !reclaim {
        reclaim::lose_all(inner);
    }
    // Only now: a fenced request (`Client::within`) of the new session
    // was fenced after its sender saw this session's losses.
    inner.settled.store(inner.generation.load(Ordering::SeqCst), Ordering::SeqCst);
}

/// Bytes of the server's stream taken in between acknowledgements (the
/// server keeps what is unacknowledged, to send again after a reconnect).
const ACK_EVERY: u64 = 16 << 10;

/// Drives one connection until it drops; [`settle`] has set its streams
/// up. Returns where the server stopped reading our stream if it said
/// goodbye (it stopped cleanly).
pub(crate) async fn run(inner: Arc<Inner>, conn: Conn, settled: Settled) -> Option<u64> {
    let Conn { mut frames, wr } = conn;
    let outbox = inner.outbox.clone();
    let tables = inner.clone();
    let writer = tokio::spawn(outbox.write_to(wr, move || tables.tables.lock().pending.len() > 1));
    if settled == Settled::Reclaim {
        reclaim::reclaim(&inner, inner.generation.load(Ordering::Relaxed));
    }
    if matches!(settled, Settled::Reclaim | Settled::Lost) {
        resend_waits(&inner);
    }
    // Where the server's stream stood when this connection began (modulo
    // 2^64: the welcome counts in `consumed` but not in the stream).
    let mut acked = inner.received.load(Ordering::Relaxed);
    let origin = acked.wrapping_sub(frames.decoder().consumed());
    let mut goodbye = None;
    // Wakes at the point the lease is trusted until, on the boot clock
    // (see `clock`), to give the session up if no renewal moved that
    // point meanwhile (see `lease`).
    let lapse = clock::until(inner.lease.lock().trusted_until());
    tokio::pin!(lapse);
    let lapsed = loop {
        let read = tokio::select! {
            // Frames first: the timer is then polled once per read that
            // drains the socket, not once per frame (a frame ready means
            // the server is heard from anyway).
            biased;
            read = frames.next() => read,
            () = &mut lapse => {
                let until = inner.lease.lock().trusted_until();
                if until > Moment::now() {
                    lapse.set(clock::until(until));
                    continue;
                }
                break true;
            }
        };
        let Some(read) = read else { break false };
        match read {
            // The last the server sends before it stops cleanly: what it
            // did not read is told so once the next session is settled (a
            // request may still be sent before this connection is seen to
            // close).
            Ok(ServerMsg::Goodbye { served }) => goodbye = Some(served),
            Ok(msg) => {
                dispatch(&inner, msg);
                let received = origin.wrapping_add(frames.decoder().consumed());
                inner.received.store(received, Ordering::Relaxed);
                if received - acked >= ACK_EVERY {
                    inner.send_unanswered(&Op::Renew { received });
                    acked = received;
                }
            }
            Err(proto::ReadError::Io(_)) => break false,
            Err(e) => {
                tracing::warn!(error = %e, "bad message from the server; reconnecting");
                break false;
            }
        }
    };
    // Requests sent from now on wait for the next connection.
    writer.abort();
    if lapsed {
        // Gone for good before the new session's stream begins, so that
        // nothing of it goes out in this one.
        let _ = writer.await;
        give_up(&inner, goodbye);
        return None;
    }
    goodbye
}

/// In a new session, asks again for what we waited for: the old session's
/// waits went with it. Their answers come through each wait's
/// `grant_tx`.
fn resend_waits(inner: &Inner) {
    let mut t = inner.tables.lock();
    let t = &mut *t;
    for (&id, w) in &t.waits {
        if w.grant_tx.is_none() {
            continue;
        }
        // A convert of a DLM lock being reclaimed goes once the reclaim
        // is answered, under the lock's new handle (`reclaim_one`).
        if let Op::DlmConvert { handle, .. } = w.op
            && t.dlm.hold_back(handle, id)
        {
            continue;
        }
        let _ = inner.outbox.send(&ClientMsgRef::Request { id, op: &w.op });
    }
}

/// Routes a message from the server to whoever waits for it.
fn dispatch(inner: &Arc<Inner>, msg: ServerMsg) {
    if matches!(msg, ServerMsg::Reply { .. }) {
        inner.outbox.replied();
    }
    let generation = inner.generation.load(Ordering::Relaxed);
    match msg {
        ServerMsg::Reply { id: 0, .. } => {}
        ServerMsg::Reply { id, reply } => {
            let mut t = inner.tables.lock();
            if let Some(p) = t.resolve(id) {
                match p.to {
                    ReplyTo::Caller(tx) => {
                        let _ = tx.send(Ok(reply));
                    }
                    ReplyTo::Reclaim(r) => {
                        drop(t);
                        reclaim::answered(inner, r, reply);
                    }
                }
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
            } else if !matches!(reply, Reply::Queued)
                && let Some(tx) = t.waits.get_mut(&id).and_then(|w| w.grant_tx.take())
            {
                // A wait sent again in a new session, answered at once.
                let _ = tx.send(Answer { reply, generation });
            }
        }
        ServerMsg::Granted { id, grant } => {
            let mut t = inner.tables.lock();
            if let Some(tx) = t.waits.get_mut(&id).and_then(|w| w.grant_tx.take()) {
                let _ = tx.send(Answer { reply: Reply::Granted(grant), generation });
            } else if let Some(op) = t.abandoned.remove(&id) {
                // The wait was dropped but the grant won the race: give
                // the lock back.
                drop(t);
                give_back(inner, op, grant);
            }
        }
        ServerMsg::Blocking { resource, handle, owner, held, wanted } => {
            if let Some(tx) = inner.blocking.lock().as_ref()
                && let Some(b) = inner.tables.lock().dlm.callback(Blocking { resource, handle, owner, held, wanted })
            {
                let _ = tx.send(b);
            }
        }
        // Seen by `run`.
        ServerMsg::Welcome { .. } | ServerMsg::Refused { .. } | ServerMsg::Goodbye { .. } => {}
    }
}

/// Gives back what a request whose caller is gone was granted: a lock is
/// released; a converted DLM lock converts back to the mode its caller
/// knows (never a wait: the new mode covers it), or, where it does not
/// (a conversion down or across, never queued, that raced its drop),
/// keeps the new mode, which the client then records (a reclaim asks for
/// it).
pub(crate) fn give_back(inner: &Inner, op: Op, grant: GrantInfo) {
    let undo = match (op, grant.handle) {
        (Op::Lock { target, .. }, Some(handle)) if target.kind == Kind::Dlm => {
            Op::DlmUnlock { resource: target.resource, owner: target.owner, handle, lvb: None }
        }
        (Op::Lock { target, .. }, _) => Op::Unlock { target },
        (Op::DlmConvert { resource, owner, handle, mode: new, .. }, _) => {
            let mut t = inner.tables.lock();
            let name = t.dlm.name_of(handle);
            let Some(old) = t.dlm.get(name).map(|l| l.mode) else { return };
            let mode = |m: u8| Mode::ALL.get(usize::from(m)).copied();
            let (Some(old_mode), Some(new_mode)) = (mode(old), mode(new)) else { return };
            if !new_mode.covers(old_mode) {
                t.dlm.set_mode(name, new);
                return;
            }
            Op::DlmConvert { resource, owner, handle, mode: old, wait: false, lvb: None }
        }
        _ => return,
    };
    inner.send_unanswered(&undo);
}
