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

use std::time::Instant;

/// A span being measured: see [`Span::stop`].
pub struct Span {
    start: Instant,
    ticks: Option<Ticks>,
}

/// A measured span.
#[derive(Clone, Copy, Debug)]
pub struct Took {
    pub secs: f64,
    /// CPU seconds the machine spent, all cores together.
    pub cpu_secs: Option<f64>,
}

impl Took {
    /// Microseconds of machine CPU per one of `ops` operations.
    pub fn cpu_us_per(&self, ops: u64) -> Option<f64> {
        self.cpu_secs.map(|c| c * 1e6 / ops.max(1) as f64)
    }
}

impl Span {
    pub fn start() -> Span {
        Span { ticks: Ticks::now(), start: Instant::now() }
    }

    pub fn stop(self) -> Took {
        let secs = self.start.elapsed().as_secs_f64();
        let cpu_secs = self.ticks.zip(Ticks::now()).and_then(|(a, b)| b.busy_secs_since(&a, secs));
        Took { secs, cpu_secs }
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
    fn a_busy_span_costs_cpu_time_on_linux() {
        let took = measured(|| {
            let t = Instant::now();
            let mut x = 0u64;
            while t.elapsed().as_millis() < 300 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        });
        assert!(took.secs >= 0.3);
        if cfg!(target_os = "linux") {
            // This thread alone kept a core busy for the whole span.
            let cpu = took.cpu_secs.expect("/proc/stat is readable on Linux");
            assert!(cpu >= 0.2 && cpu <= took.secs * 64.0, "{cpu} CPU seconds over {} s", took.secs);
            assert!(took.cpu_us_per(1000).is_some_and(|us| us >= 200.0));
        }
    }
}
