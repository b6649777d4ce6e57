//! A session resumed after a lost connection loses nothing: no request,
//! reply or pushed grant that was on the wire when it dropped.
//!
//! The client talks to the server through a relay that can swallow the
//! bytes going one way and then cut the connection, as a network does.
//! The client reconnects within its lease and resumes its session; each
//! test checks that what was swallowed still takes effect exactly once.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use interlock_client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP relay to the server that can lose bytes and cut connections.
struct Relay {
    addr: String,
    /// Swallow what the server sends (`down`) or what the client sends.
    lose_down: Arc<AtomicBool>,
    lose_up: Arc<AtomicBool>,
    /// Bytes swallowed so far.
    lost: Arc<AtomicU64>,
    cut: watch::Sender<u64>,
}

impl Relay {
    async fn start(server: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (cut, _) = watch::channel(0);
        let relay = Relay { addr, lose_down: Arc::default(), lose_up: Arc::default(), lost: Arc::default(), cut };
        let (server, down, up, lost, cut) =
            (server.to_string(), relay.lose_down.clone(), relay.lose_up.clone(), relay.lost.clone(), relay.cut.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = TcpStream::connect(&server).await.unwrap();
                let (crd, cwr) = client.into_split();
                let (srd, swr) = upstream.into_split();
                tokio::spawn(pump(crd, swr, up.clone(), lost.clone(), cut.subscribe()));
                tokio::spawn(pump(srd, cwr, down.clone(), lost.clone(), cut.subscribe()));
            }
        });
        relay
    }

    /// Swallows from now on what goes one way (server to client: `down`).
    fn lose(&self, down: bool) {
        let flag = if down { &self.lose_down } else { &self.lose_up };
        flag.store(true, Ordering::SeqCst);
    }

    /// Waits until something was swallowed.
    async fn until_lost(&self) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.lost.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the relay swallowed something");
    }

    /// Closes every connection relayed so far; new ones pass everything.
    fn cut(&self) {
        self.lose_down.store(false, Ordering::SeqCst);
        self.lose_up.store(false, Ordering::SeqCst);
        self.cut.send_modify(|g| *g += 1);
    }
}

/// Copies `rd` to `wr` until either side closes or the relay cuts,
/// swallowing while `lose` is set.
async fn pump(
    mut rd: tokio::net::tcp::OwnedReadHalf,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    lose: Arc<AtomicBool>,
    lost: Arc<AtomicU64>,
    mut cut: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = tokio::select! {
            _ = cut.changed() => return,
            r = rd.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
        };
        if lose.load(Ordering::SeqCst) {
            lost.fetch_add(n as u64, Ordering::SeqCst);
        } else if wr.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Runs a test against a server with a long lease (every reconnect
/// resumes), with a client straight to it and one through a relay.
fn with_relay<F: std::future::Future<Output = ()>>(test: impl FnOnce(Client, Client, Relay) -> F) {
    let (_data, server) = long_lease_server();
    rt().block_on(async {
        let relay = Relay::start(&server.addr).await;
        let direct = client(&server.addr).await;
        let relayed = client(&relay.addr).await;
        test(direct, relayed, relay).await
    });
}

/// Runs `f` on a clone of `client` in a task of its own, so that the test
/// can lose and cut its connection meanwhile.
fn on<T: Send + 'static, F: std::future::Future<Output = T> + Send + 'static>(
    client: &Client,
    f: impl FnOnce(Client) -> F,
) -> tokio::task::JoinHandle<T> {
    tokio::spawn(f(client.clone()))
}

/// Waits for `f` to finish, well before the lease would end anything.
async fn soon<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after 10 s"))
}

/// A grant pushed into a connection that then drops reaches the waiter
/// once its session is resumed; it is not lost while its session holds
/// the lock.
#[test]
fn a_grant_lost_with_the_connection_still_reaches_its_waiter() {
    with_relay(|direct, relayed, relay| async move {
        let held = direct.lock(&spec("x", 1)).await.unwrap();
        let waiter = on(&relayed, |c| async move { c.lock(&spec("x", 2)).await });
        soon("the wait is queued", async {
            while direct.status().await.unwrap().waiters != 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        relay.lose(true);
        direct.dlm_unlock(b"x", 1, held.handle.unwrap(), None).await.unwrap();
        relay.until_lost().await;
        relay.cut();
        let grant = soon("the waiter", waiter).await.unwrap().expect("granted after the resume");
        assert!(grant.handle.is_some());
        assert_eq!(direct.try_lock(&spec("x", 3)).await.unwrap(), None, "the waiter holds x");
        assert_eq!(direct.status().await.unwrap().sessions, 2, "the relayed session was resumed");
    });
}

/// A request lost on its way reaches the server after the resume: the
/// unlock takes effect, and its caller gets its answer, not an error.
#[test]
fn a_request_lost_with_the_connection_is_sent_again() {
    with_relay(|direct, relayed, relay| async move {
        let held = relayed.lock(&spec("x", 1)).await.unwrap();
        relay.lose(false);
        let unlock = on(&relayed, |c| async move { c.dlm_unlock(b"x", 1, held.handle.unwrap(), None).await });
        relay.until_lost().await;
        assert_eq!(direct.try_lock(&spec("x", 2)).await.unwrap(), None, "the unlock has not arrived");
        relay.cut();
        soon("the unlock", unlock).await.unwrap().expect("the unlock is answered after the resume");
        assert!(direct.try_lock(&spec("x", 2)).await.unwrap().is_some(), "x is free");
    });
}

/// A reply lost on its way reaches its caller after the resume: a lock
/// granted at the server is not left held by a caller told it failed.
#[test]
fn a_reply_lost_with_the_connection_still_reaches_its_caller() {
    with_relay(|direct, relayed, relay| async move {
        relay.lose(true);
        let lock = on(&relayed, |c| async move { c.try_lock(&spec("y", 1)).await });
        relay.until_lost().await;
        relay.cut();
        let grant = soon("the lock", lock).await.unwrap().expect("answered after the resume");
        assert!(grant.is_some(), "granted: y was free");
        assert_eq!(direct.try_lock(&spec("y", 2)).await.unwrap(), None, "the relayed client holds y");
        relayed.dlm_unlock(b"y", 1, grant.unwrap().handle.unwrap(), None).await.unwrap();
        assert!(direct.try_lock(&spec("y", 2)).await.unwrap().is_some(), "given back");
    });
}

/// Clients lock and unlock through a relay that cuts every connection
/// every few milliseconds, losing whatever was in flight each way. Every
/// request takes effect exactly once: exclusion holds, no waiter waits
/// forever, and no lock is left over (a request served twice would leave
/// a second DLM lock; one lost, a waiter stuck or a lock held).
#[test]
fn cut_after_cut_every_request_takes_effect_exactly_once() {
    let (_data, server) = long_lease_server();
    rt().block_on(async {
        let relay = Relay::start(&server.addr).await;
        let direct = client(&server.addr).await;
        let held: Arc<[AtomicBool; 3]> = Arc::default();
        let (mut workers, mut clients) = (Vec::new(), Vec::new());
        for c in 0..4u32 {
            let relayed = client(&relay.addr).await;
            clients.push(relayed.clone());
            for owner in 0..2u32 {
                let (relayed, held) = (relayed.clone(), held.clone());
                workers.push(tokio::spawn(async move {
                    for i in 0..150u32 {
                        let r = ((c + owner + i) % 3) as usize;
                        let name = format!("r{r}");
                        let g = relayed.lock(&spec(&name, owner)).await.unwrap();
                        assert!(!held[r].swap(true, Ordering::SeqCst), "two holders of {name}");
                        tokio::task::yield_now().await;
                        held[r].store(false, Ordering::SeqCst);
                        relayed.dlm_unlock(name.as_bytes(), owner, g.handle.unwrap(), None).await.unwrap();
                    }
                }));
            }
        }
        let cutter = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(7)).await;
                relay.cut();
            }
        });
        for w in workers {
            soon("a worker", w).await.unwrap();
        }
        cutter.abort();
        let st = direct.status().await.unwrap();
        assert_eq!((st.locks, st.waiters), (0, 0), "nothing left over");
        assert_eq!(st.sessions, 5, "every relayed session lives on");
        drop(clients);
    });
}

/// A client that never acknowledges what it reads makes its session pile
/// up output for a resume. Past the limit (64 MiB) the server drops it and
/// closes the connection, and the session cannot be resumed: the client
/// is given a new one, and counts the old one's locks lost once it reads
/// the welcome. Until then it counts on them, so the old session keeps
/// them until its lease runs out, and no one else is granted them before.
/// The old session's end then leaves the client's replay cache, which
/// its new session fills, alone, as does the end of a session it was
/// given but never heard of. An acknowledgement of bytes never sent is
/// refused.
#[test]
fn a_session_that_never_acknowledges_cannot_resume() {
    use interlock_core::{Mode, Range};
    use interlock_meta::{Cred, FileType, ROOT};
    use interlock_proto::meta::{Asking, MetaOp, MetaReply, Once};
    use interlock_proto::{ClientMsg, Kind, Op, Reply, ServerMsg, Target};
    use std::io::Write;
    let data = tempfile::tempdir().unwrap();
    // Long enough for the flood below to end well within it.
    let lease = Duration::from_secs(4);
    let lease_ms = lease.as_millis().to_string();
    let server = ServerProc::start(data.path(), "127.0.0.1:0", &["--lease-ms", &lease_ms]);
    let mut conn = std::net::TcpStream::connect(&server.addr).unwrap();
    let hello = |session, received, secret| ClientMsg::Hello {
        version: interlock_proto::VERSION,
        token: None,
        session,
        received,
        secret,
        origin: 99,
    };
    conn.write_all(&raw_frame(&hello(None, 0, [0; 16]))).unwrap();
    let ServerMsg::Welcome { session, secret, .. } = interlock_proto::decode(&read_raw_frame(&mut conn)).unwrap()
    else {
        panic!("welcome expected")
    };
    let target = Target { resource: b"held".to_vec(), kind: Kind::Dlm, owner: 1, start: 0, end: Range::WHOLE.end() };
    let lock = Op::Lock { target, mode: Mode::EX as u8, wait: false, reclaim: false };
    conn.write_all(&raw_frame(&ClientMsg::Request { id: 1, op: lock })).unwrap();
    let reply = interlock_proto::decode(&read_raw_frame(&mut conn)).unwrap();
    assert!(matches!(reply, ServerMsg::Reply { id: 1, reply: Reply::Granted(_) }), "{reply:?}");
    conn.write_all(&raw_frame(&ClientMsg::Request { id: 2, op: Op::Renew { received: 1 << 40 } })).unwrap();
    let reply = interlock_proto::decode(&read_raw_frame(&mut conn)).unwrap();
    assert!(matches!(reply, ServerMsg::Reply { id: 2, reply: Reply::Error(_) }), "{reply:?}");

    let mut writer = conn.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let frame = raw_frame(&ClientMsg::Request { id: 3, op: Op::Status });
        let chunk = frame.repeat(4096);
        // Until the server hangs up.
        while writer.write_all(&chunk).is_ok() {}
    });
    let mut received = 0u64;
    // The server hangs up once it holds 64 MiB unacknowledged.
    while let Some(body) = try_read_raw_frame(&mut conn) {
        received += 4 + body.len() as u64;
        assert!(received < 64 << 20, "the server kept serving past its limit");
    }
    // (Closed with more than the limit unread in flight: what was read
    // is less.)
    sender.join().unwrap();

    // Resuming the session gives a new one.
    let resume = || {
        let mut again = std::net::TcpStream::connect(&server.addr).unwrap();
        again.write_all(&raw_frame(&hello(Some(session), received, secret))).unwrap();
        match interlock_proto::decode(&read_raw_frame(&mut again)).unwrap() {
            ServerMsg::Welcome { session: s, resumed, secret: new, .. } => {
                assert!(!resumed, "the session cannot be resumed");
                assert!(s != session && new != secret, "a new session, with its own id and secret");
                (again, s)
            }
            other => panic!("welcome expected, got {other:?}"),
        }
    };
    // Once as if its welcome were lost (the client tries again, naming
    // the old session, which runs out its lease meanwhile), then for good.
    let (lost, first) = resume();
    drop(lost);
    let (mut again, second) = resume();
    assert_ne!(first, second);
    // A change the new session makes, to be asked about again.
    let create = MetaOp::Create {
        parent: ROOT,
        name: b"made".to_vec(),
        kind: FileType::Regular,
        perm: 0o644,
        rdev: 0,
        target: Vec::new(),
        umask: 0,
    };
    let ask = |s: &mut std::net::TcpStream, asking| {
        let op = Op::Meta { cred: Cred::root(), op: create.clone(), once: Some(Once { settled: 10, asking }) };
        s.write_all(&raw_frame(&ClientMsg::Request { id: 10, op })).unwrap();
        loop {
            if let ServerMsg::Reply { id: 10, reply } = interlock_proto::decode(&read_raw_frame(s)).unwrap() {
                return reply;
            }
        }
    };
    let Reply::Meta(MetaReply::Attr(made)) = ask(&mut again, Asking::First) else { panic!("the create") };
    // The new session renews its lease while the old one's runs out.
    let renewing = std::sync::Arc::new(AtomicBool::new(true));
    let renewer = {
        let (mut s, renewing) = (again.try_clone().unwrap(), renewing.clone());
        std::thread::spawn(move || {
            while renewing.load(Ordering::SeqCst) {
                s.write_all(&raw_frame(&ClientMsg::Request { id: 11, op: Op::Renew { received: 0 } })).unwrap();
                std::thread::sleep(lease / 8);
            }
        })
    };
    // The old session's client may not have read that welcome yet.
    rt().block_on(async {
        let other = client(&server.addr).await;
        let asked = std::time::Instant::now();
        let held = other.try_lock(&spec("held", 1)).await.unwrap();
        assert!(
            held.is_none() || asked.elapsed() >= lease,
            "granted to another client while the old session's client may still count on it"
        );
        let granted = tokio::time::timeout(3 * lease, other.lock(&spec("held", 1))).await;
        assert!(granted.is_ok_and(|g| g.is_ok()), "the old session's lock was released when its lease ran out");
    });
    renewing.store(false, Ordering::SeqCst);
    renewer.join().unwrap();
    match ask(&mut again, Asking::IfMade) {
        Reply::Meta(MetaReply::Attr(a)) => assert_eq!(a.ino, made.ino, "answered as made"),
        other => panic!("the new session's change, asked about again: {other:?}"),
    }
}

/// A resume that races the end of its session (its `Bye` still on its
/// way, or its lease running out) is welcomed with a new session, as a
/// resume of a session that had already ended is: the client learns at
/// once that its locks are gone. Before, the connection was closed
/// without a word, and the client had to try again to find out.
#[test]
fn a_resume_that_races_its_sessions_end_is_welcomed_with_a_new_session() {
    use interlock_proto::{ClientMsg, Op, ServerMsg};
    use std::io::Write;
    let data = tempfile::tempdir().unwrap();
    let server = ServerProc::start(data.path(), "127.0.0.1:0", &[]);
    let (mut won, mut lost) = (0, 0);
    for origin in 1..=500 {
        let ahead = origin % 50;
        let old = std::net::TcpStream::connect(&server.addr).unwrap();
        let Some(ServerMsg::Welcome { session, secret, .. }) = raw_hello_resuming(&mut &old, &mut &old, origin, None)
        else {
            panic!("a new session is welcome")
        };
        // Requests ahead of the `Bye`, so that the resume comes while
        // they are served.
        let mut burst: Vec<u8> =
            (1..=ahead).flat_map(|id| raw_frame(&ClientMsg::Request { id, op: Op::Status })).collect();
        burst.extend(raw_frame(&ClientMsg::Request { id: ahead + 1, op: Op::Bye }));
        (&old).write_all(&burst).unwrap();
        let new = std::net::TcpStream::connect(&server.addr).unwrap();
        let answer = raw_hello_resuming(&mut &new, &mut &new, origin, Some((session, secret, 0)));
        let Some(ServerMsg::Welcome { resumed, session: now, .. }) = answer else {
            panic!("no welcome for a resume racing its session's end (round {origin}): {answer:?}")
        };
        // Resumed before the `Bye` ended it, or a new one after.
        if resumed {
            assert_eq!(now, session);
            won += 1;
        } else {
            assert_ne!(now, session);
            lost += 1;
        }
    }
    eprintln!("{won} resumes came before the session's end, {lost} after");
}
