//! File data against the kernel: random writes at any offset, truncates
//! up and down, `fallocate`s (reserving, with and without the size, and
//! punching holes), `copy_file_range`s (within a file too), `SEEK_DATA`
//! and `SEEK_HOLE` (never skipping data, never a hole that reads other
//! than zeros), reads and restarts on two files of a store, and the same
//! on two files in a tmpfs directory, must read back the same bytes at
//! every step and in the end. And a freed file's data goes.

use std::os::unix::fs::{FileExt, MetadataExt};

use interlock_meta::{
    COPY_MAX, Cred, Errno, Fallocate, FileType, Ino, NewInode, ROOT, ReadFrom, RenameFlags, SeekTo, SetAttr, Store,
    StoreOptions, XattrMode,
};
use nix::fcntl::{FallocateFlags, copy_file_range, fallocate};
use proptest::prelude::*;

mod common;

#[derive(Clone, Debug)]
enum Op {
    Write(usize, u64, usize, u8),
    Truncate(usize, u64),
    /// `fallocate` with a mode tmpfs has (0, keep-size, punch).
    Fallocate(usize, Fallocate, u64, u64),
    /// `copy_file_range` from one file (offset) to one file (offset):
    /// the same file too, where overlapping ranges are `EINVAL`.
    Copy((usize, u64), (usize, u64), u64),
    /// `SEEK_DATA` and `SEEK_HOLE` from an offset, checked against what
    /// the file reads: no data skipped, no hole that reads other than
    /// zeros.
    Seek(usize, u64),
    Read(usize, u64, usize),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    // Offsets up to a few 128 KiB pages, holes included; sizes across
    // page boundaries.
    let off = prop_oneof![0u64..5_000, 0u64..600_000, Just(4095u64), Just(131_072u64)];
    prop_oneof![
        4 => (0usize..2, off.clone(), 1usize..70_000, any::<u8>()).prop_map(|(f, o, l, b)| Op::Write(f, o, l, b)),
        2 => (0usize..2, prop_oneof![0u64..700_000, Just(0u64)]).prop_map(|(f, s)| Op::Truncate(f, s)),
        2 => (0usize..2, how(), off.clone(), 1u64..300_000).prop_map(|(f, h, o, l)| Op::Fallocate(f, h, o, l)),
        2 => ((0usize..2, off.clone()), (0usize..2, off.clone()), 0u64..300_000).prop_map(|(a, b, l)| Op::Copy(a, b, l)),
        2 => (0usize..2, off.clone()).prop_map(|(f, o)| Op::Seek(f, o)),
        3 => (0usize..2, off, 1usize..200_000).prop_map(|(f, o, l)| Op::Read(f, o, l)),
        1 => Just(Op::Reopen),
    ]
}

fn how() -> impl Strategy<Value = Fallocate> {
    prop_oneof![
        Just(Fallocate::Allocate { keep_size: false }),
        Just(Fallocate::Allocate { keep_size: true }),
        Just(Fallocate::PunchHole),
    ]
}

fn kernel_read(f: &std::fs::File, off: u64, len: usize) -> Vec<u8> {
    let size = f.metadata().unwrap().len();
    let len = size.saturating_sub(off).min(len as u64) as usize;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, off).unwrap();
    buf
}

// The cases in two halves, which the test harness runs at once: each
// step waits for its record to be durable, so the test waits on the
// disk's syncs, not on the processor (44 s for 64 cases in one test,
// with 1 s of processor time).
proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(64) / 2))]

    #[test]
    fn data_reads_back_as_the_kernels_does(ops in prop::collection::vec(op(), 1..40)) {
        reads_back_as_the_kernels_does(&ops)?;
    }

    #[test]
    fn data_reads_back_as_the_kernels_does_other_half(ops in prop::collection::vec(op(), 1..40)) {
        reads_back_as_the_kernels_does(&ops)?;
    }
}

/// Runs `ops` on two files of a store and two of a tmpfs directory,
/// checking each step and the end.
fn reads_back_as_the_kernels_does(ops: &[Op]) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let root = Cred::root();
    let (mut store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
    let new = || NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
    let inos: Vec<Ino> = (0..2)
        .map(|i| store.ns().create(&root, ROOT, format!("f{i}").as_bytes(), new(), b"", 2).unwrap().0.ino)
        .collect();
    let kernel: Vec<std::fs::File> = (0..2)
        .map(|i| {
            std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(shm.path().join(format!("f{i}")))
                .unwrap()
        })
        .collect();
    for (t, op) in ops.iter().enumerate() {
        match *op {
            Op::Write(f, off, len, b) => {
                let bytes = vec![b; len];
                let (a, seq) = store.write((&root).into(), inos[f], Some(off), &bytes, 10 + t as i64).unwrap();
                store.wait(seq).unwrap();
                kernel[f].write_all_at(&bytes, off).unwrap();
                prop_assert_eq!(a.size, kernel[f].metadata().unwrap().len(), "size after the write");
            }
            Op::Truncate(f, size) => {
                let set = SetAttr { size: Some(size), ..SetAttr::default() };
                let (_, seq) = store.setattr(&root, inos[f], &set, 10 + t as i64).unwrap();
                store.wait(seq).unwrap();
                kernel[f].set_len(size).unwrap();
            }
            Op::Fallocate(f, how, off, len) => {
                let (a, seq) = store.fallocate((&root).into(), inos[f], how, (off, len), 10 + t as i64).unwrap();
                store.wait(seq).unwrap();
                let mode = FallocateFlags::from_bits_retain(how.mode() as i32);
                fallocate(&kernel[f], mode, off as i64, len as i64).unwrap();
                prop_assert_eq!(a.size, kernel[f].metadata().unwrap().len(), "size after {:?}", how);
            }
            Op::Copy((from, at), (to, to_at), len) => {
                let ours = store.copy_range((&root).into(), (inos[from], at), (inos[to], to_at), len, 10 + t as i64);
                let (mut a, mut b) = (at as i64, to_at as i64);
                let theirs = copy_file_range(&kernel[from], Some(&mut a), &kernel[to], Some(&mut b), len as usize);
                match (ours, theirs) {
                    (Ok((n, attr, seq)), Ok(k)) => {
                        store.wait(seq).unwrap();
                        prop_assert_eq!(n, k as u64, "bytes copied");
                        prop_assert_eq!(attr.size, kernel[to].metadata().unwrap().len(), "size after the copy");
                    }
                    (Err(e), Err(k)) => prop_assert_eq!(e.0, k as i32),
                    (ours, theirs) => {
                        prop_assert!(false, "copy: ours {:?}, the kernel's {:?}", ours.map(|r| r.0), theirs)
                    }
                }
            }
            Op::Seek(f, off) => {
                let size = store.ns().getattr(inos[f]).unwrap().size;
                let bytes = read(&store, inos[f], 0, size as usize);
                let zeros = |from: u64, to: u64| bytes[from as usize..to as usize].iter().all(|&b| b == 0);
                let first = (off..size).find(|&p| bytes[p as usize] != 0);
                match store.seek((&root).into(), inos[f], off, SeekTo::Data) {
                    Ok(d) => {
                        prop_assert!(off <= d && d < size && zeros(off, d), "data at {} from {} of {}", d, off, size)
                    }
                    Err(e) => {
                        prop_assert!(e == Errno::ENXIO && first.is_none(), "{:?} from {}: data at {:?}", e, off, first)
                    }
                }
                match store.seek((&root).into(), inos[f], off, SeekTo::Hole) {
                    Ok(h) => {
                        let next = store.seek((&root).into(), inos[f], h, SeekTo::Data).unwrap_or(size);
                        // A hole starts at h: no data there, zeros up to the next.
                        let hole = h == size || (next > h && zeros(h, next));
                        prop_assert!(off <= h && h <= size && hole, "hole at {} (to {}) from {}", h, next, off);
                    }
                    Err(e) => prop_assert!(e == Errno::ENXIO && off >= size, "{:?} from {} of {}", e, off, size),
                }
            }
            Op::Read(f, off, len) => {
                let want = kernel_read(&kernel[f], off, len);
                prop_assert!(read(&store, inos[f], off, len) == want, "read {} bytes at {} of f{}", len, off, f);
                // From the page cache: the same bytes, or EAGAIN.
                let cached = store.read((&root).into(), inos[f], (off, len), ReadFrom::Cache);
                prop_assert!(
                    cached.as_ref().map_or_else(|e| *e == Errno::EAGAIN, |c| *c == want),
                    "cached read of {} bytes at {} of f{}",
                    len,
                    off,
                    f
                );
            }
            Op::Reopen => {
                drop(store);
                store = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap().0;
            }
        }
        // st_blocks is what the data file took on the local file system
        // when it last changed, after every change and after a reopen.
        // The file system may take a block more when it writes the data
        // back: ext4, its allocation delayed until then, may need one for
        // its extent tree's index (until session 48 this compared exactly,
        // and failed when the writeback came during a case: 720 blocks
        // against 728). The data files are written back here at once, so
        // that every step meets it.
        for &ino in &inos {
            let path = data_path(tmp.path(), ino);
            if let Ok(f) = std::fs::File::open(&path) {
                f.sync_data().unwrap();
            }
            let held = std::fs::metadata(&path).map_or(0, |m| m.blocks());
            let ours = store.ns().getattr(ino).unwrap().blocks;
            prop_assert!(ours.abs_diff(held) <= 8, "blocks of {}: {} against {} after {:?}", ino, ours, held, op);
        }
    }
    for f in 0..2 {
        let size = kernel[f].metadata().unwrap().len();
        prop_assert_eq!(store.ns().getattr(inos[f]).unwrap().size, size);
        prop_assert!(
            read(&store, inos[f], 0, size as usize + 10) == kernel_read(&kernel[f], 0, size as usize + 10),
            "f{} in the end",
            f
        );
    }
    Ok(())
}

/// `len` bytes of `ino` from `at`, as root, from the disk if need be.
fn read(store: &Store, ino: Ino, at: u64, len: usize) -> Vec<u8> {
    store.read((&Cred::root()).into(), ino, (at, len), ReadFrom::Disk).unwrap()
}

/// A store in a fresh directory with two empty regular files, `a` and `b`.
fn store_with_files() -> (tempfile::TempDir, Store, [Ino; 2]) {
    store_with_files_in(tempfile::tempdir().unwrap())
}

/// [`store_with_files`] in `tmp`.
fn store_with_files_in(tmp: tempfile::TempDir) -> (tempfile::TempDir, Store, [Ino; 2]) {
    let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
    let new = || NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
    let files = [b"a", b"b"].map(|name| store.ns().create(&Cred::root(), ROOT, name, new(), b"", 2).unwrap().0.ino);
    (tmp, store, files)
}

/// Where the store in `dir` keeps `ino`'s data (`docs/namespace.md`).
fn data_path(dir: &std::path::Path, ino: Ino) -> std::path::PathBuf {
    dir.join("data").join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"))
}

fn data_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("data")).unwrap().map(|d| std::fs::read_dir(d.unwrap().path()).unwrap().count()).sum()
}

/// A store whose data lies on a file system that cannot say whether a
/// read would wait (no `RWF_NOWAIT`: tmpfs here) answers a read from the
/// cache only with `EAGAIN`, which sends a server to read as from the
/// disk, where the bytes are. Until session 32 it answered `EOPNOTSUPP`,
/// and every read through a server whose `--data` was on tmpfs failed.
#[test]
fn a_store_on_tmpfs_answers_a_cache_read_with_eagain_and_reads_from_the_disk() {
    let (_tmp, store, [a, _]) = store_with_files_in(tempfile::tempdir_in("/dev/shm").unwrap());
    let root = Cred::root();
    store.write((&root).into(), a, Some(0), b"data", 3).unwrap();
    for _ in 0..2 {
        let cached = store.read((&root).into(), a, (0, 4), ReadFrom::Cache);
        // A kernel whose tmpfs takes RWF_NOWAIT serves it from the cache.
        assert!(cached == Err(Errno::EAGAIN) || cached == Ok(b"data".to_vec()), "{cached:?}");
        assert_eq!(read(&store, a, 0, 4), b"data");
    }
}

/// A file's data goes once the record that frees it is durable; if the
/// store stops first, the next start removes it.
#[test]
fn a_freed_files_data_goes() {
    let (tmp, store, files) = store_with_files();
    let root = Cred::root();
    for (i, ino) in files.into_iter().enumerate() {
        store.write((&root).into(), ino, Some(1 << 30), b"far out", 3).unwrap();
        assert_eq!(store.ns().getattr(ino).unwrap().size, (1 << 30) + 7, "a sparse file of a GiB ({i})");
    }
    assert_eq!(data_files(tmp.path()), 2);
    store.wait(store.ns().unlink(&root, ROOT, b"a", 4).unwrap()).unwrap();
    assert_eq!(store.collect_freed(), 1);
    assert_eq!(data_files(tmp.path()), 1);
    store.ns().unlink(&root, ROOT, b"b", 5).unwrap();
    drop(store);
    let (_, opened) = Store::open(tmp.path(), StoreOptions::default(), 6).unwrap();
    assert_eq!((opened.data_removed, data_files(tmp.path())), (1, 0));
}

/// Freeing a file that never had data removes no data file: no path is
/// made and no `unlink(2)` is asked (0.6-1.1 µs of the collecting
/// thread per freed empty file, session 56). A file whose data file was found
/// at open (written before a restart), or made since by a write, a
/// `fallocate` or a copy into it, has its data removed once freed, a
/// chmod or an ACL set after the data (which rewrite the word the mark
/// is kept in) notwithstanding.
#[test]
fn only_files_that_had_data_have_it_removed_when_freed() {
    let (tmp, store, [a, b]) = store_with_files();
    let root = Cred::root();
    store.write((&root).into(), b, Some(0), b"before the restart", 3).unwrap();
    drop(store);
    let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 4).unwrap();
    let new = || NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
    let [c, d, e] = [b"c", b"d", b"e"].map(|name| store.ns().create(&root, ROOT, name, new(), b"", 5).unwrap().0.ino);
    store.fallocate((&root).into(), c, Fallocate::Allocate { keep_size: false }, (0, 4096), 6).unwrap();
    store.copy_range((&root).into(), (b, 0), (d, 0), 6, 6).unwrap();
    store.write((&root).into(), e, Some(0), b"written", 6).unwrap();
    store.setattr(&root, c, &SetAttr { perm: Some(0o600), ..SetAttr::default() }, 7).unwrap();
    let acl = common::acl("u::rw,u:1000:rw,g::r,m::rw,o::");
    store.ns().setxattr(&root, d, b"system.posix_acl_access", &acl, XattrMode::Any, 7).unwrap();
    assert_eq!(data_files(tmp.path()), 4, "all but a's");
    for name in [b"a", b"b", b"c", b"d", b"e"] {
        store.wait(store.ns().unlink(&root, ROOT, name, 8).unwrap()).unwrap();
    }
    assert!(store.ns().getattr(a).is_err());
    assert_eq!(store.collect_freed(), 4, "b, c, d and e had data; a never did");
    assert_eq!(data_files(tmp.path()), 0);
}

/// A file replaced by a rename that leaves a whiteout, in a directory
/// with a default ACL (the whiteout inherits it: one record of both,
/// `Mutation::Inherit`), has its data freed as by any rename over it.
/// Before, the store did not see the freed file through the record that
/// wraps the rename, and its data file stayed on the disk.
#[test]
fn a_file_replaced_by_a_whiteout_rename_under_a_default_acl_has_its_data_freed() {
    let (tmp, store, [a, b]) = store_with_files();
    let root = Cred::root();
    store.write((&root).into(), b, Some(0), b"replaced", 3).unwrap();
    store.write((&root).into(), a, Some(0), b"moved", 3).unwrap();
    assert_eq!(data_files(tmp.path()), 2);
    let default = common::acl("u::rwx,u:1000:rwx,g::rx,m::rwx,o::");
    store.ns().setxattr(&root, ROOT, b"system.posix_acl_default", &default, XattrMode::Any, 4).unwrap();
    let flags = RenameFlags { whiteout: true, ..RenameFlags::default() };
    store.wait(store.ns().rename(&root, (ROOT, b"a"), (ROOT, b"b"), flags, 5).unwrap()).unwrap();
    let whiteout = store.ns().lookup(&root, ROOT, b"a").unwrap().ino;
    assert!(store.ns().getxattr(&root, whiteout, b"system.posix_acl_access").is_ok(), "the whiteout inherited");
    assert_eq!(store.collect_freed(), 1);
    assert_eq!(data_files(tmp.path()), 1, "b's data went");
}

/// A copy moves only the source's data: its holes stay holes, so a
/// sparse file copies into a destination that takes no more space than
/// the source's data (and reads the same).
#[test]
fn a_copy_keeps_the_sources_holes() {
    let (tmp, store, files) = store_with_files();
    let (root, [a, b]) = (Cred::root(), files);
    const FAR: u64 = 64 << 20;
    store.write((&root).into(), a, Some(0), b"head", 3).unwrap();
    store.write((&root).into(), a, Some(FAR), b"tail", 3).unwrap();
    store.write((&root).into(), b, Some(FAR / 2), &[9u8; 8192], 3).unwrap();
    // As `cp` does: each call copies at most COPY_MAX, and it goes on.
    let mut done = 0;
    while done < FAR + 4 {
        let (n, attr, _) = store.copy_range((&root).into(), (a, done), (b, done), FAR + 4 - done, 4).unwrap();
        assert!(n > 0 && n <= COPY_MAX, "{n} bytes a call");
        done += n;
        assert_eq!(attr.size, done.max(FAR / 2 + 8192));
    }
    let read = |ino, at, len| read(&store, ino, at, len);
    assert_eq!((read(b, 0, 4), read(b, FAR, 8)), (b"head".to_vec(), b"tail".to_vec()));
    assert_eq!(read(b, FAR / 2 - 10, 8300), vec![0u8; 8300], "b's own data under the source's hole is zeros");
    let used = std::fs::metadata(data_path(tmp.path(), b)).unwrap().blocks() * 512;
    assert!(used <= 64 << 10, "the copy of a 64 MiB sparse file takes {used} bytes");
    assert_eq!(store.ns().getattr(b).unwrap().blocks * 512, used, "and st_blocks says so");
}

/// A read from the page cache only fails with `EAGAIN` when the file's data is
/// not there (a server's worker then hands the read to a thread that may
/// wait for the disk), and the bytes once a read from the disk has
/// brought them in. The store is on the project's disk: tmpfs pages
/// cannot be dropped (on a tmpfs target directory the test says so and
/// skips).
#[test]
fn a_read_from_the_cache_fails_with_eagain_until_the_data_is_in_it() {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    if nix::sys::statfs::statfs(tmp.path()).unwrap().filesystem_type() == nix::sys::statfs::TMPFS_MAGIC {
        eprintln!(
            "SKIPPED a_read_from_the_cache_fails_with_eagain_until_the_data_is_in_it: the target directory is on tmpfs"
        );
        return;
    }
    let (store, _) = Store::open(tmp.path(), StoreOptions::default(), 1).unwrap();
    let root = Cred::root();
    let new = || NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
    let ino = store.ns().create(&root, ROOT, b"f", new(), b"", 2).unwrap().0.ino;
    let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    store.write((&root).into(), ino, Some(0), &bytes, 3).unwrap();
    store.fsync(ino).unwrap();
    let cached = || store.read((&root).into(), ino, (4096, 65536), ReadFrom::Cache);
    assert_eq!(cached().as_deref(), Ok(&bytes[4096..69632]), "just written: in the cache");
    // Clean once synced, so the kernel drops them: when it can. A page
    // another thread holds for a moment (the other tests' writes share
    // the machine's page cache and its per-CPU lists) is skipped, so the
    // drop is asked again until the pages are gone, or fails the test.
    let file = std::fs::File::open(data_path(tmp.path(), ino)).unwrap();
    let dropped = (0..100).any(|_| {
        posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
        let gone = cached() == Err(Errno::EAGAIN);
        if !gone {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        gone
    });
    assert!(dropped, "dropped from the cache: the read would wait for the disk, yet the cache answered");
    assert_eq!(read(&store, ino, 4096, 65536), bytes[4096..69632], "from the disk");
    assert_eq!(cached().as_deref(), Ok(&bytes[4096..69632]), "and in the cache again");
    // A file with no data file yet reads as zeros from anywhere.
    let empty = store.ns().create(&root, ROOT, b"e", new(), b"", 4).unwrap().0.ino;
    store.setattr(&root, empty, &SetAttr { size: Some(100), ..SetAttr::default() }, 5).unwrap();
    assert_eq!(store.read((&root).into(), empty, (0, 100), ReadFrom::Cache), Ok(vec![0; 100]));
}
