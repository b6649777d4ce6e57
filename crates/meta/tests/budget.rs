//! The namespace's memory budget: once the namespace holds it, every
//! change that would grow it (a new inode, name or extended attribute)
//! fails with `ENOSPC` and changes nothing, while removals, renames,
//! truncates, writes and attribute changes go on; removals bring it under
//! again and it grows once more. `statfs` counts the inodes left in it.
//! (That the counts kept as the namespace changes are what a count of
//! the whole finds is `tests/store.rs`'s reopening property.)

use interlock_meta::{Caller, Cred, Errno, FileType, Namespace, NewInode, ROOT, RenameFlags, SetAttr, XattrMode};

fn file() -> NewInode {
    new(FileType::Regular, 0o644)
}

fn new(kind: FileType, perm: u32) -> NewInode {
    NewInode { kind, perm, rdev: 0, umask: 0 }
}

fn name(i: usize) -> Vec<u8> {
    format!("file-{i:05}").into_bytes()
}

/// The most a single thread's changes pass the budget by before it is
/// seen held: its line's look comes every 64 KiB moved, and one change
/// may be a 64 KiB extended attribute.
const SLACK: u64 = 128 << 10;

#[test]
fn a_namespace_at_its_budget_grows_no_more_until_removals_make_room() {
    let ns = Namespace::new(7, 1);
    let root = Cred::root();
    let (empty, none) = ns.memory();
    assert_eq!(none, u64::MAX, "no budget unless set");
    assert!(ns.statfs().files_free > 1 << 30, "without a budget, room for any number of files");
    let budget = empty + (1 << 20);
    ns.set_memory_budget(budget);
    let room = ns.statfs().files_free;
    assert!((2_000..5_000).contains(&room), "1 MiB is room for a few thousand files, not {room}");

    // Files until the budget is held.
    let mut made = 0;
    let refused = loop {
        match ns.create(&root, ROOT, &name(made), file(), b"", 2) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100_000, "the budget never held");
    };
    assert_eq!(refused, Errno::ENOSPC);
    assert_eq!(ns.lookup(&root, ROOT, &name(made)), Err(Errno::ENOENT), "a refused create made nothing");
    let (held, _) = ns.memory();
    assert!((budget..budget + SLACK).contains(&held), "held {held} against a budget of {budget}");
    assert!(made as u64 >= room * 9 / 10, "statfs said {room} files would fit, and {made} did");
    assert_eq!(ns.statfs().files_free, 0);
    assert_eq!(ns.statfs().files, made as u64 + 1, "the files and the root");

    // Every change that would grow it is refused, and changes nothing.
    let f = ns.lookup(&root, ROOT, &name(0)).unwrap().ino;
    let dir = || new(FileType::Directory, 0o755);
    let link = || new(FileType::Symlink, 0o777);
    assert_eq!(ns.create(&root, ROOT, b"d", dir(), b"", 3).err(), Some(Errno::ENOSPC));
    assert_eq!(ns.create(&root, ROOT, b"s", link(), b"target", 3).err(), Some(Errno::ENOSPC));
    assert_eq!(ns.create_open(&root, ROOT, b"o", (0o644, 0), 3).err(), Some(Errno::ENOSPC));
    assert_eq!(ns.link(&root, f, ROOT, b"l", 3).err(), Some(Errno::ENOSPC));
    assert_eq!(ns.tmpfile(&root, ROOT, (0o600, 0), true, 3).err(), Some(Errno::ENOSPC));
    assert_eq!(ns.setxattr(&root, f, b"user.k", &[7; 1000], XattrMode::Any, 3), Err(Errno::ENOSPC));
    let whiteout = RenameFlags { whiteout: true, ..RenameFlags::default() };
    assert_eq!(ns.rename(&root, (ROOT, &name(1)), (ROOT, b"w"), whiteout, 3), Err(Errno::ENOSPC));
    for gone in [&b"d"[..], b"s", b"o", b"l", b"w"] {
        assert_eq!(ns.lookup(&root, ROOT, gone), Err(Errno::ENOENT));
    }
    assert_eq!(ns.getxattr(&root, f, b"user.k"), Err(Errno::ENODATA));
    assert_eq!(ns.getattr(f).unwrap().nlink, 1);
    assert_eq!(ns.memory().0, held, "the refusals charged nothing");

    // What does not grow it goes on.
    ns.rename(&root, (ROOT, &name(1)), (ROOT, b"renamed"), RenameFlags::default(), 4).unwrap();
    let set = SetAttr { size: Some(4096), perm: Some(0o600), ..SetAttr::default() };
    ns.setattr(&root, f, &set, 4).unwrap();
    let caller = Caller { cred: &root, opened: false };
    ns.write_with(caller, f, (Some(0), 10), 4, |_| Ok(8)).unwrap();
    ns.unlink(&root, ROOT, b"renamed", 4).unwrap();

    // Removals make room: a quarter of the files, and the namespace grows
    // again, into what they left.
    for i in 2..made / 4 {
        ns.unlink(&root, ROOT, &name(i), 5).unwrap();
    }
    assert!(ns.memory().0 < budget, "removals count out what they free");
    assert!(ns.statfs().files_free > 0);
    ns.create(&root, ROOT, b"d", dir(), b"", 6).unwrap();
    ns.create(&root, ROOT, b"s", link(), b"target", 6).unwrap();
    ns.setxattr(&root, f, b"user.k", &[7; 1000], XattrMode::Any, 6).unwrap();
    ns.link(&root, f, ROOT, b"l", 6).unwrap();

    // Lifting the budget lifts the refusals at once.
    while ns.create(&root, ROOT, &name(made), file(), b"", 7).is_ok() {
        made += 1;
    }
    ns.set_memory_budget(u64::MAX);
    ns.create(&root, ROOT, &name(made), file(), b"", 8).unwrap();
}

/// An extended attribute's bytes count: one file's attributes fill the
/// budget, and their removal empties it.
#[test]
fn extended_attributes_are_charged_for_their_bytes() {
    let ns = Namespace::new(7, 1);
    let root = Cred::root();
    let (f, _) = ns.create(&root, ROOT, b"f", file(), b"", 2).unwrap();
    let (empty, _) = ns.memory();
    ns.set_memory_budget(empty + (4 << 20));
    let value = vec![1u8; 64 << 10];
    let mut set = 0;
    while ns.setxattr(&root, f.ino, format!("user.{set}").as_bytes(), &value, XattrMode::Create, 3).is_ok() {
        set += 1;
        assert!(set < 1000, "the budget never held");
    }
    assert!((62..=66).contains(&set), "4 MiB holds about 64 values of 64 KiB, not {set}");
    let replaced = ns.memory().0;
    ns.setxattr(&root, f.ino, b"user.0", b"small", XattrMode::Replace, 4).unwrap_err();
    for i in 0..set {
        ns.removexattr(&root, f.ino, format!("user.{i}").as_bytes(), 5).unwrap();
    }
    assert!(replaced > empty + (4 << 20));
    assert_eq!(ns.memory().0, empty, "every attribute's bytes counted out");
    ns.setxattr(&root, f.ino, b"user.again", &value, XattrMode::Create, 6).unwrap();
}
