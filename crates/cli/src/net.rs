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
    /// A TOML file of settings: the options below, by the same names
    /// (`listen = "0.0.0.0:7420"`, `lease-ms = 3000`, ...; paths relative
    /// to the file). Options given on the command line override it.
    #[arg(long, env = "INTERLOCK_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: ServeSettings,
}

/// The server's settings, from the command line or the config file (the
/// command line wins); unset ones take the defaults shown.
#[derive(clap::Args, serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServeSettings {
    /// Address to listen on. Off loopback, --token-file is required
    /// [default: 127.0.0.1:7420].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Directory for the server's state [default: ./interlock-data].
    #[arg(long)]
    data: Option<PathBuf>,
    /// File holding the shared-secret token clients must present.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Milliseconds a silent client keeps its session (and locks)
    /// [default: 5000].
    #[arg(long)]
    lease_ms: Option<u64>,
    /// Milliseconds after a restart during which clients reclaim their
    /// locks (new requests wait until it ends). 0: none [default: 10000].
    #[arg(long)]
    recovery_ms: Option<u64>,
    /// Locks one session may hold [default: 100000].
    #[arg(long)]
    max_locks: Option<usize>,
    /// Requests one session may have queued [default: 10000].
    #[arg(long)]
    max_waiters: Option<usize>,
    /// Requests of one connection read ahead of writing their replies. The
    /// server reads nothing more from a connection whose replies it cannot
    /// write, so a client that does not read its replies is held back
    /// [default: 4096].
    #[arg(long)]
    max_in_flight: Option<usize>,
}

impl ServeSettings {
    /// Each setting from `self`, else from `file`.
    fn or(self, file: ServeSettings) -> ServeSettings {
        ServeSettings {
            listen: self.listen.or(file.listen),
            data: self.data.or(file.data),
            token_file: self.token_file.or(file.token_file),
            lease_ms: self.lease_ms.or(file.lease_ms),
            recovery_ms: self.recovery_ms.or(file.recovery_ms),
            max_locks: self.max_locks.or(file.max_locks),
            max_waiters: self.max_waiters.or(file.max_waiters),
            max_in_flight: self.max_in_flight.or(file.max_in_flight),
        }
    }

    /// The settings in a config file. Relative paths in it are relative
    /// to the file's directory, so it means the same from anywhere.
    fn read(path: &std::path::Path) -> Result<ServeSettings, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        let mut s: ServeSettings = toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        s.data = s.data.map(|d| dir.join(d));
        s.token_file = s.token_file.map(|t| dir.join(t));
        Ok(s)
    }

    /// The server's configuration, defaults filled in.
    fn config(self) -> Result<interlock_server::Config, String> {
        let token = self.token_file.as_ref().map(|f| token(Some(f))).transpose()?.flatten();
        if token.as_deref() == Some("") {
            return Err("the token file is empty".into());
        }
        let defaults = interlock_server::Limits::default();
        Ok(interlock_server::Config {
            listen: self.listen.unwrap_or_else(|| "127.0.0.1:7420".parse().expect("valid address")),
            data: self.data.unwrap_or_else(|| "./interlock-data".into()),
            token,
            lease: Duration::from_millis(self.lease_ms.unwrap_or(5000).max(100)),
            recovery: Duration::from_millis(self.recovery_ms.unwrap_or(10_000)),
            limits: interlock_server::Limits {
                max_locks: self.max_locks.unwrap_or(defaults.max_locks),
                max_waiters: self.max_waiters.unwrap_or(defaults.max_waiters),
                max_in_flight: self.max_in_flight.unwrap_or(defaults.max_in_flight),
            },
        })
    }
}

pub fn serve(args: ServeArgs) -> ExitCode {
    init_logging();
    let file = match &args.config {
        Some(path) => ServeSettings::read(path),
        None => Ok(ServeSettings::default()),
    };
    let config = match file.and_then(|file| args.settings.or(file).config()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("interlock serve: {e}");
            return ExitCode::from(2);
        }
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
    /// One JSON object instead of text (with --watch: one per line).
    #[arg(long)]
    json: bool,
    /// Print a line every SECS seconds (default 1) with the counters and
    /// the request rate over that interval, until interrupted.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1", value_parser = parse_interval)]
    watch: Option<Duration>,
    #[command(flatten)]
    server: ServerArgs,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(secs) if secs >= 0.05 && secs.is_finite() => Ok(Duration::from_secs_f64(secs)),
        _ => Err(format!("{s:?}: an interval in seconds, at least 0.05")),
    }
}

pub fn status(args: StatusArgs) -> ExitCode {
    runtime().block_on(async move {
        let connected = match args.server.options() {
            Ok(options) => Client::connect(&args.server.server, options).await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let client = match connected {
            Ok(c) => c,
            Err(e) => {
                eprintln!("interlock status: {e}");
                return ExitCode::from(EX_UNAVAILABLE);
            }
        };
        let result = match args.watch {
            None => client.status().await.map(|s| print_status(&s, args.json)),
            Some(every) => watch(&client, every, args.json).await,
        };
        let _ = client.bye().await;
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("interlock status: {e}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        }
    })
}

fn print_status(s: &interlock_proto::StatusInfo, json: bool) {
    let rate = s.requests as f64 * 1000.0 / s.uptime_ms.max(1) as f64;
    if json {
        println!("{}", status_json(s, rate));
        return;
    }
    println!("sessions   {}", s.sessions);
    println!("resources  {}", s.resources);
    println!("locks      {}", s.locks);
    println!("waiters    {}", s.waiters);
    println!("requests   {} ({rate:.0}/s over {:.1}s up)", s.requests, s.uptime_ms as f64 / 1000.0);
    if s.recovering_ms > 0 {
        println!("recovering {} ms left", s.recovering_ms);
    }
}

/// The counters as one JSON object; `rate` in requests per second.
fn status_json(s: &interlock_proto::StatusInfo, rate: f64) -> serde_json::Value {
    serde_json::json!({
        "sessions": s.sessions, "resources": s.resources, "locks": s.locks,
        "waiters": s.waiters, "requests": s.requests, "uptime_ms": s.uptime_ms,
        "requests_per_sec": rate, "recovering_ms": s.recovering_ms,
    })
}

/// A line per interval: the counters, and requests per second over the
/// interval (from the server's own uptime clock; the watcher's own status
/// requests not counted).
async fn watch(client: &Client, every: Duration, json: bool) -> Result<(), ClientError> {
    let mut last = client.status().await?;
    if !json {
        println!("{:>10} {:>10} {:>10} {:>10} {:>12}", "sessions", "resources", "locks", "waiters", "requests/s");
    }
    loop {
        tokio::time::sleep(every).await;
        let now = client.status().await?;
        let secs = now.uptime_ms.saturating_sub(last.uptime_ms).max(1) as f64 / 1000.0;
        let rate = now.requests.saturating_sub(last.requests + 1) as f64 / secs;
        if json {
            println!("{}", status_json(&now, rate));
        } else {
            println!("{:>10} {:>10} {:>10} {:>10} {:>12.0}", now.sessions, now.resources, now.locks, now.waiters, rate);
        }
        last = now;
    }
}
