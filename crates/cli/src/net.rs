//! The commands that talk to a server: `serve`, `lock`, `status`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use interlock_client::{Client, ClientError, ClientOptions, LockSpec};
use interlock_core::{Mode, Range};
use interlock_proto::Kind;

/// Where the server is and how to prove we may talk to it.
#[derive(clap::Args, Clone, Debug)]
pub struct ServerArgs {
    /// Server address.
    #[arg(long, env = "INTERLOCK_SERVER", default_value = "127.0.0.1:7420")]
    pub server: String,
    /// File holding the shared-secret token (or set INTERLOCK_TOKEN).
    #[arg(long, env = "INTERLOCK_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl ServerArgs {
    pub fn options(&self) -> Result<ClientOptions, String> {
        Ok(ClientOptions { token: token(self.token_file.as_ref())?, no_local: false })
    }
}

/// The token from `--token-file`, else `INTERLOCK_TOKEN`.
fn token(file: Option<&PathBuf>) -> Result<Option<String>, String> {
    match file {
        Some(f) => std::fs::read_to_string(f)
            .map(|t| Some(t.trim().to_string()))
            .map_err(|e| format!("cannot read token file {}: {e}", f.display())),
        None => Ok(std::env::var("INTERLOCK_TOKEN").ok().filter(|t| !t.is_empty())),
    }
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on. Off loopback, --token-file is required.
    #[arg(long, default_value = "127.0.0.1:7420")]
    listen: std::net::SocketAddr,
    /// Directory for the server's state.
    #[arg(long, default_value = "./interlock-data")]
    data: PathBuf,
    /// File holding the shared-secret token clients must present.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Milliseconds a silent client keeps its session (and locks).
    #[arg(long, default_value_t = 5000)]
    lease_ms: u64,
    /// Milliseconds after a restart during which clients reclaim their
    /// locks (new requests wait until it ends). 0: none.
    #[arg(long, default_value_t = 10_000)]
    recovery_ms: u64,
    /// Locks one session may hold.
    #[arg(long, default_value_t = 100_000)]
    max_locks: usize,
    /// Requests one session may have queued.
    #[arg(long, default_value_t = 10_000)]
    max_waiters: usize,
    /// Requests of one connection read ahead of writing their replies. The
    /// server reads nothing more from a connection whose replies it cannot
    /// write, so a client that does not read its replies is held back.
    #[arg(long, default_value_t = 4096)]
    max_in_flight: usize,
}

pub fn serve(args: ServeArgs) -> ExitCode {
    init_logging();
    let token = match args.token_file.as_ref().map(|f| token(Some(f))).transpose() {
        Ok(t) => t.flatten(),
        Err(e) => {
            eprintln!("interlock serve: {e}");
            return ExitCode::from(2);
        }
    };
    if token.as_deref() == Some("") {
        eprintln!("interlock serve: the token file is empty");
        return ExitCode::from(2);
    }
    let config = interlock_server::Config {
        listen: args.listen,
        data: args.data,
        token,
        lease: Duration::from_millis(args.lease_ms.max(100)),
        recovery: Duration::from_millis(args.recovery_ms),
        limits: interlock_server::Limits {
            max_locks: args.max_locks,
            max_waiters: args.max_waiters,
            max_in_flight: args.max_in_flight,
        },
    };
    match runtime().block_on(interlock_server::run(config, |addr| println!("interlock: listening on {addr}"))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("interlock serve: {e}");
            ExitCode::FAILURE
        }
    }
}

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INTERLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

#[derive(clap::Args)]
pub struct LockArgs {
    /// The lock's name (any string).
    name: String,
    /// Mode: ex (exclusive, default), pw, pr (shared), cw, cr.
    #[arg(long, default_value = "ex", value_parser = parse_mode)]
    mode: Mode,
    /// Byte range START-END (inclusive) instead of the whole name.
    #[arg(long, value_parser = parse_range)]
    range: Option<Range>,
    /// Fail at once (exit 1) if the lock is held.
    #[arg(long, conflicts_with = "timeout")]
    nowait: bool,
    /// Give up (exit 1) after this many seconds.
    #[arg(long)]
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

/// Exit status when the server cannot be reached (sysexits EX_UNAVAILABLE).
const EX_UNAVAILABLE: u8 = 69;

/// `interlock lock`: like flock(1): 1 when --nowait/--timeout could not get
/// the lock; otherwise the command's own status (128 + signal if killed).
pub fn lock(args: LockArgs) -> ExitCode {
    let rt = runtime();
    rt.block_on(async move {
        let options = match args.server.options() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("interlock lock: {e}");
                return ExitCode::from(2);
            }
        };
        let client = match Client::connect(&args.server.server, options).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("interlock lock: {e}");
                return ExitCode::from(EX_UNAVAILABLE);
            }
        };
        let spec = LockSpec {
            resource: args.name.clone().into_bytes(),
            kind: Kind::Dlm,
            owner: 1,
            mode: args.mode,
            range: args.range.unwrap_or(Range::WHOLE),
        };
        let got = if args.nowait {
            client.try_lock(&spec).await
        } else if let Some(secs) = args.timeout {
            match tokio::time::timeout(Duration::from_secs_f64(secs.max(0.0)), client.lock(&spec)).await {
                Ok(r) => r.map(Some),
                Err(_) => Ok(None),
            }
        } else {
            client.lock(&spec).await.map(Some)
        };
        let grant = match got {
            Ok(Some(g)) => g,
            Ok(None) => {
                eprintln!("interlock lock: {} is held by someone else", args.name);
                let _ = client.bye().await;
                return ExitCode::from(1);
            }
            Err(ClientError::Server(e)) => {
                eprintln!("interlock lock: {e}");
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("interlock lock: {e}");
                return ExitCode::from(EX_UNAVAILABLE);
            }
        };
        let status = tokio::process::Command::new(&args.command[0])
            .args(&args.command[1..])
            .env("INTERLOCK_FENCE", grant.fence.to_string())
            .status()
            .await;
        let _ = client.bye().await;
        match status {
            Ok(s) => match s.code() {
                Some(c) => ExitCode::from(c as u8),
                None => {
                    use std::os::unix::process::ExitStatusExt;
                    ExitCode::from(128 + s.signal().unwrap_or(0) as u8)
                }
            },
            Err(e) => {
                eprintln!("interlock lock: cannot run {}: {e}", args.command[0]);
                ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 })
            }
        }
    })
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    server: ServerArgs,
}

pub fn status(args: StatusArgs) -> ExitCode {
    runtime().block_on(async move {
        let result = async {
            let client =
                Client::connect(&args.server.server, args.server.options()?).await.map_err(|e| e.to_string())?;
            let s = client.status().await.map_err(|e| e.to_string())?;
            let _ = client.bye().await;
            Ok::<_, String>(s)
        }
        .await;
        match result {
            Ok(s) => {
                if args.json {
                    let v = serde_json::json!({
                        "sessions": s.sessions, "resources": s.resources, "locks": s.locks,
                        "waiters": s.waiters, "requests": s.requests, "uptime_ms": s.uptime_ms,
                        "requests_per_sec": s.requests as f64 * 1000.0 / s.uptime_ms.max(1) as f64,
                        "recovering_ms": s.recovering_ms,
                    });
                    println!("{v}");
                } else {
                    println!("sessions   {}", s.sessions);
                    println!("resources  {}", s.resources);
                    println!("locks      {}", s.locks);
                    println!("waiters    {}", s.waiters);
                    println!(
                        "requests   {} ({:.0}/s over {:.1}s up)",
                        s.requests,
                        s.requests as f64 * 1000.0 / s.uptime_ms.max(1) as f64,
                        s.uptime_ms as f64 / 1000.0
                    );
                    if s.recovering_ms > 0 {
                        println!("recovering {} ms left", s.recovering_ms);
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("interlock status: {e}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        }
    })
}
