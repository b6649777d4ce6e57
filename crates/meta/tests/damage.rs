//! A damaged store is refused with an error, or opens as a whole state
//! its records describe: never a panic, never a namespace with a part
//! silently missing. The store's files (the checkpoint, the journal's
//! segment, the changelog consumers' file) are damaged at random: a bit
//! flipped, a byte changed, a sector zeroed, the file cut short. What
//! each damage must give:
//!
//! - in the checkpoint: an error, always (it ends in a CRC of every
//!   byte, checked after the items are decoded and placed, so a damaged
//!   item must be placed without a panic first);
//! - in the journal: an error, or a torn tail cut, and what opens passes
//!   `fsck`. A changed byte loses at most the last record: each record
//!   here is a group of its own, and a damaged last group cannot be told
//!   from one a crash cut mid-write. A zeroed sector or a cut at the end
//!   looks like such a crash, and loses what it took;
//! - in the consumers' file (JSON, no checksum): an error, or consumers
//!   read as the damage left them;
//! - never a panic, in `fsck::check_dir` (run first: it changes nothing)
//!   or in `Store::open`.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use interlock_meta::fsck::check_dir;
use interlock_meta::{Attr, Cred, FileType, NewInode, ROOT, RenameFlags, Store, StoreOptions, Tag, XattrMode, tagged};
use proptest::prelude::*;

/// A store of every kind of inode and record: files, directories, a
/// symlink, a device, hard links, xattrs and an ACL, attribute flags, an
/// orphan held open and a linkable `O_TMPFILE`, renames, removals, the
/// replay cache's tagged changes, and a changelog consumer; checkpointed
/// halfway, so that the image and the journal both hold them. Each
/// change is waited on before the next is made: each record is a group
/// of its own, and the records
/// after it prove it durable (see the journal's `segment`).
fn build(dir: &Path) {
    let root = Cred::root();
    let (store, _) = Store::open(dir, StoreOptions::default(), 1).unwrap();
    let ns = store.ns();
    let durable = |seq| store.wait(seq).unwrap();
    let made = |r: Result<(Attr, u64), _>| {
        let (a, seq) = r.unwrap();
        durable(seq);
        a.ino
    };
    let new =
        |kind, perm| NewInode { kind, perm, rdev: if kind == FileType::CharDevice { 0x0501 } else { 0 }, umask: 0 };
    let acl = common::acl("u::rwx,g::rx,g:1000:rw,m::r,o::r");
    for round in 0..2u8 {
        let t = 10 + i64::from(round) * 10;
        let name = |s: &str| format!("{s}{round}").into_bytes();
        let d = made(ns.create(&root, ROOT, &name("dir"), new(FileType::Directory, 0o755), b"", t));
        let f = made(ns.create(&root, d, &name("file"), new(FileType::Regular, 0o644), b"", t));
        made(ns.create(&root, d, &name("link"), new(FileType::Symlink, 0o777), b"../somewhere", t));
        made(ns.create(&root, ROOT, &name("dev"), new(FileType::CharDevice, 0o600), b"", t));
        made(ns.link(&root, f, ROOT, &name("hard"), t));
        durable(ns.setxattr(&root, f, b"user.k", b"value", XattrMode::Any, t).unwrap());
        durable(ns.setxattr(&root, d, b"system.posix_acl_access", &acl, XattrMode::Any, t).unwrap());
        durable(ns.set_flags(&root, f, 0x40, t).unwrap());
        let gone = made(ns.create(&root, ROOT, &name("gone"), new(FileType::Regular, 0o600), b"", t));
        ns.open(&root, gone, 0).unwrap();
        durable(ns.unlink(&root, ROOT, &name("gone"), t).unwrap());
        made(ns.tmpfile(&root, d, (0o600, 0), true, t));
        let tag = Tag { origin: 7, id: u64::from(round), settled: 0 };
        let moved = (ROOT, &name("dev")[..]);
        durable(tagged(tag, || ns.rename(&root, moved, (d, &name("dev")), RenameFlags::default(), t)).unwrap());
        made(ns.create(&root, ROOT, &name("rm"), new(FileType::Directory, 0o700), b"", t));
        durable(ns.rmdir(&root, ROOT, &name("rm"), t).unwrap());
        if round == 0 {
            store.checkpoint().unwrap();
            let cl = store.changelog();
            let reader = cl.register(Some("audit"), interlock_journal::changelog::Mask::default_mask(), 5).unwrap();
            cl.clear(&reader.id, 3, 6).unwrap();
        }
    }
}

/// One way to damage a file.
#[derive(Clone, Debug)]
enum Damage {
    /// Bit `bit` of the byte at `at` (a fraction of the file's length).
    Flip { at: f64, bit: u8 },
    /// The byte at `at` becomes `to` (unless it is that already).
    Byte { at: f64, to: u8 },
    /// The 512 bytes from `at` become zeros.
    Sector { at: f64 },
    /// The file ends at `at`.
    Cut { at: f64 },
}

fn damage() -> impl Strategy<Value = Damage> {
    let at = 0.0..1.0f64;
    prop_oneof![
        (at.clone(), 0u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
        (at.clone(), any::<u8>()).prop_map(|(at, to)| Damage::Byte { at, to }),
        at.clone().prop_map(|at| Damage::Sector { at }),
        at.prop_map(|at| Damage::Cut { at }),
    ]
}

/// Damages `file` in its first `len` bytes; whether a byte changed.
fn apply(file: &Path, len: usize, how: &Damage) -> bool {
    let mut bytes = std::fs::read(file).unwrap();
    let at = |f: f64| ((f * len as f64) as usize).min(len - 1);
    let before = bytes.clone();
    match *how {
        Damage::Flip { at: f, bit } => bytes[at(f)] ^= 1 << bit,
        Damage::Byte { at: f, to } => bytes[at(f)] = to,
        Damage::Sector { at: f } => {
            let from = at(f);
            let end = (from + 512).min(bytes.len());
            bytes[from..end].fill(0);
        }
        Damage::Cut { at: f } => bytes.truncate(at(f)),
    }
    let changed = bytes != before;
    std::fs::write(file, bytes).unwrap();
    changed
}

/// The store's files a damage may hit, each with the length of the part
/// written (a journal segment is longer on disk: set aside ahead of its
/// tail, zeros that a torn tail is found in).
fn targets(dir: &Path) -> Vec<(PathBuf, usize)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n == "meta.ckpt" || n == "consumers.json")
                || p.extension().is_some_and(|e| e == "seg")
            {
                let bytes = std::fs::read(&p).unwrap();
                let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                if used > 0 {
                    out.push((p, used));
                }
            }
        }
    }
    out.sort();
    out
}

/// Opens the store in `dir`: what `fsck` finds in it, and how many
/// records it replayed.
fn open(dir: &Path) -> Result<(Vec<interlock_meta::fsck::Damage>, u64), interlock_journal::Error> {
    let (store, opened) = Store::open(dir, StoreOptions::default(), 100)?;
    Ok((store.ns().check().damage, opened.replayed))
}

/// Copies the files of `from` into `to` (which exists).
fn copy(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir(&dest).unwrap();
            copy(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn a_damaged_store_is_an_error_or_a_whole_state_never_a_panic() {
    let built = tempfile::tempdir().unwrap();
    build(built.path());
    let files = targets(built.path());
    let names: Vec<_> = files.iter().map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert!(names.contains(&"meta.ckpt".to_string()), "{names:?}");
    assert!(names.len() >= 2, "a journal segment too: {names:?}");
    // What an undamaged copy replays.
    let full = {
        let whole = tempfile::tempdir().unwrap();
        copy(built.path(), whole.path());
        open(whole.path()).unwrap().1
    };
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: common::cases(1000),
        failure_persistence: None,
        ..Default::default()
    });
    let (refused, opened) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    runner
        .run(&(0..files.len(), damage()), |(k, how)| {
            let copy_dir = tempfile::tempdir().unwrap();
            copy(built.path(), copy_dir.path());
            let (file, len) = &files[k];
            let file = copy_dir.path().join(file.strip_prefix(built.path()).unwrap());
            let changed = apply(&file, *len, &how);
            let checkpoint = file.file_name().is_some_and(|n| n == "meta.ckpt");
            let at = || format!("{how:?} of {}", file.display());
            // The offline check first: it changes nothing, and reads the
            // damage as it is (the open cuts a torn tail).
            let Ok(checked) = catch_unwind(AssertUnwindSafe(|| check_dir(copy_dir.path()).map(|r| r.damage))) else {
                return Err(TestCaseError::fail(format!("fsck panicked on {}", at())));
            };
            if let Ok(damage) = checked {
                prop_assert!(!(checkpoint && changed), "fsck read a damaged checkpoint ({})", at());
                prop_assert!(damage.is_empty(), "fsck after {}: {damage:?}", at());
            }
            let Ok(opened_store) = catch_unwind(AssertUnwindSafe(|| open(copy_dir.path()))) else {
                return Err(TestCaseError::fail(format!("Store::open panicked on {}", at())));
            };
            match opened_store {
                Ok((damage, replayed)) => {
                    prop_assert!(!(checkpoint && changed), "a damaged checkpoint opened ({})", at());
                    prop_assert!(damage.is_empty(), "{} opened damaged: {damage:?}", at());
                    // A byte changed in a record: only the last record
                    // may be taken for a torn tail (a zeroed sector or a
                    // cut end the file as a crash may, and lose what the
                    // disk lost).
                    if matches!(how, Damage::Flip { .. } | Damage::Byte { .. }) {
                        prop_assert!(replayed + 1 >= full, "{} lost {} records", at(), full - replayed);
                    }
                    opened.set(opened.get() + 1);
                }
                Err(e) => {
                    prop_assert!(changed, "an undamaged store refused: {e}");
                    refused.set(refused.get() + 1);
                }
            }
            Ok(())
        })
        .unwrap();
    // Both outcomes came about: the damage reached past the checks that
    // refuse at once, and torn tails were cut.
    let (refused, opened) = (refused.get(), opened.get());
    assert!(refused > 0 && opened > 0, "refused {refused}, opened {opened}");
}
