//! What a measured span cost the whole machine: its wall time, and the
//! CPU time every process and the kernel spent during it, from
//! `/proc/stat`. On a shared machine the wall time swings with the
//! neighbours; the CPU time per operation swings far less, and when the
//! cores are saturated (a server and its clients on one machine) it is
//! what sets the rate: `cores / cpu per operation`. It is the figure
//! that compares two servers' efficiency (ours and Redis's, each with
//! its clients) and the one that shows a regression.
//!
//! Busy time is user, nice, system, irq and softirq; idle, iowait and
//! steal (time the hypervisor gave to another machine) are not. Every
//! process counts, so nothing else of ours should run meanwhile (a build,
//! a test suite). Off Linux, or if `/proc/stat` cannot be read, the CPU
//! time is `None`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// A span being measured: see [`Span::stop`].
pub struct Span {
    start: Instant,
    ticks: Option<Ticks>,
    server: Server,
    server_ticks: Option<u64>,
}

/// A measured span.
#[derive(Clone, Copy, Debug, Default)]
pub struct Took {
    pub secs: f64,
    /// CPU seconds the machine spent, all cores together.
    pub cpu_secs: Option<f64>,
    /// CPU seconds the server's process (or threads) spent, if the span
    /// had one ([`Span::with_server`]): what the machine spent less this
    /// is its clients' and the kernel's work done outside it.
    pub server_cpu_secs: Option<f64>,
}

impl Took {
    /// Microseconds of machine CPU per one of `ops` operations.
    pub fn cpu_us_per(&self, ops: u64) -> Option<f64> {
        self.cpu_secs.map(|c| per_op(c, ops))
    }

    /// Microseconds of the server's CPU per one of `ops` operations.
    pub fn server_cpu_us_per(&self, ops: u64) -> Option<f64> {
        self.server_cpu_secs.map(|c| per_op(c, ops))
    }
}

fn per_op(secs: f64, ops: u64) -> f64 {
    secs * 1e6 / ops.max(1) as f64
}

/// Whose CPU time a span counts apart from the machine's: a server's, to
/// tell its cost per operation from its clients'.
#[derive(Clone, Copy, Debug)]
pub enum Server {
    None,
    /// A process of its own (`redis-server`).
    Process(u32),
    /// Every thread of this process but the calling one: a server run
    /// in-process whose clients all run on the calling thread.
    OtherThreads,
    /// Every thread of this process but the calling one and those named
    /// so: a server run in-process whose clients run on the calling
    /// thread and on threads of that name (`comm`, at most 15 bytes),
    /// which must live until the span ends (an ended thread's time is the
    /// process's, and no longer its own).
    OtherThreadsBut(&'static str),
}

impl Server {
    /// CPU ticks (hundredths of a second, user and system) it has used.
    fn ticks(self) -> Option<u64> {
        let read = |path: &str| std::fs::read_to_string(path).ok().as_deref().and_then(task_ticks);
        match self {
            Server::None => None,
            Server::Process(pid) => read(&format!("/proc/{pid}/stat")),
            // The thread first: the process's count, read after it, holds
            // all of it, so the difference is never short of the others'.
            // The kernel rounds each count (user and system apart) down to
            // a tick, so the process's may still come out a tick below the
            // thread's when the other threads did next to nothing: none,
            // then, not a missing figure (seen in CI, session 53).
            Server::OtherThreads => {
                let mine = read("/proc/thread-self/stat")?;
                Some(read("/proc/self/stat")?.saturating_sub(mine))
            }
            Server::OtherThreadsBut(name) => {
                let clients =
                    read("/proc/thread-self/stat")? + named_threads(name, "stat", task_ticks).values().sum::<u64>();
                Some(read("/proc/self/stat")?.saturating_sub(clients))
            }
        }
    }
}

/// Nanoseconds the calling thread has run on a CPU (the first field of
/// `/proc/thread-self/schedstat`), or `None` where that cannot be read:
/// finer than [`task_ticks`]' hundredths, for a thread whose share of a
/// run is a fraction of a second.
pub fn thread_cpu_ns() -> Option<u64> {
    run_ns(Path::new("/proc/thread-self/schedstat"))
}

/// The first field of a `schedstat` file: nanoseconds its thread has run
/// on a CPU.
fn run_ns(schedstat: &Path) -> Option<u64> {
    schedstat_ns(&std::fs::read_to_string(schedstat).ok()?)
}

/// The first field of a `schedstat` file's text.
fn schedstat_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Nanoseconds each of this process's threads named `name` (its `comm`,
/// at most 15 bytes) has run on a CPU, by thread id: for a library's
/// thread of its own (a journal's flusher), which the caller cannot
/// time from inside. Empty where `/proc/self/task` cannot be read; a
/// thread that ends meanwhile is left out. O(threads).
pub fn named_threads_cpu_ns(name: &str) -> BTreeMap<u64, u64> {
    named_threads(name, "schedstat", schedstat_ns)
}

/// What `parse` reads from `file` of `/proc/self/task/TID` for each of
/// this process's threads named `name`, by thread id. O(threads).
fn named_threads(name: &str, file: &str, parse: impl Fn(&str) -> Option<u64>) -> BTreeMap<u64, u64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return BTreeMap::new() };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            let tid = t.file_name().to_str()?.parse().ok()?;
            (std::fs::read_to_string(t.path().join("comm")).ok()?.trim_end() == name).then_some(())?;
            Some((tid, parse(&std::fs::read_to_string(t.path().join(file)).ok()?)?))
        })
        .collect()
}

/// User plus system ticks from a `/proc/PID/stat` line: its 14th and
/// 15th fields, counted after the command name (which may hold spaces
/// and parentheses, so from its last `)`).
fn task_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(field(14)? + field(15)?)
}

impl Span {
    pub fn start() -> Span {
        Span::with_server(Server::None)
    }

    /// A span that also counts `server`'s CPU time.
    pub fn with_server(server: Server) -> Span {
        Span { ticks: Ticks::now(), server_ticks: server.ticks(), server, start: Instant::now() }
    }

    pub fn stop(self) -> Took {
        let secs = self.start.elapsed().as_secs_f64();
        let cpu_secs = self.ticks.zip(Ticks::now()).and_then(|(a, b)| b.busy_secs_since(&a, secs));
        // Two reads a tick apart can overstate the start by one: never
        // below zero.
        let server_cpu_secs =
            self.server_ticks.zip(self.server.ticks()).map(|(a, b)| b.saturating_sub(a) as f64 / 100.0);
        Took { secs, cpu_secs, server_cpu_secs }
    }
}

/// Runs `f` as one span.
pub fn measured(f: impl FnOnce()) -> Took {
    let span = Span::start();
    f();
    span.stop()
}

/// The machine's CPU counters: busy and all ticks, summed over cores.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ticks {
    busy: u64,
    total: u64,
    cores: u32,
}

impl Ticks {
    fn now() -> Option<Ticks> {
        Ticks::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// From `/proc/stat`'s text: the `cpu` line's counters (user nice
    /// system idle iowait irq softirq steal ...), and one `cpuN` line per
    /// core.
    fn parse(stat: &str) -> Option<Ticks> {
        let mut lines = stat.lines();
        let all = lines.next()?.strip_prefix("cpu ")?;
        let n: Vec<u64> = all.split_whitespace().take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = n[..] else { return None };
        let cores = lines.take_while(|l| l.starts_with("cpu")).count() as u32;
        let busy = user + nice + system + irq + softirq;
        (cores > 0).then_some(Ticks { busy, total: busy + idle + iowait + steal, cores })
    }

    /// CPU seconds spent since `before`, over `secs` of wall time: the
    /// busy share of the ticks, times the cores, times the span. Ticks
    /// are counted in hundredths of a second: a span of a few seconds
    /// on a few cores reads to a fraction of a percent. `None` if no
    /// tick passed.
    fn busy_secs_since(&self, before: &Ticks, secs: f64) -> Option<f64> {
        let total = self.total.checked_sub(before.total).filter(|&t| t > 0)?;
        let busy = self.busy.checked_sub(before.busy)?;
        Some(busy as f64 / total as f64 * f64::from(self.cores) * secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str =
        "cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 50 2 25 400 10 1 1 5 0 0\ncpu1 50 3 25 400 10 2 1 5 0 0\nintr 1 2 3\n";

    /// Keeps the calling thread busy for 0.3 s of its own CPU time (on
    /// Linux; elsewhere of wall time): on a loaded machine 0.3 s of wall
    /// time can be half that of CPU.
    fn spin() {
        let own = || std::fs::read_to_string("/proc/thread-self/stat").ok().as_deref().and_then(task_ticks);
        let (start, t) = (own(), Instant::now());
        let mut x = 0u64;
        while match start {
            Some(start) => own().is_some_and(|now| now < start + 30),
            None => t.elapsed().as_millis() < 300,
        } {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn parses_the_cpu_line_and_counts_the_cores() {
        assert_eq!(Ticks::parse(STAT), Some(Ticks { busy: 160, total: 990, cores: 2 }));
        assert_eq!(Ticks::parse("intr 1 2\n"), None, "no cpu line");
        assert_eq!(Ticks::parse("cpu  1 2 x 4 5 6 7 8\ncpu0 1\n"), None, "a counter that is not a number");
        assert_eq!(Ticks::parse("cpu  1 2 3\ncpu0 1\n"), None, "too few counters");
    }

    #[test]
    fn busy_seconds_are_the_busy_share_of_every_core_over_the_span() {
        let a = Ticks { busy: 100, total: 1000, cores: 2 };
        // Over 2 s on 2 cores, 400 ticks passed, 300 of them busy: 3 of
        // the 4 core-seconds.
        let b = Ticks { busy: 400, total: 1400, cores: 2 };
        assert_eq!(b.busy_secs_since(&a, 2.0), Some(3.0));
        assert_eq!(a.busy_secs_since(&a, 2.0), None, "no tick passed");
        assert_eq!(a.busy_secs_since(&b, 2.0), None, "counters that went back");
    }

    #[test]
    fn a_task_s_ticks_are_its_user_and_system_time_whatever_its_name() {
        let line = "42 (tokio (rt) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0";
        assert_eq!(task_ticks(line), Some(325));
        assert_eq!(task_ticks("42 (x) S 1 2"), None, "too few fields");
        assert_eq!(task_ticks("no name here"), None);
    }

    #[test]
    fn the_server_s_time_is_that_of_the_other_threads() {
        // Another thread spins while the calling one waits: its time is
        // the server's. (Tests running beside this one only add to it.)
        let span = Span::with_server(Server::OtherThreads);
        std::thread::spawn(spin).join().unwrap();
        let took = span.stop();
        if cfg!(target_os = "linux") {
            let server = took.server_cpu_secs.expect("/proc/self is readable on Linux");
            assert!(server >= 0.2, "{server} CPU seconds for a thread that spun 0.3 s");
        }
    }

    /// A thread of the clients' name spins 0.3 s: the others' time
    /// counts it, the server's but theirs does not. Both read the same
    /// moments, so what tests beside this one add is in both.
    #[test]
    fn the_server_s_time_leaves_out_its_clients_named_threads() {
        let (all, but) = (Server::OtherThreads, Server::OtherThreadsBut("bench-client"));
        let before = (all.ticks(), but.ticks());
        let ((spun, has_spun), (end, ends)) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let client = std::thread::Builder::new().name("bench-client".into());
        let client = client
            .spawn(move || {
                spin();
                spun.send(()).unwrap();
                ends.recv().unwrap();
            })
            .unwrap();
        has_spun.recv().unwrap();
        // Read while it is still a thread of the process: once it ends
        // it is gone from /proc/self/task, and its time is the process's.
        let after = (all.ticks(), but.ticks());
        end.send(()).unwrap();
        client.join().unwrap();
        if cfg!(target_os = "linux") {
            let spent = |a: Option<u64>, b: Option<u64>| b.expect("after").saturating_sub(a.expect("before"));
            let (others, server) = (spent(before.0, after.0), spent(before.1, after.1));
            assert!(others >= server + 20, "a client thread spun 0.3 s: others {others} ticks, server {server}");
        }
    }

    #[test]
    fn the_calling_thread_s_time_is_not_the_server_s() {
        spin();
        if cfg!(target_os = "linux") {
            // Others first: the process's count, read after, can only be
            // larger, so the gap is at least this thread's 0.3 s.
            let others = Server::OtherThreads.ticks().expect("/proc/self is readable on Linux");
            let all = Server::Process(std::process::id()).ticks().expect("this process's stat");
            assert!(
                all >= others + 20,
                "this thread spun 0.3 s, yet the process has {all} ticks and the others {others}"
            );
        }
    }

    #[test]
    fn a_busy_span_costs_cpu_time_on_linux() {
        let took = measured(spin);
        assert!(took.secs >= 0.28, "{} s", took.secs);
        if cfg!(target_os = "linux") {
            // This thread alone kept a core busy for the whole span.
            let cpu = took.cpu_secs.expect("/proc/stat is readable on Linux");
            assert!(cpu >= 0.2 && cpu <= took.secs * 64.0, "{cpu} CPU seconds over {} s", took.secs);
            assert!(took.cpu_us_per(1000).is_some_and(|us| us >= 200.0));
        }
    }
}
