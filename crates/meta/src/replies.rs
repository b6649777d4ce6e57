//! What a restarted server needs to answer a change it may already have
//! made: a *replay cache* that outlives the server, as NFSv4.1's sessions
//! specify one.
//!
//! A create, a rename, an unlink (a change that may not be made twice)
//! sent to a server that dies before it answers may or may not have taken
//! effect. Made again blindly, a create that did take effect fails with
//! `EEXIST`, an unlink with `ENOENT`; refused, it fails the program with
//! `EIO`. So each such request carries a [`Tag`]: the client's `origin`
//! (a random number it keeps for its life), the request's id, and
//! `settled` (every tagged request of that client below it is answered).
//! The tag is written in the change's journal record, no second write,
//! and noted here by the live operation and by replay alike; the
//! checkpoint holds what is noted here (the records below its start are
//! purged). A client that sends such a request again after a restart
//! gets the first one's outcome if its record is here
//! ([`find`](Replies::find)), and has it made otherwise: a change whose
//! record is not in the journal never took effect.
//!
//! What is kept per client is the tagged requests it has not yet seen
//! answered: a later tag's `settled` lets go of the earlier ones. A
//! client that ends its session ([`forget`](Replies::forget)), or does
//! not come back within a restarted server's recovery window
//! ([`retain`](Replies::retain)), is let go of whole.
//!
//! Costs: O(log k) to find, and to note a client's next request, for k
//! requests of that client kept (its tagged requests in flight, a few;
//! O(k) for one noted out of order); O(clients) to retain; the image
//! O(total kept).

use std::cell::Cell;
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::types::Ino;

/// A change that may not be made twice, as its client names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// The client, for its life (across sessions and server restarts).
    pub origin: u64,
    /// The request, unique within the client's life.
    pub id: u64,
    /// Every tagged request of the client with a lower id was answered:
    /// it will not be asked about again.
    pub settled: u64,
}

/// A [`Tag`] as a journal record ends with it: `settled` as a distance
/// back from `id` (a byte or two, where the number itself takes three
/// or four).
#[derive(Serialize, Deserialize)]
pub(crate) struct TagImage {
    origin: u64,
    id: u64,
    behind: u64,
}

impl From<Tag> for TagImage {
    fn from(t: Tag) -> TagImage {
        TagImage { origin: t.origin, id: t.id, behind: t.id.saturating_sub(t.settled) }
    }
}

impl From<TagImage> for Tag {
    fn from(t: TagImage) -> Tag {
        Tag { origin: t.origin, id: t.id, settled: t.id.saturating_sub(t.behind) }
    }
}

thread_local!(static CURRENT: Cell<Option<Tag>> = const { Cell::new(None) });

/// Runs `f` (one namespace operation) with the records it makes tagged
/// `tag`. The tag goes by the thread, not through every operation's
/// arguments: the server is its one caller, an operation runs on one
/// thread from start to end, and the namespace's operations stay as a
/// local caller (a test, `fsck --repair`) calls them. O(1).
pub fn tagged<R>(tag: Tag, f: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            CURRENT.set(None);
        }
    }
    CURRENT.set(Some(tag));
    let _reset = Reset;
    f()
}

/// The tag of the operation running on this thread, if any.
pub(crate) fn current() -> Option<Tag> {
    CURRENT.get()
}

/// One client's tagged requests not yet known to be answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Recent {
    settled: u64,
    /// (Request id, the inode its record names), by id: a client's ids
    /// come nearly in order, so a note goes at the back and a settle
    /// takes from the front, with no allocation once the queue has room
    /// for the client's requests in flight (a map's `split_off` at each
    /// settle cost an allocation a create).
    done: VecDeque<(u64, Ino)>,
}

impl Recent {
    /// Where request `id` is in `done`, or where it would go. O(log k).
    fn at(&self, id: u64) -> Result<usize, usize> {
        self.done.binary_search_by_key(&id, |&(id, _)| id)
    }
}

/// The replay cache: client origin -> its requests made and perhaps not
/// yet seen answered.
#[derive(Default)]
pub struct Replies(scc::HashMap<u64, Recent, foldhash::fast::RandomState>);

impl Replies {
    /// Notes that the request `tag` names was made, its record naming
    /// inode `ino`, and lets go of the client's requests below its
    /// `settled`. Records apply in any order a checkpoint's image and
    /// replay give them: a request already let go of is not noted again.
    /// O(log k) for the client's latest request, O(k) for an earlier one.
    pub(crate) fn note(&self, tag: Tag, ino: Ino) {
        let mut e = self.0.entry_sync(tag.origin).or_default();
        let r = e.get_mut();
        if tag.settled > r.settled {
            r.settled = tag.settled;
            let below = r.done.partition_point(|&(id, _)| id < tag.settled);
            r.done.drain(..below);
        }
        if tag.id >= r.settled {
            match r.at(tag.id) {
                Ok(at) => r.done[at].1 = ino,
                Err(at) => r.done.insert(at, (tag.id, ino)),
            }
        }
    }

    /// The inode the record of request `id` of client `origin` named, if
    /// that request was made (and not yet let go of). O(log k).
    pub fn find(&self, origin: u64, id: u64) -> Option<Ino> {
        self.0.read_sync(&origin, |_, r| r.at(id).ok().map(|at| r.done[at].1)).flatten()
    }

    /// Whether client `origin` has requests kept. A client that gave its
    /// session up with changes on their way learns so at its next hello
    /// (`Welcome.kept`): if a restarted server kept none of its
    /// requests, it may have let go of them all (the client did not come
    /// back within the recovery window), and asking again could make a
    /// change twice. O(1) expected.
    pub fn has(&self, origin: u64) -> bool {
        self.0.contains_sync(&origin)
    }

    /// Lets go of client `origin` (it ended its session: it will ask
    /// about none of its requests again). O(1) expected.
    pub fn forget(&self, origin: u64) {
        self.0.remove_sync(&origin);
    }

    /// Keeps only the clients `keep` says to (after a restart, those that
    /// came back within the recovery window). O(clients).
    pub fn retain(&self, mut keep: impl FnMut(u64) -> bool) {
        self.0.retain_sync(|origin, _| keep(*origin));
    }

    /// Clients with requests kept.
    pub fn clients(&self) -> usize {
        self.0.len()
    }

    /// Every client's requests kept, for a checkpoint. O(total kept).
    pub(crate) fn image(&self) -> Vec<(u64, Recent)> {
        let mut all = Vec::with_capacity(self.0.len());
        self.0.iter_sync(|origin, r| {
            all.push((*origin, r.clone()));
            true
        });
        all
    }

    /// Puts back what [`image`](Replies::image) took.
    pub(crate) fn load(&self, origin: u64, r: Recent) {
        let _ = self.0.upsert_sync(origin, r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(id: u64, settled: u64) -> Tag {
        Tag { origin: 7, id, settled }
    }

    /// A request is found once noted, until a later tag of its client
    /// says it was answered; other clients' are apart.
    #[test]
    fn a_request_is_kept_until_its_client_says_it_was_answered() {
        let r = Replies::default();
        r.note(tag(3, 3), 30);
        r.note(tag(5, 3), 50);
        assert_eq!((r.find(7, 3), r.find(7, 5), r.find(7, 4), r.find(8, 3)), (Some(30), Some(50), None, None));
        r.note(tag(9, 5), 90);
        assert_eq!((r.find(7, 3), r.find(7, 5), r.find(7, 9)), (None, Some(50), Some(90)));
        // A record replayed over an image that had let go of it already.
        r.note(tag(3, 3), 30);
        assert_eq!(r.find(7, 3), None);
        r.forget(7);
        assert_eq!((r.find(7, 5), r.clients()), (None, 0));
    }

    /// A tag reads back as written, its `settled` carried as a distance.
    #[test]
    fn a_tag_survives_its_image() {
        let t = Tag { origin: u64::MAX, id: 1 << 40, settled: (1 << 40) - 3 };
        let bytes = postcard::to_stdvec(&TagImage::from(t)).unwrap();
        assert_eq!(Tag::from(postcard::from_bytes::<TagImage>(&bytes).unwrap()), t);
    }

    /// The thread's tag is there for the operation only, and gone after
    /// it even if it panics.
    #[test]
    fn the_tag_lasts_for_the_operation_only() {
        assert_eq!(tagged(tag(1, 1), current), Some(tag(1, 1)));
        assert_eq!(current(), None);
        let _ = std::panic::catch_unwind(|| tagged(tag(2, 2), || panic!("inside")));
        assert_eq!(current(), None);
    }
}
