//! Faults in any order lose no acknowledged change and make none twice.
//!
//! Two clients, one straight to the server and one through a relay,
//! append numbered lines to a log per task, while a seeded schedule of
//! faults runs (`FAULTS_SEED` repeats one):
//!
//! - a cut of the relayed connections: the client resumes its session;
//! - a partition of the relay longer than the client's lease: the client
//!   gives its session up, then opens a new one;
//! - a clean stop of the server, restarted at once, or once its clients
//!   have given their sessions up;
//! - a `kill -9` of the server, restarted the same two ways;
//! - either, with the relay partitioned until the restarted server's
//!   recovery window is over (that server lets go of the relayed client's
//!   replay cache).
//!
//! Each client also takes one DLM lock in turn with the other, holds it
//! (50 ms, or every fourth time across a whole fault) and gives it back,
//! letting go at once when its client reports it lost: no client is
//! granted it while the other holds it.
//!
//! Every append answered is in its log once; none is there twice, or out
//! of order; an append told it had no effect (`Unread`, made again by the
//! task) had none. An append may fail only where the client cannot know
//! whether it was made (`ConnectionLost`): past the recovery window of a
//! server that died, which let go of the client's replay cache. Every
//! other fault fails no call: before session 50, a clean stop or a kill
//! that outlasted the lease failed the appends on their way, and before
//! session 53 a partition did (a copy of the append could still be on
//! its way; the server now stops a client's old connections at its new
//! hello, and keeps the cache of a client whose session lapsed).

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use interlock_client::meta::{Cred, FileType, ROOT};
use interlock_client::{Client, ClientError};

/// Long enough that a restart fits well within it on a loaded machine.
const LEASE: [&str; 4] = ["--lease-ms", "5000", "--recovery-ms", "0"];
const TASKS_PER_CLIENT: usize = 4;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Cut,
    Partition,
    Stop,
    StopPastLease,
    Kill,
    KillPastLease,
    StopPastWindow,
    KillPastWindow,
}

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::Cut,
        Fault::Partition,
        Fault::Stop,
        Fault::StopPastLease,
        Fault::Kill,
        Fault::KillPastLease,
        Fault::StopPastWindow,
        Fault::KillPastWindow,
    ];

    /// Whether the client may be unable to know if a change on its way
    /// was made.
    fn unknowable(self) -> bool {
        matches!(self, Fault::KillPastWindow)
    }
}

/// What a task's appends came to.
#[derive(Default)]
struct Outcome {
    answered: BTreeSet<u64>,
    /// Failed with `ConnectionLost`: made or not.
    unknown: BTreeSet<u64>,
    unread: u64,
    failed: Vec<String>,
}

/// What the test tells the tasks.
#[derive(Default)]
struct Flags {
    stop: AtomicBool,
    /// The fault under way is [`Fault::unknowable`].
    unknowable: AtomicBool,
    /// Faults over.
    faults: AtomicU64,
}

/// Appends lines 0, 1, … to `log` until `stop`, making again each append
/// told `Unread`. A `ConnectionLost` is a failure but where `unknowable`.
/// If `fenced`, each append goes out only in the session it was first
/// sent in, as a mount's does (`Client::within`): one on its way when
/// its session ended is asked again only if made (`Asking::IfMade`).
async fn appender(
    c: Client,
    (log, fenced): (u64, bool),
    flags: Arc<Flags>,
    done: Arc<[AtomicU64; 2]>,
    client: usize,
) -> Outcome {
    let mut out = Outcome::default();
    let mut i = 0;
    while !flags.stop.load(Ordering::Relaxed) {
        let c = if fenced { c.within(c.settled()) } else { c.clone() };
        match c.append(&Cred::root(), log, format!("{i}\n").as_bytes()).await {
            Ok(_) => {
                out.answered.insert(i);
            }
            Err(ClientError::Unread) => {
                out.unread += 1;
                continue;
            }
            Err(ClientError::ConnectionLost) if flags.unknowable.load(Ordering::Relaxed) => {
                out.unknown.insert(i);
            }
            Err(e) => out.failed.push(format!("append {i} to inode {log}: {e}")),
        }
        done[client].fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
    out
}

/// Which client holds the lock, as the clients see it.
type Holder = Arc<Mutex<Option<usize>>>;

/// Takes the lock, holds it 50 ms (every fourth time until a whole fault
/// is over) and gives it back, until `stop`, letting go at once when the
/// client reports it lost; counts the grants. A grant while the other
/// client holds the lock is a failure; a request that fails (the server
/// down, a session given up) is made again.
async fn locker(c: Client, me: usize, holder: Holder, flags: Arc<Flags>, grants: Arc<AtomicU64>) -> Vec<String> {
    let (mut failed, mut mine) = (Vec::new(), 0);
    let mut lost = c.lost_locks();
    while !flags.stop.load(Ordering::Relaxed) {
        let seen = *lost.borrow_and_update();
        let g = match c.lock(&spec("L", 1)).await {
            Ok(g) => g,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        // Not a grant of a session given up since the request.
        if c.lost_since(seen).iter().any(|l| l.handle == g.handle) {
            continue;
        }
        if let Some(other) = holder.lock().unwrap().replace(me) {
            failed.push(format!("client {me} was granted the lock while client {other} held it"));
        }
        grants.fetch_add(1, Ordering::Relaxed);
        mine += 1;
        let held = async {
            if mine % 4 == 0 {
                let over = flags.faults.load(Ordering::Relaxed) + 2;
                while flags.faults.load(Ordering::Relaxed) < over && !flags.stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            () = held => {}
            _ = lost.changed() => {}
        }
        holder.lock().unwrap().take_if(|h| *h == me);
        let _ = c.dlm_unlock(b"L", 1, g.handle.unwrap(), None).await;
    }
    failed
}

/// Notes each client's session now; the closure returned waits until
/// each gave it up (the server is down, or the relay frozen: none can
/// open a new one meanwhile).
fn given_up(clients: Vec<Client>) -> impl FnOnce() {
    let sessions: Vec<u64> = clients.iter().map(|c| c.settled()).collect();
    move || {
        wait_for("the clients to give their sessions up", || {
            clients.iter().zip(&sessions).all(|(c, &s)| c.settled() != s)
        })
    }
}

#[test]
fn faults_in_any_order_lose_no_answered_append_and_make_none_twice() {
    let mut draw = Draw::seeded("FAULTS_SEED", "faults");
    let seed = draw.seed;
    let data = tempfile::tempdir().unwrap();
    let mut server = ServerProc::start(data.path(), "127.0.0.1:0", &LEASE);
    let addr = server.addr.clone();
    let relay = Relay::start(&addr);
    let rt = rt();
    let (direct, relayed) = rt.block_on(async { (client(&addr).await, client(&relay.addr).await) });
    let flags = Arc::new(Flags::default());
    // Appends made by each client.
    let done: Arc<[AtomicU64; 2]> = Arc::default();
    let (holder, grants) = (Holder::default(), Arc::new(AtomicU64::new(0)));
    let lockers: Vec<_> = [&direct, &relayed]
        .iter()
        .enumerate()
        .map(|(me, c)| rt.spawn(locker((*c).clone(), me, holder.clone(), flags.clone(), grants.clone())))
        .collect();
    let tasks: Vec<_> = (0..2 * TASKS_PER_CLIENT)
        .map(|t| {
            let c = if t < TASKS_PER_CLIENT { direct.clone() } else { relayed.clone() };
            let log =
                rt.block_on(c.create(&Cred::root(), ROOT, format!("log{t}").as_bytes(), FileType::Regular, 0o644, b""));
            let log = log.unwrap().ino;
            (log, rt.spawn(appender(c, (log, t % 2 == 1), flags.clone(), done.clone(), t / TASKS_PER_CLIENT)))
        })
        .collect();
    // Each client made appends since: so each has a session (one that
    // gave its session up has none until the next server answers, and
    // nothing to give up).
    let progress = |what: &str| {
        let before: Vec<u64> = done.iter().map(|d| d.load(Ordering::Relaxed)).collect();
        wait_for(what, || done.iter().zip(&before).all(|(d, b)| d.load(Ordering::Relaxed) >= b + 50));
    };
    // Each fault once, and more drawn, shuffled.
    let mut schedule = Fault::ALL.to_vec();
    schedule.extend((0..6).map(|_| Fault::ALL[draw.below(Fault::ALL.len() as u64) as usize]));
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, draw.below(i as u64 + 1) as usize);
    }
    for &fault in &schedule {
        // The last fault's answers are in (its clients made appends since).
        progress("the appends to go on");
        flags.unknowable.store(fault.unknowable(), Ordering::Relaxed);
        eprintln!("faults: {fault:?}, {done:?} appends so far");
        match fault {
            Fault::Cut => relay.cut(),
            Fault::Partition => {
                let wait = given_up(vec![relayed.clone()]);
                relay.freeze();
                wait();
                relay.cut();
                relay.thaw();
            }
            Fault::Stop | Fault::StopPastLease | Fault::Kill | Fault::KillPastLease => {
                let wait = given_up(vec![direct.clone(), relayed.clone()]);
                if matches!(fault, Fault::Stop | Fault::StopPastLease) {
                    server.terminate()
                } else {
                    server.kill9()
                }
                if matches!(fault, Fault::StopPastLease | Fault::KillPastLease) {
                    wait();
                }
                server = ServerProc::start(data.path(), &addr, &LEASE);
            }
            Fault::StopPastWindow | Fault::KillPastWindow => {
                // Stopped, the server's goodbye reaches the relayed client
                // first. Killed, the relayed client's appends reached it,
                // and their answers are held in the relay.
                if matches!(fault, Fault::StopPastWindow) {
                    server.terminate();
                    relay.freeze();
                } else {
                    relay.freeze();
                    server.kill9();
                }
                server = ServerProc::start(data.path(), &addr, &LEASE);
                wait_for("the recovery window to end", || {
                    rt.block_on(direct.status()).is_ok_and(|s| s.recovering_ms == 0)
                });
                relay.cut();
                relay.thaw();
            }
        }
        flags.faults.fetch_add(1, Ordering::Relaxed);
    }
    progress("the appends to go on after the last fault");
    flags.stop.store(true, Ordering::Relaxed);
    eprintln!("faults: {schedule:?}");
    rt.block_on(async {
        let mut outs = Vec::new();
        for (log, task) in tasks {
            outs.push((log, task.await.unwrap()));
        }
        let mut two = Vec::new();
        for l in lockers {
            match tokio::time::timeout(Duration::from_secs(60), l).await {
                Ok(r) => two.extend(r.unwrap()),
                Err(_) => panic!(
                    "a locker still waits a minute after the stop (seed {seed}); sessions {} {}; the lock: {:?}",
                    direct.session(),
                    relayed.session(),
                    direct.inspect(b"L").await
                ),
            }
        }
        assert!(two.is_empty(), "two holders (seed {seed}): {two:#?}");
        assert!(grants.load(Ordering::Relaxed) > 0, "the lock was never granted");
        let failed: Vec<&String> = outs.iter().flat_map(|(_, o)| &o.failed).collect();
        assert!(failed.is_empty(), "appends failed (seed {seed}): {failed:#?}");
        let unread: u64 = outs.iter().map(|(_, o)| o.unread).sum();
        let unknown: usize = outs.iter().map(|(_, o)| o.unknown.len()).sum();
        for (log, out) in outs {
            let mut text = Vec::new();
            loop {
                let part = direct.read(&Cred::root(), log, text.len() as u64, 1 << 20).await.unwrap();
                if part.is_empty() {
                    break;
                }
                text.extend(part);
            }
            let lines: Vec<u64> = String::from_utf8(text).unwrap().lines().map(|l| l.parse().unwrap()).collect();
            let wrong = lines.windows(2).position(|w| w[0] >= w[1]);
            let around = |at: usize| &lines[at.saturating_sub(3)..(at + 5).min(lines.len())];
            assert!(
                wrong.is_none(),
                "inode {log}: a line twice or out of order (seed {seed}): {:?}",
                wrong.map(around)
            );
            let made: BTreeSet<u64> = lines.into_iter().collect();
            let lost: Vec<_> = out.answered.difference(&made).collect();
            assert!(lost.is_empty(), "inode {log}: answered appends lost (seed {seed}): {lost:?}");
            let unasked: Vec<_> =
                made.iter().filter(|i| !out.answered.contains(i) && !out.unknown.contains(i)).collect();
            assert!(unasked.is_empty(), "inode {log}: lines made that were failed (seed {seed}): {unasked:?}");
        }
        eprintln!(
            "faults: {unread} appends told unread and made again; {unknown} failed, made or not; {} grants",
            grants.load(Ordering::Relaxed)
        );
    });
}
