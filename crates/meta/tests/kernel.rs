//! Differential test against the Linux kernel: random sequences of
//! namespace operations (`O_TMPFILE` and its `linkat`, whiteouts, device
//! nodes and `utimensat`'s settings among them) run on
//! a tmpfs directory and on a `Namespace` must give the same errno for
//! every operation and the same final tree (names, types, modes, sizes,
//! link counts, user xattrs, POSIX ACLs). Operations run as root or as
//! an unprivileged user (the kernel side switches the thread's fsuid and
//! fsgid), so permission checks are compared too, ACLs' among them (the
//! ACLs name that user and its group), and new inodes inherit
//! directories' default ACLs under a umask of 022 as tmpfs has them.
//! Attribute flags (`chattr`: immutable, append-only, no-dump,
//! no-atime) are set and compared too, and with them every refusal they
//! make.
//!
//! Needs a tmpfs (`/dev/shm`) and root (to switch ids); without them it
//! says loudly that it skipped.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use interlock_meta::{
    Cred, Errno, FileType, Ino, Namespace, NewInode, ROOT, RenameFlags, SetAttr, TimeSet, WANT_APPEND, XattrMode,
};
use proptest::prelude::*;

mod common;

/// Paths the operations use: a small pool, so they meet.
const PATHS: &[&str] = &["a", "b", "d", "e", "d/a", "d/b", "d/e", "e/a", "e/d", "d/e/a", "d/e/b"];
const USER: u32 = 1000;
/// The nodes `mknod` makes: a fifo, a character device (root's to make)
/// and a whiteout (the character device 0:0, anyone's).
const NODES: &[(FileType, u64)] = &[(FileType::Fifo, 0), (FileType::CharDevice, 0x103), (FileType::CharDevice, 0)];
/// The times `utimensat` sets (atime, mtime): `None` leaves one
/// (`UTIME_OMIT`); both now is `touch`, one now `touch -a` or `-m`.
const TIMES: &[[Option<TimeSet>; 2]] = &[
    [Some(TimeSet::Now), Some(TimeSet::Now)],
    [Some(TimeSet::Now), None],
    [None, Some(TimeSet::Now)],
    [Some(TimeSet::At(5_000_000_000)), Some(TimeSet::Now)],
];

#[derive(Clone, Debug)]
enum Op {
    Create(usize, u32),
    Mkdir(usize, u32),
    /// `mknod(2)` of `NODES[k]`.
    Mknod(usize, usize),
    Symlink(usize),
    Unlink(usize),
    Rmdir(usize),
    Rename(usize, usize, u8),
    Link(usize, usize),
    Chmod(usize, u32),
    Chown(usize, bool, bool),
    Truncate(usize, u64),
    SetXattr(usize, u8, u8),
    RemoveXattr(usize, u8),
    /// `utimensat(2)` of `TIMES[k]` (atime, mtime), not following a
    /// final symlink.
    Utime(usize, usize),
    /// `open(O_TMPFILE)` in a directory (`PATHS.len()`: the top one) with
    /// a mode, `O_EXCL` or not; then `linkat` of it to a path; then
    /// `close`.
    Tmpfile(usize, usize, u32, bool),
    /// `lsetxattr` of `ACLS[k]` as the access ACL (`false`) or the
    /// default ACL of a path (`PATHS.len()`: the top directory, so that
    /// creates meet default ACLs often); `ACLS.len()`: `lremovexattr` of
    /// it.
    SetAcl(usize, bool, usize),
    /// `chattr` of a path (`PATHS.len()`: the top directory) to
    /// `FLAGS[k]`: `open(O_RDONLY | O_NONBLOCK | O_NOFOLLOW)`, then
    /// `FS_IOC_SETFLAGS` if it is a regular file or a directory (a
    /// mount's kernel sends the ioctl for no other: `ENOTTY` here).
    Chattr(usize, usize),
    /// `open(O_WRONLY)`, with `O_APPEND` or not, then a write of 3 bytes
    /// (at the end, or at the start), then `close`: what the flags
    /// allow of a file's data.
    Write(usize, bool),
}

/// The flags `chattr` sets: none (most often, so that trees stay
/// changeable), each kept one, immutable with append-only, and one
/// tmpfs keeps not (compression: `EOPNOTSUPP`).
const FLAGS: &[u32] = &[0, 0, 0x10, 0x20, 0x40, 0x80, 0x30, 0x60, 0x04];

/// The ACLs the sequences set (see `common::acl`): a named user (the
/// unprivileged one) under a mask; a named group (the user's) with a
/// mask narrower than it; one the mode says all of; none (which
/// removes); one without the mask its named entry needs (`EINVAL`).
const ACLS: &[&str] = &[
    "u::rw,u:1000:rwx,g::r,m::rwx,o::",
    "u::rwx,g::rx,g:1000:rw,m::r,o::r",
    "u::rw,g::r,o::r",
    "",
    "u::rw,u:1000:rw,g::r,o::",
];

/// The extended attribute of an access (`false`) or default ACL.
fn acl_name(default: bool) -> &'static str {
    if default { "system.posix_acl_default" } else { "system.posix_acl_access" }
}

/// An operation on `PATHS[i]` for `i` drawn from `p`, `chattr` and a
/// write weighing `flags` times another.
fn op(p: BoxedStrategy<usize>, flags: u32) -> impl Strategy<Value = Op> {
    let mode =
        prop_oneof![Just(0o755u32), Just(0o700), Just(0o555), Just(0o1777), Just(0o2775), Just(0o644), Just(0o4755)];
    prop_oneof![
        1 => (p.clone(), mode.clone()).prop_map(|(p, m)| Op::Create(p, m)),
        1 => (p.clone(), mode.clone()).prop_map(|(p, m)| Op::Mkdir(p, m)),
        1 => (p.clone(), 0..NODES.len()).prop_map(|(p, k)| Op::Mknod(p, k)),
        1 => p.clone().prop_map(Op::Symlink),
        1 => p.clone().prop_map(Op::Unlink),
        1 => p.clone().prop_map(Op::Rmdir),
        1 => (p.clone(), p.clone(), 0u8..4).prop_map(|(a, b, f)| Op::Rename(a, b, f)),
        1 => (p.clone(), p.clone()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (p.clone(), mode).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => (p.clone(), any::<bool>(), any::<bool>()).prop_map(|(p, u, g)| Op::Chown(p, u, g)),
        1 => (p.clone(), 0u64..5000).prop_map(|(p, s)| Op::Truncate(p, s)),
        1 => (p.clone(), 0u8..XNAMES, 0u8..3).prop_map(|(p, n, f)| Op::SetXattr(p, n, f)),
        1 => (p.clone(), 0u8..XNAMES).prop_map(|(p, n)| Op::RemoveXattr(p, n)),
        1 => (p.clone(), 0..TIMES.len()).prop_map(|(p, k)| Op::Utime(p, k)),
        1 => (
            prop_oneof![3 => Just(PATHS.len()), 1 => p.clone()],
            p.clone(),
            prop_oneof![Just(0o640u32), Just(0o2755)],
            any::<bool>()
        )
            .prop_map(|(d, l, m, x)| Op::Tmpfile(d, l, m, x)),
        1 => (prop_oneof![Just(PATHS.len()), p.clone()], any::<bool>(), 0..=ACLS.len())
            .prop_map(|(p, d, k)| Op::SetAcl(p, d, k)),
        flags => (prop_oneof![1 => Just(PATHS.len()), 4 => p.clone()], 0..FLAGS.len()).prop_map(|(p, k)| Op::Chattr(p, k)),
        flags => (p, any::<bool>()).prop_map(|(p, a)| Op::Write(p, a)),
    ]
}

/// The kernel side: paths under a fresh tmpfs directory.
struct Kernel {
    base: PathBuf,
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The result of a libc call: 0 or the errno.
fn errno(r: i32) -> i32 {
    if r < 0 { std::io::Error::last_os_error().raw_os_error().unwrap() } else { 0 }
}

/// Runs `f` with the thread's fsuid and fsgid switched to the user (the
/// kernel drops the file-system capabilities with a non-zero fsuid) and
/// without `CAP_LINUX_IMMUTABLE`, which is not one of them.
fn as_user<T>(user: bool, f: impl FnOnce() -> T) -> T {
    if !user {
        return f();
    }
    // SAFETY: setfsuid/setfsgid change only this thread's file-system ids.
    unsafe {
        libc::setfsgid(USER);
        libc::setfsuid(USER);
    }
    immutable_cap(false);
    let out = f();
    immutable_cap(true);
    // SAFETY: as above, back to root.
    unsafe {
        libc::setfsuid(0);
        libc::setfsgid(0);
    }
    out
}

/// Raises or drops `CAP_LINUX_IMMUTABLE` in this thread's effective set
/// (kept in its permitted set, so it can be raised again).
fn immutable_cap(on: bool) {
    const CAP_LINUX_IMMUTABLE: u32 = 9;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header { version: 0x2008_0522, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget and capset of this thread, with version 3's header
    // and its two data words.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()), 0);
        let bit = 1 << CAP_LINUX_IMMUTABLE;
        data[0].effective = if on { data[0].effective | bit } else { data[0].effective & !bit };
        assert_eq!(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()), 0);
    }
}

/// `FS_IOC_GETFLAGS` or (`set`) `FS_IOC_SETFLAGS` on an open file.
fn ioctl_flags(fd: i32, set: Option<u32>) -> Result<u32, i32> {
    let mut flags = set.unwrap_or(0) as libc::c_int;
    let cmd = if set.is_some() { libc::FS_IOC_SETFLAGS } else { libc::FS_IOC_GETFLAGS };
    // SAFETY: the command takes a pointer to an int.
    let r = unsafe { libc::ioctl(fd, cmd, &mut flags) };
    if r < 0 { Err(errno(r)) } else { Ok(flags as u32) }
}

/// Runs `f` on `path` opened as `chattr` opens it, if it is a regular
/// file or a directory (`ENOTTY` for anything else).
fn with_flags_of(path: &CString, f: impl FnOnce(i32) -> Result<u32, i32>) -> Result<u32, i32> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW) };
    if fd < 0 {
        return Err(errno(fd));
    }
    let kind = std::fs::metadata(format!("/proc/self/fd/{fd}")).map(|m| m.file_type());
    let r = match kind {
        Ok(k) if k.is_file() || k.is_dir() => f(fd),
        _ => Err(libc::ENOTTY),
    };
    // SAFETY: ours to close.
    unsafe { libc::close(fd) };
    r
}

/// Clears every flag under a tmpfs directory and of itself when
/// dropped, so that it can be removed (an immutable file cannot), even
/// after a failed assertion.
struct Unflag(PathBuf);

impl Drop for Unflag {
    fn drop(&mut self) {
        fn walk(p: &Path) {
            let _ = with_flags_of(&c(p), |fd| ioctl_flags(fd, Some(0)));
            if std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
                for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                    walk(&e.path());
                }
            }
        }
        walk(&self.0);
    }
}

/// The xattr names the sequences use: `user.x0` and the like, and the
/// namespace's prefix alone, which names nothing (`EINVAL`).
const XNAMES: u8 = 4;

fn xname(n: u8) -> String {
    if n == XNAMES - 1 { "user.".into() } else { format!("user.x{n}") }
}

/// The extended attributes the trees compare: the user ones and the
/// ACLs.
fn xnames() -> impl Iterator<Item = String> {
    (0..XNAMES).map(xname).chain([false, true].map(|d| acl_name(d).to_string()))
}

impl Kernel {
    fn path(&self, p: usize) -> CString {
        c(&self.base.join(PATHS[p]))
    }

    fn run(&self, op: &Op, user: bool) -> i32 {
        as_user(user, || {
            // SAFETY: plain system calls on NUL-terminated paths we own.
            unsafe {
                match *op {
                    Op::Create(p, m) => {
                        let fd = libc::open(self.path(p).as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, m);
                        if fd >= 0 {
                            libc::close(fd);
                        }
                        errno(fd)
                    }
                    Op::Mkdir(p, m) => errno(libc::mkdir(self.path(p).as_ptr(), m)),
                    Op::Mknod(p, k) => {
                        let (kind, rdev) = NODES[k];
                        errno(libc::mknod(self.path(p).as_ptr(), kind.mode_bits() | 0o640, rdev))
                    }
                    Op::Symlink(p) => errno(libc::symlink(c"/nonexistent".as_ptr(), self.path(p).as_ptr())),
                    Op::Unlink(p) => errno(libc::unlink(self.path(p).as_ptr())),
                    Op::Rmdir(p) => errno(libc::rmdir(self.path(p).as_ptr())),
                    Op::Rename(a, b, f) => {
                        let flags =
                            [0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE, libc::RENAME_WHITEOUT][f as usize];
                        errno(libc::renameat2(
                            libc::AT_FDCWD,
                            self.path(a).as_ptr(),
                            libc::AT_FDCWD,
                            self.path(b).as_ptr(),
                            flags,
                        ))
                    }
                    Op::Link(a, b) => errno(libc::link(self.path(a).as_ptr(), self.path(b).as_ptr())),
                    Op::Chmod(p, m) => errno(libc::chmod(self.path(p).as_ptr(), m)),
                    Op::Chown(p, u, g) => {
                        let uid = if u { USER } else { u32::MAX };
                        let gid = if g { USER } else { u32::MAX };
                        errno(libc::lchown(self.path(p).as_ptr(), uid, gid))
                    }
                    Op::Truncate(p, s) => errno(libc::truncate(self.path(p).as_ptr(), s as i64)),
                    Op::SetXattr(p, n, f) => {
                        let name = CString::new(xname(n)).unwrap();
                        let flags = [0, libc::XATTR_CREATE, libc::XATTR_REPLACE][f as usize];
                        let v = [n; 3];
                        errno(libc::lsetxattr(self.path(p).as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), flags))
                    }
                    Op::RemoveXattr(p, n) => {
                        let name = CString::new(xname(n)).unwrap();
                        errno(libc::lremovexattr(self.path(p).as_ptr(), name.as_ptr()))
                    }
                    Op::Utime(p, k) => {
                        let spec = |t: Option<TimeSet>| match t {
                            None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
                            Some(TimeSet::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
                            Some(TimeSet::At(ns)) => {
                                libc::timespec { tv_sec: ns / 1_000_000_000, tv_nsec: ns % 1_000_000_000 }
                            }
                        };
                        let times = TIMES[k].map(spec);
                        errno(libc::utimensat(
                            libc::AT_FDCWD,
                            self.path(p).as_ptr(),
                            times.as_ptr(),
                            libc::AT_SYMLINK_NOFOLLOW,
                        ))
                    }
                    Op::Tmpfile(d, l, m, excl) => {
                        let dir = if d == PATHS.len() { c(&self.base) } else { self.path(d) };
                        let flags = libc::O_TMPFILE | libc::O_WRONLY | if excl { libc::O_EXCL } else { 0 };
                        let fd = libc::open(dir.as_ptr(), flags, m);
                        if fd < 0 {
                            return errno(fd);
                        }
                        let proc = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
                        let to = self.path(l);
                        let r = errno(libc::linkat(
                            libc::AT_FDCWD,
                            proc.as_ptr(),
                            libc::AT_FDCWD,
                            to.as_ptr(),
                            libc::AT_SYMLINK_FOLLOW,
                        ));
                        libc::close(fd);
                        r
                    }
                    Op::SetAcl(p, default, k) => {
                        let name = CString::new(acl_name(default)).unwrap();
                        let path = if p == PATHS.len() { c(&self.base) } else { self.path(p) };
                        if k == ACLS.len() {
                            return errno(libc::lremovexattr(path.as_ptr(), name.as_ptr()));
                        }
                        let v = common::acl(ACLS[k]);
                        errno(libc::lsetxattr(path.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0))
                    }
                    Op::Chattr(p, k) => {
                        let path = if p == PATHS.len() { c(&self.base) } else { self.path(p) };
                        with_flags_of(&path, |fd| ioctl_flags(fd, Some(FLAGS[k]))).err().unwrap_or(0)
                    }
                    Op::Write(p, append) => {
                        // Not waiting for a fifo's reader: `ENXIO`.
                        let flags = libc::O_WRONLY | libc::O_NONBLOCK | if append { libc::O_APPEND } else { 0 };
                        let fd = libc::open(self.path(p).as_ptr(), flags);
                        if fd < 0 {
                            return errno(fd);
                        }
                        let r = libc::pwrite(fd, b"abc".as_ptr().cast(), 3, 0);
                        libc::close(fd);
                        errno(r as i32)
                    }
                }
            }
        })
    }
}

/// The namespace side: paths resolved by lookups, as a mount would.
struct Ours {
    ns: Namespace,
    time: i64,
}

fn cred(user: bool) -> Cred {
    if user { Cred { uid: USER, gid: USER, groups: vec![] } } else { Cred::root() }
}

impl Ours {
    /// The parent directory of a path and its last name; a component
    /// that is missing is ENOENT, one that is not a directory ENOTDIR
    /// (symlinks here all dangle: ENOENT, as the kernel finds following
    /// them).
    fn parent<'p>(&self, cred: &Cred, path: &'p str) -> Result<(Ino, &'p [u8]), Errno> {
        let mut dir = ROOT;
        let mut parts: Vec<&str> = path.split('/').collect();
        let last = parts.pop().unwrap();
        for part in parts {
            let a = self.ns.lookup(cred, dir, part.as_bytes())?;
            match a.kind {
                FileType::Directory => dir = a.ino,
                FileType::Symlink => return Err(Errno::ENOENT),
                _ => return Err(Errno::ENOTDIR),
            }
        }
        // The walk searches the last directory too (Linux's
        // link_path_walk checks each before its next name).
        self.ns.lookup(cred, dir, b".")?;
        Ok((dir, last.as_bytes()))
    }

    /// The inode a path names, a final symlink itself (`lchown`,
    /// `lsetxattr`, `link`).
    fn named(&self, cred: &Cred, path: &str) -> Result<Ino, Errno> {
        let (dir, name) = self.parent(cred, path)?;
        Ok(self.ns.lookup(cred, dir, name)?.ino)
    }

    /// The inode a path names, following a final symlink (to nothing).
    fn resolve(&self, cred: &Cred, path: &str) -> Result<Ino, Errno> {
        let ino = self.named(cred, path)?;
        if self.ns.getattr(ino)?.kind == FileType::Symlink {
            return Err(Errno::ENOENT);
        }
        Ok(ino)
    }

    fn run(&mut self, op: &Op, user: bool) -> i32 {
        self.time += 1;
        let now = self.time;
        let cr = cred(user);
        let new = |kind, perm| NewInode { kind, perm, rdev: 0, umask: 0o022 };
        let r: Result<(), Errno> = (|| match *op {
            Op::Create(p, m) => {
                let (d, n) = self.parent(&cr, PATHS[p])?;
                self.ns.create(&cr, d, n, new(FileType::Regular, m), b"", now).map(drop)
            }
            Op::Mkdir(p, m) => {
                let (d, n) = self.parent(&cr, PATHS[p])?;
                self.ns.create(&cr, d, n, new(FileType::Directory, m), b"", now).map(drop)
            }
            Op::Mknod(p, k) => {
                let (d, n) = self.parent(&cr, PATHS[p])?;
                let (kind, rdev) = NODES[k];
                self.ns.create(&cr, d, n, NewInode { rdev, ..new(kind, 0o640) }, b"", now).map(drop)
            }
            Op::Symlink(p) => {
                let (d, n) = self.parent(&cr, PATHS[p])?;
                self.ns.create(&cr, d, n, new(FileType::Symlink, 0o777), b"/nonexistent", now).map(drop)
            }
            Op::Unlink(p) => {
                let (d, n) = self.parent(&cr, PATHS[p])?;
                self.ns.unlink(&cr, d, n, now).map(drop)
            }
            Op::Rmdir(p) => {
                let (d, n) = self.parent(&cr, PATHS[p])?;
                self.ns.rmdir(&cr, d, n, now).map(drop)
            }
            Op::Rename(a, b, f) => {
                let from = self.parent(&cr, PATHS[a])?;
                let to = self.parent(&cr, PATHS[b])?;
                let flags = RenameFlags { noreplace: f == 1, exchange: f == 2, whiteout: f == 3 };
                self.ns.rename(&cr, from, to, flags, now).map(drop)
            }
            Op::Link(a, b) => {
                let ino = self.named(&cr, PATHS[a])?;
                let (d, n) = self.parent(&cr, PATHS[b])?;
                self.ns.link(&cr, ino, d, n, now).map(drop)
            }
            Op::Chmod(p, m) => {
                let ino = self.resolve(&cr, PATHS[p])?;
                self.ns.setattr(&cr, ino, &SetAttr { perm: Some(m), ..SetAttr::default() }, now).map(drop)
            }
            Op::Chown(p, u, g) => {
                let ino = self.named(&cr, PATHS[p])?;
                let set = SetAttr { uid: u.then_some(USER), gid: g.then_some(USER), chown: true, ..SetAttr::default() };
                self.ns.setattr(&cr, ino, &set, now).map(drop)
            }
            Op::Truncate(p, s) => {
                let ino = self.resolve(&cr, PATHS[p])?;
                self.ns.setattr(&cr, ino, &SetAttr { size: Some(s), ..SetAttr::default() }, now).map(drop)
            }
            Op::SetXattr(p, n, f) => {
                let ino = self.named(&cr, PATHS[p])?;
                let mode = [XattrMode::Any, XattrMode::Create, XattrMode::Replace][f as usize];
                self.ns.setxattr(&cr, ino, xname(n).as_bytes(), &[n; 3], mode, now).map(drop)
            }
            Op::RemoveXattr(p, n) => {
                let ino = self.named(&cr, PATHS[p])?;
                self.ns.removexattr(&cr, ino, xname(n).as_bytes(), now).map(drop)
            }
            Op::Utime(p, k) => {
                let ino = self.named(&cr, PATHS[p])?;
                let [atime, mtime] = TIMES[k];
                self.ns.setattr(&cr, ino, &SetAttr { atime, mtime, ..SetAttr::default() }, now).map(drop)
            }
            Op::Tmpfile(d, l, m, excl) => {
                let dir = if d == PATHS.len() { ROOT } else { self.resolve(&cr, PATHS[d])? };
                if self.ns.getattr(dir)?.kind != FileType::Directory {
                    return Err(Errno::ENOTDIR);
                }
                let (t, _) = self.ns.tmpfile(&cr, dir, (m, 0o022), !excl, now)?;
                let linked = self.parent(&cr, PATHS[l]).and_then(|(d, n)| self.ns.link(&cr, t.ino, d, n, now));
                self.ns.release(&cr, t.ino)?;
                linked.map(drop)
            }
            Op::SetAcl(p, default, k) => {
                let ino = if p == PATHS.len() { ROOT } else { self.named(&cr, PATHS[p])? };
                let name = acl_name(default).as_bytes();
                if k == ACLS.len() {
                    return self.ns.removexattr(&cr, ino, name, now).map(drop);
                }
                self.ns.setxattr(&cr, ino, name, &common::acl(ACLS[k]), XattrMode::Any, now).map(drop)
            }
            Op::Chattr(p, k) => {
                let ino = if p == PATHS.len() { ROOT } else { self.named(&cr, PATHS[p])? };
                let a = self.ns.getattr(ino)?;
                match a.kind {
                    FileType::Symlink => return Err(Errno(libc::ELOOP)),
                    // What `open` finds: the character device 0:0 has
                    // no driver.
                    FileType::CharDevice if a.rdev == 0 => {
                        self.ns.open(&cr, ino, 4)?;
                        self.ns.release(&cr, ino)?;
                        return Err(Errno::ENXIO);
                    }
                    _ => {}
                }
                self.ns.open(&cr, ino, 4)?;
                let set = self.ns.set_flags(&cr, ino, FLAGS[k], now);
                self.ns.release(&cr, ino)?;
                set.map(drop)
            }
            Op::Write(p, append) => {
                let ino = self.resolve(&cr, PATHS[p])?;
                let a = self.ns.getattr(ino)?;
                if a.kind == FileType::Directory {
                    return Err(Errno::EISDIR);
                }
                self.ns.open(&cr, ino, 2 | if append { WANT_APPEND } else { 0 })?;
                let wrote = match a.kind {
                    FileType::Regular => {
                        let who = interlock_meta::Caller { cred: &cr, opened: true };
                        self.ns.write_with(who, ino, (if append { None } else { Some(0) }, 3), now, |_| Ok(0))
                    }
                    // A fifo has no reader (the open does not wait: see
                    // `Kernel::run`); the character device 0:0 no driver.
                    FileType::Fifo | FileType::CharDevice if a.rdev == 0 => Err(Errno::ENXIO),
                    // The other device node is `/dev/null`'s.
                    _ => Ok((a, 0)),
                };
                self.ns.release(&cr, ino)?;
                wrote.map(drop)
            }
        })();
        r.err().map_or(0, |e| e.0)
    }
}

/// A tree as both sides are compared: path → (type, mode, nlink, size,
/// uid, gid, attribute flags, user xattrs and ACLs).
type Tree = BTreeMap<String, (u32, u32, u64, u64, u32, u32, u32, Vec<(String, Vec<u8>)>)>;

fn kernel_tree(base: &Path) -> Tree {
    fn walk(base: &Path, rel: &str, out: &mut Tree) {
        for e in std::fs::read_dir(base.join(rel)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let m = std::fs::symlink_metadata(base.join(&path)).unwrap();
            let mut xattrs = Vec::new();
            if !m.file_type().is_symlink() {
                for n in xnames() {
                    let cpath = c(&base.join(&path));
                    let cname = CString::new(n.clone()).unwrap();
                    let mut buf = [0u8; 256];
                    // SAFETY: a buffer of the length given.
                    let len =
                        unsafe { libc::lgetxattr(cpath.as_ptr(), cname.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
                    if len >= 0 {
                        xattrs.push((n, buf[..len as usize].to_vec()));
                    }
                }
            }
            let size = if m.is_dir() { 0 } else { m.size() };
            let flags = kernel_flags(&base.join(&path));
            out.insert(
                path.clone(),
                (m.mode() & libc::S_IFMT, m.mode() & 0o7777, m.nlink(), size, m.uid(), m.gid(), flags, xattrs),
            );
            if m.is_dir() {
                walk(base, &path, out);
            }
        }
    }
    let mut out = Tree::new();
    walk(base, "", &mut out);
    out
}

/// A path's attribute flags on tmpfs (0 for a node that has none).
fn kernel_flags(path: &Path) -> u32 {
    with_flags_of(&c(path), |fd| ioctl_flags(fd, None)).unwrap_or(0)
}

fn our_tree(ns: &Namespace) -> Tree {
    fn walk(ns: &Namespace, dir: Ino, rel: &str, out: &mut Tree) {
        for e in ns.readdir(&Cred::root(), dir, 0, usize::MAX).unwrap() {
            let name = String::from_utf8(e.name.clone()).unwrap();
            let path = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let a = ns.getattr(e.ino).unwrap();
            let mut xattrs = Vec::new();
            if a.kind != FileType::Symlink {
                for n in xnames() {
                    if let Ok(v) = ns.getxattr(&Cred::root(), e.ino, n.as_bytes()) {
                        xattrs.push((n, v));
                    }
                }
            }
            let size = if a.kind == FileType::Directory { 0 } else { a.size };
            let flags = ns.flags(e.ino).unwrap_or(0);
            out.insert(path.clone(), (a.kind.mode_bits(), a.perm, a.nlink as u64, size, a.uid, a.gid, flags, xattrs));
            if a.kind == FileType::Directory {
                walk(ns, e.ino, &path, out);
            }
        }
    }
    let mut out = Tree::new();
    walk(ns, ROOT, "", &mut out);
    out
}

fn usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let shm = std::fs::metadata("/dev/shm").is_ok_and(|m| m.is_dir());
    if !root || !shm {
        eprintln!("SKIPPED: the kernel differential test needs root and a tmpfs at /dev/shm");
    }
    root && shm
}

proptest! {
    // 1000 sequences by default; PROPTEST_CASES sets another number.
    #![proptest_config(ProptestConfig {
        cases: common::cases(1000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_namespace_behaves_as_tmpfs(ops in proptest::collection::vec((op((0..PATHS.len()).boxed(), 1), any::<bool>()), 1..60)) {
        run(&ops)?;
    }

    /// The same on four paths (two files, a directory, a file in it) with
    /// many `chattr`s and writes, so that what a flag forbids is tried
    /// often (on all the paths, a refusal for a flag of a file comes
    /// about ten times in 1,000 sequences).
    #[test]
    fn the_attribute_flags_refuse_what_tmpfs_refuses(
        ops in proptest::collection::vec((op(proptest::sample::select(vec![0, 1, 2, 4]).boxed(), 6), any::<bool>()), 1..40)
    ) {
        run(&ops)?;
    }
}

/// Runs `ops` (each as the user or root) on both sides: the same errno
/// for each, then the same tree.
fn run(ops: &[(Op, bool)]) -> Result<(), TestCaseError> {
    if !usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let kernel = Kernel { base: dir.path().to_path_buf() };
    let _unflag = Unflag(dir.path().to_path_buf());
    let mut ours = Ours { ns: Namespace::new(1, 0), time: 0 };
    // SAFETY: umask has no preconditions; 022 as the namespace side applies.
    unsafe { libc::umask(0o022) };
    for (i, (op, user)) in ops.iter().enumerate() {
        let k = kernel.run(op, *user);
        let o = ours.run(op, *user);
        prop_assert_eq!(
            o,
            k,
            "op {} {:?} as {}: ours {}, kernel {}",
            i,
            op,
            if *user { "user" } else { "root" },
            Errno(o),
            Errno(k)
        );
    }
    prop_assert_eq!(our_tree(&ours.ns), kernel_tree(dir.path()));
    prop_assert_eq!(ours.ns.flags(ROOT), Ok(kernel_flags(dir.path())), "the top directory's flags");
    Ok(())
}
