//! The FUSE kernel protocol (`linux/fuse.h`), as much of it as the mount
//! speaks: request parsing and reply encoding, by hand, in native byte
//! order (the kernel's). No I/O here.
//!
//! A request is one `read` of `/dev/fuse`: a 40-byte `fuse_in_header`
//! (length, opcode, unique id, node id, the caller's uid, gid and pid)
//! then the opcode's arguments. A reply is one `write`: a 16-byte
//! `fuse_out_header` (length, -errno, the request's unique id) then the
//! opcode's answer. Notifications are replies with unique id 0 and the
//! notification's code in the error field.

use interlock_client::meta::{Attr, FileType};

/// The protocol version we speak: 7.39 adds `FUSE_DIRECT_IO_ALLOW_MMAP`.
pub const MAJOR: u32 = 7;
pub const MINOR: u32 = 39;

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const RENAME2: u32 = 45;
    pub const TMPFILE: u32 = 51;
}

/// `fuse_init_out` flags (bits 32.. go in `flags2`).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    /// The bits that change an attribute (not `FH`, `LOCKOWNER`, `CTIME`).
    pub const CHANGES: u32 = MODE | UID | GID | SIZE | ATIME | MTIME | ATIME_NOW | MTIME_NOW;
}

pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// Writes that do not extend the file (nor append) may run at once: the
/// kernel takes the inode's lock shared for them (Linux 6.2; older
/// kernels ignore the bit).
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// The `FOPEN_*` flags of an open with `flags`: data never cached; and
/// for an `O_DIRECT` open, writes in parallel. The kernel takes a file's
/// lock for each write, which keeps two `write(2)`s from interleaving
/// (POSIX has them atomic with respect to each other, and a write larger
/// than a request goes out in several); `O_DIRECT` asks for no such
/// promise (ext4 and XFS run such writes at once too), and a program
/// that writes one file from many processes at distinct offsets (MPI-IO,
/// a database) then gets their writes in flight together: 16 writers of
/// 4 KiB made 4-5 times as many writes a second (session 41).
pub fn fopen(flags: u32) -> u32 {
    if flags as i32 & libc::O_DIRECT != 0 { FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES } else { FOPEN_DIRECT_IO }
}
pub const LK_FLOCK: u32 = 1 << 0;
pub const NOTIFY_INVAL_INODE: i32 = 2;

pub const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// `fuse_in_header`.
#[derive(Clone, Copy, Debug)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
#[error("malformed FUSE request: {0}")]
pub struct Malformed(pub &'static str);

/// A cursor over a request's arguments.
pub struct Args<'a> {
    buf: &'a [u8],
}

impl<'a> Args<'a> {
    pub fn new(buf: &'a [u8]) -> Args<'a> {
        Args { buf }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.buf.len() < n {
            return Err(Malformed("arguments too short"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_ne_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_ne_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }

    pub fn skip(&mut self, n: usize) -> Result<(), Malformed> {
        self.bytes(n).map(drop)
    }

    /// A NUL-terminated string (a name), without its NUL.
    pub fn cstr(&mut self) -> Result<&'a [u8], Malformed> {
        let end = self.buf.iter().position(|&b| b == 0).ok_or(Malformed("a name without its NUL"))?;
        let s = self.bytes(end + 1)?;
        Ok(&s[..end])
    }

    /// What is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

/// Splits one read of `/dev/fuse` into its header and arguments.
pub fn parse(buf: &[u8]) -> Result<(InHeader, &[u8]), Malformed> {
    let mut a = Args::new(buf);
    let len = a.u32()? as usize;
    if len != buf.len() || len < IN_HEADER {
        return Err(Malformed("length does not match the read"));
    }
    let h =
        InHeader { opcode: a.u32()?, unique: a.u64()?, nodeid: a.u64()?, uid: a.u32()?, gid: a.u32()?, pid: a.u32()? };
    a.skip(4)?;
    Ok((h, a.rest()))
}

/// A reply: the header then `body`, ready for one write.
pub fn reply(unique: u64, result: Result<&[u8], i32>) -> Vec<u8> {
    let (error, body): (i32, &[u8]) = match result {
        Ok(b) => (0, b),
        Err(e) => (-e, &[]),
    };
    let mut out = Vec::with_capacity(OUT_HEADER + body.len());
    put32(&mut out, (OUT_HEADER + body.len()) as u32);
    out.extend_from_slice(&error.to_ne_bytes());
    put64(&mut out, unique);
    out.extend_from_slice(body);
    out
}

/// A notification (`code` is a `NOTIFY_*`).
pub fn notify(code: i32, body: &[u8]) -> Vec<u8> {
    let mut out = reply(0, Ok(body));
    out[4..8].copy_from_slice(&code.to_ne_bytes());
    out
}

pub fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_ne_bytes());
}

pub fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_ne_bytes());
}

/// How long the kernel may keep a name or attributes.
#[derive(Clone, Copy, Debug)]
pub struct Ttl {
    pub entry: std::time::Duration,
    pub attr: std::time::Duration,
}

fn put_ttl(out: &mut Vec<u8>, d: std::time::Duration) {
    put64(out, d.as_secs());
}

fn split_time(t: i64) -> (u64, u32) {
    (t.div_euclid(1_000_000_000) as u64, t.rem_euclid(1_000_000_000) as u32)
}

/// `fuse_attr` (88 bytes).
pub fn put_attr(out: &mut Vec<u8>, a: &Attr) {
    put64(out, a.ino);
    put64(out, a.size);
    put64(out, a.blocks);
    let (at, an) = split_time(a.atime);
    let (mt, mn) = split_time(a.mtime);
    let (ct, cn) = split_time(a.ctime);
    for s in [at, mt, ct] {
        put64(out, s);
    }
    for n in [an, mn, cn] {
        put32(out, n);
    }
    put32(out, a.mode());
    put32(out, a.nlink);
    put32(out, a.uid);
    put32(out, a.gid);
    put32(out, a.rdev as u32);
    put32(out, 4096);
    put32(out, 0);
}

/// `fuse_entry_out` (128 bytes).
pub fn put_entry(out: &mut Vec<u8>, a: &Attr, ttl: Ttl) {
    put64(out, a.ino);
    put64(out, 0);
    put_ttl(out, ttl.entry);
    put_ttl(out, ttl.attr);
    put32(out, ttl.entry.subsec_nanos());
    put32(out, ttl.attr.subsec_nanos());
    put_attr(out, a);
}

pub fn entry(a: &Attr, ttl: Ttl) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    put_entry(&mut out, a, ttl);
    out
}

/// `fuse_attr_out` (104 bytes).
pub fn attr_out(a: &Attr, ttl: Ttl) -> Vec<u8> {
    let mut out = Vec::with_capacity(104);
    put_ttl(&mut out, ttl.attr);
    put32(&mut out, ttl.attr.subsec_nanos());
    put32(&mut out, 0);
    put_attr(&mut out, a);
    out
}

/// `fuse_write_out`: how many bytes a write (or copy) took.
pub fn write_out(size: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(8);
    put32(&mut out, size);
    put32(&mut out, 0);
    out
}

/// `fuse_open_out`.
pub fn open_out(fh: u64, flags: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    put64(&mut out, fh);
    put32(&mut out, flags);
    put32(&mut out, 0);
    out
}

/// `DT_*` of a file type, for directory entries.
pub fn dtype(kind: FileType) -> u32 {
    kind.mode_bits() >> 12
}

/// Appends a `fuse_dirent` if it fits in `max` bytes; whether it did.
pub fn put_dirent(out: &mut Vec<u8>, max: usize, ino: u64, cookie: u64, kind: u32, name: &[u8]) -> bool {
    let len = (24 + name.len()).next_multiple_of(8);
    if out.len() + len > max {
        return false;
    }
    put64(out, ino);
    put64(out, cookie);
    put32(out, name.len() as u32);
    put32(out, kind);
    out.extend_from_slice(name);
    out.resize(out.len() + (len - 24 - name.len()), 0);
    true
}

/// The size of a `fuse_direntplus` holding `name`.
pub fn direntplus_len(name: &[u8]) -> usize {
    128 + (24 + name.len()).next_multiple_of(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> Attr {
        Attr {
            ino: 7,
            kind: FileType::Regular,
            perm: 0o644,
            nlink: 1,
            uid: 1,
            gid: 2,
            rdev: 0,
            size: 1000,
            blocks: 8,
            atime: -1,
            mtime: 1_500_000_000,
            ctime: 0,
            acl: false,
        }
    }

    #[test]
    fn structures_have_the_kernels_sizes() {
        let ttl = Ttl { entry: std::time::Duration::from_millis(1500), attr: std::time::Duration::ZERO };
        assert_eq!(entry(&attr(), ttl).len(), 128);
        assert_eq!(attr_out(&attr(), ttl).len(), 104);
        assert_eq!(open_out(1, 0).len(), 16);
        let e = entry(&attr(), ttl);
        assert_eq!(u64::from_ne_bytes(e[16..24].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(e[32..36].try_into().unwrap()), 500_000_000);
        // fuse_attr from byte 40: ino, size, then blocks as the server
        // counted them (not the size's).
        assert_eq!(u64::from_ne_bytes(e[56..64].try_into().unwrap()), 8);
        let mut d = Vec::new();
        assert!(put_dirent(&mut d, 100, 7, 3, dtype(FileType::Directory), b"abc"));
        assert_eq!(d.len(), 32);
        assert_eq!(u32::from_ne_bytes(d[20..24].try_into().unwrap()), libc::DT_DIR as u32);
        assert!(!put_dirent(&mut d, 40, 7, 3, 0, b"abc"));
        assert_eq!(direntplus_len(b"abc"), 160);
    }

    #[test]
    fn times_before_the_epoch_split_into_seconds_and_nanoseconds() {
        assert_eq!(split_time(-1), (u64::MAX, 999_999_999));
        assert_eq!(split_time(1_500_000_000), (1, 500_000_000));
    }

    #[test]
    fn a_request_is_parsed_and_a_short_one_refused() {
        let mut buf = Vec::new();
        put32(&mut buf, 48);
        put32(&mut buf, op::LOOKUP);
        put64(&mut buf, 9);
        put64(&mut buf, 1);
        for v in [5u32, 6, 7, 0] {
            put32(&mut buf, v);
        }
        buf.extend_from_slice(b"name\0\0\0\0");
        let (h, args) = parse(&buf).unwrap();
        assert_eq!((h.opcode, h.unique, h.nodeid, h.uid, h.gid, h.pid), (op::LOOKUP, 9, 1, 5, 6, 7));
        assert_eq!(Args::new(args).cstr().unwrap(), b"name");
        assert!(parse(&buf[..47]).is_err());
        assert!(Args::new(b"abc").cstr().is_err());
        let r = reply(9, Err(libc::ENOENT));
        assert_eq!(r.len(), 16);
        assert_eq!(i32::from_ne_bytes(r[4..8].try_into().unwrap()), -libc::ENOENT);
    }
}
