//! What the client knows of its own lease, without a clock of its own:
//! every instant is passed in, so the rule is tested without sleeps.
//!
//! The server renews a session's lease whenever it reads a request of it,
//! so a request sent at `t` whose reply came proves the lease ran at least
//! until `t + lease`. Past that, the server may have ended the session and
//! given its locks to others: the client must not reclaim them after a
//! server restart, nor believe it still holds them (Chubby's rule).

use std::time::{Duration, Instant};

/// The lease as the client sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lease {
    length: Duration,
    /// The latest send time of a request that was answered.
    confirmed: Instant,
}

impl Lease {
    /// A session welcomed in answer to a hello sent at `sent`.
    pub fn new(length: Duration, sent: Instant) -> Lease {
        Lease { length, confirmed: sent }
    }

    /// A request sent at `sent` was answered.
    pub fn confirm(&mut self, sent: Instant) {
        self.confirmed = self.confirmed.max(sent);
    }

    /// Whether the server cannot have ended the session by `now`.
    pub fn holds_at(&self, now: Instant) -> bool {
        now < self.confirmed + self.length
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_runs_from_the_last_answered_send() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut l = Lease::new(5 * s, t0);
        assert!(l.holds_at(t0 + 4 * s));
        assert!(!l.holds_at(t0 + 5 * s), "not a moment past the lease");
        l.confirm(t0 + 3 * s);
        assert!(l.holds_at(t0 + 7 * s));
        // An answer to an older request does not move it back.
        l.confirm(t0 + s);
        assert!(l.holds_at(t0 + 7 * s) && !l.holds_at(t0 + 8 * s));
    }
}
