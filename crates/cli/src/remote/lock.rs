//! `interlock lock`: a cluster-wide flock(1). The command never runs
//! without the lock:
//!
//! - SIGINT, SIGTERM and SIGHUP are forwarded to the command, and the
//!   lock is held until it exits; while the lock is still awaited, they
//!   withdraw the wait at the server before the wrapper exits.
//! - If the wrapper is killed (SIGKILL), the command is killed with it
//!   (`PR_SET_PDEATHSIG`), well before the lease can free the lock.
//! - If the lock is lost, the command gets SIGTERM, then SIGKILL, and the
//!   wrapper exits with [`exit::LOCK_LOST`]. Cut off from the server (a
//!   partition, a server that hangs), the client reports the loss a
//!   quarter of a lease before the server may give the lock to another
//!   ([`Client::loss_notice`]), and the SIGKILL comes half that later
//!   (at most [`GRACE`]): the command is dead before anyone else holds
//!   the lock. A wrapper stopped past its lease learns of the loss only
//!   when it runs again; what its command did meanwhile is what the
//!   fencing token (`INTERLOCK_FENCE`) is for.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use interlock_client::{Client, ClientError, LockSpec};
use interlock_core::{Mode, Range};
use interlock_proto::Kind;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::{ServerArgs, runtime, status_of};
use crate::{args, exit};

/// The longest a command that lost its lock has between SIGTERM and
/// SIGKILL.
pub const GRACE: Duration = Duration::from_secs(5);

#[derive(clap::Args)]
pub struct LockArgs {
    /// The lock's name (any string of at most 256 bytes).
    name: String,
    /// Mode: ex (exclusive, default), pw (protected write), pr (shared
    /// read), cw (concurrent write), cr (concurrent read), nl (null: holds
    /// nothing, conflicts with nothing).
    #[arg(long, default_value = "ex", value_parser = parse_mode)]
    mode: Mode,
    /// Byte range START-END (inclusive) instead of the whole name.
    #[arg(long, value_parser = parse_range)]
    range: Option<Range>,
    /// Fail at once (exit 1) if the lock is held, or if the server is in
    /// its recovery window after a restart.
    #[arg(long, conflicts_with = "timeout")]
    nowait: bool,
    /// Give up after this many seconds: exit 1 if the lock was held by
    /// others all along, 69 if the server did not answer (connecting,
    /// the handshake and the request all count).
    #[arg(long, value_parser = args::seconds, value_name = "SECS")]
    timeout: Option<f64>,
    #[command(flatten)]
    server: ServerArgs,
    /// The command to run while holding the lock.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse::<Mode>().map_err(|e| e.to_string())
}

fn parse_range(s: &str) -> Result<Range, String> {
    let (a, b) = s.split_once('-').ok_or_else(|| format!("{s:?} is not START-END"))?;
    let start = a.trim().parse::<u64>().map_err(|_| format!("{a:?} is not a byte offset"))?;
    let end = b.trim().parse::<u64>().map_err(|_| format!("{b:?} is not a byte offset"))?;
    Range::new(start, end).map_err(|e| e.to_string())
}

/// The signals the wrapper handles.
struct Signals([(Signal, i32); 3]);

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals([
            (signal(SignalKind::interrupt())?, libc::SIGINT),
            (signal(SignalKind::terminate())?, libc::SIGTERM),
            (signal(SignalKind::hangup())?, libc::SIGHUP),
        ]))
    }

    /// The next one to arrive.
    async fn recv(&mut self) -> i32 {
        let [(a, na), (b, nb), (c, nc)] = &mut self.0;
        tokio::select! {
            _ = a.recv() => *na,
            _ = b.recv() => *nb,
            _ = c.recv() => *nc,
        }
    }
}

/// The status of a wrapper ended by signal `sig` (as a shell reports it).
fn by_signal(sig: i32) -> ExitCode {
    ExitCode::from(128 + sig as u8)
}

pub fn lock(args: LockArgs) -> ExitCode {
    runtime().block_on(run(args))
}

async fn run(args: LockArgs) -> ExitCode {
    let fail = |code: u8, msg: &dyn std::fmt::Display| {
        eprintln!("interlock lock: {msg}");
        ExitCode::from(code)
    };
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => return fail(exit::UNAVAILABLE, &format!("cannot handle signals: {e}")),
    };
    let deadline = args.timeout.map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut options = match args.server.options() {
        Ok(o) => o,
        Err(e) => return fail(exit::USAGE, &e),
    };
    // --timeout bounds the connection too.
    if let (Some(d), Some(c)) = (deadline, options.connect_timeout.as_mut()) {
        *c = (*c).min(d.saturating_duration_since(Instant::now())).max(Duration::from_millis(1));
    }
    let answer_by = Instant::now() + options.connect_timeout.unwrap_or(Duration::from_secs(10));
    let client = tokio::select! {
        c = Client::connect(&args.server.server, options) => match c {
            Ok(c) => c,
            Err(e) => return fail(status_of(&e), &e),
        },
        sig = signals.recv() => return by_signal(sig),
    };
    // From the start: a loss at any moment after the grant is seen.
    let lost = client.lost_locks();
    let spec = LockSpec {
        resource: args.name.clone().into_bytes(),
        kind: Kind::Dlm,
        owner: 1,
        mode: args.mode,
        range: args.range.unwrap_or(Range::WHOLE),
    };
    let acquire = async {
        match (args.nowait, deadline) {
            // A request that does not wait still needs an answer.
            (true, _) => {
                let by = answer_by.max(Instant::now() + Duration::from_secs(1));
                // A few times, not in a loop: a client that gave up its
                // server fails at once.
                let mut again = 3;
                loop {
                    match client.lock_by(&spec, false, by).await {
                        // The server stopped before it read the request,
                        // or the session ended with the request on its
                        // way (a lock it got went with the session): ask
                        // in the next session.
                        Err(ClientError::Unread | ClientError::ConnectionLost) if again > 0 && Instant::now() < by => {
                            again -= 1;
                        }
                        got => break got,
                    }
                }
            }
            (false, Some(d)) => client.lock_by(&spec, true, d).await,
            (false, None) => client.lock(&spec).await.map(Some),
        }
    };
    let got = tokio::select! {
        got = acquire => got,
        sig = signals.recv() => {
            // The wait was withdrawn with the future; the bye ends the
            // session at once, so nothing is granted to it after we go.
            let _ = tokio::time::timeout(Duration::from_secs(2), client.bye()).await;
            return by_signal(sig);
        }
    };
    let grant = match got {
        Ok(Some(g)) => g,
        Ok(None) => {
            let _ = client.bye().await;
            return fail(exit::NOT_OBTAINED, &format!("{} is held by someone else", args.name));
        }
        Err(e @ ClientError::Recovering(_)) => return fail(exit::NOT_OBTAINED, &e),
        Err(ClientError::Server(e)) => return fail(exit::USAGE, &e),
        Err(e) => return fail(status_of(&e), &e),
    };
    // Dead before the server may give the lock away: the kill lands
    // within half the client's notice, and the other half covers the
    // time a kill takes and clocks that run at slightly different rates.
    let grace = GRACE.min(client.loss_notice() / 2);
    let code = run_command(&args.command, grant.fence, lost, grace, &mut signals).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), client.bye()).await;
    code
}

/// Runs the command under the lock: signals forwarded, the command
/// stopped if the lock is lost (SIGTERM, then SIGKILL `grace` later).
async fn run_command(
    command: &[String],
    fence: u64,
    mut lost: tokio::sync::watch::Receiver<usize>,
    grace: Duration,
    signals: &mut Signals,
) -> ExitCode {
    if *lost.borrow_and_update() > 0 {
        eprintln!("interlock lock: the lock was lost before the command started; not running it");
        return ExitCode::from(exit::LOCK_LOST);
    }
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).env("INTERLOCK_FENCE", fence.to_string());
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec. The
    // command is killed when this thread (the runtime's `block_on`
    // thread, alive until the wrapper exits) dies; if the wrapper died
    // before the request took, the command does not start.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(exit::LOCK_LOST.into());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("interlock lock: cannot run {}: {e}", command[0]);
            let code = if e.kind() == std::io::ErrorKind::NotFound { exit::NOT_FOUND } else { exit::CANNOT_RUN };
            return ExitCode::from(code);
        }
    };
    let pid = child.id().map(|p| p as libc::pid_t);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            sig = signals.recv() => {
                if let Some(pid) = pid {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(pid, sig) };
                }
            }
            Ok(()) = lost.changed() => {
                eprintln!(
                    "interlock lock: the lock was lost (no answer from the server for most of the lease, the lease ran out, or the server refused this client as it reconnected: another token, another namespace); stopping the command: SIGTERM, then SIGKILL after {} ms",
                    grace.as_millis()
                );
                if let Some(pid) = pid {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    let _ = child.kill().await;
                }
                return ExitCode::from(exit::LOCK_LOST);
            }
        }
    };
    match status {
        Ok(s) => match s.code() {
            Some(c) => ExitCode::from(c as u8),
            None => {
                use std::os::unix::process::ExitStatusExt;
                by_signal(s.signal().unwrap_or(0))
            }
        },
        Err(e) => {
            eprintln!("interlock lock: waiting for {}: {e}", command[0]);
            ExitCode::from(exit::CANNOT_RUN)
        }
    }
}
