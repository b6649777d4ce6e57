//! The store: what was acknowledged is what a restart finds. Random
//! sequences (with checkpoints at random points, and files held open
//! while their names go) must reopen to the same namespace; checkpoints
//! taken while threads change one shared tree must replay to the state
//! those threads left.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::dump;
use interlock_meta::{
    Cred, FileType, Ino, Namespace, NewInode, ROOT, RenameFlags, SetAttr, Store, StoreOptions, Tag, TimeSet, XattrMode,
    tagged,
};
use proptest::prelude::*;

const NAMES: &[&[u8]] = &[b"a", b"b", b"c", b"d"];

#[derive(Clone, Debug)]
enum Op {
    Create(u8, u8, bool),
    Mkdir(u8, u8),
    Symlink(u8, u8),
    Unlink(u8, u8),
    Rmdir(u8, u8),
    Rename(u8, u8, u8, u8, u8),
    Link(u8, u8, u8, u8),
    Chmod(u8, u8, u32),
    Chown(u8, u8),
    Truncate(u8, u8, u64),
    Utimens(u8, u8, i64),
    SetXattr(u8, u8, u8),
    RemoveXattr(u8, u8, u8),
    /// `ACLS[k]` set as an access ACL (`k` even) or a default one, or
    /// with `k` past them, the ACL of that kind removed: new inodes in a
    /// directory with a default ACL inherit it (`Mutation::Inherit`).
    SetAcl(u8, u8, u8),
    Open(u8, u8),
    Close(u8),
    /// `O_TMPFILE` in a directory, linkable or not: held open.
    Tmpfile(u8, bool),
    /// A link of the `k`th inode held open to a name (a linkable
    /// `O_TMPFILE` is named; any other orphan's link fails).
    LinkOpen(u8, u8, u8),
    /// `chattr` to `FLAGS[k]`: a directory's no-dump and no-atime are
    /// taken by what is made in it.
    Chattr(u8, u8, u8),
    Checkpoint,
}

/// The flags `Op::Chattr` sets: none, each kept one, and two at once.
const FLAGS: &[u32] = &[0, 0x10, 0x20, 0x40, 0x80, 0xC0];

fn op() -> impl Strategy<Value = Op> {
    // A name is (directory, name): directory 0 is the root, 1..=3 the
    // directories named a, b, c in the root (when they are directories).
    let d = 0u8..3;
    let n = 0u8..4;
    prop_oneof![
        (d.clone(), n.clone(), any::<bool>()).prop_map(|(d, n, u)| Op::Create(d, n, u)),
        (d.clone(), n.clone()).prop_map(|(d, n)| Op::Mkdir(d, n)),
        (d.clone(), n.clone()).prop_map(|(d, n)| Op::Symlink(d, n)),
        (d.clone(), n.clone()).prop_map(|(d, n)| Op::Unlink(d, n)),
        (d.clone(), n.clone()).prop_map(|(d, n)| Op::Rmdir(d, n)),
        (d.clone(), n.clone(), d.clone(), n.clone(), 0u8..4).prop_map(|(a, b, c, e, f)| Op::Rename(a, b, c, e, f)),
        (d.clone(), n.clone(), d.clone(), n.clone()).prop_map(|(a, b, c, e)| Op::Link(a, b, c, e)),
        (d.clone(), n.clone(), prop_oneof![Just(0o755u32), Just(0o600), Just(0o2755)])
            .prop_map(|(d, n, m)| Op::Chmod(d, n, m)),
        (d.clone(), n.clone()).prop_map(|(d, n)| Op::Chown(d, n)),
        (d.clone(), n.clone(), 0u64..10_000).prop_map(|(d, n, s)| Op::Truncate(d, n, s)),
        (d.clone(), n.clone(), 0i64..1_000).prop_map(|(d, n, t)| Op::Utimens(d, n, t)),
        (d.clone(), n.clone(), 0u8..3).prop_map(|(d, n, x)| Op::SetXattr(d, n, x)),
        (d.clone(), n.clone(), 0u8..3).prop_map(|(d, n, x)| Op::RemoveXattr(d, n, x)),
        (d.clone(), n.clone(), 0u8..6).prop_map(|(d, n, k)| Op::SetAcl(d, n, k)),
        (d.clone(), n.clone()).prop_map(|(d, n)| Op::Open(d, n)),
        (0u8..4).prop_map(Op::Close),
        (d.clone(), any::<bool>()).prop_map(|(d, l)| Op::Tmpfile(d, l)),
        (0u8..4, d.clone(), n.clone()).prop_map(|(k, d, n)| Op::LinkOpen(k, d, n)),
        (d.clone(), n.clone(), 0..FLAGS.len() as u8).prop_map(|(d, n, k)| Op::Chattr(d, n, k)),
        Just(Op::Checkpoint),
    ]
}

/// The ACLs `Op::SetAcl` sets (see `common::acl`): a named user under
/// a mask, and a named group.
const ACLS: &[&str] = &["u::rw,u:1000:rwx,g::r,m::rw,o::", "u::rwx,g::rx,g:1000:rw,m::r,o::r"];

fn user(u: bool) -> Cred {
    if u { Cred { uid: 1000, gid: 1000, groups: vec![] } } else { Cred::root() }
}

fn new(kind: FileType, perm: u32) -> NewInode {
    NewInode { kind, perm, rdev: 0, umask: 0 }
}

/// Directory `d` (0: the root; else the root's `NAMES[d - 1]`, if a
/// directory).
fn dir(ns: &Namespace, d: u8) -> Option<Ino> {
    if d == 0 {
        return Some(ROOT);
    }
    let a = ns.lookup(&Cred::root(), ROOT, NAMES[d as usize - 1]).ok()?;
    (a.kind == FileType::Directory).then_some(a.ino)
}

fn ino(ns: &Namespace, d: u8, n: u8) -> Option<Ino> {
    ns.lookup(&Cred::root(), dir(ns, d)?, NAMES[n as usize]).ok().map(|a| a.ino)
}

/// Runs `op` at time `t`; every change is waited on as a server would
/// before acknowledging it.
/// `open` holds the inodes held open, `linkable` the `O_TMPFILE`s made
/// linkable and not linked since.
fn run(store: &Store, op: &Op, t: i64, open: &mut Vec<Ino>, linkable: &mut HashSet<Ino>) {
    let ns = store.ns();
    let root = Cred::root();
    let name = |n: u8| NAMES[n as usize];
    let seq = match *op {
        Op::Create(d, n, u) => dir(ns, d)
            .and_then(|p| ns.create(&user(u), p, name(n), new(FileType::Regular, 0o644), b"", t).ok())
            .map(|r| r.1),
        Op::Mkdir(d, n) => dir(ns, d)
            .and_then(|p| ns.create(&root, p, name(n), new(FileType::Directory, 0o755), b"", t).ok())
            .map(|r| r.1),
        Op::Symlink(d, n) => dir(ns, d)
            .and_then(|p| ns.create(&root, p, name(n), new(FileType::Symlink, 0o777), b"../x", t).ok())
            .map(|r| r.1),
        Op::Unlink(d, n) => dir(ns, d).and_then(|p| ns.unlink(&root, p, name(n), t).ok()),
        Op::Rmdir(d, n) => dir(ns, d).and_then(|p| ns.rmdir(&root, p, name(n), t).ok()),
        Op::Rename(a, b, c, e, f) => {
            let flags = RenameFlags { noreplace: f == 1, exchange: f == 2, whiteout: f == 3 };
            match (dir(ns, a), dir(ns, c)) {
                (Some(p), Some(q)) => ns.rename(&root, (p, name(b)), (q, name(e)), flags, t).ok(),
                _ => None,
            }
        }
        Op::Link(a, b, c, e) => match (ino(ns, a, b), dir(ns, c)) {
            (Some(i), Some(q)) => ns.link(&root, i, q, name(e), t).ok().map(|r| r.1),
            _ => None,
        },
        Op::Chmod(d, n, m) => ino(ns, d, n)
            .and_then(|i| ns.setattr(&root, i, &SetAttr { perm: Some(m), ..SetAttr::default() }, t).ok())
            .map(|r| r.1),
        Op::Chown(d, n) => ino(ns, d, n)
            .and_then(|i| {
                ns.setattr(&root, i, &SetAttr { uid: Some(7), gid: Some(8), chown: true, ..SetAttr::default() }, t).ok()
            })
            .map(|r| r.1),
        Op::Truncate(d, n, s) => ino(ns, d, n)
            .and_then(|i| ns.setattr(&root, i, &SetAttr { size: Some(s), ..SetAttr::default() }, t).ok())
            .map(|r| r.1),
        Op::Utimens(d, n, at) => ino(ns, d, n)
            .and_then(|i| {
                let set =
                    SetAttr { atime: Some(TimeSet::At(at)), mtime: Some(TimeSet::At(at * 2)), ..SetAttr::default() };
                ns.setattr(&root, i, &set, t).ok()
            })
            .map(|r| r.1),
        Op::SetXattr(d, n, x) => ino(ns, d, n)
            .and_then(|i| ns.setxattr(&root, i, format!("user.{x}").as_bytes(), &[x; 5], XattrMode::Any, t).ok()),
        Op::RemoveXattr(d, n, x) => {
            ino(ns, d, n).and_then(|i| ns.removexattr(&root, i, format!("user.{x}").as_bytes(), t).ok())
        }
        Op::SetAcl(d, n, k) => ino(ns, d, n).and_then(|i| {
            let name: &[u8] = if k % 2 == 0 { b"system.posix_acl_access" } else { b"system.posix_acl_default" };
            match ACLS.get(k as usize / 2) {
                Some(acl) => ns.setxattr(&root, i, name, &common::acl(acl), XattrMode::Any, t).ok(),
                None => ns.removexattr(&root, i, name, t).ok(),
            }
        }),
        Op::Open(d, n) => {
            if let Some(i) = ino(ns, d, n)
                && ns.open(&root, i, 0).is_ok()
            {
                open.push(i);
            }
            None
        }
        Op::Close(k) => {
            if open.is_empty() {
                None
            } else {
                let i = open.remove(k as usize % open.len());
                Some(ns.release(&root, i).unwrap())
            }
        }
        Op::Tmpfile(d, may_link) => dir(ns, d).and_then(|p| {
            let (a, seq) = ns.tmpfile(&root, p, (0o600, 0), may_link, t).ok()?;
            open.push(a.ino);
            if may_link {
                linkable.insert(a.ino);
            }
            Some(seq)
        }),
        Op::LinkOpen(k, d, n) => match (open.is_empty(), dir(ns, d)) {
            (false, Some(q)) => {
                let i = open[k as usize % open.len()];
                let linked = ns.link(&root, i, q, name(n), t).ok();
                if linked.is_some() {
                    linkable.remove(&i);
                }
                linked.map(|r| r.1)
            }
            _ => None,
        },
        Op::Chattr(d, n, k) => ino(ns, d, n).and_then(|i| ns.set_flags(&root, i, FLAGS[k as usize], t).ok()),
        Op::Checkpoint => {
            store.checkpoint().unwrap();
            None
        }
    };
    if let Some(seq) = seq {
        store.wait(seq).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(300)))]

    /// Reopening a store (checkpoint + replay of the journal after it)
    /// rebuilds exactly the namespace its acknowledged changes made:
    /// every path, attribute (times included), xattr and symlink target,
    /// link counts, and orphans still held open.
    #[test]
    ///
    /// And its replay cache: each change is asked for by one of two
    /// clients, which says its requests up to a few back were answered.
    fn a_reopened_store_is_the_store_that_was(
        ops in prop::collection::vec(op(), 1..80),
        lags in prop::collection::vec(0..4u64, 80),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
        let (mut open, mut linkable) = (Vec::new(), HashSet::new());
        let tag = |t: usize| Tag { origin: 1 + t as u64 % 2, id: t as u64, settled: (t as u64).saturating_sub(lags[t]) };
        for (t, op) in ops.iter().enumerate() {
            tagged(tag(t), || run(&store, op, 10 + t as i64, &mut open, &mut linkable));
        }
        let cached = |store: &Store| (0..ops.len()).map(|t| store.ns().replies().find(tag(t).origin, t as u64)).collect::<Vec<_>>();
        let replies = cached(&store);
        let before = dump(store.ns(), &open);
        let (inodes, memory) = (store.ns().inode_count(), store.ns().memory());
        drop(store);
        let (again, opened) = Store::open(tmp.path(), StoreOptions::default(), 99_999).unwrap();
        prop_assert!(opened.dangling.is_empty(), "dangling entries {:?}", opened.dangling);
        prop_assert_eq!(dump(again.ns(), &open), before);
        prop_assert_eq!(again.ns().inode_count(), inodes, "inodes (orphans included)");
        // What the changes counted as they went is what a count of the
        // whole namespace finds.
        prop_assert_eq!(again.ns().memory(), memory, "the namespace's memory, counted live and recounted");
        prop_assert_eq!(cached(&again), replies, "the replay cache");
        // Which orphans a link may name came back too: a file held open
        // may be linked if it has a name, or is an `O_TMPFILE` made
        // linkable and not linked since, and is neither immutable nor
        // append-only.
        let root = Cred::root();
        for (k, &i) in open.iter().enumerate() {
            let a = again.ns().getattr(i).unwrap();
            let frozen = again.ns().flags(i).unwrap_or(0) & 0x30 != 0;
            let may = a.kind != FileType::Directory && (a.nlink > 0 || linkable.contains(&i)) && !frozen;
            let linked = again.ns().link(&root, i, ROOT, format!("relinked{k}").as_bytes(), 99_999);
            prop_assert_eq!(linked.is_ok(), may, "link of #{} ({:?})", i, linked.map(drop));
        }
    }
}

/// A checkpoint taken while threads create, rename, link, unlink and
/// chmod in shared directories (the fuzzy image: objects caught at
/// different moments) replays to the state the threads left, the replay
/// cache of the threads' tagged changes included.
#[test]
fn checkpoints_under_load_replay_to_the_state_left() {
    for round in 0..4u64 {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
        let store = Arc::new(store);
        let root = Cred::root();
        let mut dirs = vec![ROOT];
        for d in 0..3 {
            let (a, s) = store
                .ns()
                .create(&root, ROOT, format!("d{d}").as_bytes(), new(FileType::Directory, 0o755), b"", 2)
                .unwrap();
            store.wait(s).unwrap();
            dirs.push(a.ino);
        }
        // d0 busy from the start: its count and times are kept on each
        // thread's line (`spread`), and must come back the same.
        for i in 0..300 {
            let (_, s) = store
                .ns()
                .create(&root, dirs[1], format!("fill{i}").as_bytes(), new(FileType::Regular, 0o644), b"", 3)
                .unwrap();
            store.wait(s).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let checkpointer = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) || n == 0 {
                    store.checkpoint().unwrap();
                    n += 1;
                }
                n
            })
        };
        let workers: Vec<_> = (0..4u64)
            .map(|w| {
                let (store, dirs, stop) = (store.clone(), dirs.clone(), stop.clone());
                std::thread::spawn(move || {
                    let ns = store.ns();
                    let root = Cred::root();
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (round << 8 | w);
                    for i in 0..3_000i64 {
                        if i == 2_000 && w == 0 {
                            // The last checkpoint overlaps the load, and
                            // what follows it is replayed over its image.
                            stop.store(true, Ordering::Relaxed);
                        }
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let d = dirs[(x % 4) as usize];
                        let e = dirs[(x >> 8) as usize % 4];
                        let name = format!("n{}", (x >> 16) % 24);
                        let other = format!("n{}", (x >> 24) % 24);
                        let t = 10 + i;
                        // Worker w is a client that says its requests up
                        // to a few back were answered.
                        let tag = Tag { origin: w, id: i as u64, settled: (i - i % 8) as u64 };
                        let seq = tagged(tag, || match (x >> 32) % 6 {
                            0 | 1 => {
                                ns.create(&root, d, name.as_bytes(), new(FileType::Regular, 0o644), b"", t).map(|r| r.1)
                            }
                            2 => ns.unlink(&root, d, name.as_bytes(), t),
                            3 => {
                                ns.rename(&root, (d, name.as_bytes()), (e, other.as_bytes()), RenameFlags::default(), t)
                            }
                            4 => ns
                                .lookup(&root, d, name.as_bytes())
                                .and_then(|a| ns.link(&root, a.ino, e, other.as_bytes(), t))
                                .map(|r| r.1),
                            _ => ns
                                .lookup(&root, d, name.as_bytes())
                                .and_then(|a| {
                                    ns.setattr(
                                        &root,
                                        a.ino,
                                        &SetAttr { perm: Some(0o600 | (t as u32 & 0o77)), ..SetAttr::default() },
                                        t,
                                    )
                                })
                                .map(|r| r.1),
                        });
                        if let Ok(s) = seq {
                            store.wait(s).unwrap();
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let checkpoints = checkpointer.join().unwrap();
        assert!(checkpoints >= 1);
        let before = dump(store.ns(), &[]);
        let inodes = store.ns().inode_count();
        let cached =
            |s: &Store| (0..4).flat_map(|w| (0..3_000).map(move |i| s.ns().replies().find(w, i))).collect::<Vec<_>>();
        let replies = cached(&store);
        assert!(replies.iter().flatten().count() >= 4, "each client's last changes are kept");
        drop(store);
        let (again, opened) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
        assert_eq!(cached(&again), replies, "the replay cache, round {round}");
        assert!(opened.dangling.is_empty(), "dangling entries {:?}", opened.dangling);
        assert!(opened.replayed > 0, "the last checkpoint ended before the load did");
        assert_eq!(
            dump(again.ns(), &[]),
            before,
            "round {round}: {checkpoints} checkpoints, {} replayed",
            opened.replayed
        );
        assert_eq!(again.ns().inode_count(), inodes);
    }
}

/// A change asked for by a client that may ask again is found in the
/// replay cache after a restart, from the journal's record or, once the
/// journal behind a checkpoint is gone, from the checkpoint's image,
/// until a later request of the client says it was answered; an
/// untagged change is never found.
#[test]
fn a_tagged_change_is_found_after_a_restart_until_its_client_settles_it() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = StoreOptions::default;
    let (store, _) = Store::open(tmp.path(), opts(), 1).unwrap();
    let me = Cred::root();
    let file = || new(FileType::Regular, 0o644);
    let (a, seq) =
        tagged(Tag { origin: 5, id: 10, settled: 10 }, || store.ns().create(&me, ROOT, b"a", file(), b"", 2)).unwrap();
    store.wait(seq).unwrap();
    let seq = tagged(Tag { origin: 5, id: 11, settled: 10 }, || store.ns().unlink(&me, ROOT, b"a", 3)).unwrap();
    store.wait(seq).unwrap();
    let (_, seq) = store.ns().create(&me, ROOT, b"b", file(), b"", 4).unwrap();
    store.wait(seq).unwrap();
    let found = |s: &Store| [10, 11, 12].map(|id| s.ns().replies().find(5, id));
    assert_eq!(found(&store), [Some(a.ino), Some(a.ino), None]);
    drop(store);
    let (store, opened) = Store::open(tmp.path(), opts(), 5).unwrap();
    assert_eq!((opened.replayed, found(&store)), (3, [Some(a.ino), Some(a.ino), None]), "from the journal");
    store.checkpoint().unwrap();
    drop(store);
    let (store, opened) = Store::open(tmp.path(), opts(), 6).unwrap();
    assert_eq!((opened.replayed, found(&store)), (0, [Some(a.ino), Some(a.ino), None]), "from the checkpoint");
    // Request 12 says 10 and 11 were answered.
    let (c, seq) =
        tagged(Tag { origin: 5, id: 12, settled: 12 }, || store.ns().create(&me, ROOT, b"c", file(), b"", 7)).unwrap();
    store.wait(seq).unwrap();
    assert_eq!(found(&store), [None, None, Some(c.ino)]);
    drop(store);
    let (store, _) = Store::open(tmp.path(), opts(), 8).unwrap();
    assert_eq!(found(&store), [None, None, Some(c.ino)], "replayed over an image that has 10 and 11");
    store.ns().replies().forget(5);
    assert_eq!(found(&store), [None; 3]);
}

/// A namespace keeps its identity for its life (across restarts, with
/// or without a checkpoint between), a new one has another, and an image
/// from before identities (version 2: no identity frame) is read and
/// given one that a crash right after the opening does not change.
#[test]
fn a_namespace_keeps_its_identity_and_an_older_image_is_given_one() {
    let (one, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open = |dir: &std::path::Path| Store::open(dir, StoreOptions::default(), 1).unwrap().0;
    let store = open(one.path());
    let id = store.id();
    let (_, seq) = store.ns().create(&Cred::root(), ROOT, b"a", new(FileType::Regular, 0o644), b"", 2).unwrap();
    store.wait(seq).unwrap();
    drop(store);
    assert_eq!(open(one.path()).id(), id, "replayed");
    open(one.path()).checkpoint().unwrap();
    assert_eq!(open(one.path()).id(), id, "from the checkpoint");
    assert_ne!(open(other.path()).id(), id, "another namespace");

    // The image as version 2 wrote it: the header saying 2, no identity.
    let path = one.path().join("meta.ckpt");
    let image = std::fs::read(&path).unwrap();
    let body = &image[8..image.len() - 4];
    let mut frames = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let len = u32::from_le_bytes(body[at..at + 4].try_into().unwrap()) as usize;
        frames.push(&body[at..at + 4 + len]);
        at += 4 + len;
    }
    let mut header = frames[0].to_vec();
    assert_eq!(header[4..6], [0, 3], "the header item, version 3");
    header[5] = 2;
    let mut old = image[..8].to_vec();
    old.extend_from_slice(&header);
    frames[2..].iter().for_each(|f| old.extend_from_slice(f));
    let crc = crc32c::crc32c(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &old).unwrap();
    let store = open(one.path());
    let given = store.id();
    assert!(store.ns().lookup(&Cred::root(), ROOT, b"a").is_ok(), "the older image is read");
    drop(store);
    assert_ne!(std::fs::read(&path).unwrap(), old, "checkpointed at the opening");
    assert_eq!(open(one.path()).id(), given, "the identity given is kept");
}

/// Creates and removals in a directory that another thread makes
/// immutable and mutable again, over and over, never land in the log
/// while it is immutable: `set_flags` takes the directory's intention
/// lock exclusive, and each entry change holds it shared across its
/// check and its record, so a change checked before the flag is logged
/// before it. (The changelog shows the order: each `SATTR` of the
/// directory flips the flag, as its one changer alternates.)
#[test]
fn no_entry_changes_in_a_directory_while_the_log_has_it_immutable() {
    use interlock_journal::changelog::{Mask, RecordType};
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
    let root = Cred::root();
    store.changelog().register(Some("order"), Mask::ALL, 0).unwrap();
    let (d, _) = store.ns().create(&root, ROOT, b"d", new(FileType::Directory, 0o755), b"", 1).unwrap();
    let (refused, made) = (std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0));
    let (start, done) = (std::sync::Barrier::new(3), AtomicBool::new(false));
    let mut set = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            // Flips until the creators are done, and ends mutable.
            while !done.load(Ordering::Relaxed) || set % 2 == 1 {
                store.ns().set_flags(&root, d.ino, if set % 2 == 0 { 0x10 } else { 0 }, 2).unwrap();
                set += 1;
            }
        });
        let creators: Vec<_> = (0..2)
            .map(|t| {
                let (store, refused, made, root, start) = (&store, &refused, &made, &root, &start);
                s.spawn(move || {
                    start.wait();
                    for n in 0..20_000 {
                        let name = format!("{t}.{n}");
                        match store.ns().create(root, d.ino, name.as_bytes(), new(FileType::Regular, 0o644), b"", 3) {
                            Ok(_) => {
                                made.fetch_add(1, Ordering::Relaxed);
                                while store.ns().unlink(root, d.ino, name.as_bytes(), 3).is_err() {}
                            }
                            Err(e) => {
                                assert_eq!(e.0, libc::EPERM);
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for c in creators {
            c.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let (_, last) = store.ns().create(&root, ROOT, b"end", new(FileType::Regular, 0o644), b"", 4).unwrap();
    store.wait(last).unwrap();
    let (mut immutable, mut flips, mut changes) = (false, 0, 0);
    for e in store.changelog().read("order", None, usize::MAX, None).unwrap() {
        let r = &e.record;
        if r.rtype == RecordType::SATTR && r.target == d.ino {
            immutable = !immutable;
            flips += 1;
        } else if matches!(r.rtype, RecordType::CREAT | RecordType::UNLNK) && r.parent == d.ino {
            assert!(!immutable, "record {} changed an entry of the directory while it was immutable", e.index);
            changes += 1;
        }
    }
    assert_eq!(flips, set);
    let (made, refused) = (made.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    assert_eq!(changes, 2 * made);
    assert!(made > 100 && refused > 100, "creates met the directory both ways: {made} made, {refused} refused");
}
