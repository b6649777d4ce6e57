//! The offline check finds each kind of damage, changes nothing while
//! checking, and its repair leaves a clean store that keeps every
//! undamaged file. Damage is made by applying records no operation would
//! make (`Namespace::apply` checks nothing), then checkpointing.

mod common;

use interlock_meta::fsck::{Damage, check_dir};
use interlock_meta::{Cred, FileType, Gone, Mutation, NewInode, ROOT, Renamed, Store, StoreOptions};

fn new(kind: FileType) -> NewInode {
    NewInode { kind, perm: 0o755, rdev: 0, umask: 0 }
}

/// The bytes of every file under `dir`, by path.
fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            let sub = files(&e.path());
            out.extend(sub.into_iter().map(|(n, b)| (format!("{}/{n}", e.file_name().to_string_lossy()), b)));
        } else {
            out.push((e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()));
        }
    }
    out.sort();
    out
}

#[test]
fn each_kind_of_damage_is_found_and_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Cred::root();
    let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
    let ns = store.ns();
    let (keep, _) = ns.create(&root, ROOT, b"keep", new(FileType::Regular), b"", 2).unwrap();
    let (a, _) = ns.create(&root, ROOT, b"a", new(FileType::Directory), b"", 2).unwrap();
    let (b, _) = ns.create(&root, a.ino, b"b", new(FileType::Directory), b"", 2).unwrap();
    let (c, _) = ns.create(&root, ROOT, b"c", new(FileType::Directory), b"", 2).unwrap();
    let (d, _) = ns.create(&root, c.ino, b"d", new(FileType::Directory), b"", 2).unwrap();
    let (leak, s) = ns.create(&root, ROOT, b"leak", new(FileType::Regular), b"", 2).unwrap();
    store.wait(s).unwrap();
    let clean = check_dir(tmp.path()).unwrap();
    assert!(clean.damage.is_empty(), "{:?}", clean.damage);

    // A name for an inode that does not exist.
    ns.apply(&Mutation::Link { parent: ROOT, name: b"ghost".to_vec(), ino: 999_999, time: 3 });
    // A second name for directory b.
    ns.apply(&Mutation::Link { parent: ROOT, name: b"b2".to_vec(), ino: b.ino, time: 3 });
    // c moved under its own child d: a cycle the root does not reach.
    ns.apply(&Mutation::Rename(Renamed {
        parent: ROOT,
        name: b"c".to_vec(),
        ino: c.ino,
        new_parent: d.ino,
        new_name: b"c".to_vec(),
        victim: None,
        gone: Gone::Linked,
        exchange: false,
        time: 3,
    }));
    // leak's only name gone, but the inode kept.
    ns.apply(&Mutation::Remove {
        parent: ROOT,
        name: b"leak".to_vec(),
        ino: leak.ino,
        dir: false,
        gone: Gone::Linked,
        time: 3,
    });
    store.checkpoint().unwrap();
    drop(store);

    let before = files(tmp.path());
    let found = check_dir(tmp.path()).unwrap();
    assert_eq!(files(tmp.path()), before, "checking changes nothing");
    let mut kinds: Vec<&str> = found
        .damage
        .iter()
        .map(|damage| match damage {
            Damage::Dangling { ino: 999_999, .. } => "dangling",
            Damage::ManyParents { dir, .. } if *dir == b.ino => "two parents",
            Damage::Unreachable { dir, .. } if *dir == c.ino || *dir == d.ino => "cut off",
            Damage::Leaked { ino } if *ino == leak.ino => "leaked",
            other => panic!("unexpected {other}"),
        })
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["cut off", "cut off", "dangling", "leaked", "two parents"]);

    let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 4).unwrap();
    store.repair(&found.damage, 5).unwrap();
    drop(store);
    let after = check_dir(tmp.path()).unwrap();
    assert!(after.damage.is_empty(), "after repair: {:?}", after.damage);
    let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 6).unwrap();
    let ns = store.ns();
    assert_eq!(ns.lookup(&root, ROOT, b"keep").unwrap().ino, keep.ino);
    let names_of_b = [ns.lookup(&root, a.ino, b"b"), ns.lookup(&root, ROOT, b"b2")];
    assert_eq!(names_of_b.iter().filter(|r| r.as_ref().is_ok_and(|x| x.ino == b.ino)).count(), 1, "b keeps one name");
    let lost = ns.lookup(&root, ROOT, b"lost+found").unwrap().ino;
    let found_again = common::dump(ns, &[]);
    let cut_off: Vec<_> =
        found_again.iter().filter(|s| s.path.starts_with(b"/lost+found/")).map(|s| s.attr.ino).collect();
    assert!(cut_off.contains(&c.ino) || cut_off.contains(&d.ino), "the cycle is reattached under {lost}: {cut_off:?}");
    assert!(ns.getattr(leak.ino).is_err(), "the leaked inode is freed");
}
