//! A client's connections, by its `origin`: a new hello supersedes the
//! client's other connections before its welcome.
//!
//! A client that gave its session up (no answer for three quarters of
//! its lease) may have had a change that may not be made twice (a
//! create, a rename, an append) on its way: made or not, it cannot tell,
//! and a copy may still be held up in the network, on the old
//! connection. It may ask about the change again on a new connection
//! only if no such copy can be served after it asks: otherwise the
//! server would find the change not made, make it, and then make the
//! copy as well. So before the welcome, every other connection of the
//! same client is stopped, and the hello waits until each has stopped
//! serving: a connection serves each request it reads whole, with no
//! await between reading it and answering (or handing it on: see
//! `connection::serve`), so once its task is done, what it read is made
//! or never will be, and what it did not read it never will (its socket
//! is closed). The welcome then says `kept` if the replay cache holds
//! the client's changes, and the client asks again (protocol 24; until
//! then such changes failed with `ConnectionLost`, a mount's `EIO`,
//! unless the server had restarted, where no copy can reach the dead one).
//!
//! A client has one connection at a time (a [`Client`] and its clones
//! share one), so a second one of its origin is always a reconnect. An
//! origin is 64 random bits the client never shows anyone else.
//!
//! Costs: O(connections of the origin) to register, one or two; each
//! superseded connection is waited for once.
//!
//! [`Client`]: https://docs.rs/interlock-client

use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::HashMap;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// One connection of a client, as the others see it.
#[derive(Clone)]
struct Conn {
    id: u64,
    /// Cancelled to stop it.
    stop: CancellationToken,
    /// Cancelled once it has stopped serving (its [`Registered`] dropped).
    done: CancellationToken,
}

/// Every client's connections that said hello, by origin.
#[derive(Default)]
pub(crate) struct Superseding {
    by_origin: Mutex<HashMap<u64, Vec<Conn>>>,
    next: AtomicU64,
}

/// A connection registered under its client's origin: its `stop` is
/// cancelled when a newer connection of the client supersedes it. Held
/// until the connection has stopped serving; dropped, it says so to any
/// connection waiting for it, and leaves the table.
pub(crate) struct Registered<'a> {
    table: &'a Superseding,
    origin: u64,
    me: Conn,
}

impl Registered<'_> {
    /// Resolves once a newer connection of the client supersedes this one.
    pub async fn superseded(&self) {
        self.me.stop.cancelled().await;
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut by_origin = self.table.by_origin.lock();
        if let Some(conns) = by_origin.get_mut(&self.origin) {
            conns.retain(|c| c.id != self.me.id);
            if conns.is_empty() {
                by_origin.remove(&self.origin);
            }
        }
        drop(by_origin);
        self.me.done.cancel();
    }
}

impl Superseding {
    /// Registers a connection of client `origin`, stops the client's
    /// other connections and waits until each has stopped serving.
    /// `None` if a newer one supersedes this one meanwhile (it waits for
    /// this one, which then stops).
    pub async fn supersede(&self, origin: u64) -> Option<Registered<'_>> {
        let me = Conn {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            stop: CancellationToken::new(),
            done: CancellationToken::new(),
        };
        // Every other one listed, those already superseded but not yet
        // stopped among them: one that gives way to this one stops
        // waiting for those older.
        let others = {
            let mut by_origin = self.by_origin.lock();
            let conns = by_origin.entry(origin).or_default();
            let others = conns.clone();
            conns.push(me.clone());
            others
        };
        let registered = Registered { table: self, origin, me };
        for other in &others {
            other.stop.cancel();
        }
        for other in others {
            tokio::select! {
                () = other.done.cancelled() => {}
                () = registered.superseded() => return None,
            }
        }
        Some(registered)
    }

    /// Connections registered now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_origin.lock().values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new connection of a client stops the old one and waits until it
    /// has stopped; other clients' connections are left alone; a third
    /// connection supersedes a second still waiting for the first.
    #[tokio::test]
    async fn a_new_connection_waits_for_the_clients_others_to_stop() {
        let table = Superseding::default();
        let first = table.supersede(7).await.expect("nothing to wait for");
        let other_client = table.supersede(8).await.expect("another client's");
        let second = table.supersede(7);
        tokio::pin!(second);
        // The first is told to stop; the second waits until it has.
        assert!(futures::poll!(&mut second).is_pending());
        assert!(first.me.stop.is_cancelled() && !other_client.me.stop.is_cancelled());
        drop(first);
        let second = second.await.expect("the first has stopped");
        assert_eq!(table.len(), 2);
        // A third comes, then a fourth: the third gives way, and the
        // fourth still waits for the second.
        let third = table.supersede(7);
        tokio::pin!(third);
        assert!(futures::poll!(&mut third).is_pending());
        let fourth = table.supersede(7);
        tokio::pin!(fourth);
        assert!(futures::poll!(&mut fourth).is_pending());
        assert!(third.await.is_none(), "superseded while it waited");
        assert!(futures::poll!(&mut fourth).is_pending(), "the second has not stopped");
        drop(second);
        let fourth = fourth.await.expect("every older one has stopped");
        drop(fourth);
        drop(other_client);
        assert_eq!(table.len(), 0, "the table holds no connection that stopped");
    }
}
