//! Rules the random differential test reaches too rarely to guard: each
//! named case, with the errno Linux gives.

mod common;

use interlock_meta::{
    COPY_MAX, Caller, Cred, Errno, Fallocate, FileType, Ino, Namespace, NewInode, ROOT, RenameFlags, SetAttr, XattrMode,
};

fn user() -> Cred {
    Cred { uid: 1000, gid: 1000, groups: vec![] }
}

fn new(kind: FileType, perm: u32) -> NewInode {
    NewInode { kind, perm, rdev: 0, umask: 0 }
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

/// Bad input gets Linux's errno and changes nothing: names with `/` or
/// NUL, empty or over 255 bytes, `.` and `..` as targets, xattrs over
/// the limits, operations on a removed inode or in a removed directory, a
/// file as a parent.
#[test]
fn bad_input_gets_its_errno_and_changes_nothing() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o755), b"", 1).unwrap();
    let (f, _) = ns.create(&root, d.ino, b"f", new(FileType::Regular, 0o644), b"", 2).unwrap();
    let (gone, _) = ns.create(&root, ROOT, b"gone", new(FileType::Regular, 0o644), b"", 3).unwrap();
    ns.unlink(&root, ROOT, b"gone", 4).unwrap();
    let (dead, _) = ns.create(&root, ROOT, b"dead", new(FileType::Directory, 0o755), b"", 5).unwrap();
    ns.open(&Cred::root(), dead.ino, 0).unwrap();
    ns.rmdir(&root, ROOT, b"dead", 6).unwrap();
    let long = vec![b'x'; 256];
    let flags = RenameFlags::default();
    let before = common::dump(&ns, &[dead.ino]);
    let file = || new(FileType::Regular, 0o644);
    let cases: Vec<(&str, Result<(), Errno>, Errno)> = vec![
        ("slash in a name", ns.create(&root, ROOT, b"a/b", file(), b"", 9).map(drop), Errno::EINVAL),
        ("NUL in a name", ns.create(&root, ROOT, b"a\0b", file(), b"", 9).map(drop), Errno::EINVAL),
        ("empty name", ns.create(&root, ROOT, b"", file(), b"", 9).map(drop), Errno::EINVAL),
        ("256-byte name", ns.create(&root, ROOT, &long, file(), b"", 9).map(drop), Errno::ENAMETOOLONG),
        ("256-byte lookup", ns.lookup(&root, ROOT, &long).map(drop), Errno::ENAMETOOLONG),
        ("create .", ns.create(&root, d.ino, b".", file(), b"", 9).map(drop), Errno::EEXIST),
        ("mkdir ..", ns.create(&root, d.ino, b"..", new(FileType::Directory, 0o755), b"", 9).map(drop), Errno::EEXIST),
        ("unlink .", ns.unlink(&root, d.ino, b".", 9).map(drop), Errno::EISDIR),
        ("rmdir .", ns.rmdir(&root, d.ino, b".", 9).map(drop), Errno::EINVAL),
        ("rmdir ..", ns.rmdir(&root, d.ino, b"..", 9).map(drop), Errno::ENOTEMPTY),
        ("rename onto ..", ns.rename(&root, (d.ino, b"f"), (d.ino, b".."), flags, 9).map(drop), Errno::EBUSY),
        ("link to .", ns.link(&root, f.ino, d.ino, b".", 9).map(drop), Errno::EEXIST),
        ("rmdir of a file", ns.rmdir(&root, d.ino, b"f", 9).map(drop), Errno::ENOTDIR),
        ("unlink of a directory", ns.unlink(&root, ROOT, b"d", 9).map(drop), Errno::EISDIR),
        (
            "rename both flags",
            ns.rename(
                &root,
                (d.ino, b"f"),
                (d.ino, b"g"),
                RenameFlags { noreplace: true, exchange: true, whiteout: false },
                9,
            )
            .map(drop),
            Errno::EINVAL,
        ),
        (
            "xattr value over 64 KiB",
            ns.setxattr(&root, f.ino, b"user.v", &vec![0; 65_537], XattrMode::Any, 9).map(drop),
            Errno::E2BIG,
        ),
        (
            "xattr name over 255",
            ns.setxattr(&root, f.ino, &[b"user.".as_slice(), &long].concat(), b"v", XattrMode::Any, 9).map(drop),
            Errno::ERANGE,
        ),
        (
            "xattr replace of nothing",
            ns.setxattr(&root, f.ino, b"user.none", b"v", XattrMode::Replace, 9).map(drop),
            Errno::ENODATA,
        ),
        (
            "unknown xattr namespace",
            ns.setxattr(&root, f.ino, b"bogus.v", b"v", XattrMode::Any, 9).map(drop),
            Errno::EOPNOTSUPP,
        ),
        // ACLs Linux would not read.
        (
            "an ACL of another version",
            ns.setxattr(&root, f.ino, b"system.posix_acl_access", &[1, 0, 0, 0], XattrMode::Any, 9).map(drop),
            Errno::EINVAL,
        ),
        (
            "an ACL with a cut entry",
            ns.setxattr(&root, d.ino, b"system.posix_acl_default", &[2, 0, 0, 0, 1, 0], XattrMode::Any, 9).map(drop),
            Errno::EINVAL,
        ),
        (
            "a system. name but an ACL's",
            ns.setxattr(&root, f.ino, b"system.other", b"v", XattrMode::Any, 9).map(drop),
            Errno::EOPNOTSUPP,
        ),
        ("reading an ACL never set", ns.getxattr(&root, f.ino, b"system.posix_acl_access").map(drop), Errno::ENODATA),
        ("getattr of a removed inode", ns.getattr(gone.ino).map(drop), Errno::ENOENT),
        (
            "setattr of a removed inode",
            ns.setattr(&root, gone.ino, &SetAttr { perm: Some(0o600), ..SetAttr::default() }, 9).map(drop),
            Errno::ENOENT,
        ),
        ("link of a removed inode", ns.link(&root, gone.ino, ROOT, b"back", 9).map(drop), Errno::ENOENT),
        ("create in a removed directory", ns.create(&root, dead.ino, b"x", file(), b"", 9).map(drop), Errno::ENOENT),
        ("a file as a parent", ns.create(&root, f.ino, b"x", file(), b"", 9).map(drop), Errno::ENOTDIR),
        ("listing a file", ns.readdir(&root, f.ino, 0, 10).map(drop), Errno::ENOTDIR),
        ("readlink of a file", ns.readlink(f.ino).map(drop), Errno::EINVAL),
        (
            "truncate of a directory",
            ns.setattr(&root, d.ino, &SetAttr { size: Some(0), ..SetAttr::default() }, 9).map(drop),
            Errno::EISDIR,
        ),
        ("release of what is not open", ns.release(&root, f.ino).map(drop), Errno::EBADF),
    ];
    for (what, got, want) in cases {
        assert_eq!(got, Err(want), "{what}");
    }
    assert_eq!(common::dump(&ns, &[dead.ino]), before, "nothing changed");
}

/// `create_open` is `create` then `open` in one step: the new file is held
/// open (unlinked, it lives on until released), a taken name is `EEXIST`,
/// and the directory's permissions apply as to `create`.
#[test]
fn create_open_creates_a_file_held_open() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (a, _) = ns.create_open(&root, ROOT, b"a", (0o640, 0), 1).unwrap();
    assert_eq!((a.kind, a.perm, a.nlink, a.size), (FileType::Regular, 0o640, 1, 0));
    assert_eq!(ns.lookup(&root, ROOT, b"a").unwrap().ino, a.ino);
    assert_eq!(ns.create_open(&root, ROOT, b"a", (0o644, 0), 2).map(drop), Err(Errno::EEXIST));
    ns.unlink(&root, ROOT, b"a", 3).unwrap();
    assert_eq!(ns.getattr(a.ino).unwrap().nlink, 0, "open, so an orphan, not freed");
    ns.release(&root, a.ino).unwrap();
    assert_eq!(ns.getattr(a.ino).map(drop), Err(Errno::ENOENT), "freed at its only release");
    assert_eq!(ns.release(&root, a.ino).map(drop), Err(Errno::ENOENT));
    let (ro, _) = ns.create(&root, ROOT, b"ro", new(FileType::Directory, 0o755), b"", 4).unwrap();
    assert_eq!(ns.create_open(&user(), ro.ino, b"x", (0o644, 0), 5).map(drop), Err(Errno::EACCES));
    assert_eq!(ns.lookup(&root, ro.ino, b"x").map(drop), Err(Errno::ENOENT));
}

/// `fallocate` is checked as a write is: an empty range is `EINVAL`, a
/// directory `EISDIR`, a range past 16 TiB `EFBIG`, another's file
/// without write permission `EACCES`, and none of those touches the data
/// or the file. A keep-size mode leaves the size, the others grow it to
/// the range's end (never shrink it); every one sets mtime and ctime,
/// and a user's clears setuid, as a write's does.
#[test]
fn fallocate_is_checked_as_a_write_and_grows_the_file_only_when_asked() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (f, _) = ns.create(&root, ROOT, b"f", new(FileType::Regular, 0o4755), b"", 1).unwrap();
    let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o777), b"", 1).unwrap();
    let f = ns.getattr(f.ino).unwrap();
    let reserve = Fallocate::Allocate { keep_size: false };
    let refused = |cred: &Cred, ino, range| {
        ns.fallocate_with(cred.into(), ino, reserve, range, 2, || panic!("the data file is not touched")).map(drop)
    };
    assert_eq!(refused(&root, f.ino, (0, 0)), Err(Errno::EINVAL));
    assert_eq!(refused(&root, d.ino, (0, 10)), Err(Errno::EISDIR));
    assert_eq!(refused(&root, f.ino, ((16 << 40) - 5, 10)), Err(Errno::EFBIG));
    assert_eq!(refused(&user(), f.ino, (0, 10)), Err(Errno::EACCES));
    assert_eq!(ns.getattr(f.ino).unwrap(), f, "unchanged");
    let steps = [
        (Fallocate::Allocate { keep_size: true }, (100, 50), 0),
        (Fallocate::PunchHole, (0, 500), 0),
        (reserve, (100, 50), 150),
        (Fallocate::ZeroRange { keep_size: true }, (0, 400), 150),
        (Fallocate::ZeroRange { keep_size: false }, (200, 100), 300),
        (reserve, (0, 10), 300),
    ];
    for (t, (how, range, size)) in steps.into_iter().enumerate() {
        let now = 10 + t as i64;
        let mut put = 0;
        let (a, _) = ns
            .fallocate_with((&root).into(), f.ino, how, range, now, || {
                put += 1;
                Ok(8 * now as u64)
            })
            .unwrap();
        // The blocks are what the data file takes after the change.
        assert_eq!((a.size, a.blocks, a.mtime, a.ctime, put), (size, 8 * now as u64, now, now, 1), "{how:?} {range:?}");
        assert_eq!(a.perm, 0o4755, "root keeps setuid");
    }
    let all = SetAttr { perm: Some(0o4777), ..SetAttr::default() };
    ns.setattr(&root, f.ino, &all, 20).unwrap();
    let (a, _) = ns.fallocate_with((&user()).into(), f.ino, reserve, (0, 1), 21, || Ok(0)).unwrap();
    assert_eq!(a.perm, 0o777, "a user's fallocate clears setuid");
}

/// `copy_file_range` checks the source as a read and the destination as
/// a write, refuses overlapping ranges of one file (`EINVAL`, on the count
/// cut to the source's end) and a destination past 16 TiB (`EFBIG`), and
/// copies none of the refused; it copies no more than the source holds,
/// and a copy of nothing records nothing.
#[test]
fn copy_range_is_checked_as_a_read_and_a_write() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let file = |name: &[u8], perm| ns.create(&root, ROOT, name, new(FileType::Regular, perm), b"", 1).unwrap().0.ino;
    let (src, dst, secret) = (file(b"src", 0o644), file(b"dst", 0o644), file(b"secret", 0o600));
    let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o777), b"", 1).unwrap();
    ns.write_with((&root).into(), src, (Some(0), 1000), 2, |_| Ok(0)).unwrap();
    let clock = std::cell::Cell::new(10);
    let copied = |cred: &Cred, from, to, len| {
        let (mut put, now) = (None, clock.get() + 1);
        clock.set(now);
        let r = ns.copy_range_with(cred.into(), from, to, len, now, |n| {
            put = Some(n);
            Ok(0)
        });
        // Whether it was recorded: the record sets mtime to the time given.
        (r.map(|(n, a, _)| (n, a.size, a.mtime == now)), put)
    };
    let refused = |e: Errno| (Err(e), None);
    assert_eq!(copied(&user(), (secret, 0), (dst, 0), 10), refused(Errno::EACCES), "an unreadable source");
    assert_eq!(copied(&user(), (src, 0), (dst, 0), 10), refused(Errno::EACCES), "an unwritable destination");
    assert_eq!(copied(&root, (d.ino, 0), (dst, 0), 10), refused(Errno::EISDIR));
    assert_eq!(copied(&root, (src, 0), (d.ino, 0), 10), refused(Errno::EISDIR));
    assert_eq!(copied(&root, (src, 0), (src, 500), 600), refused(Errno::EINVAL), "overlapping");
    assert_eq!(copied(&root, (src, 0), (dst, (16 << 40) - 5), 10), refused(Errno::EFBIG));
    assert_eq!(
        copied(&root, (src, 600), (src, 0), 600),
        (Ok((400, 1000, true)), Some(400)),
        "cut at the end, so apart"
    );
    assert_eq!(copied(&root, (src, 900), (dst, 50), 500), (Ok((100, 150, true)), Some(100)));
    assert_eq!(copied(&root, (src, 1000), (dst, 0), 500), (Ok((0, 150, false)), None), "nothing to copy");
    assert_eq!(copied(&user(), (src, 1000), (secret, 0), 5), refused(Errno::EACCES), "checked even then");
    ns.write_with((&root).into(), src, (Some(COPY_MAX * 3), 1), 5, |_| Ok(0)).unwrap();
    let most = Ok((COPY_MAX, COPY_MAX + 100, true));
    assert_eq!(copied(&root, (src, 0), (dst, 100), COPY_MAX * 2), (most, Some(COPY_MAX)), "at most COPY_MAX a call");
}

/// An open is checked as Linux checks it, for what it asks (an
/// execute-only program may be opened to run, not to read); the data
/// calls made through the handle are not checked again, so a chmod after
/// the open takes nothing from it, where a call with no handle is checked
/// as it comes (before session 31 every call was, with the opener's ids).
/// Either way the privileges a write drops are the writer's: root's
/// write through a user's handle keeps setuid, a user's write through
/// root's drops it. A listing through a directory handle is not checked
/// again either.
#[test]
fn an_open_is_checked_once_and_a_write_drops_privileges_by_its_writer() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let file = |name: &[u8], perm| ns.create(&root, ROOT, name, new(FileType::Regular, perm), b"", 1).unwrap().0.ino;
    let (private, program, shared) = (file(b"private", 0o600), file(b"program", 0o711), file(b"shared", 0o6777));
    let (r, w, x) = (libc::R_OK as u32, libc::W_OK as u32, libc::X_OK as u32);
    assert_eq!(ns.open(&user(), private, r).map(drop), Err(Errno::EACCES));
    assert_eq!(ns.open(&user(), private, w).map(drop), Err(Errno::EACCES));
    assert!(ns.open(&root, private, r | w).is_ok(), "root may");
    assert!(ns.open(&user(), private, 0).is_ok(), "a handle opened again asks for nothing");
    assert!(ns.open(&user(), program, x).is_ok(), "run");
    assert_eq!(ns.open(&user(), program, r).map(drop), Err(Errno::EACCES), "not read");

    ns.open(&user(), shared, r | w).unwrap();
    ns.setattr(&root, shared, &SetAttr { perm: Some(0o4000), ..SetAttr::default() }, 2).unwrap();
    let someone = user();
    let (through, alone) = (Caller { cred: &someone, opened: true }, Caller::checked(&someone));
    assert_eq!(ns.readable(alone, shared).map(drop), Err(Errno::EACCES), "a call with no handle is checked");
    assert_eq!(ns.write_with(alone, shared, (Some(0), 1), 3, |_| Ok(0)).map(drop), Err(Errno::EACCES));
    assert!(ns.readable(through, shared).is_ok(), "a handle keeps its access");
    let root_through = Caller { cred: &root, opened: true };
    let (a, _) = ns.write_with(root_through, shared, (Some(0), 1), 4, |_| Ok(0)).unwrap();
    assert_eq!(a.perm, 0o4000, "root writes through the user's handle: setuid stays");
    let (a, _) = ns.write_with(through, shared, (Some(0), 1), 5, |_| Ok(0)).unwrap();
    assert_eq!((a.perm, a.size, a.mtime), (0, 1, 5), "the user writes: setuid goes");

    // A listing that goes on through a directory handle, likewise.
    let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o700), b"", 6).unwrap();
    ns.create(&root, d.ino, b"x", new(FileType::Regular, 0o600), b"", 7).unwrap();
    assert_eq!(ns.readdir(alone, d.ino, 0, 10).map(drop), Err(Errno::EACCES));
    assert_eq!(ns.readdir(through, d.ino, 0, 10).unwrap().len(), 1);
}

/// `O_TMPFILE`: a file with no name, checked and owned as a create in its
/// directory is (a user may not make one where they may not write; a
/// setgid directory gives its group), which the directory does not list
/// and which does not change it; `link` names it unless it was made
/// `O_EXCL`, as it never names an open file that lost its last name;
/// one nobody names goes at its last close.
#[test]
fn an_o_tmpfile_has_no_name_until_linked_and_goes_at_its_last_close() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o2755), b"", 1).unwrap();
    let sgid = SetAttr { perm: Some(0o2755), gid: Some(5), chown: true, ..SetAttr::default() };
    let (d, _) = ns.setattr(&root, d.ino, &sgid, 1).unwrap();
    let (shared, _) = ns.create(&root, ROOT, b"shared", new(FileType::Directory, 0o777), b"", 1).unwrap();
    assert_eq!(ns.tmpfile(&user(), d.ino, (0o600, 0), true, 2).map(drop), Err(Errno::EACCES));
    let (t, _) = ns.tmpfile(&root, d.ino, (0o2640, 0), true, 3).unwrap();
    assert_eq!((t.kind, t.nlink, t.perm, t.gid), (FileType::Regular, 0, 0o2640, 5));
    assert_eq!(ns.getattr(d.ino).unwrap(), d, "the directory is as it was");
    assert!(ns.readdir(&root, d.ino, 0, 10).unwrap().is_empty());
    let (named, _) = ns.link(&root, t.ino, shared.ino, b"kept", 4).unwrap();
    assert_eq!((named.ino, named.nlink), (t.ino, 1));
    assert_eq!(ns.lookup(&root, shared.ino, b"kept").unwrap().ino, t.ino);

    let (excl, _) = ns.tmpfile(&user(), shared.ino, (0o600, 0), false, 5).unwrap();
    assert_eq!((excl.uid, excl.gid), (1000, 1000));
    assert_eq!(ns.link(&user(), excl.ino, shared.ino, b"x", 6).map(drop), Err(Errno::ENOENT), "O_EXCL");
    let (f, _) = ns.create(&root, shared.ino, b"f", new(FileType::Regular, 0o644), b"", 7).unwrap();
    ns.open(&root, f.ino, 0).unwrap();
    ns.unlink(&root, shared.ino, b"f", 8).unwrap();
    assert_eq!(ns.link(&root, f.ino, shared.ino, b"back", 9).map(drop), Err(Errno::ENOENT), "an unlinked file");

    ns.release(&user(), excl.ino).unwrap();
    assert!(ns.getattr(excl.ino).is_err(), "nobody named it: gone at its last close");
    ns.release(&root, t.ino).unwrap();
    assert_eq!(ns.getattr(t.ino).unwrap().nlink, 1, "named: it stays");
}

/// `RENAME_WHITEOUT` leaves a whiteout (a character device 0:0 with no
/// permission bits, the renamer's) at the old name in the same step, and
/// goes with `RENAME_NOREPLACE` but not with `RENAME_EXCHANGE`; anyone
/// may make a whiteout, as on Linux since 5.8, but only root another
/// device node.
#[test]
fn a_rename_with_whiteout_leaves_a_character_device_0_0_behind() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o777), b"", 1).unwrap();
    let (f, _) = ns.create(&user(), d.ino, b"f", new(FileType::Regular, 0o644), b"", 2).unwrap();
    let whiteout = RenameFlags { whiteout: true, ..RenameFlags::default() };
    let both = RenameFlags { exchange: true, ..whiteout };
    assert_eq!(ns.rename(&user(), (d.ino, b"f"), (d.ino, b"g"), both, 3), Err(Errno::EINVAL));
    ns.rename(&user(), (d.ino, b"f"), (d.ino, b"g"), RenameFlags { noreplace: true, ..whiteout }, 4).unwrap();
    assert_eq!(ns.lookup(&root, d.ino, b"g").unwrap().ino, f.ino);
    let w = ns.lookup(&root, d.ino, b"f").unwrap();
    assert_eq!((w.kind, w.rdev, w.perm, w.uid, w.nlink, w.ctime), (FileType::CharDevice, 0, 0, 1000, 1, 4));
    assert_eq!(ns.readdir(&root, d.ino, 0, 10).unwrap().len(), 2, "f (the whiteout) and g");

    let device = |rdev| NewInode { rdev, ..new(FileType::CharDevice, 0o600) };
    assert_eq!(ns.create(&user(), d.ino, b"null", device(0x103), b"", 5).map(drop), Err(Errno::EPERM));
    assert!(ns.create(&user(), d.ino, b"w", device(0), b"", 5).is_ok(), "a whiteout is anyone's");
    assert!(ns.create(&root, d.ino, b"null", device(0x103), b"", 5).is_ok());
}

/// `security.*` extended attributes are anyone's to read and root's to set
/// or remove (Linux's capability module asks `CAP_SYS_ADMIN`, the file's
/// owner or not); until session 31 the owner could set them.
#[test]
fn security_xattrs_are_roots_to_set_and_anyones_to_read() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (f, _) = ns.create(&root, ROOT, b"f", new(FileType::Regular, 0o644), b"", 1).unwrap();
    let mine = SetAttr { uid: Some(1000), chown: true, ..SetAttr::default() };
    ns.setattr(&root, f.ino, &mine, 1).unwrap();
    let set = |cred: &Cred| ns.setxattr(cred, f.ino, b"security.a", b"v", XattrMode::Any, 2).map(drop);
    assert_eq!(set(&user()), Err(Errno::EPERM), "not even the owner");
    assert!(set(&root).is_ok());
    assert_eq!(ns.getxattr(&user(), f.ino, b"security.a").unwrap(), b"v");
    assert_eq!(ns.removexattr(&user(), f.ino, b"security.a", 3), Err(Errno::EPERM));
    assert!(ns.removexattr(&root, f.ino, b"security.a", 3).is_ok());
}

/// A change to a file's data, size or owner takes away the capabilities
/// it grants (`security.capability`), whoever makes it, as Linux's
/// killpriv does, and a chmod does not; anyone who could change the file
/// may remove the attribute (which such a change would), no one else but
/// root, and only root may set it. Until session 42 a write kept it.
#[test]
fn a_change_to_a_files_data_size_or_owner_takes_its_capabilities_away() {
    const CAPS: &[u8] = b"security.capability";
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let capped = |name: &[u8], perm| {
        let (f, _) = ns.create(&root, ROOT, name, new(FileType::Regular, perm), b"", 1).unwrap();
        ns.setxattr(&root, f.ino, CAPS, b"caps", XattrMode::Any, 1).unwrap();
        f.ino
    };
    let kept = |ino| ns.listxattr(&root, ino).unwrap().iter().any(|n| n == CAPS);
    let u = user();
    let writer: Caller = (&u).into();
    type Change<'a> = &'a dyn Fn(Ino) -> Result<(), Errno>;
    let changes: [(&[u8], Change); 6] = [
        (b"write", &|ino| ns.write_with(writer, ino, (Some(0), 1), 2, |_| Ok(0)).map(drop)),
        (b"append", &|ino| ns.write_with(writer, ino, (None, 1), 2, |_| Ok(0)).map(drop)),
        (b"fallocate", &|ino| ns.fallocate_with(writer, ino, Fallocate::PunchHole, (0, 1), 2, || Ok(0)).map(drop)),
        (b"truncate", &|ino| ns.setattr(&user(), ino, &SetAttr { size: Some(0), ..SetAttr::default() }, 2).map(drop)),
        (b"chown", &|ino| ns.setattr(&root, ino, &SetAttr { chown: true, ..SetAttr::default() }, 2).map(drop)),
        (b"removexattr", &|ino| ns.removexattr(&user(), ino, CAPS, 2).map(drop)),
    ];
    for (name, change) in changes {
        let ino = capped(name, 0o666);
        change(ino).unwrap();
        assert!(!kept(ino), "{}", String::from_utf8_lossy(name));
    }
    let ino = capped(b"chmod", 0o666);
    ns.setattr(&root, ino, &SetAttr { perm: Some(0o644), ..SetAttr::default() }, 2).unwrap();
    assert!(kept(ino), "a chmod keeps them");
    let ino = capped(b"private", 0o644);
    assert_eq!(ns.removexattr(&user(), ino, CAPS, 2), Err(Errno::EPERM), "neither owner nor writer");
    assert_eq!(ns.setxattr(&user(), ino, CAPS, b"more", XattrMode::Any, 2), Err(Errno::EPERM));
    assert!(kept(ino));
}

/// A list of extended attribute names past `XATTR_LIST_MAX` (64 KiB,
/// each name with its NUL) is `E2BIG`, as Linux's `listxattr(2)`
/// answers; one that fits is listed.
#[test]
fn a_list_of_xattr_names_past_64_kib_is_e2big() {
    let ns = Namespace::new(1, 0);
    let root = Cred::root();
    let (f, _) = ns.create(&root, ROOT, b"f", new(FileType::Regular, 0o644), b"", 1).unwrap();
    // 251 bytes listed a name: 261 fit in 65,536, 262 do not.
    let name = |i: usize| format!("user.{}", format!("{i:05}").repeat(49)).into_bytes();
    for i in 0..261 {
        ns.setxattr(&root, f.ino, &name(i), b"", XattrMode::Any, 2).unwrap();
    }
    assert_eq!(ns.listxattr(&root, f.ino).unwrap().len(), 261);
    ns.setxattr(&root, f.ino, &name(261), b"", XattrMode::Any, 2).unwrap();
    assert_eq!(ns.listxattr(&root, f.ino), Err(Errno::E2BIG));
}

/// What the attribute flags allow of a file's data, where a handle may
/// be older than the flag (which the differential test's sequences never
/// hold): an append-only file is written anywhere through a handle (its
/// open was checked) but only at its end by a call checked on its own,
/// never cut, and reserved but never punched; an immutable one is not
/// written even through a handle opened before (as ext4 and XFS refuse;
/// tmpfs lets it through), nor linked (which the random sequences try
/// rarely). Only root sets or clears those two; the owner the others;
/// flags tmpfs keeps not are `EOPNOTSUPP`.
#[test]
fn the_attribute_flags_hold_for_handles_opened_before_them() {
    use interlock_meta::{FLAG_APPEND, FLAG_IMMUTABLE, FLAG_NODUMP};
    let ns = Namespace::new(1, 0);
    let (root, u) = (Cred::root(), user());
    let (d, _) = ns.create(&root, ROOT, b"d", new(FileType::Directory, 0o777), b"", 1).unwrap();
    let (f, _) = ns.create(&u, d.ino, b"f", new(FileType::Regular, 0o644), b"", 1).unwrap();
    let write = |who: Caller, offset: Option<u64>| ns.write_with(who, f.ino, (offset, 3), 2, |_| Ok(0)).map(drop);
    let (handle, checked) = (Caller { cred: &u, opened: true }, Caller::checked(&u));
    assert_eq!(ns.set_flags(&u, f.ino, FLAG_APPEND, 2), Err(Errno::EPERM), "root's to set");
    assert_eq!(ns.set_flags(&root, f.ino, 0x04, 2), Err(Errno::EOPNOTSUPP));
    assert_eq!(ns.set_flags(&Cred { uid: 7, gid: 7, groups: vec![] }, f.ino, FLAG_NODUMP, 2), Err(Errno::EPERM));
    ns.set_flags(&u, f.ino, FLAG_NODUMP, 2).unwrap();
    ns.set_flags(&root, f.ino, FLAG_APPEND | FLAG_NODUMP, 3).unwrap();
    assert_eq!(ns.flags(f.ino), Ok(FLAG_APPEND | FLAG_NODUMP));
    assert_eq!(ns.set_flags(&u, f.ino, FLAG_NODUMP, 3), Err(Errno::EPERM), "nor its owner's to clear");
    ns.set_flags(&u, f.ino, FLAG_APPEND, 3).unwrap();
    assert_eq!(write(checked, Some(0)), Err(Errno::EPERM));
    assert_eq!(write(checked, None), Ok(()));
    assert_eq!(write(handle, Some(0)), Ok(()));
    let truncate = SetAttr { size: Some(0), opened_for_write: true, ..SetAttr::default() };
    assert_eq!(ns.setattr(&u, f.ino, &truncate, 4).map(drop), Err(Errno::EPERM));
    let punch = ns.fallocate_with(handle, f.ino, Fallocate::PunchHole, (0, 1), 4, || Ok(0));
    assert_eq!(punch.map(drop), Err(Errno::EPERM));
    let reserve = ns.fallocate_with(handle, f.ino, Fallocate::Allocate { keep_size: true }, (0, 9), 4, || Ok(0));
    assert_eq!(reserve.map(drop), Ok(()));
    ns.set_flags(&root, f.ino, FLAG_IMMUTABLE, 5).unwrap();
    assert_eq!(write(handle, None), Err(Errno::EPERM));
    assert_eq!(ns.setattr(&u, f.ino, &truncate, 6).map(drop), Err(Errno::EPERM));
    assert_eq!(ns.link(&root, f.ino, d.ino, b"g", 6).map(drop), Err(Errno::EPERM), "no link to it");
    assert_eq!(ns.getattr(f.ino).unwrap().size, 3, "3 bytes appended, then written over, nothing cut");
    ns.set_flags(&root, f.ino, 0, 7).unwrap();
    assert_eq!(write(checked, Some(0)), Ok(()));
}
