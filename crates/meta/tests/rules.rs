//! Rules the random differential test reaches too rarely to guard: each
//! named case, with the errno Linux gives.

use interlock_meta::{Cred, Errno, FileType, Namespace, NewInode, ROOT, RenameFlags};

fn user() -> Cred {
    Cred { uid: 1000, gid: 1000, groups: vec![] }
}

fn new(kind: FileType, perm: u32) -> NewInode {
    NewInode { kind, perm, rdev: 0 }
}

/// In a sticky, world-writable directory a user may not remove or rename
/// another's file (`EPERM`), but may remove their own.
#[test]
fn a_sticky_directory_protects_other_owners_files() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (tmp, _) = ns.create(&root, ROOT, b"tmp", new(FileType::Directory, 0o1777), b"", 1).unwrap();
    ns.create(&root, tmp.ino, b"roots", new(FileType::Regular, 0o666), b"", 2).unwrap();
    ns.create(&user(), tmp.ino, b"mine", new(FileType::Regular, 0o644), b"", 3).unwrap();
    assert_eq!(ns.unlink(&user(), tmp.ino, b"roots", 4), Err(Errno::EPERM));
    let renamed = ns.rename(&user(), (tmp.ino, b"roots"), (tmp.ino, b"x"), RenameFlags::default(), 5);
    assert_eq!(renamed, Err(Errno::EPERM));
    assert!(ns.unlink(&user(), tmp.ino, b"mine", 6).is_ok());
    assert!(ns.unlink(&root, tmp.ino, b"roots", 7).is_ok(), "root is exempt");
}

/// A directory cannot move into its own subtree (`EINVAL`), nor replace
/// an ancestor of its source (`ENOTEMPTY`).
#[test]
fn renames_that_would_make_a_loop_are_refused() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (a, _) = ns.create(&root, ROOT, b"a", new(FileType::Directory, 0o755), b"", 1).unwrap();
    let (b, _) = ns.create(&root, a.ino, b"b", new(FileType::Directory, 0o755), b"", 2).unwrap();
    let flags = RenameFlags::default();
    assert_eq!(ns.rename(&root, (ROOT, b"a"), (b.ino, b"c"), flags, 3), Err(Errno::EINVAL));
    assert_eq!(ns.rename(&root, (b.ino, b"."), (ROOT, b"z"), flags, 3), Err(Errno::EBUSY));
    ns.create(&root, b.ino, b"d", new(FileType::Directory, 0o755), b"", 4).unwrap();
    // b/d over a, which holds b: the target is an ancestor of the source.
    assert_eq!(ns.rename(&root, (b.ino, b"d"), (ROOT, b"a"), flags, 5), Err(Errno::ENOTEMPTY));
    let swap = RenameFlags { exchange: true, ..flags };
    assert_eq!(ns.rename(&root, (b.ino, b"d"), (ROOT, b"a"), swap, 5), Err(Errno::EINVAL));
}
