//! POSIX ACLs in the namespace, each case as Linux decides it (checked
//! on tmpfs): the access an ACL grants, what a new inode inherits from
//! its directory's default ACL, and how the mode and the ACL stay in
//! step. The differential test (`kernel.rs`) sets ACLs among its random
//! operations; these name the cases it reaches too rarely.

mod common;

use common::acl;
use interlock_meta::{Cred, Errno, FileType, Ino, Namespace, NewInode, ROOT, SetAttr, XattrMode};

const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";
fn user(uid: u32) -> Cred {
    Cred { uid, gid: uid, groups: vec![] }
}

fn new(kind: FileType, perm: u32, umask: u32) -> NewInode {
    NewInode { kind, perm, rdev: 0, umask }
}

/// A directory `/d` of mode 0777 owned by root, and the namespace.
fn with_dir() -> (Namespace, Ino) {
    let ns = Namespace::new(1, 0);
    let (d, _) = ns.create(&Cred::root(), ROOT, b"d", new(FileType::Directory, 0o777, 0), b"", 1).unwrap();
    (ns, d.ino)
}

/// `setfacl -d -m u:1000:rwx d; umask 077; touch d/f; mkdir d/s`: the
/// umask is not applied (the default ACL decides), the file's mode is
/// cut to the ACL and the ACL to the mode, and the new directory keeps
/// the default ACL as its own.
#[test]
fn a_new_inode_inherits_its_directorys_default_acl_and_not_the_umask() {
    let (ns, d) = with_dir();
    let root = Cred::root();
    let default = acl("u::rwx,u:1000:rwx,g::rx,m::rwx,o::");
    ns.setxattr(&root, d, DEFAULT, &default, XattrMode::Any, 2).unwrap();
    let (f, _) = ns.create(&root, d, b"f", new(FileType::Regular, 0o666, 0o077), b"", 3).unwrap();
    assert_eq!(f.perm, 0o660, "rw- from the owner's, mask rw- from 0666");
    let got = ns.getxattr(&root, f.ino, ACCESS).unwrap();
    assert_eq!(got, acl("u::rw,u:1000:rwx,g::rx,m::rw,o::"));
    assert_eq!(ns.getxattr(&root, f.ino, DEFAULT), Err(Errno::ENODATA), "a file keeps no default ACL");
    let (s, _) = ns.create(&root, d, b"s", new(FileType::Directory, 0o777, 0o077), b"", 4).unwrap();
    assert_eq!(s.perm, 0o770);
    assert_eq!(ns.getxattr(&root, s.ino, DEFAULT).unwrap(), default);
    let (t, _) = ns.tmpfile(&root, d, (0o600, 0o077), true, 5).unwrap();
    assert_eq!(t.perm, 0o600);
    let (l, _) = ns.create(&root, d, b"l", new(FileType::Symlink, 0o777, 0o077), b"f", 6).unwrap();
    assert_eq!((l.perm, ns.getxattr(&root, l.ino, ACCESS)), (0o777, Err(Errno::EOPNOTSUPP)), "a symlink has none");
    // Without a default ACL, the umask.
    let (g, _) = ns.create(&root, ROOT, b"g", new(FileType::Regular, 0o666, 0o027), b"", 7).unwrap();
    assert_eq!(g.perm, 0o640);
}

/// The named user reads through the ACL, within the mask; a chmod of the
/// group bits is a change of the mask, read back in the ACL; an ACL the
/// mode says all of is not kept.
#[test]
fn an_access_acl_grants_within_its_mask_and_a_chmod_moves_the_mask() {
    let (ns, d) = with_dir();
    let root = Cred::root();
    let (f, _) = ns.create(&root, d, b"f", new(FileType::Regular, 0o600, 0), b"", 2).unwrap();
    assert_eq!(ns.open(&user(1000), f.ino, 4).map(drop), Err(Errno::EACCES));
    let named = acl("u::rw,u:1000:rw,g::,m::rw,o::");
    ns.setxattr(&root, f.ino, ACCESS, &named, XattrMode::Any, 3).unwrap();
    assert_eq!(ns.getattr(f.ino).unwrap().perm, 0o660, "the mask is the group class");
    assert!(ns.open(&user(1000), f.ino, 4 | 2).is_ok());
    assert_eq!(ns.open(&user(1001), f.ino, 4).map(drop), Err(Errno::EACCES));
    ns.setattr(&root, f.ino, &SetAttr { perm: Some(0o640), ..SetAttr::default() }, 4).unwrap();
    assert_eq!(ns.open(&user(1000), f.ino, 2).map(drop), Err(Errno::EACCES), "the mask is r-- now");
    let read = ns.getxattr(&user(1001), f.ino, ACCESS).unwrap();
    assert_eq!(read, acl("u::rw,u:1000:rw,g::,m::r,o::"));
    // Setting only what the mode says: a chmod, and the ACL is gone.
    let plain = acl("u::rwx,g::rx,o::r");
    ns.setxattr(&root, f.ino, ACCESS, &plain, XattrMode::Any, 5).unwrap();
    assert_eq!(ns.getattr(f.ino).unwrap().perm, 0o754);
    assert_eq!(ns.getxattr(&root, f.ino, ACCESS), Err(Errno::ENODATA));
    assert_eq!(ns.open(&user(1000), f.ino, 2).map(drop), Err(Errno::EACCES));
}

/// Only the owner or root sets an ACL (`EPERM`), a default one only on a
/// directory (`EACCES`), a malformed one never (`EINVAL`, checked after
/// those, as Linux does); a setter
/// outside the file's group drops its setgid bit, as a chmod would.
#[test]
fn who_may_set_an_acl_and_what_it_drops() {
    let (ns, d) = with_dir();
    let root = Cred::root();
    let owner = user(1000);
    let (f, _) = ns.create(&owner, d, b"f", new(FileType::Regular, 0o640, 0), b"", 2).unwrap();
    let named = acl("u::rw,g:2000:r,g::r,m::r,o::");
    assert_eq!(ns.setxattr(&owner, f.ino, ACCESS, &named, XattrMode::Any, 3), Err(Errno::EINVAL), "out of order");
    let named = acl("u::rw,g::r,g:2000:r,m::r,o::");
    assert_eq!(ns.setxattr(&user(1001), f.ino, ACCESS, &named, XattrMode::Any, 3), Err(Errno::EPERM));
    assert_eq!(ns.setxattr(&owner, f.ino, DEFAULT, &named, XattrMode::Any, 3), Err(Errno::EACCES));
    assert_eq!(ns.removexattr(&owner, f.ino, DEFAULT, 3), Ok(0), "no default ACL to remove: nothing to do");
    ns.setattr(&root, f.ino, &SetAttr { perm: Some(0o2640), gid: Some(3000), chown: true, ..SetAttr::default() }, 4)
        .unwrap();
    ns.setxattr(&owner, f.ino, ACCESS, &named, XattrMode::Any, 5).unwrap();
    assert_eq!(ns.getattr(f.ino).unwrap().perm, 0o640, "the owner is not in group 3000");
    let in_group = Cred { uid: 2001, gid: 2000, groups: vec![] };
    assert!(ns.open(&in_group, f.ino, 4).is_ok(), "a named group's member reads");
    ns.removexattr(&owner, f.ino, ACCESS, 6).unwrap();
    assert_eq!(ns.getattr(f.ino).unwrap().perm, 0o640, "a removal keeps the mode");
    assert_eq!(ns.open(&in_group, f.ino, 4).map(drop), Err(Errno::EACCES));
    // Removing one it no longer has still moves the ctime, as on tmpfs.
    ns.removexattr(&owner, f.ino, ACCESS, 7).unwrap();
    assert_eq!(ns.getattr(f.ino).unwrap().ctime, 7);
}

/// ACLs come back with a store, from its checkpoint and from its
/// journal: the named user still reads, and a new file still inherits.
#[test]
fn acls_outlive_a_restart_from_the_checkpoint_and_from_the_journal() {
    use interlock_meta::{Store, StoreOptions};
    let root = Cred::root();
    let named = acl("u::rw,u:1000:rw,g::,m::rw,o::");
    for checkpoint in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let (f, d) = {
            let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
            let ns = store.ns();
            let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o777, 0), b"", 1).unwrap();
            let (f, _) = ns.create(&root, ROOT, b"f", new(FileType::Regular, 0o600, 0), b"", 2).unwrap();
            ns.setxattr(&root, f.ino, ACCESS, &named, XattrMode::Any, 3).unwrap();
            let seq = ns.setxattr(&root, d.ino, DEFAULT, &named, XattrMode::Any, 4).unwrap();
            store.wait(seq).unwrap();
            if checkpoint {
                store.checkpoint().unwrap();
            }
            (f.ino, d.ino)
        };
        let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 2).unwrap();
        let ns = store.ns();
        assert!(ns.open(&user(1000), f, 4 | 2).is_ok(), "checkpoint {checkpoint}");
        assert_eq!(ns.open(&user(1001), f, 4).map(drop), Err(Errno::EACCES));
        let (g, _) = ns.create(&root, d, b"g", new(FileType::Regular, 0o644, 0o077), b"", 5).unwrap();
        assert_eq!(g.perm, 0o640, "inherited, not masked: checkpoint {checkpoint}");
        assert!(ns.getxattr(&root, g.ino, ACCESS).is_ok());
    }
}
