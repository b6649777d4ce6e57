//! The clock the client measures its lease on: time since boot, a suspend
//! of the machine included (`CLOCK_BOOTTIME`).
//!
//! Why not [`Instant`](std::time::Instant): on Linux it reads
//! `CLOCK_MONOTONIC`, which stops while the machine is suspended, and
//! tokio's timers run on it. The server's clock does not stop for the
//! client's suspend: it ends the session a lease after it last heard from
//! the client and gives the session's locks to others. A client measuring
//! its lease on `CLOCK_MONOTONIC` would resume believing it still held
//! them for what was left of its lease when it was suspended (up to three
//! quarters of a lease), beside their new holders. On this clock the
//! lease runs on through the suspend, and [`until`] waits on a timer of
//! the same clock (a `timerfd`), which the kernel fires as the machine
//! resumes if the suspend carried the clock past it: the client gives
//! its locks up then, before anything of its own runs long.

use std::io;
use std::ops::Add;
use std::time::Duration;

use rustix::time::{ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::net::unix::pipe;

/// A reading of the boot clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Moment(Duration);

impl Moment {
    /// Now. One `clock_gettime`, served by the vDSO.
    pub fn now() -> Moment {
        let t = rustix::time::clock_gettime(ClockId::Boottime);
        // The boot clock is never negative.
        Moment(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
    }

    /// How long after `earlier` this is (0 if it is not).
    pub fn since(self, earlier: Moment) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Moment {
    type Output = Moment;

    fn add(self, d: Duration) -> Moment {
        Moment(self.0 + d)
    }
}

/// Completes once the boot clock reaches `at` (at once if it has), also
/// when a suspend carried it past `at`: then as the machine resumes. Where
/// no timer of that clock can be made (a sandbox without one), a tokio
/// timer of what is left now stands in, with a warning: it is late by the
/// length of any suspend.
pub(crate) async fn until(at: Moment) {
    match alarm(at) {
        Ok(alarm) => loop {
            if alarm.readable().await.is_err() {
                break;
            }
            // Eight bytes, the count of expiries: one, as the timer is
            // set once.
            match alarm.try_read(&mut [0u8; 8]) {
                Ok(_) => return,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "no timer on the boot clock: a suspend of this machine delays the lease's end")
        }
    }
    tokio::time::sleep(at.since(Moment::now())).await;
}

/// A `timerfd` on the boot clock set to fire at `at`, registered with
/// tokio. Three system calls. It is registered as a pipe's reading end,
/// which tokio can take from any owned descriptor without `unsafe` (its
/// `AsyncFd` cannot): all it does with it is wait for it to be readable
/// and `read(2)` it, which a `timerfd` answers as a pipe would.
fn alarm(at: Moment) -> io::Result<pipe::Receiver> {
    let fd = rustix::time::timerfd_create(TimerfdClockId::Boottime, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    // A time of zero would disarm the timer; a nanosecond more is the
    // same point to a lease.
    let value = Timespec { tv_sec: at.0.as_secs() as i64, tv_nsec: i64::from(at.0.subsec_nanos()).max(1) };
    rustix::time::timerfd_settime(&fd, TimerfdTimerFlags::ABSTIME, &Itimerspec { it_interval: zero, it_value: value })?;
    pipe::Receiver::from_owned_fd_unchecked(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boot clock runs with the monotonic one while the machine is
    /// awake, and the wait ends at its point, not before.
    #[tokio::test]
    async fn the_wait_ends_when_the_boot_clock_reaches_its_point() {
        let (start, started) = (Moment::now(), std::time::Instant::now());
        until(start + Duration::from_millis(50)).await;
        assert!(Moment::now().since(start) >= Duration::from_millis(50));
        assert!(started.elapsed() >= Duration::from_millis(49), "the monotonic clock agrees, within a tick");
        // A point passed already: at once.
        let t = std::time::Instant::now();
        until(start).await;
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
