//! `interlock mount [SERVER] MOUNTPOINT`: the shared tree as a local file
//! system.
//!
//! Stays in the foreground until unmounted (`fusermount3 -u`, `umount`,
//! Ctrl-C or SIGTERM, which unmount). `--background` starts the same
//! command detached and returns once the mount is live: a new process
//! rather than a fork, as forking a process with threads is unsafe.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use interlock_client::Client;
use interlock_fs::{Config, MountError, MountOptions};
use interlock_proto::StatusInfo;
use tokio::signal::unix::{SignalKind, signal};

use super::{ServerArgs, serve::init_logging, status_of};
use crate::exit;

/// Set in the detached child of `--background`.
const DETACHED: &str = "INTERLOCK_MOUNT_DETACHED";

#[derive(clap::Args)]
pub struct MountArgs {
    /// The server, HOST:PORT (else --server), then where to mount: an
    /// existing directory nothing is mounted on (but the dead mount a
    /// killed mount process left, which is unmounted first). The server
    /// comes first, as mount(8) names a remote file system before the
    /// mount point.
    #[arg(required = true, num_args = 1..=2, value_name = "[SERVER] MOUNTPOINT")]
    operands: Vec<PathBuf>,
    /// Mount options, comma-separated: `ro` (read-only), `rw` (the
    /// default), `entry_timeout=SECS` and `attr_timeout=SECS` (how long
    /// the kernel may keep names and attributes; default 1, 0 to ask the
    /// server every time), `allow_other` (a user's mount open to every
    /// user, as root's always is; fusermount3 allows it only with
    /// `user_allow_other` in /etc/fuse.conf), `hard` (the default: calls
    /// wait for a server that does not answer, as long as it takes),
    /// `soft` or `soft_timeout=SECS` (a call the server has not answered
    /// in SECS, 60 for `soft`, fails with EIO, as on a soft NFS mount; it
    /// may still be made at the server later; a blocking lock wait still
    /// waits for the lock). File data is never cached.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Detach once the mount is live: what the mount process says until
    /// then (why it failed) is printed here; its logs after are dropped
    /// unless --log-file.
    #[arg(long)]
    background: bool,
    /// With --background: append the mount's log here.
    #[arg(long, value_name = "FILE", requires = "background")]
    log_file: Option<PathBuf>,
    #[command(flatten)]
    server: ServerArgs,
}

impl MountArgs {
    /// Reads the operands: a server named before the mount point takes
    /// the place of `--server` and `INTERLOCK_SERVER`, unless `--server`
    /// is on the command line too (`server_given`), which is refused
    /// rather than one of the two silently ignored.
    fn resolve(&mut self, server_given: bool) -> Result<(), String> {
        if let [server, _] = &self.operands[..] {
            if server_given {
                return Err("the server is named twice: as an operand and with --server; name it once".to_string());
            }
            let server = server.to_str().ok_or_else(|| format!("{server:?} is not HOST:PORT"))?;
            self.server.server = crate::args::server(server)?;
        }
        Ok(())
    }

    /// Where to mount: the last operand.
    fn mountpoint(&self) -> &Path {
        self.operands.last().expect("clap asks for one operand at least")
    }
}

/// A soft mount's time for a call unless told (`-o soft`): a soft NFS
/// mount's over TCP for one try (`timeo=600`, in tenths of a second).
/// A server restart, which the mount rides out, takes far less.
const SOFT_TIMEOUT: Duration = Duration::from_secs(60);

/// `-o` options into a mount configuration.
fn config(args: &MountArgs) -> Result<Config, String> {
    let mut cfg =
        Config { mountpoint: args.mountpoint().to_path_buf(), options: MountOptions::default(), ..Config::default() };
    for opt in args.options.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let secs = |v: &str| {
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 3600.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("-o {opt}: want seconds from 0 to 3600"))
        };
        match opt.split_once('=') {
            None if opt == "ro" => cfg.options.read_only = true,
            None if opt == "rw" => cfg.options.read_only = false,
            None if opt == "allow_other" => cfg.options.allow_other = true,
            Some(("entry_timeout", v)) => cfg.entry_timeout = secs(v)?,
            Some(("attr_timeout", v)) => cfg.attr_timeout = secs(v)?,
            None if opt == "hard" => cfg.soft_timeout = None,
            None if opt == "soft" => cfg.soft_timeout = Some(SOFT_TIMEOUT),
            Some(("soft_timeout", v)) => {
                let t = secs(v)?;
                if t.is_zero() {
                    return Err(format!("-o {opt}: a soft mount's time must be more than 0 seconds"));
                }
                cfg.soft_timeout = Some(t);
            }
            _ => {
                return Err(format!(
                    "unknown mount option {opt:?} (known: ro, rw, entry_timeout=SECS, attr_timeout=SECS, allow_other, hard, soft, soft_timeout=SECS)"
                ));
            }
        }
    }
    Ok(cfg)
}

/// `server_given`: whether `--server` is on the command line (not from
/// the environment or the default).
pub fn mount(mut args: MountArgs, server_given: bool) -> ExitCode {
    let cfg = match args.resolve(server_given).and_then(|()| config(&args)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("interlock mount: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    // A bad mount point is the caller's mistake: say so before reaching
    // for the server, or starting a process that would (`--background`
    // then waits for a new mount there: one already there is not its).
    // A dead mount there is replaced, but only once the server is
    // reached (`run`).
    if interlock_fs::dead(&cfg.mountpoint).is_none()
        && let Err(e) = interlock_fs::check(&cfg.mountpoint)
    {
        eprintln!("interlock mount: {e}");
        return ExitCode::from(exit::USAGE);
    }
    if args.background && std::env::var_os(DETACHED).is_none() {
        return detach(&args);
    }
    if std::env::var_os(DETACHED).is_some() {
        // Out of the caller's session: its terminal closing is no signal
        // to us.
        let _ = nix::unistd::setsid();
    }
    // Started by `--background` with no log file: the caller reads what
    // we say until the mount is live (why it failed; that the server
    // squashes root), and nobody after.
    let caller_reads = std::env::var_os(DETACHED).is_some() && args.log_file.is_none();
    init_logging();
    // One thread: a request's cost is its wake-ups (see `interlock_fs`'s
    // session), and every hand-over between threads adds some.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let options = match args.server.options() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("interlock mount: {e}");
                return ExitCode::from(exit::USAGE);
            }
        };
        let client = match Client::connect(&args.server.server, options).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("interlock mount: {e}");
                return ExitCode::from(status_of(&e));
            }
        };
        let cfg = Config { root_squashed: tell_root_squash(&client).await, ..cfg };
        run(client, &cfg, caller_reads).await
    })
}

/// Says so when the server squashes root (`serve --root-squash`), and
/// whether it does: root on this host may then not be root in the tree,
/// and a mount by root that may not write its tree's root directory
/// would otherwise puzzle. Whether this host is spared, only the server
/// knows (by the address it sees): the addresses spared are named, and
/// the mount acts as if it were not ([`Config::root_squashed`]). One
/// round trip; a server that does not answer is met again by the mount.
async fn tell_root_squash(client: &Client) -> bool {
    let Ok(StatusInfo { root_squash: Some(q), .. }) = client.status().await else { return false };
    // Not `eprintln!`, which panics where nobody reads any more: a
    // `--background` caller that gave up waiting.
    let _ = writeln!(std::io::stderr(), "interlock mount: the server squashes root: root's requests are served as {q}");
    true
}

/// Mounts and serves until unmounted. `caller_reads`: this process's
/// standard error goes to the caller that started it (see `detach`),
/// which stops reading once the mount is live: it then goes nowhere.
async fn run(client: Client, cfg: &Config, caller_reads: bool) -> ExitCode {
    let refused = client.refused();
    // Only now that the server answered: a dead mount fails every call,
    // where its directory unmounted and not mounted again (the server
    // down) would take programs' writes on the local disk.
    match interlock_fs::clear_dead(&cfg.mountpoint) {
        Ok(true) => eprintln!(
            "interlock mount: unmounted what an interlock mount process that ended left at {}",
            cfg.mountpoint.display()
        ),
        Ok(false) => {}
        Err(e) => {
            eprintln!("interlock mount: {e}");
            return ExitCode::from(exit::USAGE);
        }
    }
    let mounted = match interlock_fs::mount(client, cfg) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("interlock mount: {e}");
            return ExitCode::from(match e {
                MountError::Helper(_) => exit::AUTH,
                MountError::MountPoint(..) => exit::USAGE,
                _ => exit::UNAVAILABLE,
            });
        }
    };
    if caller_reads && let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stderr(null);
    }
    let path = std::fs::canonicalize(&cfg.mountpoint).unwrap_or_else(|_| cfg.mountpoint.clone());
    let soft = cfg.soft_timeout.map(|t| format!("soft, {} s", t.as_secs_f64()));
    tracing::info!(mountpoint = %path.display(), mode = soft.as_deref().unwrap_or("hard"), "mounted");
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        eprintln!("interlock mount: cannot handle signals");
        let _ = interlock_fs::unmount(&path);
        return ExitCode::FAILURE;
    };
    let serving = mounted.serve();
    tokio::pin!(serving);
    let done = tokio::select! {
        r = &mut serving => r,
        _ = int.recv() => unmount_then(&path, serving).await,
        _ = term.recv() => unmount_then(&path, serving).await,
        why = refused => {
            // Every call would fail from now on. The mount is left to die
            // with this process rather than unmounted: calls on it then
            // fail (ENOTCONN) instead of reaching the directory beneath,
            // and the next mount there replaces it (a supervisor's
            // restart, with a new token, say).
            tracing::error!(
                mountpoint = %path.display(),
                "the server refused this mount for good ({why}); the mount process ends, and the mount point fails \
                 every call until a new mount replaces it"
            );
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    match done {
        Ok(()) => {
            tracing::info!(mountpoint = %path.display(), "unmounted");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("interlock mount: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Unmounts, then lets the session see the end.
async fn unmount_then(
    path: &Path,
    serving: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    tracing::info!(mountpoint = %path.display(), "unmounting");
    interlock_fs::unmount(path).map_err(std::io::Error::from)?;
    serving.await
}

/// Starts this command again, detached, and waits until its mount is
/// live (or it failed).
fn detach(args: &MountArgs) -> ExitCode {
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("interlock mount: cannot find this program: {e}");
            return ExitCode::FAILURE;
        }
    };
    let log = match &args.log_file {
        Some(f) => match std::fs::OpenOptions::new().create(true).append(true).open(f) {
            Ok(f) => Stdio::from(f),
            Err(e) => {
                eprintln!("interlock mount: log file {}: {e}", f.display());
                return ExitCode::from(exit::USAGE);
            }
        },
        None => Stdio::piped(),
    };
    let argv: Vec<_> = std::env::args_os().skip(1).collect();
    let mut child = match Command::new(me)
        .args(argv)
        .env(DETACHED, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("interlock mount: cannot start the mount process: {e}");
            return ExitCode::FAILURE;
        }
    };
    let said = child.stderr.take().map(pass_on);
    // Until the mount process lets go of its standard error (once live,
    // or ended): what it said before is then all passed on.
    let heard = || {
        if let Some(s) = &said {
            let _ = s.recv_timeout(Duration::from_secs(1));
        }
    };
    let mountpoint = args.mountpoint();
    let path = interlock_fs::dead(mountpoint)
        .unwrap_or_else(|| std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf()));
    let until = Instant::now() + Duration::from_secs_f64(args.server.connect_timeout + 10.0);
    loop {
        // A dead mount there (which the mount process replaces once it
        // reaches its server) is not the new one.
        if interlock_fs::is_mounted(&path) && interlock_fs::dead(&path).is_none() {
            heard();
            println!("interlock: mounted at {} (pid {})", path.display(), child.id());
            return ExitCode::SUCCESS;
        }
        if let Ok(Some(status)) = child.try_wait() {
            heard();
            let log = if said.is_some() { "" } else { "; see --log-file" };
            eprintln!("interlock mount: the mount process ended ({status}) before the mount was live{log}");
            return ExitCode::from(status.code().map_or(1, |c| c as u8));
        }
        if Instant::now() > until {
            eprintln!(
                "interlock mount: the mount was not live in time; it goes on in the background (pid {})",
                child.id()
            );
            return ExitCode::from(exit::UNAVAILABLE);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Passes on what the mount process writes to its standard error, a line
/// at a time, to ours, until it lets go of it; then says so on the
/// channel returned.
fn pass_on(err: std::process::ChildStderr) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{line}");
        }
        let _ = tx.send(());
    });
    rx
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::MountArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mount: MountArgs,
    }

    /// The server and mount point `interlock mount ARGS` resolves to, or
    /// its error; `--server` on the command line if `server_given`.
    fn resolve(args: &[&str], server_given: bool) -> Result<(String, String), String> {
        let mut m = Cli::try_parse_from(std::iter::once("mount").chain(args.iter().copied()))
            .map_err(|e| e.kind().to_string())?
            .mount;
        m.resolve(server_given)?;
        Ok((m.server.server.clone(), m.mountpoint().display().to_string()))
    }

    #[test]
    fn the_server_may_come_before_the_mount_point() {
        let default = "127.0.0.1:7420".to_string();
        assert_eq!(resolve(&["/mnt/x"], false), Ok((default, "/mnt/x".into())));
        assert_eq!(resolve(&["db-1:7420", "/mnt/x"], false), Ok(("db-1:7420".into(), "/mnt/x".into())));
        assert_eq!(resolve(&["--server", "h:1", "/mnt/x"], true), Ok(("h:1".into(), "/mnt/x".into())));
        let twice = resolve(&["--server", "h:1", "h:2", "/mnt/x"], true).unwrap_err();
        assert!(twice.contains("named twice"), "{twice}");
        let bad = resolve(&["not-an-address", "/mnt/x"], false).unwrap_err();
        assert!(bad.contains("is not HOST:PORT"), "{bad}");
        assert!(resolve(&[], false).is_err() && resolve(&["a:1", "/m", "/n"], false).is_err());
    }

    /// The soft mount's time `-o OPTIONS` give, or the error.
    fn soft(options: &str) -> Result<Option<Duration>, String> {
        let m = Cli::try_parse_from(["mount", "-o", options, "/mnt/x"]).unwrap().mount;
        super::config(&m).map(|c| c.soft_timeout)
    }

    /// `hard` by default; `soft` a minute; `soft_timeout=SECS` that, and
    /// implies `soft`; the last word wins; a time of 0 or none is refused.
    #[test]
    fn a_mount_is_hard_unless_told_soft_with_a_time() {
        assert_eq!(soft("rw"), Ok(None));
        assert_eq!(soft("soft"), Ok(Some(super::SOFT_TIMEOUT)));
        assert_eq!(soft("soft_timeout=2.5"), Ok(Some(Duration::from_millis(2500))));
        assert_eq!(soft("soft,hard"), Ok(None));
        assert_eq!(soft("hard,soft_timeout=3"), Ok(Some(Duration::from_secs(3))));
        for bad in ["soft_timeout=0", "soft_timeout=", "soft_timeout=-1", "soft_timeout=4000"] {
            let e = soft(bad).unwrap_err();
            assert!(e.contains("soft_timeout"), "{bad}: {e}");
        }
    }
}
