//! `interlock`: one binary, many subcommands (like `etcdctl` or `lfs`).

mod alloc;
mod args;
mod bench;
mod exit;
mod fsck_cmd;
mod journal_cmd;
mod remote;
mod replay;
mod tls_init;

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// The version, the protocol's, and the clients' a server serves: its
/// own version's and those older ones whose messages are the same
/// (`interlock_proto::OLDEST_CLIENT`; `docs/protocol.md`).
fn version() -> &'static str {
    static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "{} (protocol {}; a server serves clients of protocol {})",
            env!("CARGO_PKG_VERSION"),
            interlock_proto::VERSION,
            interlock_proto::versions_served()
        )
    });
    &VERSION
}

/// interlock: a lock and metadata service for shared file systems.
///
/// POSIX, OFD, flock and DLM locks with exact Linux semantics, where every
/// lock operation costs O(log n + k) however many locks a file holds.
#[derive(Parser)]
#[command(name = "interlock", version = version(), propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: cluster-wide locks with leases, and the shared
    /// namespace (files, directories, data, changelog) over TCP.
    // Boxed: its many settings would make every command as large.
    Serve(Box<remote::serve::ServeArgs>),
    /// Hold a cluster-wide lock while a command runs (like flock(1)).
    ///
    /// The command never runs without the lock: SIGINT, SIGTERM and SIGHUP
    /// are forwarded to it (the lock is held until it exits); if this
    /// wrapper is killed, the command is killed with it; if the lock is
    /// lost (the session's lease ran out: a network partition, a stopped
    /// wrapper), the command gets SIGTERM, then SIGKILL 5 s later. A
    /// signal while the lock is awaited withdraws the wait.
    ///
    /// Exit status: the command's own (128 + N if killed by signal N);
    /// 1 if --nowait or --timeout could not get the lock (held, or the
    /// server is in its recovery window); 2 for a usage error; 69 if the
    /// server cannot be reached, did not answer in time, or is at a limit
    /// (max-locks, max-total-locks); 75 if the lock
    /// was lost while the command ran; 77 if the server refused the token
    /// or its TLS certificate is not trusted;
    /// 126 if the command cannot be run, 127 if it is not found. The
    /// command sees the lock's fencing token in INTERLOCK_FENCE.
    Lock(remote::lock::LockArgs),
    /// Mount the shared tree (FUSE): ordinary programs share its files
    /// and their fcntl, OFD and flock locks with every other mount.
    ///
    /// `interlock mount 10.0.0.5:7420 /mnt/shared`, or with the server
    /// from --server or INTERLOCK_SERVER: `interlock mount /mnt/shared`.
    ///
    /// Needs /dev/fuse (Debian package fuse3 for fusermount3). Root's
    /// mount serves every user of the machine; any other user mounts
    /// through fusermount3, for that user alone, on a directory they may
    /// write. The server checks each operation with the calling
    /// process's uid, gid and groups. While the server does not answer
    /// (down, restarting, cut off), calls wait for it, as on a hard NFS
    /// mount, and go on when it is back; a program so waiting can still
    /// be killed (with -o soft, they fail with EIO after a minute). Stays in the foreground until unmounted (fusermount3 -u
    /// MOUNTPOINT, umount, Ctrl-C or SIGTERM).
    /// Exit status: 0 unmounted; 2 a usage error or a bad mount point; 69
    /// the server cannot be reached, fusermount3 is missing, or the mount
    /// failed; 77 fusermount3 refused the mount, or the token was
    /// refused.
    #[command(override_usage = "interlock mount [OPTIONS] [SERVER] <MOUNTPOINT>")]
    Mount(remote::mount::MountArgs),
    /// Live counters of a server: sessions, resources, locks, waiters,
    /// request rate, inodes, journal, changelog consumers, the data disk.
    Status(remote::status::StatusArgs),
    /// End a session at once, as if its lease had run out: its locks are
    /// released and its waits withdrawn (force a dead client out; find its
    /// session with `interlock status --resource NAME`). Exit 1 if there
    /// is no such session; 77 if the caller may not (on the server's
    /// machine, only root and the server's own user may evict).
    Evict(remote::evict::EvictArgs),
    /// Make a private CA and a server certificate for TLS: writes
    /// DIR/ca.pem (for clients' --tls-ca), DIR/server.pem and
    /// DIR/server.key (for serve --tls-cert and --tls-key).
    TlsInit(tls_init::TlsInitArgs),
    /// Tools for reproducing lock problems without a cluster.
    #[command(subcommand)]
    Debug(DebugCommand),
    /// Inspect a journal directory offline: check, dump.
    #[command(subcommand)]
    Journal(journal_cmd::JournalCommand),
    /// The namespace's changelog on a running server: register, list,
    /// read (--follow), clear, deregister consumers. Exit 77 if the caller
    /// may not (on the server's machine, only root and the server's own
    /// user may use it).
    Changelog(remote::changelog::ChangelogArgs),
    /// Check a namespace store offline: every entry names an inode in a
    /// directory, every directory has one name and is reached from the
    /// root, no inode is leaked. Changes nothing unless --repair. Exit
    /// status 0 clean, 1 damage found (repaired with --repair), 4 the
    /// checkpoint or journal cannot be read, 8 a running server has the
    /// store open (stop it first), 2 DIR is missing or not a directory.
    Fsck(fsck_cmd::FsckArgs),
    /// Benchmarks: the seed scenarios, with the kernel's own locks beside
    /// ours where it finishes in reasonable time.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

#[derive(Subcommand)]
enum DebugCommand {
    /// Replay POSIX lock operations from stdin on one file, one per line.
    ///
    /// Each line is `OWNER OP TYPE START LEN`: OWNER any word (each one an
    /// OFD-style owner: an open file description), OP one of `setlk`,
    /// `getlk`, `unlk`, `close`, TYPE one of `rd`, `wr`, `un`, START a byte
    /// offset, LEN a length (0 = to end of file; negative = the bytes before
    /// START, as in POSIX). `close` and `unlk` ignore TYPE; `close` needs no
    /// further fields. A line `dump` prints every lock as `lock OWNER TYPE
    /// START LEN` (LEN 0 = to end of file), by owner then start, then `end`.
    /// Blank lines and lines starting with `#` are skipped.
    ///
    /// Prints one line per operation: `ok`, `eagain`, `unlocked` (getlk
    /// found nothing) or `conflict OWNER TYPE START LEN`. A bad line gets an
    /// error on stderr naming its number and the run goes on; the exit
    /// status is then 2.
    PosixReplay,
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if !matches!(cli.command, Command::Serve(_) | Command::Mount(_) | Command::Bench(_)) {
        die_of_closed_pipes();
    }
    match cli.command {
        Command::Serve(args) => remote::serve::serve(*args),
        Command::Lock(args) => remote::lock::lock(args),
        Command::Mount(args) => {
            let mount = matches.subcommand_matches("mount").expect("the mount subcommand's matches");
            remote::mount::mount(args, mount.value_source("server") == Some(ValueSource::CommandLine))
        }
        Command::Status(args) => remote::status::status(args),
        Command::Evict(args) => remote::evict::evict(args),
        Command::TlsInit(args) => match tls_init::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("interlock tls-init: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Debug(DebugCommand::PosixReplay) => {
            let stdin = std::io::stdin().lock();
            let stdout = std::io::stdout().lock();
            match replay::run(stdin, stdout, &mut std::io::stderr()) {
                Ok(0) => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(2),
                Err(e) => {
                    eprintln!("interlock: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Journal(cmd) => match journal_cmd::run(cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("interlock journal: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Fsck(args) => fsck_cmd::fsck(args),
        Command::Changelog(args) => remote::changelog::changelog(args),
        Command::Bench(cmd) => match bench::run(cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("interlock bench: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// A command whose output goes to a reader that stopped reading
/// (`interlock changelog read cl1 | head`) ends as other Unix tools do, by
/// `SIGPIPE`, silently: Rust's runtime ignores the signal, and `println!`
/// then panicked ("failed printing to stdout: Broken pipe", until session
/// 42). Not the server nor the mount, nor `bench`, which runs both in
/// its own process: their writes to a peer gone (a socket; a
/// `--background` caller that stopped reading) are errors they handle.
fn die_of_closed_pipes() {
    // SAFETY: `signal` with `SIG_DFL` installs no handler of ours; it
    // runs before any thread but this one exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
