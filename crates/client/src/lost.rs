//! Locks the client held and no longer does, though no caller gave them
//! up: the session's lease ran out (a partition, a stopped process), or a
//! reclaim after a server restart was refused. Every loss is kept, and a
//! watch channel counts them, so a caller cannot miss one: it awaits a
//! change of the count, then reads what was lost since it last looked.

use interlock_proto::Kind;
use parking_lot::Mutex;
use tokio::sync::watch;

/// A lock that was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostLock {
    pub resource: Vec<u8>,
    pub kind: Kind,
    /// The client's number for the owner that held it.
    pub owner: u32,
    /// For a DLM lock, its handle (as the caller knew it).
    pub handle: Option<u64>,
}

pub(crate) struct Losses {
    log: Mutex<Vec<LostLock>>,
    count: watch::Sender<usize>,
}

impl Default for Losses {
    fn default() -> Self {
        Losses { log: Mutex::default(), count: watch::Sender::new(0) }
    }
}

impl Losses {
    /// Records losses and wakes every watcher. O(losses).
    pub fn report(&self, lost: impl IntoIterator<Item = LostLock>) {
        let mut log = self.log.lock();
        let before = log.len();
        log.extend(lost);
        for l in &log[before..] {
            tracing::warn!(resource = %String::from_utf8_lossy(&l.resource), kind = ?l.kind, owner = l.owner, "lock lost");
        }
        let n = log.len();
        drop(log);
        if n > before {
            self.count.send_replace(n);
        }
    }

    pub fn watch(&self) -> watch::Receiver<usize> {
        self.count.subscribe()
    }

    /// The losses after the first `from`.
    pub fn since(&self, from: usize) -> Vec<LostLock> {
        self.log.lock().get(from..).map(<[LostLock]>::to_vec).unwrap_or_default()
    }
}
