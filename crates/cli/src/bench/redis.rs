//! The Redis anchor of `bench mdtest`: creates and stats over loopback
//! beside `redis-benchmark -t set,get -c T` in the same run (issue 11's
//! targets). A `redis-server` of our own on a free loopback port; a SET
//! stands for a create and a GET for a stat, with `-r N` so that each SET
//! makes a new key as each create makes a new file. `redis` keeps its
//! data in memory only, as the target's Redis does; `redis-aof` appends
//! every write and fsyncs it before answering (`appendfsync always`, its
//! file in `--dir`), durable as our creates are.
//!
//! Needs `redis-server` and `redis-benchmark` (Debian package
//! `redis-server`); without them the variant says it skipped.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::machine::{self, Span, Took};
use super::scratch_dir;

/// Whether both programs are installed.
pub(super) fn installed() -> bool {
    ["redis-server", "redis-benchmark"]
        .iter()
        .all(|p| Command::new(p).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok())
}

/// A `redis-server` child, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `requests` SETs took, then as many GETs, by `clients`
/// connections each waiting for its answer.
pub(super) fn run(durable: bool, dir: &Option<PathBuf>, clients: usize, requests: u64) -> Result<[Took; 2], String> {
    let data = scratch_dir(dir, "interlock-bench-redis")?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("a free port for redis: {e}"))?
        .port()
        .to_string();
    let data_dir = data.path().to_str().ok_or("the scratch directory's path is not UTF-8")?;
    let mut args = vec!["--port", &port, "--bind", "127.0.0.1", "--save", "", "--dir", data_dir, "--daemonize", "no"];
    if durable {
        args.extend(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        args.extend(["--appendonly", "no"]);
    }
    let server = Server(
        Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?,
    );
    let until = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(format!("127.0.0.1:{port}")).is_err() {
        if Instant::now() > until {
            return Err(format!("redis-server did not listen on port {port} within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    benchmark(&port, machine::Server::Process(server.0.id()), clients, requests)
}

/// `redis-benchmark` against the server on loopback port `port`: what
/// `requests` SETs took, then as many GETs, by `clients` connections
/// each waiting for its answer, counting `server`'s CPU apart.
pub(super) fn benchmark(
    port: &str,
    server: machine::Server,
    clients: usize,
    requests: u64,
) -> Result<[Took; 2], String> {
    // One run per test, so that each has its own span of machine CPU.
    let (c, n) = (clients.to_string(), requests.to_string());
    let test = |test: &str| -> Result<Took, String> {
        let span = Span::with_server(server);
        let out = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", port, "-t", test, "-c", &c, "-n", &n, "-r", &n, "--csv"])
            .output()
            .map_err(|e| format!("redis-benchmark: {e}"))?;
        let took = span.stop();
        if !out.status.success() {
            return Err(format!("redis-benchmark: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let rate = text
            .lines()
            .map(|l| l.split(',').map(|f| f.trim_matches('"')).collect::<Vec<_>>())
            .find(|f| f.first().is_some_and(|name| name.eq_ignore_ascii_case(test)))
            .and_then(|f| f.get(1)?.parse::<f64>().ok())
            .filter(|r| *r > 0.0)
            .ok_or_else(|| format!("redis-benchmark printed no {test} rate: {text}"))?;
        // Its own count of the time, without its start and end; the CPU
        // over the span it ran in.
        Ok(Took { secs: requests as f64 / rate, ..took })
    };
    Ok([test("set")?, test("get")?])
}
