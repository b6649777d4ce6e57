//! `interlock serve`: settings from the command line and a config file,
//! checked, then the server.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use interlock_server::RootSquash;

use super::token;
use crate::{args, exit};

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
    /// Address to listen on. Off loopback, --token-file is required, and
    /// TLS unless --insecure-plaintext [default: 127.0.0.1:7420].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Directory for the server's state, held by one server at a time
    /// [default: ./interlock-data].
    #[arg(long)]
    data: Option<PathBuf>,
    /// File holding the shared-secret token clients must present (keep it
    /// readable by its owner only).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Milliseconds a silent client keeps its session (and locks), from
    /// 100 [default: 5000].
    #[arg(long, value_parser = args::lease_ms)]
    lease_ms: Option<u64>,
    /// Milliseconds after a restart during which clients reclaim their
    /// locks (new requests wait until it ends). Never shorter than the
    /// lease: until a lease has passed, a client of the server that died
    /// may still count on its locks [default: 10000].
    #[arg(long)]
    recovery_ms: Option<u64>,
    /// Milliseconds a client whose session lapsed (its lease ran out: a
    /// partition, a hung machine) keeps the server's record of its
    /// changes on their way: back within it, a client asks about them
    /// again instead of failing them (EIO on a mount). 0 keeps none
    /// [default: 900000, 15 minutes].
    #[arg(long)]
    replay_keep_ms: Option<u64>,
    /// Locks one session may hold, every byte range counted
    /// [default: 100000].
    #[arg(long, value_parser = args::count)]
    max_locks: Option<usize>,
    /// Requests one session may have queued [default: 10000].
    #[arg(long, value_parser = args::count)]
    max_waiters: Option<usize>,
    /// Locks held and requests queued in all sessions together, counted
    /// as --max-locks and --max-waiters count them: the lock table's
    /// memory (~500 bytes each at most), which many sessions could
    /// otherwise grow at will [default: a quarter of the machine's memory,
    /// or of its control group's limit if lower, at 512 bytes each].
    #[arg(long, value_parser = args::count)]
    max_total_locks: Option<usize>,
    /// Requests of one connection read ahead of writing their replies. The
    /// server reads nothing more from a connection whose replies it cannot
    /// write, so a client that does not read its replies is held back
    /// [default: 4096].
    #[arg(long, value_parser = args::count)]
    max_in_flight: Option<usize>,
    /// Connections open at once. At the limit, connections that have not
    /// said hello make room for new ones; past it, new ones are refused
    /// [default: the open-file limit less 64, at least 16].
    #[arg(long, value_parser = args::count)]
    max_connections: Option<usize>,
    /// PEM certificate chain (leaf first) to serve TLS with; needs
    /// --tls-key. Clients then need --tls-ca.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve in clear off loopback. Without it a server listening off
    /// loopback refuses to start without TLS: the token and every lock
    /// name would cross the network unencrypted.
    #[arg(long)]
    #[serde(default)]
    insecure_plaintext: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9420) [default: off].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// UNSAFE: acknowledge namespace changes once written, without
    /// fdatasync (as etcd's --unsafe-no-fsync). A crash of the machine, not
    /// just of the server, may lose acknowledged changes. For measuring and
    /// for data that can be rebuilt.
    #[arg(long)]
    #[serde(default)]
    unsafe_no_fsync: bool,
    /// Threads that serve connections; the journal's flusher and the
    /// checkpointer run beside them. Fewer can be faster on a machine the
    /// server shares (see docs/configuration.md) [default: the number of
    /// cores].
    #[arg(long, value_parser = args::threads)]
    threads: Option<usize>,
    /// Serve namespace requests made as root as this uid and gid (NFS's
    /// root_squash): a client's host is trusted, its root user is not.
    /// Alone, as nobody:nogroup (65534:65534) [default: off].
    #[arg(long, value_name = "UID:GID", num_args = 0..=1, default_missing_value = "65534:65534", value_parser = args::ids)]
    #[serde(default, deserialize_with = "ids_setting")]
    root_squash: Option<(u32, u32)>,
    /// Memory the namespace may hold (its files, names and extended
    /// attributes, as estimated; `interlock status` shows it), e.g. 8GiB.
    /// Past it, new files, names and extended attributes get ENOSPC,
    /// while removals and writes go on: clients cannot grow the server
    /// until the kernel kills it. A file takes ~300 bytes
    /// [default: half of the machine's memory, or of its control group's
    /// limit if lower].
    #[arg(long, value_name = "SIZE", value_parser = args::bytes)]
    #[serde(default, deserialize_with = "bytes_setting")]
    max_namespace_memory: Option<u64>,
    /// Memory all sessions' streams may keep together (answers not yet
    /// acknowledged, requests held back while a client lags), e.g. 2GiB.
    /// Past it, each session is held to a share, and one that holds back
    /// more than its share (a client that takes in its answers and never
    /// acknowledges them) is cut: it can no longer resume. `interlock
    /// status` shows what they keep [default: an eighth of the machine's
    /// memory, or of its control group's limit if lower; at least 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = args::bytes)]
    #[serde(default, deserialize_with = "bytes_setting")]
    max_output_memory: Option<u64>,
    /// Clients at these addresses are not squashed (e.g. 127.0.0.1, for
    /// setting the tree up from the server's own host; 10.1.0.0/16).
    /// Needs --root-squash (here or in the config file).
    #[arg(long, value_name = "ADDR[/LEN],...", value_delimiter = ',')]
    no_squash_from: Option<Vec<interlock_server::IpPrefix>>,
    /// Journal records after which a new checkpoint (an image of the
    /// namespace) is written while changes go on: a restart replays at
    /// most about this many after loading it. Fewer make restarts
    /// shorter and images more frequent [default: 1000000].
    #[arg(long, value_name = "RECORDS", value_parser = args::count)]
    checkpoint_every: Option<usize>,
}

/// A config file's `max-namespace-memory = "8GiB"`, checked as the
/// command line's.
fn bytes_setting<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text = <String as serde::Deserialize>::deserialize(d)?;
    args::bytes(&text).map(Some).map_err(serde::de::Error::custom)
}

/// A config file's `root-squash = "UID:GID"`, checked as the command
/// line's.
fn ids_setting<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<(u32, u32)>, D::Error> {
    let text = <String as serde::Deserialize>::deserialize(d)?;
    args::ids(&text).map(Some).map_err(serde::de::Error::custom)
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
            replay_keep_ms: self.replay_keep_ms.or(file.replay_keep_ms),
            max_locks: self.max_locks.or(file.max_locks),
            max_waiters: self.max_waiters.or(file.max_waiters),
            max_total_locks: self.max_total_locks.or(file.max_total_locks),
            max_in_flight: self.max_in_flight.or(file.max_in_flight),
            max_connections: self.max_connections.or(file.max_connections),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            insecure_plaintext: self.insecure_plaintext || file.insecure_plaintext,
            metrics: self.metrics.or(file.metrics),
            unsafe_no_fsync: self.unsafe_no_fsync || file.unsafe_no_fsync,
            threads: self.threads.or(file.threads),
            root_squash: self.root_squash.or(file.root_squash),
            no_squash_from: self.no_squash_from.or(file.no_squash_from),
            max_namespace_memory: self.max_namespace_memory.or(file.max_namespace_memory),
            max_output_memory: self.max_output_memory.or(file.max_output_memory),
            checkpoint_every: self.checkpoint_every.or(file.checkpoint_every),
        }
    }

    /// The settings in a config file. Relative paths in it are relative
    /// to the file's directory, so it means the same from anywhere. Its
    /// values pass the same checks as the command line's.
    fn read(path: &std::path::Path) -> Result<ServeSettings, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        let mut s: ServeSettings = toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        s.data = s.data.map(|d| dir.join(d));
        s.token_file = s.token_file.map(|t| dir.join(t));
        s.tls_cert = s.tls_cert.map(|t| dir.join(t));
        s.tls_key = s.tls_key.map(|t| dir.join(t));
        if s.tls_cert.is_some() != s.tls_key.is_some() {
            return Err(format!("config {}: tls-cert and tls-key go together", path.display()));
        }
        let bad = |key: &str, e: String| format!("config {}: {key}: {e}", path.display());
        if let Some(v) = s.lease_ms {
            args::lease_ms(&v.to_string()).map_err(|e| bad("lease-ms", e))?;
        }
        for (key, v) in [
            ("max-locks", s.max_locks),
            ("max-waiters", s.max_waiters),
            ("max-total-locks", s.max_total_locks),
            ("max-in-flight", s.max_in_flight),
            ("max-connections", s.max_connections),
            ("checkpoint-every", s.checkpoint_every),
        ] {
            if let Some(v) = v {
                args::count(&v.to_string()).map_err(|e| bad(key, e))?;
            }
        }
        if let Some(v) = s.threads {
            args::threads(&v.to_string()).map_err(|e| bad("threads", e))?;
        }
        Ok(s)
    }

    /// The server's configuration, defaults filled in.
    fn config(self, fd_limit: u64) -> Result<interlock_server::Config, String> {
        let token = self.token_file.as_ref().map(|f| token(Some(f))).transpose()?.flatten();
        if token.as_deref() == Some("") {
            return Err("the token file is empty".into());
        }
        if let Some(f) = &self.token_file {
            warn_if_shared(f);
        }
        let defaults = interlock_server::Limits::default();
        Ok(interlock_server::Config {
            listen: self.listen.unwrap_or_else(|| "127.0.0.1:7420".parse().expect("valid address")),
            data: self.data.unwrap_or_else(|| "./interlock-data".into()),
            token,
            lease: Duration::from_millis(self.lease_ms.unwrap_or(5000)),
            recovery: Duration::from_millis(self.recovery_ms.unwrap_or(10_000)),
            replay_keep: self.replay_keep_ms.map_or(interlock_server::REPLAY_KEEP, Duration::from_millis),
            limits: interlock_server::Limits {
                max_locks: self.max_locks.unwrap_or(defaults.max_locks),
                max_waiters: self.max_waiters.unwrap_or(defaults.max_waiters),
                max_total_locks: self.max_total_locks.unwrap_or(defaults.max_total_locks),
                max_in_flight: self.max_in_flight.unwrap_or(defaults.max_in_flight),
                max_connections: self.max_connections.unwrap_or_else(|| default_max_connections(fd_limit)),
                max_output_memory: self
                    .max_output_memory
                    .map_or(defaults.max_output_memory, |b| usize::try_from(b).unwrap_or(usize::MAX)),
            },
            tls: match (self.tls_cert, self.tls_key) {
                (Some(cert), Some(key)) => Some(interlock_server::TlsFiles { cert, key }),
                (None, None) => None,
                _ => return Err("--tls-cert and --tls-key go together".into()),
            },
            insecure_plaintext: self.insecure_plaintext,
            metrics: self.metrics,
            unsafe_no_fsync: self.unsafe_no_fsync,
            threads: self.threads.unwrap_or_else(interlock_server::default_threads),
            root_squash: match (self.root_squash, self.no_squash_from) {
                (Some(anon), except) => Some(RootSquash { anon, except: except.unwrap_or_default() }),
                (None, None) => None,
                (None, Some(_)) => return Err("no-squash-from needs root-squash".into()),
            },
            namespace_memory: self.max_namespace_memory.unwrap_or_else(interlock_server::default_namespace_memory),
            checkpoint_every: self.checkpoint_every.map_or(interlock_server::CHECKPOINT_EVERY, |n| n as u64),
        })
    }
}

/// Connections the server takes by default: the open-file limit less 64
/// (the listener, the data directory's files, the connections at their
/// limit being refused), at least 16.
fn default_max_connections(fd_limit: u64) -> usize {
    fd_limit.saturating_sub(64).max(16) as usize
}

/// A token readable by group or others is a token others may have.
fn warn_if_shared(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", m.permissions().mode() & 0o777),
            "the token file is readable by group or others; chmod 600 it"
        );
    }
}

/// Raises the soft open-file limit to the hard one (as redis and etcd
/// do: each connection is a file) and returns it.
fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit and setrlimit with a valid resource and pointer.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 1024;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                l.rlim_cur = l.rlim_max;
            }
        }
        l.rlim_cur
    }
}

pub fn serve(args: ServeArgs) -> ExitCode {
    init_logging();
    let file = match &args.config {
        Some(path) => ServeSettings::read(path),
        None => Ok(ServeSettings::default()),
    };
    let fd_limit = raise_fd_limit();
    let config = match file.and_then(|file| args.settings.or(file).config(fd_limit)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("interlock serve: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    if config.limits.max_connections as u64 + 32 > fd_limit {
        tracing::warn!(
            max_connections = config.limits.max_connections,
            fd_limit,
            "max-connections is near or above the open-file limit; accepts will fail before it is reached"
        );
    }
    let rt = match interlock_server::runtime(&config) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("interlock serve: cannot start {} threads: {e}", config.threads);
            return ExitCode::FAILURE;
        }
    };
    let served = rt.block_on(interlock_server::run(config, |addr, metrics| {
        println!("interlock: listening on {addr}");
        if let Some(m) = metrics {
            println!("interlock: metrics at http://{m}/metrics");
        }
    }));
    // The clean stop has waited for every connection and for the disk's
    // work it owes answers to; what may be left on the blocking threads
    // is changelog reads waiting for records nobody will now make (up to
    // 30 s each), which a runtime dropped would wait out. Until session
    // 48 a client's read that asked to wait 49 days kept a stopped
    // server from exiting for as long.
    rt.shutdown_timeout(Duration::from_secs(1));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("interlock serve: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `INTERLOCK_LOG`, in colour only on a
/// terminal.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INTERLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--unsafe-no-fsync` and the config file's `unsafe-no-fsync` both
    /// reach the server's configuration; neither set, it is off.
    #[test]
    fn the_unsafe_mode_comes_from_the_flag_or_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "unsafe-no-fsync = true\n").unwrap();
        let from_file = ServeSettings::default().or(ServeSettings::read(&file).unwrap());
        assert!(from_file.config(1024).unwrap().unsafe_no_fsync);
        let flag = ServeSettings { unsafe_no_fsync: true, ..ServeSettings::default() };
        assert!(flag.or(ServeSettings::default()).config(1024).unwrap().unsafe_no_fsync);
        assert!(!ServeSettings::default().config(1024).unwrap().unsafe_no_fsync);
    }

    /// `--root-squash` alone squashes to nobody:nogroup, with ids to
    /// those, and `--no-squash-from` exempts addresses; the config file's
    /// `root-squash` and `no-squash-from` say the same, checked as the
    /// flags are, and either may come from each; neither set, root is
    /// not squashed, and exemptions without a squash are refused.
    #[test]
    fn root_squash_comes_from_the_flags_or_the_file() {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            args: ServeArgs,
        }
        let line = |args: &[&str]| {
            let line = <Line as clap::Parser>::try_parse_from([&["serve"], args].concat()).map_err(|e| e.to_string());
            line.and_then(|l| l.args.settings.config(1024)).map(|c| c.root_squash)
        };
        let squash = |anon, except: &[&str]| {
            Some(RootSquash { anon, except: except.iter().map(|e| e.parse().unwrap()).collect() })
        };
        assert_eq!(line(&["--root-squash"]), Ok(squash((65534, 65534), &[])));
        assert_eq!(line(&["--root-squash", "1000:1001"]), Ok(squash((1000, 1001), &[])));
        assert_eq!(
            line(&["--root-squash", "--no-squash-from", "127.0.0.1,10.1.0.0/16"]),
            Ok(squash((65534, 65534), &["127.0.0.1", "10.1.0.0/16"]))
        );
        assert_eq!(line(&[]), Ok(None));
        assert!(line(&["--root-squash", "0:0"]).unwrap_err().contains("UID:GID"));
        assert!(line(&["--root-squash", "--no-squash-from", "10.1.0.0/33"]).unwrap_err().contains("ADDR/LEN"));
        assert!(line(&["--no-squash-from", "127.0.0.1"]).unwrap_err().contains("needs root-squash"));

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let read = |text: &str| {
            std::fs::write(&file, text).unwrap();
            ServeSettings::read(&file).and_then(|s| ServeSettings::default().or(s).config(1024))
        };
        let from_file = read("root-squash = \"2000:2001\"\nno-squash-from = [\"::1\"]\n").unwrap();
        assert_eq!(from_file.root_squash, squash((2000, 2001), &["::1"]));
        // An exemption on the command line, the squash in the file.
        std::fs::write(&file, "root-squash = \"2000:2001\"\n").unwrap();
        let flag =
            ServeSettings { no_squash_from: Some(vec!["10.0.0.0/8".parse().unwrap()]), ..ServeSettings::default() };
        let both = flag.or(ServeSettings::read(&file).unwrap()).config(1024).unwrap();
        assert_eq!(both.root_squash, squash((2000, 2001), &["10.0.0.0/8"]));
        for (bad, why) in [
            ("root-squash = \"0:5\"\n", "UID:GID"),
            ("root-squash = \"5:5\"\nno-squash-from = [\"host\"]\n", "ADDR/LEN"),
            ("no-squash-from = [\"::1\"]\n", "needs root-squash"),
        ] {
            let refused = read(bad).err().unwrap();
            assert!(refused.contains(why), "{bad}: {refused}");
        }
    }
}
