//! One client connection: the handshake (version, token, session and its
//! secret), then the loop that reads requests, answers each at once and
//! writes the session's stream back.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::{FutureExt, StreamExt};
use interlock_proto::{self as proto, ClientMsg, Op, Reply, Secret, ServerMsg};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::dispatch::{Gate, handle, later, recovery_gate};
use crate::origins::Ending;
use crate::peer::{self, LocalUser, ServedAs};
use crate::session::{self, same_secret};
use crate::transport::{self, Reader, Writer};
use crate::wire::{self, Admit, Wire};
use crate::{Inner, end_session, ms_left};

/// How long a new connection has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// One client connection. `evicted` is cancelled if the server needs
/// its place before it has said hello (see `Limits::max_connections`);
/// `greeted` is called once it has.
pub(crate) async fn connection(
    inner: Arc<Inner>,
    stream: TcpStream,
    peer: SocketAddr,
    evicted: CancellationToken,
    greeted: impl FnOnce(),
) {
    // Who it is, the TLS handshake and the hello, within the hello
    // timeout.
    let greet = async {
        let served_as = served_as(&inner, &stream, peer).await;
        let (rd, wr) = match &inner.tls {
            None => transport::plain(stream),
            Some(acceptor) => match transport::tls(stream, acceptor).await {
                Ok(halves) => halves,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "TLS handshake failed; closing");
                    return None;
                }
            },
        };
        let mut source = proto::reader::<ClientMsg, _>(rd);
        source.decoder_mut().limit(proto::MAX_HELLO);
        match source.next().await? {
            Ok(msg) => Some((msg, source, wr, served_as)),
            Err(e) => {
                tracing::warn!(%peer, error = %e, "garbage instead of hello; closing");
                None
            }
        }
    };
    let (hello, mut source, wr, served_as) = tokio::select! {
        () = evicted.cancelled() => {
            tracing::debug!(%peer, "closing a connection that has not said hello, to make room");
            return;
        }
        read = tokio::time::timeout(HELLO_TIMEOUT, greet) => match read {
            Ok(Some(greeted)) => greeted,
            _ => return,
        },
    };
    greeted();
    let refuse = |reason: String| ServerMsg::Refused { reason, auth: false, busy: false };
    let ClientMsg::Hello { version, token, session, received, secret, origin } = hello else {
        let _ = wire::send(&wr, &refuse("the first message must be Hello".into())).await;
        return;
    };
    if !(proto::OLDEST_CLIENT..=proto::VERSION).contains(&version) {
        let why = format!("unsupported protocol version {version}; this server speaks {}", proto::versions_served());
        let _ = wire::send(&wr, &refuse(why)).await;
        return;
    }
    if let Some(want) = &inner.config.token
        && !token.as_deref().is_some_and(|t| same_secret(t.as_bytes(), want.as_bytes()))
    {
        tracing::warn!(%peer, "refused: wrong or missing token");
        let reason = "authentication failed: wrong or missing token".into();
        let _ = wire::send(&wr, &ServerMsg::Refused { reason, auth: true, busy: false }).await;
        return;
    }
    // Shown its token: it may send the largest frames.
    source.decoder_mut().limit(proto::MAX_FRAME);
    // Before the welcome, which may tell the client to ask again about
    // changes on their way when its last connection went: no copy of
    // one is served after this (see `supersede`).
    let registered = match origin {
        0 => None,
        origin => match inner.superseding.supersede(origin).await {
            Some(r) => Some(r),
            None => return,
        },
    };
    let attached = match attach(&inner, session, &secret) {
        Ok(a) => a,
        Err(session::BadResume) => {
            tracing::warn!(%peer, session = ?session, "refused: resume with the wrong secret");
            let _ = wire::send(&wr, &refuse("cannot resume that session: wrong secret".into())).await;
            return;
        }
    };
    // A session evicted before the restart may not be reclaimed (see
    // `datadir`): its welcome says there is no window.
    let named = session;
    let Some((session, mut turn)) = take_over(&inner, attached, received, &wr, peer).await else { return };
    let recovering = inner.recovering().filter(|_| !named.is_some_and(|s| inner.evictions.contains(s)));
    // 0: a client without one (its changes are not kept for it).
    if origin != 0 {
        inner.origins.set(session.sid, origin);
    }
    let mut welcome = BytesMut::new();
    wire::put(
        &mut welcome,
        &ServerMsg::Welcome {
            version: proto::VERSION,
            session: session.sid,
            lease_ms: inner.config.lease.as_millis() as u64,
            resumed: session.resumed,
            recovering_ms: recovering.map_or(0, ms_left),
            received: *turn,
            secret: session.secret,
            boot: inner.boot,
            verifier: inner.verifier,
            namespace: inner.store.id(),
            kept: origin != 0 && inner.store.ns().replies().has(origin),
        },
    );
    let serve = async {
        // Ahead of the stream, which waits for it (`Wire::attach`).
        wire::write_all(&wr, &welcome).await.ok()?;
        session.wire.open();
        let ended =
            serve_connection(&inner, session.sid, peer, &served_as, &mut source, &session.wire, &mut turn).await;
        if ended == Ended::Stopping {
            // The server stops cleanly: once every answer owed for what
            // was read is in the stream, the goodbye follows them.
            inner.stop.answered().await;
            session.wire.append(&ServerMsg::Goodbye { served: *turn });
            session.wire.flush().await.ok()?;
        }
        Some(ended)
    };
    // Stopped at any await, it leaves the session whole: see
    // `serve_connection`.
    let superseded = async {
        match &registered {
            Some(r) => r.superseded().await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        // Seen before anything more is served.
        biased;
        () = session.stop.cancelled() => None,
        () = superseded => None,
        ended = serve => ended,
    };
    session.wire.detach(&wr);
    if ended == Some(Ended::Bye) {
        end_session(&inner, session.sid, Ending::Bye);
    }
}

/// How the connection's requests are served: as the user of this
/// machine who opened it, if that is not root or the server's user (see
/// `peer`); otherwise with the ids they carry, root squashed where the
/// server squashes this client's.
async fn served_as(inner: &Inner, stream: &TcpStream, peer: SocketAddr) -> ServedAs {
    let squash = inner.config.root_squash.as_ref().and_then(|s| s.for_peer(peer.ip()));
    let local = stream.local_addr().ok().filter(|_| inner.owners_known);
    let Some(uid) = local.and_then(|local| peer::user_of(peer, local)) else {
        return ServedAs { user: None, squash };
    };
    // The user database may be slow to answer (NSS).
    let user =
        tokio::task::spawn_blocking(move || LocalUser::of(uid)).await.unwrap_or_else(|_| LocalUser::unknown(uid));
    tracing::info!(%peer, uid, gid = user.gid, "a user of the server's machine: its requests are served as that user");
    ServedAs { user: Some(user), squash }
}

/// The session `want` if it is alive and `secret` is its secret, else a
/// new one (see [`Sessions::attach`](session::Sessions::attach)).
fn attach(inner: &Inner, want: Option<u64>, secret: &Secret) -> Result<session::Attached, session::BadResume> {
    inner.sessions.attach(want, secret, Instant::now(), crate::fresh_secret, |sid| inner.evictions.contains(sid))
}

/// How a connection's request loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The client said `Bye`: its session ends.
    Bye,
    /// The connection closed or failed: the session waits for the next.
    Closed,
    /// The server stops cleanly: nothing more is read (see `stop`).
    Stopping,
}

/// Gives the session attached (resumed or new) to a new connection:
/// waits for the turn of the connection that served it (stopped by the
/// attach), then has the session's stream resent from `received`. A
/// session whose stream cannot be resent from there (it piled up past its
/// limit while the client did not acknowledge it) cannot resume: the
/// client is given a new one, and counts the old one's locks lost once
/// it reads the welcome. Until then it counts on them, so the old
/// session keeps them until its lease runs out (the reaper ends it, a
/// lease from this hello), as a client that went silent does; its end
/// then leaves the client's replay cache, which the new session uses,
/// alone (see `origins`). So is a session that ended meanwhile.
/// `None`: a newer connection took over meanwhile.
async fn take_over(
    inner: &Inner,
    mut session: session::Attached,
    received: u64,
    wr: &Arc<Writer>,
    peer: SocketAddr,
) -> Option<(session::Attached, tokio::sync::OwnedMutexGuard<u64>)> {
    loop {
        let turn = session.turn.clone().lock_owned().await;
        if session.stop.is_cancelled() {
            // Ended while the last connection served its last requests
            // (its `Bye`, its lease): a new session, as for a resume of
            // one that had ended before the hello, so that the client
            // learns at once that its locks are gone. Not from a server
            // that is stopping: a session from it would end at once, and
            // the client would count as lost the locks it may reclaim
            // from the next server (it finds that server again after
            // the close).
            if inner.sessions.wire(session.sid).is_none() && !inner.stop.is_stopping() {
                drop(turn);
                session = attach(inner, None, &session.secret).ok()?;
                continue;
            }
            return None;
        }
        if session.wire.attach(wr.clone(), if session.resumed { received } else { 0 }) {
            return Some((session, turn));
        }
        tracing::warn!(
            %peer,
            session = session.sid,
            received,
            "the session's stream cannot be resent from there; a new session for the client (the old one's locks are held until its lease runs out)"
        );
        drop(turn);
        session = attach(inner, None, &session.secret).ok()?;
    }
}

/// What the connection does next.
enum Next {
    Frame(Option<Result<ClientMsg, proto::ReadError>>),
    Flush,
    /// The server stops: read nothing more.
    Stop,
}

/// Serves one connection's requests, answering each at once. A burst of
/// pipelined requests is read, answered into the session's stream (see
/// [`Wire`]) and written back in one write. It reads ahead at most
/// `max_in_flight` requests before writing their replies, and reads
/// nothing while it cannot write: a client that does not read its
/// replies is held back. Between bursts it writes what other tasks pushed
/// and could not write themselves. `served` counts the bytes of the
/// client's stream served, request by request. While the session's
/// stream is full ([`Wire::admit`]: the client's acknowledgements come
/// behind its requests) it serves no more requests but reads on, holding
/// them and applying acknowledgements as they come; held requests are
/// not served yet, so a lost connection or a clean stop leaves them
/// unread, for the client to send again. A clean stop of the server ends
/// it between two requests, with what was served answered or handed on.
async fn serve_connection(
    inner: &Inner,
    sid: u64,
    peer: SocketAddr,
    served_as: &ServedAs,
    source: &mut tokio_util::codec::FramedRead<Reader, proto::Reader<ClientMsg>>,
    wire: &Wire,
    served: &mut u64,
) -> Ended {
    let Some(_reading) = inner.stop.reading() else { return Ended::Stopping };
    let limit = inner.config.limits.max_in_flight.max(1);
    let mut unflushed = 0usize;
    // Requests read while the session's stream was full ([`Wire::admit`]),
    // not yet served, each with where it ends in the client's stream.
    let mut held: VecDeque<(u64, Op, u64)> = VecDeque::new();
    let mut touched = false;
    // Where the client's stream stood when this connection began (modulo
    // 2^64: the hello counts in `consumed` but not in the stream).
    let origin = served.wrapping_sub(source.decoder().consumed());
    if wire.flush().await.is_err() {
        return Ended::Closed;
    }
    loop {
        let next = if inner.stop.is_stopping() {
            Next::Stop
        } else if unflushed == 0 {
            // A clean stop wakes it through `wire.ready()` (see `stop`).
            tokio::select! {
                () = wire.ready() => Next::Flush,
                f = source.next() => Next::Frame(f),
            }
        } else if unflushed < limit
            && let Some(f) = source.next().now_or_never()
        {
            Next::Frame(f)
        } else {
            Next::Flush
        };
        let (id, op) = match next {
            Next::Flush => {
                if wire.flush().await.is_err() {
                    return Ended::Closed;
                }
                unflushed = 0;
                touched = false;
                continue;
            }
            Next::Stop => return Ended::Stopping,
            Next::Frame(f) => match read_request(f, sid, peer) {
                Some(req) => req,
                None => return Ended::Closed,
            },
        };
        // Once per batch of requests read together: it renews the lease
        // and checks that the session has not ended. (A session that ends
        // while a request runs gets back what that request obtained: see
        // `session_gone`.)
        if !touched {
            if !inner.sessions.touch(sid, Instant::now()) {
                return Ended::Closed;
            }
            touched = true;
        }
        // An acknowledgement takes effect as it is read, ahead of the
        // requests held before it; its reply keeps its place (and says
        // if it was wrong).
        if let Op::Renew { received } = op {
            let _ = wire.ack(received);
        }
        held.push_back((id, op, origin.wrapping_add(source.decoder().consumed())));
        // While the stream is full, requests wait here for the client's
        // acknowledgements, which come behind them: served now, their
        // answers would pile up unacknowledged. Past `limit` of them, or
        // too many bytes of them, they are served anyway, or the stream
        // is cut (see [`Wire::admit`]).
        while !held.is_empty() {
            match wire.admit(held_bytes(&held, *served), held.len() > limit) {
                Admit::Hold => break,
                Admit::Cut => return Ended::Closed,
                Admit::Serve => {}
            }
            let (id, op, end) = held.pop_front().expect("not empty");
            let bye = matches!(op, Op::Bye);
            serve(inner, sid, id, op, served_as, wire);
            *served = end;
            unflushed += 1;
            if bye {
                let _ = wire.flush().await;
                return Ended::Bye;
            }
        }
    }
}

/// Bytes of the client's stream the `held` requests take, `served` being
/// where the first of them begins. O(1).
fn held_bytes(held: &VecDeque<(u64, Op, u64)>, served: u64) -> usize {
    held.back().map_or(0, |&(_, _, end)| end.wrapping_sub(served) as usize)
}

/// Serves request `id` and puts its answer in the session's stream
/// (unless it will be pushed later). After a restart, only reclaims (and
/// releases) go through until the window ends; what waits is served
/// then, apart. Behind any push this request made: a grant that raced a
/// cancel reaches the client before the cancel's reply. Served and
/// answered with no await between: a connection stopped at an await has
/// each request it read either served and answered in the stream (or
/// handed to whoever will answer it: see `durable`), or neither.
fn serve(inner: &Inner, sid: u64, id: u64, op: Op, served_as: &ServedAs, wire: &Wire) {
    let reply = match served_as.admit(op) {
        Err(refused) => Some(refused),
        Ok(op) => match recovery_gate(inner, &op) {
            Gate::Go => handle(inner, sid, id, op),
            Gate::Later(left) => {
                later(inner, sid, id, op, left);
                None
            }
            Gate::Refuse(left) => Some(Reply::Recovering { left_ms: ms_left(left) }),
        },
    };
    if let Some(reply) = reply {
        wire.append(&ServerMsg::Reply { id, reply });
    }
}

/// The request read, or `None` (logged) if the connection must close.
fn read_request(read: Option<Result<ClientMsg, proto::ReadError>>, sid: u64, peer: SocketAddr) -> Option<(u64, Op)> {
    match read? {
        Ok(ClientMsg::Request { id, op }) => Some((id, op)),
        Ok(ClientMsg::Hello { .. }) => {
            tracing::warn!(%peer, session = sid, "second hello; closing the connection");
            None
        }
        Err(e) => {
            tracing::warn!(%peer, session = sid, error = %e, "bad request; closing the connection");
            None
        }
    }
}
