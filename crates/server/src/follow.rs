//! Changelog reads that wait for records (`changelog read --follow`), on
//! no thread: each is a task that waits for the journal's durable end to
//! reach the record it needs, woken by the sync that makes it durable.
//!
//! Until session 55 each such read waited on one of tokio's blocking
//! threads, at most 64 at once (the pool is every client's `fsync`s and
//! disk reads), and a read past them looked once, then waited out its
//! whole wait (up to 30 s) before it looked again.
//!
//! Waiters are kept by the end they wait for, so that a sync wakes only
//! those it serves: a client's reads waiting for records far ahead cost
//! the syncs nothing (woken by every sync, 600 of them would be 600 task
//! wake-ups a sync).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use interlock_journal::Journal;
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// The reads waiting for records, by the durable end each waits for.
#[derive(Default)]
pub(crate) struct Waiting {
    /// Tells apart waiters for the same end.
    next: AtomicU64,
    by_end: Mutex<BTreeMap<(u64, u64), oneshot::Sender<()>>>,
}

impl Waiting {
    /// After a sync that made every record below `end` durable (or the
    /// journal's failure): wakes the reads that wait for no more than
    /// that. O(log w + woken) for w waiting; one lock when none waits.
    pub fn synced(&self, end: u64, failed: bool) {
        let woken = {
            let mut by_end = self.by_end.lock();
            if by_end.is_empty() {
                return;
            }
            let rest = if failed { BTreeMap::new() } else { by_end.split_off(&(end.saturating_add(1), 0)) };
            std::mem::replace(&mut *by_end, rest)
        };
        for tx in woken.into_values() {
            let _ = tx.send(());
        }
    }

    /// Waits until every record below `end` is durable, the journal has
    /// failed, or `deadline`. O(log w).
    pub async fn until(&self, journal: &Journal, end: u64, deadline: Instant) {
        let done = || journal.durable_end() >= end || journal.failed();
        if done() {
            return;
        }
        let key = (end, self.next.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.by_end.lock().insert(key, tx);
        // The journal stores its durable end before it calls the hook that
        // calls `synced`: a sync between the look above and the insert is
        // seen here, one after it finds the waiter.
        if done() || tokio::time::timeout_at(deadline.into(), rx).await.is_err() {
            self.by_end.lock().remove(&key);
        }
    }

    /// Reads waiting, for tests.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_end.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A sync wakes the reads it serves and no other; one that gives up
    /// at its deadline leaves nothing behind.
    #[tokio::test]
    async fn a_sync_wakes_only_the_reads_it_serves() {
        let dir = tempfile::tempdir().unwrap();
        let journal = std::sync::Arc::new(Journal::open(dir.path(), interlock_journal::Options::default()).unwrap().0);
        let waiting = std::sync::Arc::new(Waiting::default());
        let far = Instant::now() + Duration::from_secs(60);
        let wait = |end| {
            let (w, j) = (waiting.clone(), journal.clone());
            tokio::spawn(async move { w.until(&j, end, far).await })
        };
        let (near, ahead) = (wait(2), wait(1_000));
        while waiting.len() < 2 {
            tokio::task::yield_now().await;
        }
        let seq = journal.append(b"one").unwrap();
        journal.append(b"two").unwrap();
        journal.wait_for(seq + 1, None).unwrap();
        let end = journal.durable_end();
        assert!(end >= 2, "{end}");
        waiting.synced(end, false);
        tokio::time::timeout(Duration::from_secs(10), near).await.expect("woken by the sync").unwrap();
        assert_eq!(waiting.len(), 1, "the read for record 1,000 still waits");
        assert!(!ahead.is_finished());
        waiting.synced(end, true);
        tokio::time::timeout(Duration::from_secs(10), ahead).await.expect("woken by the failure").unwrap();
        // At its deadline.
        waiting.until(&journal, 1_000, Instant::now()).await;
        assert_eq!(waiting.len(), 0, "a read that gave up left nothing");
    }
}
