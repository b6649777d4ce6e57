//! What the tests of server and client processes share: a server process,
//! `interlock lock`, a runtime, a client, a lock.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use interlock_client::{Client, ClientOptions, LockSpec};
use interlock_core::{Mode, Range};
use interlock_proto::Kind;

pub const BIN: &str = env!("CARGO_BIN_EXE_interlock");

/// A server process, killed on drop.
pub struct ServerProc {
    pub child: Child,
    pub addr: String,
}

impl ServerProc {
    pub fn start(data: &std::path::Path, listen: &str, extra: &[&str]) -> ServerProc {
        let mut args = vec!["--data", data.to_str().unwrap(), "--listen", listen];
        args.extend(extra);
        ServerProc::spawn(&args)
    }

    /// `interlock serve ARGS`, once it listens.
    pub fn spawn(args: &[&str]) -> ServerProc {
        ServerProc::spawn_lines(args, 1).0
    }

    /// `interlock serve ARGS` and the first `n` lines it prints (the
    /// first says where it listens).
    pub fn spawn_lines(args: &[&str], n: usize) -> (ServerProc, Vec<String>) {
        ServerProc::spawn_to(args, n, Stdio::null())
    }

    /// `interlock serve ARGS`, its warnings and errors (and any panic)
    /// written to `log`, once it listens.
    pub fn spawn_logged(args: &[&str], log: &std::fs::File) -> ServerProc {
        ServerProc::spawn_to(args, 1, log.try_clone().unwrap().into()).0
    }

    fn spawn_to(args: &[&str], n: usize, stderr: Stdio) -> (ServerProc, Vec<String>) {
        let mut child = Command::new(BIN)
            .arg("serve")
            .args(args)
            .env("INTERLOCK_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.as_mut().unwrap());
        let lines: Vec<String> = (0..n)
            .map(|_| {
                let mut line = String::new();
                out.read_line(&mut line).unwrap();
                line.trim().to_string()
            })
            .collect();
        let addr = lines[0].strip_prefix("interlock: listening on ").expect("listening line").to_string();
        (ServerProc { child, addr }, lines)
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Stops the server as an init system does (SIGTERM), and waits for
    /// it to exit: its clean stop.
    pub fn terminate(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the server's clean stop failed: {status}");
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn lock_cmd(addr: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("lock").args(args).env("INTERLOCK_SERVER", addr).stderr(Stdio::null());
    c
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// A client with default options, connected to `addr`.
pub async fn client(addr: &str) -> Client {
    Client::connect(addr, ClientOptions::default()).await.unwrap()
}

pub fn spec(name: &str, owner: u32) -> LockSpec {
    LockSpec { resource: name.as_bytes().to_vec(), kind: Kind::Dlm, owner, mode: Mode::EX, range: Range::WHOLE }
}

/// One length-prefixed frame of `msg`, as the codec writes it.
pub fn raw_frame(msg: &interlock_proto::ClientMsg) -> Vec<u8> {
    let body = interlock_proto::encode(msg);
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

/// The body of the next frame; `None` at the end of the stream.
pub fn try_read_raw_frame(r: &mut impl std::io::Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    r.read_exact(&mut body).ok()?;
    Some(body)
}

pub fn read_raw_frame(r: &mut impl std::io::Read) -> Vec<u8> {
    try_read_raw_frame(r).expect("a whole frame")
}

/// Says hello for a new session of client `origin` on a raw connection
/// and reads the welcome.
pub fn raw_hello(w: &mut impl std::io::Write, r: &mut impl std::io::Read, origin: u64) {
    let welcome = raw_hello_resuming(w, r, origin, None);
    assert!(matches!(welcome, Some(interlock_proto::ServerMsg::Welcome { .. })), "{welcome:?}");
}

/// Says hello on a raw connection for client `origin`: for a new
/// session, or with `resume` (a session, its secret, the bytes of the
/// server's stream taken in) for that one; the answer, a welcome or a
/// refusal, or `None` if the connection closed without one (a resume
/// that lost a race with a newer connection).
pub fn raw_hello_resuming(
    w: &mut impl std::io::Write,
    r: &mut impl std::io::Read,
    origin: u64,
    resume: Option<(u64, interlock_proto::Secret, u64)>,
) -> Option<interlock_proto::ServerMsg> {
    let (session, secret, received) =
        resume.map_or((None, [0; 16], 0), |(s, secret, received)| (Some(s), secret, received));
    let hello = interlock_proto::ClientMsg::Hello {
        version: interlock_proto::VERSION,
        token: None,
        session,
        received,
        secret,
        origin,
    };
    w.write_all(&raw_frame(&hello)).unwrap();
    try_read_raw_frame(r).map(|answer| interlock_proto::decode(&answer).unwrap())
}

/// Polls `done` until it holds (at most 30 s).
pub fn wait_for(what: &str, done: impl FnMut() -> bool) {
    assert!(holds_within(std::time::Duration::from_secs(30), done), "timed out waiting for {what}");
}

/// Polls `done` until it holds or `limit` passes: whether it held. For a
/// test that must undo something before it fails.
pub fn holds_within(limit: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + limit;
    while !done() {
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

/// How many cases a property test runs: `default`, or what
/// `PROPTEST_CASES` says (for a soak).
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A server whose sessions outlive any test (a 60 s lease): what ends a
/// session there is the test's doing, never the lease. Keep the directory
/// alive as long as the server.
pub fn long_lease_server() -> (tempfile::TempDir, ServerProc) {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProc::start(data.path(), "127.0.0.1:0", &["--lease-ms", "60000"]);
    (data, server)
}

/// A tmpfs of its own, mounted `nodev` as a FUSE mount is, so that
/// opening a device node (a whiteout, say) fails alike on both sides of a
/// comparison (`/dev/shm` may or may not be `nodev`); and of a size of
/// its own, to fill. Needs root. Unmounted when dropped.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn nodev() -> Tmpfs {
        Tmpfs::of("1g")
    }

    /// A private `nodev` tmpfs of `size` (as `mount -o size=` takes it).
    pub fn of(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("nodev,size={size},mode=0777"), "interlock-test"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "mount a tmpfs at {}", dir.path().display());
        Tmpfs(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("--lazy").arg(self.0.path()).status();
    }
}

/// A copy of the binary that any user may run, in a directory any user
/// may enter (the build's may be under a home others may not), and that
/// directory.
pub fn runnable_by_anyone() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let place = tempfile::tempdir().unwrap();
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = place.path().join("interlock");
    std::fs::copy(BIN, &bin).unwrap();
    (place, bin)
}

/// A TCP relay that can stop passing bytes both ways (a partition): while
/// frozen, neither side hears of the other's close either. It can also
/// cut its connections. A client it cannot connect onward (the server is
/// down) is closed, and the relay goes on. A connection whose two
/// directions have both ended is let go of (its sockets closed).
pub struct Relay {
    pub addr: String,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The connections relayed, by number: both ends, and each one's own
    /// freeze (see [`Relay::freeze_open`]).
    open: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u64, Relayed>>>,
}

/// One relayed connection: its two ends, and its own freeze.
struct Relayed {
    ends: [std::net::TcpStream; 2],
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    pub fn start(to: &str) -> Relay {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let frozen = std::sync::Arc::new(AtomicBool::new(false));
        let open = std::sync::Arc::<std::sync::Mutex<std::collections::HashMap<u64, Relayed>>>::default();
        let (to, f, o) = (to.to_string(), frozen.clone(), open.clone());
        std::thread::spawn(move || {
            for (number, c) in (0u64..).zip(l.incoming()) {
                let Ok(c) = c else { return };
                let Ok(s) = std::net::TcpStream::connect(&to) else { continue };
                let mine = std::sync::Arc::new(AtomicBool::new(false));
                let relayed = Relayed { ends: [c.try_clone().unwrap(), s.try_clone().unwrap()], held: mine.clone() };
                o.lock().unwrap().insert(number, relayed);
                // The direction that ends last lets the connection go.
                let running = std::sync::Arc::new(AtomicUsize::new(2));
                for (mut from, mut into) in [(c.try_clone().unwrap(), s.try_clone().unwrap()), (s, c)] {
                    let (f, mine, o, running) = (f.clone(), mine.clone(), o.clone(), running.clone());
                    let thawed = move || {
                        while f.load(Ordering::Relaxed) || mine.load(Ordering::Relaxed) {
                            std::thread::sleep(std::time::Duration::from_millis(10));
                        }
                    };
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 << 10];
                        loop {
                            let n = match std::io::Read::read(&mut from, &mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            thawed();
                            if std::io::Write::write_all(&mut into, &buf[..n]).is_err() {
                                break;
                            }
                        }
                        thawed();
                        let _ = into.shutdown(std::net::Shutdown::Both);
                        if running.fetch_sub(1, Ordering::AcqRel) == 1 {
                            o.lock().unwrap().remove(&number);
                        }
                    });
                }
            }
        });
        Relay { addr, frozen, open }
    }

    /// Closes every connection relayed so far, both ways; what a frozen
    /// relay holds of them is dropped at the thaw. New ones pass.
    pub fn cut(&self) {
        for r in self.open.lock().unwrap().values() {
            for end in &r.ends {
                let _ = end.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    pub fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The connections it relays now (not yet ended both ways).
    pub fn connections(&self) -> usize {
        self.open.lock().unwrap().len()
    }

    /// Freezes the connections open now, both ways, until the thaw; new
    /// ones pass. What they carry meanwhile is held, and passed on at the
    /// thaw: a copy of a request held up in the network.
    pub fn freeze_open(&self) {
        for r in self.open.lock().unwrap().values() {
            r.held.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn thaw(&self) {
        self.frozen.store(false, std::sync::atomic::Ordering::Relaxed);
        for r in self.open.lock().unwrap().values() {
            r.held.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// xorshift64*: small and seeded, for a test that draws at random and
/// prints the seed that repeats its run.
pub struct Draw {
    state: u64,
    /// The seed, for messages.
    pub seed: u64,
}

impl Draw {
    /// Seeded from environment variable `var` if set, else from the clock;
    /// prints the seed, and how to use it, for `test`.
    pub fn seeded(var: &str, test: &str) -> Draw {
        let seed = std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        }) | 1;
        eprintln!("{test}: seed {seed} ({var} repeats it)");
        Draw { state: seed, seed }
    }

    pub fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// Waits until a thread of process `pid` is opening a FIFO to write and
/// waits for a reader (the kernel's `wait_for_partner`): how a test holds
/// up a write at a known point and knows it is held.
pub fn wait_opening_fifo(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .any(|t| std::fs::read_to_string(t.unwrap().path().join("wchan")).is_ok_and(|w| w == "wait_for_partner"))
    {
        assert!(std::time::Instant::now() < deadline, "no thread of {pid} came to open the FIFO");
        std::thread::yield_now();
    }
}

/// `interlock tls-init DIR`, which must succeed.
pub fn tls_init(dir: &std::path::Path) {
    let out = Command::new(BIN).arg("tls-init").arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
