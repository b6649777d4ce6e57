//! Which inodes have POSIX ACLs, as far as this mount has told the
//! kernel: the kernel looks at a file's access ACL before it lets anyone
//! but the file's owner at it (`FUSE_POSIX_ACL`), and asks again each
//! time it refreshes the file's attributes. Most files have none; for
//! those the answer (`ENODATA`) comes from here, not from the server.
//! That look cost a round trip per file a user opened of another's
//! (+35% on `cat` of 3,000 files as nobody, session 46).
//!
//! The answer is as fresh as the attributes the kernel holds: every
//! attribute this mount gives the kernel says whether the inode has an
//! ACL ([`Attr::acl`]), and the kernel drops its ACLs whenever it drops
//! those attributes. An ACL set through this mount counts at once, before
//! the kernel's next look. An inode once seen with one is asked of the
//! server until an attribute says it has none: a wrong "none" could hide
//! an entry that refuses someone; a wrong "ask" costs a round trip.

use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::HashSet;
use interlock_client::meta::{Attr, Ino};
use parking_lot::Mutex;

/// The extended attributes that hold POSIX ACLs.
const NAMES: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

/// The inodes to ask the server about (see the module's docs). O(1)
/// expected per call; memory O(inodes with ACLs seen).
#[derive(Default)]
pub struct Acls {
    with: Mutex<HashSet<Ino>>,
    /// `with`'s length, read without its lock: while no inode has an
    /// ACL (most mounts), an attribute or a look takes no lock.
    len: AtomicUsize,
}

impl Acls {
    /// Notes what an attribute given to the kernel says.
    pub fn seen(&self, a: &Attr) {
        if a.acl {
            self.has(a.ino);
        } else if self.len.load(Ordering::Acquire) > 0 {
            let mut with = self.with.lock();
            with.remove(&a.ino);
            self.len.store(with.len(), Ordering::Release);
        }
    }

    /// Extended attribute `name` of `ino` is being set or removed through
    /// this mount: if it is an ACL, ask the server from now on, until an
    /// attribute says otherwise.
    pub fn changing(&self, ino: Ino, name: &[u8]) {
        if NAMES.contains(&name) {
            self.has(ino);
        }
    }

    /// `ino` has, or may have, an ACL.
    fn has(&self, ino: Ino) {
        let mut with = self.with.lock();
        with.insert(ino);
        self.len.store(with.len(), Ordering::Release);
    }

    /// Whether a look for extended attribute `name` of `ino` is answered
    /// here, with none: `name` is an ACL's, and `ino` is known to have
    /// none.
    pub fn known_none(&self, ino: Ino, name: &[u8]) -> bool {
        NAMES.contains(&name) && (self.len.load(Ordering::Acquire) == 0 || !self.with.lock().contains(&ino))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_client::meta::FileType;

    fn attr(ino: Ino, acl: bool) -> Attr {
        Attr {
            ino,
            kind: FileType::Regular,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            acl,
        }
    }

    #[test]
    fn an_inode_is_asked_about_from_an_acl_seen_or_set_until_one_is_seen_gone() {
        let acls = Acls::default();
        let access = NAMES[0];
        acls.seen(&attr(5, false));
        assert!(acls.known_none(5, access));
        acls.seen(&attr(5, true));
        assert!(!acls.known_none(5, access));
        acls.seen(&attr(5, false));
        assert!(acls.known_none(5, access));
        acls.changing(6, b"user.a");
        assert!(acls.known_none(6, access), "another xattr says nothing of ACLs");
        acls.changing(6, NAMES[1]);
        assert!(!acls.known_none(6, access), "set here: asked before any attribute says so");
        assert!(acls.known_none(7, access));
        assert!(!acls.known_none(7, b"user.a"), "other names are always asked");
    }
}
