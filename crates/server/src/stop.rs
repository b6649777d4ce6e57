//! A clean stop (SIGTERM, Ctrl-C): the server stops reading requests,
//! answers everything it read, and tells each client where it stopped
//! reading ([`ServerMsg::Goodbye`](interlock_proto::ServerMsg::Goodbye)).
//! A client then knows which of its requests had no effect, and makes
//! them again on the next server, creates and renames included: a
//! restart for an upgrade fails no program on a mount. (A server that
//! dies cannot say so: a request that may not be repeated fails with
//! `EIO` then, as the first may have taken effect.)
//!
//! The phases, each within what is left of [`GRACE`]:
//!
//! 1. every connection stops reading at its next request (the loop
//!    serves and answers what it read without an await between, so it
//!    stops between requests);
//! 2. the disk tasks handed to blocking threads finish;
//! 3. the journal syncs everything appended: its durable hook puts the
//!    waiting answers into their sessions' streams; if phases 1 and 2
//!    ended in time, every file's data is synced too, and that is
//!    recorded, so that the next start keeps the write verifier even
//!    after a restart of the machine (see `datadir`);
//! 4. every connection writes its stream out, then its goodbye, and
//!    closes.
//!
//! Past the grace, the server stops anyway: a client that does not read
//! its answers cannot hold a stop up, and its requests fare as after a
//! crash.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Inner;

/// How long a clean stop may take before the server stops anyway.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// Where a clean stop stands, for the connections.
#[derive(Default)]
pub(crate) struct Stop {
    /// Phase 1: connections stop reading.
    stopping: AtomicBool,
    /// Phase 4: every answer owed for what was read is in its stream.
    answered: CancellationToken,
    /// Connections still reading requests.
    readers: AtomicUsize,
    /// Disk tasks on blocking threads, not yet answered.
    offloaded: AtomicUsize,
}

/// A connection reading requests, counted while it lives.
pub(crate) struct Reading<'a>(&'a Stop);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A disk task on a blocking thread, counted until its answer is pushed.
pub(crate) struct Offloaded(std::sync::Arc<Inner>);

impl Offloaded {
    pub fn server(&self) -> &Inner {
        &self.0
    }
}

impl Drop for Offloaded {
    fn drop(&mut self) {
        self.0.stop.offloaded.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Stop {
    /// Counts a connection that reads requests; `None` once the stop has
    /// begun (it reads nothing more). Counted before the check, so that
    /// the stop's wait for readers sees it or it sees the stop.
    pub fn reading(&self) -> Option<Reading<'_>> {
        self.readers.fetch_add(1, Ordering::SeqCst);
        let r = Reading(self);
        (!self.is_stopping()).then_some(r)
    }

    /// Whether connections are to stop reading.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Completes when every answer owed is in its session's stream.
    pub async fn answered(&self) {
        self.answered.cancelled().await
    }
}

/// Counts a disk task handed to a blocking thread until it is dropped
/// (after its answer is pushed).
pub(crate) fn offload(server: std::sync::Arc<Inner>) -> Offloaded {
    server.stop.offloaded.fetch_add(1, Ordering::SeqCst);
    Offloaded(server)
}

/// Stops `inner` cleanly (see the module's docs); returns once every
/// connection has closed, or the grace is over.
pub(crate) async fn stop(inner: &std::sync::Arc<Inner>) {
    let until = Instant::now() + GRACE;
    let s = &inner.stop;
    s.stopping.store(true, Ordering::SeqCst);
    // A connection waiting for requests looks at `is_stopping` when
    // woken: no waiting connection polls the stop (a shared line) on its
    // way.
    inner.sessions.wake_all();
    let quiet =
        settle(until, || s.readers.load(Ordering::SeqCst) == 0 && s.offloaded.load(Ordering::SeqCst) == 0).await;
    let end = inner.store.changelog().journal().next_index();
    let left = until.saturating_duration_since(Instant::now());
    let me = inner.clone();
    let synced = tokio::task::spawn_blocking(move || {
        let journal = me.store.changelog().journal().wait_for(end, Some(left)).is_ok_and(|e| e >= end);
        // No write comes after a stop that settled: every file's data
        // can be put on disk for good, and the next start may keep the
        // write verifier (see `datadir`).
        if journal && quiet && let Err(e) = me.synced.mark() {
            tracing::warn!(error = %e, "a clean stop could not sync the files' data: the next start after a restart of this machine fails the fsyncs of writes made before it");
        }
        journal
    })
    .await;
    if !matches!(synced, Ok(true)) {
        tracing::warn!("a clean stop could not sync the journal in time: answers still owed are not sent");
    }
    s.answered.cancel();
    settle(until, || inner.conns.open.load(Ordering::SeqCst) == 0).await;
}

/// Waits until `done` holds or `until` passes, looking every 5 ms: a stop
/// happens once, and a few milliseconds of it cost nothing. Whether
/// `done` held.
async fn settle(until: Instant, done: impl Fn() -> bool) -> bool {
    while !done() {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}
