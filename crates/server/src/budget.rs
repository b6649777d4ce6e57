//! The memory all sessions' streams take together: the output each keeps
//! until its client acknowledges it, the answers promised to it, and the
//! requests its connection holds back (see `wire` and `connection`).
//!
//! Each stream is bounded on its own (64 MiB of output, 16 MiB of held
//! requests), but a client may open thousands of sessions. While the
//! streams together keep less than the limit (`max-output-memory`),
//! nothing changes. Past it, each stream gets a share of the limit (the
//! limit over the streams that keep 64 KiB or more): a stream at its share
//! serves no more requests until its client acknowledges what it took
//! in, and a connection that would hold more than a share of requests
//! back has its session's stream cut (it can no longer resume, as past
//! 64 MiB). A client that acknowledges what it reads drains below its
//! share and goes on; one that does not is cut. So the streams keep at
//! most about twice the limit, plus one answer each (at most a frame,
//! 1.1 MiB) on their way to their share.
//!
//! Streams are charged in granules of 64 KiB, so the shared counters are
//! touched only when a stream's size crosses a granule: a client's small
//! answers, acknowledged every 16 KiB, never touch them.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes per granule, as a shift.
const GRANULE: u32 = 16;

/// The least share: a stream may always keep this much, so that a client,
/// which acknowledges every 16 KiB it takes in, always gets to.
const FLOOR: usize = 1 << GRANULE;

pub(crate) struct Budget {
    /// Bytes the streams may keep together before they are held to shares.
    limit: usize,
    /// Granules charged to all streams.
    used: AtomicUsize,
    /// Streams charged at least one granule.
    users: AtomicUsize,
}

impl Default for Budget {
    /// No limit.
    fn default() -> Budget {
        Budget::new(usize::MAX)
    }
}

impl Budget {
    pub fn new(limit: usize) -> Budget {
        Budget { limit, used: AtomicUsize::new(0), users: AtomicUsize::new(0) }
    }

    /// Charges a stream that was charged `was` granules for the `bytes` it
    /// keeps now; returns its new charge. O(1), and touches the shared
    /// counters only when the charge changes.
    pub fn charge(&self, was: usize, bytes: usize) -> usize {
        let now = bytes >> GRANULE;
        if now != was {
            if now > was {
                self.used.fetch_add(now - was, Ordering::Relaxed);
            } else {
                self.used.fetch_sub(was - now, Ordering::Relaxed);
            }
            match (was, now) {
                (0, _) => {
                    self.users.fetch_add(1, Ordering::Relaxed);
                }
                (_, 0) => {
                    self.users.fetch_sub(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        now
    }

    /// While the streams together keep the limit or more, the bytes each
    /// may keep; `None` while they keep less. O(1).
    pub fn share(&self) -> Option<usize> {
        let used = self.used.load(Ordering::Relaxed);
        if used.saturating_mul(1 << GRANULE) < self.limit {
            return None;
        }
        Some((self.limit / self.users.load(Ordering::Relaxed).max(1)).max(FLOOR))
    }

    /// Bytes charged to all streams (to the granule).
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed) << GRANULE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small streams are not charged; past the limit each stream's share
    /// is the limit over the streams charged, never under the floor; a
    /// stream that empties gives its charge back.
    #[test]
    fn streams_are_held_to_shares_only_past_the_limit() {
        let b = Budget::new(1 << 20);
        assert_eq!(b.charge(0, 1000), 0, "under a granule: not charged");
        let one = b.charge(0, 600 << 10);
        assert_eq!(b.share(), None, "600 KiB of 1 MiB");
        let two = b.charge(0, 600 << 10);
        assert_eq!(b.used(), 1152 << 10);
        assert_eq!(b.share(), Some(512 << 10), "two streams past the limit: half each");
        let two = b.charge(two, 0);
        assert_eq!((two, b.share()), (0, None));
        let one = b.charge(one, 2 << 20);
        assert_eq!(b.share(), Some(1 << 20), "one stream: the whole limit");
        b.charge(one, 0);
        assert_eq!(b.used(), 0);
        let tiny = Budget::new(1 << 16);
        let charges: Vec<usize> = (0..4).map(|_| tiny.charge(0, 1 << 16)).collect();
        assert_eq!(tiny.share(), Some(FLOOR), "never under the floor");
        for c in charges {
            tiny.charge(c, 0);
        }
        assert_eq!(tiny.share(), None);
    }
}
