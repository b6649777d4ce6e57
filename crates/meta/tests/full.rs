//! A full disk: the store answers `ENOSPC`, never fails its journal, and
//! goes on once there is room, with every acknowledged change kept. Until
//! session 32 the journal failed at the first extension of its segment
//! that found no room, and every change after it failed with `EIO` until
//! a restart, the removals that would have made room among them (and a
//! failed checkpoint left its partial image holding what room was left).
//!
//! Each test runs the store on a small tmpfs of its own, which only root
//! may mount: without root it says so loudly and passes; with
//! `INTERLOCK_REQUIRE_FUSE` set (`scripts/test` as root) it must run.

use std::path::Path;

use interlock_meta::{Attr, Cred, Errno, FileType, NewInode, ROOT, ReadFrom, Store, StoreOptions};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// A tmpfs of a given size, mounted on a fresh directory for one test and
/// unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(test: &str, bytes: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let options = format!("size={bytes},mode=0755");
        match mount(Some("tmpfs"), dir.path(), Some("tmpfs"), MsFlags::empty(), Some(options.as_str())) {
            Ok(()) => Some(SmallDisk { dir }),
            Err(e) => {
                assert!(
                    std::env::var_os("INTERLOCK_REQUIRE_FUSE").is_none(),
                    "{test}: mounting a tmpfs failed ({e}), and root was promised"
                );
                eprintln!("!! SKIPPING {test}: mounting a small tmpfs needs root ({e})");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = umount2(self.dir.path(), MntFlags::MNT_DETACH);
    }
}

fn file() -> NewInode {
    NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 }
}

fn name(i: usize) -> Vec<u8> {
    format!("name-{i:06}").into_bytes()
}

/// Makes `name` in the root and waits for it to be durable: its attributes,
/// or why not.
fn create(store: &Store, name: &[u8]) -> Result<Attr, Errno> {
    let (attr, seq) = store.ns().create(&Cred::root(), ROOT, name, file(), b"", 2)?;
    store.wait(seq)?;
    Ok(attr)
}

/// Makes names until one is refused: how many were made, and the error.
fn fill_with_names(store: &Store) -> (usize, Errno) {
    let mut made = 0;
    loop {
        match create(store, &name(made)) {
            Ok(_) => made += 1,
            Err(e) => return (made, e),
        }
    }
}

/// Data fills the disk; the store then refuses writes and new names with
/// `ENOSPC` (an overwrite before its data changes); removing the file is recorded, its data goes, and names can
/// be made again; after a restart everything acknowledged is there, and
/// `fsck` is clean.
#[test]
fn a_disk_full_of_data_refuses_changes_with_enospc_until_a_removal_makes_room() {
    let Some(disk) = SmallDisk::mount("full::data", 8 << 20) else { return };
    let (store, _) = Store::open(disk.path(), StoreOptions::default(), 1).unwrap();
    let root = Cred::root();
    let big = create(&store, b"big").unwrap().ino;
    let chunk = vec![7u8; 256 << 10];
    let mut at = 0;
    let refused = loop {
        match store.write((&root).into(), big, Some(at), &chunk, 2) {
            Ok(_) => at += chunk.len() as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(refused, Errno::ENOSPC, "a write to a full disk");
    assert!(at > 0, "some data fitted");
    let (made, refused) = fill_with_names(&store);
    assert_eq!(refused, Errno::ENOSPC, "a create on a full disk, after {made}");
    let journal = store.changelog().journal();
    assert!(!journal.failed() && journal.space_low());
    // An overwrite needs no new block of the data's, but its record
    // needs room: refused before the data changes.
    let over = store.write((&root).into(), big, Some(0), b"changed", 3).map(|_| ());
    assert_eq!(over, Err(Errno::ENOSPC), "an overwrite while the journal's disk is full");
    let head = store.read((&root).into(), big, (0, 7), ReadFrom::Disk).unwrap();
    assert_eq!(head, vec![7u8; 7], "the refused overwrite left the data as it was");

    store.wait(store.ns().unlink(&root, ROOT, b"big", 3).unwrap()).unwrap();
    assert_eq!(store.collect_freed(), 1);
    create(&store, b"after").expect("a create once the data's room is back");
    assert!(!journal.space_low());
    drop(store);

    let (store, _) = Store::open(disk.path(), StoreOptions::default(), 4).unwrap();
    for i in 0..made {
        store.ns().lookup(&root, ROOT, &name(i)).unwrap_or_else(|e| panic!("name {i} of {made}: {e:?}"));
    }
    store.ns().lookup(&root, ROOT, b"after").unwrap();
    assert_eq!(store.ns().lookup(&root, ROOT, b"big").map(|_| ()), Err(Errno::ENOENT));
    drop(store);
    assert_clean(disk.path());
}

/// `fsck` finds no damage in the store in `dir`.
fn assert_clean(dir: &Path) {
    let report = interlock_meta::fsck::check_dir(dir).unwrap();
    assert!(report.damage.is_empty(), "fsck finds {:?}", report.damage);
}

/// Names alone fill the disk (their records): new names are refused with
/// `ENOSPC`, removals go on into the space the journal set aside, and once
/// it is nearly used they too are refused with `ENOSPC`, never `EIO`. The
/// journal never fails, a checkpoint that finds no room leaves nothing
/// behind, and a restart finds exactly the names made and not removed,
/// with `fsck` clean.
#[test]
fn a_disk_full_of_records_lets_removals_use_the_reserve_and_never_fails_the_journal() {
    let Some(disk) = SmallDisk::mount("full::records", 4 << 20) else { return };
    let (store, _) = Store::open(disk.path(), StoreOptions::default(), 1).unwrap();
    let root = Cred::root();
    let (made, refused) = fill_with_names(&store);
    assert_eq!(refused, Errno::ENOSPC, "a create after {made}");
    let journal = store.changelog().journal();
    assert!(journal.space_low());

    let mut removed = 0;
    let refused = loop {
        match store.ns().unlink(&root, ROOT, &name(removed), 3).and_then(|seq| store.wait(seq)) {
            Ok(()) => removed += 1,
            Err(e) => break e,
        }
        assert!(removed < made, "every name removed with the disk full");
    };
    assert_eq!(refused, Errno::ENOSPC, "a removal once the reserve is nearly used, after {removed}");
    // The reserve is 512 KiB and a removal's record under 100 bytes.
    assert!(removed > 1000, "only {removed} removals went into the reserve");
    assert!(!journal.failed());
    // The name the refused removal was for is still there, and any other
    // change is refused alike.
    store.ns().lookup(&root, ROOT, &name(removed)).unwrap();
    assert_eq!(create(&store, b"one more").map(|_| ()), Err(Errno::ENOSPC));
    // A checkpoint needs room too, and leaves none of its image behind.
    assert!(store.checkpoint().is_err(), "a checkpoint of {made} names on a full disk");
    assert!(!disk.path().join("meta.ckpt.tmp").exists(), "a failed checkpoint's partial image");
    drop(store);

    let (store, _) = Store::open(disk.path(), StoreOptions::default(), 4).unwrap();
    for i in 0..made {
        let found = store.ns().lookup(&root, ROOT, &name(i)).map(|_| ());
        assert_eq!(found, if i < removed { Err(Errno::ENOENT) } else { Ok(()) }, "name {i}");
    }
    drop(store);
    assert_clean(disk.path());
}

/// A file removed while open, closed once the disk has no room left even
/// for a removal's record: the close succeeds, the orphan waits (its
/// data kept, as its end could not be recorded), and once there is room
/// again [`Namespace::retry_forgets`] frees it and its data. Until
/// session 33 the close answered `ENOSPC` and the orphan, with all its
/// data, stayed until the next restart: on a full disk, the room most
/// wanted.
///
/// [`Namespace::retry_forgets`]: interlock_meta::Namespace::retry_forgets
#[test]
fn an_orphan_closed_on_a_full_disk_is_freed_once_there_is_room() {
    let Some(disk) = SmallDisk::mount("full::orphan", 6 << 20) else { return };
    // Another program's file, removed later to make room.
    let ballast = disk.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; 2 << 20]).unwrap();
    let dir = disk.path().join("store");
    let (store, _) = Store::open(&dir, StoreOptions::default(), 1).unwrap();
    let root = Cred::root();
    let held = create(&store, b"held").unwrap().ino;
    store.wait(store.write((&root).into(), held, Some(0), &[9u8; 64 << 10], 2).unwrap().1).unwrap();
    store.ns().open(&root, held, 0).unwrap();
    store.wait(store.ns().unlink(&root, ROOT, b"held", 2).unwrap()).unwrap();

    let (made, _) = fill_with_names(&store);
    let mut removed = 0;
    while removed < made && store.ns().unlink(&root, ROOT, &name(removed), 3).and_then(|s| store.wait(s)).is_ok() {
        removed += 1;
    }
    assert!(removed < made, "the reserve took every removal of {made}");
    assert_eq!(store.collect_freed(), 0, "the removed names' files had no data to delete");

    assert_eq!(store.ns().release(&root, held), Ok(0), "the last close, with no room to record the end");
    assert!(store.ns().getattr(held).is_ok(), "the orphan is kept until its end is recorded");
    assert_eq!(store.ns().retry_forgets(&root), Ok(0), "still no room");
    assert!(store.ns().getattr(held).is_ok());

    std::fs::remove_file(&ballast).unwrap();
    let seq = store.ns().retry_forgets(&root).unwrap();
    assert!(seq > 0, "the orphan's end recorded once there is room");
    store.wait(seq).unwrap();
    assert!(store.ns().getattr(held).is_err(), "the orphan is freed");
    assert_eq!(store.collect_freed(), 1, "its data is deleted");
    assert_eq!(store.ns().retry_forgets(&root), Ok(0), "nothing left to retry");
    drop(store);

    let (store, _) = Store::open(&dir, StoreOptions::default(), 4).unwrap();
    assert!(store.ns().getattr(held).is_err(), "the orphan stays freed after a restart");
    drop(store);
    assert_clean(&dir);
}
