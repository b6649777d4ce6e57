//! Where changes go before they are applied: the journal, through the
//! [`Log`] a store gives the namespace. An operation records its
//! [`Mutation`] while it still holds its locks, so the records of changes
//! to any one object (an entry, an inode) are in the log in the order
//! they were applied, which is what replay needs; the caller waits for
//! durability after the locks are gone, so one fsync covers many
//! operations (group commit) and nobody waits for the disk holding a
//! lock.

use std::sync::Arc;

use crate::errno::{Errno, Result};
use crate::inode::Inode;
use crate::mutation::Mutation;
use crate::namespace::Namespace;
use crate::replies::{self, Tag};
use crate::types::{Cred, Ino};

/// A record's position in the log: the change may be acknowledged once
/// the log has made this position durable. 0: nothing was recorded
/// (nothing changed, or the namespace has no log).
pub type Seq = u64;

/// A log for the namespace's records.
pub trait Log: Send + Sync {
    /// Records `m`, made by `cred` (and asked for as `tag`, if the
    /// client may ask again: see `replies`), and returns its position. Called
    /// under the operation's locks: it must not wait for the disk. An
    /// error (`EIO`: the journal failed) fails the operation before
    /// anything changes.
    fn record(&self, cred: &Cred, m: &Mutation, tag: Option<Tag>) -> Result<Seq>;

    /// The change recorded at `seq` freed inode `ino`, which may have a
    /// data file: its data is to go once `seq` is durable. Not called for
    /// an inode that never had one (a write, `fallocate` or copy into it
    /// makes one; the store notes those found when it opens). O(1).
    fn freed(&self, _seq: Seq, _ino: Ino) {}

    /// Whether the log's disk has room for its records. O(1) while it
    /// has (the journal's look for room while full: one `write`).
    fn room(&self) -> Room {
        Room::Enough
    }
}

/// How much room a log's disk has for its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    Enough,
    /// The disk is full: records go into space set aside, which only
    /// changes that may free space use ([`Mutation::needs_room`]).
    Reserve,
    /// The disk is full and what was set aside is nearly used: no change
    /// is recorded until there is room (else the log would fail, and with
    /// it every change until a restart).
    None,
}

impl Namespace {
    /// From now on every change is recorded in `log` before it is
    /// applied. Set once, before the namespace is shared (after replay).
    pub fn set_log(&mut self, log: Arc<dyn Log>) {
        self.log = Some(log);
    }

    /// Records `m` (if there is a log), then applies it. Callers hold the
    /// locks of the objects `m` changes.
    pub(crate) fn commit(&self, cred: &Cred, m: &Mutation) -> Result<Seq> {
        self.commit_held(cred, m, &[])
    }

    /// Whether a change may be recorded, as the log's disk has room
    /// ([`Log::room`]): always while it has; while it is full, only one
    /// that may free space (`frees`), and once the space set aside is
    /// nearly used none (`ENOSPC`). Asked before anything changes: by
    /// [`commit_held`](Self::commit_held), and by a change to a file's
    /// data before the data changes (which then records with
    /// [`commit_admitted`](Self::commit_admitted), not asking twice). O(1).
    pub(crate) fn admit(&self, frees: bool) -> Result<()> {
        match self.log.as_ref().map_or(Room::Enough, |log| log.room()) {
            Room::Enough => Ok(()),
            Room::Reserve if frees => Ok(()),
            Room::Reserve | Room::None => Err(Errno::ENOSPC),
        }
    }

    /// [`commit`](Self::commit), applying to the inodes in `held` (which
    /// the caller looked up and holds under its locks) without looking
    /// them up again: see [`Namespace::apply_held`]. Fails with `ENOSPC`,
    /// changing nothing, where [`admit`](Self::admit) says no
    /// ([`Mutation::needs_room`]), and where `m` would grow a namespace
    /// that holds its memory budget ([`Mutation::grows`]; see `usage`).
    pub(crate) fn commit_held(&self, cred: &Cred, m: &Mutation, held: &[&Inode]) -> Result<Seq> {
        self.admit(!m.needs_room())?;
        if self.usage.full() && m.grows() {
            return Err(Errno::ENOSPC);
        }
        self.commit_admitted(cred, m, held)
    }

    /// [`commit_held`](Self::commit_held) of a change already admitted.
    /// A change the thread's operation is tagged for (`replies::tagged`)
    /// is recorded with its tag and noted in the replay cache.
    pub(crate) fn commit_admitted(&self, cred: &Cred, m: &Mutation, held: &[&Inode]) -> Result<Seq> {
        let tag = replies::current();
        let seq = match &self.log {
            Some(log) => {
                let seq = log.record(cred, m, tag)?;
                if let Some(ino) = m.frees()
                    && self.find(held, ino).is_ok_and(|i| i.has_data())
                {
                    log.freed(seq, ino);
                }
                seq
            }
            None => 0,
        };
        if let Some(tag) = tag {
            self.replies.note(tag, m.ino());
        }
        self.apply_held(m, held);
        Ok(seq)
    }
}
