//! What the client knows of its own lease, without a clock of its own:
//! every instant is passed in, so the rule is tested without sleeps.
//!
//! The server renews a session's lease whenever it reads a request of it,
//! so a request sent at `t` whose reply came proves the lease ran at least
//! until `t + lease`. Past that, the server may have ended the session and
//! given its locks to others: the client must not reclaim them after a
//! server restart, nor believe it still holds them (Chubby's rule).
//!
//! So the client stops counting on its locks earlier, at
//! [`Lease::trusted_until`], while it is still cut off: it reports them
//! lost a [`notice`](Lease::notice) before the server may give them away,
//! and whatever acts under them (a wrapper's command) has that long to
//! stop. It renews every [`renew_every`](Lease::renew_every), so a client
//! whose renewals are answered never comes near that point.
//!
//! Every instant is a reading of the boot clock ([`Moment`]), which runs
//! on while the machine is suspended, as the server's clock does.

use std::time::Duration;

use crate::clock::Moment;

/// The lease as the client sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lease {
    length: Duration,
    /// The latest send time of a request that was answered.
    confirmed: Moment,
}

impl Lease {
    /// A session welcomed in answer to a hello sent at `sent`.
    pub fn new(length: Duration, sent: Moment) -> Lease {
        Lease { length, confirmed: sent }
    }

    /// A request sent at `sent` was answered.
    pub fn confirm(&mut self, sent: Moment) {
        self.confirmed = self.confirmed.max(sent);
    }

    /// Whether the server cannot have ended the session by `now`.
    pub fn holds_at(&self, now: Moment) -> bool {
        now < self.confirmed + self.length
    }

    /// How long before the server may end the session the client gives
    /// up its locks: a quarter of a lease of `length`.
    pub fn notice(length: Duration) -> Duration {
        length / 4
    }

    /// How often the client renews a lease of `length`: four times a
    /// lease, so that after the last answered one, two more may go
    /// unanswered and a third be sent before
    /// [`trusted_until`](Lease::trusted_until) (never less than 10 ms
    /// apart, should a lease of 0 be welcomed).
    pub fn renew_every(length: Duration) -> Duration {
        (length / 4).max(Duration::from_millis(10))
    }

    /// Until when the client counts on its locks: a
    /// [`notice`](Lease::notice) before the earliest the server can end
    /// the session.
    pub fn trusted_until(&self) -> Moment {
        self.confirmed + (self.length - Lease::notice(self.length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_runs_from_the_last_answered_send() {
        let t0 = Moment::now();
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

    #[test]
    fn the_locks_are_given_up_a_notice_before_the_lease_can_end() {
        let t0 = Moment::now();
        let ms = Duration::from_millis;
        let mut l = Lease::new(ms(4000), t0);
        assert_eq!(l.trusted_until(), t0 + ms(3000));
        assert!(l.holds_at(l.trusted_until()) && !l.holds_at(l.trusted_until() + Lease::notice(ms(4000))));
        l.confirm(t0 + ms(1000));
        assert_eq!(l.trusted_until(), t0 + ms(4000));
        // The third renewal after an answered one goes out at the latest
        // at the point the locks are given up.
        assert!(t0 + ms(1000) + 3 * Lease::renew_every(ms(4000)) <= l.trusted_until());
        assert_eq!(Lease::renew_every(ms(0)), ms(10), "never a busy loop");
    }
}
