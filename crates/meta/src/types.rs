//! The namespace's vocabulary: inode numbers, file types, attributes,
//! callers' credentials, the changes `setattr` makes.

use serde::{Deserialize, Serialize};

/// An inode number. Never reused within a namespace's life.
pub type Ino = u64;

/// The root directory.
pub const ROOT: Ino = 1;

/// Time in nanoseconds since the Unix epoch (1677 to 2262).
pub type Nanos = i64;

/// Longest name, in bytes.
pub const NAME_MAX: usize = 255;
/// Most hard links to one inode (as ext4).
pub const LINK_MAX: u32 = 65_000;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Longest extended attribute name and value, in bytes.
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_SIZE_MAX: usize = 65_536;
/// Longest list of extended attribute names (each with its NUL), in
/// bytes: Linux's `listxattr(2)` answers `E2BIG` past it.
pub const XATTR_LIST_MAX: usize = 65_536;
/// Largest file size (as ext4 with 4 KiB blocks: 16 TiB).
pub const FILE_SIZE_MAX: u64 = 16 << 40;
/// The block size `statfs` reports, and counts space in.
pub const STATFS_BLOCK: u32 = 4096;
/// The most inodes `statfs` reports, used and free: no table of inodes
/// bounds them, and a count past 2^32 would fail a 32-bit program's
/// `statfs(2)` with `EOVERFLOW`.
pub const FILES_MAX: u64 = 1 << 32;
/// What tmpfs counts per directory entry in a directory's size.
pub const DIRENT_SIZE: u64 = 20;

/// File attribute flags (`chattr`, `lsattr`; Linux's `FS_*_FL`, the
/// values of `FS_IOC_GETFLAGS`). The namespace keeps the four tmpfs
/// keeps, [`KEPT_FLAGS`], and enforces the first two.
///
/// Immutable (`chattr +i`): no change to the inode at all (data, size,
/// attributes, extended attributes, links, its names) and, for a
/// directory, none to its entries; only the flags themselves change.
pub const FLAG_IMMUTABLE: u32 = 0x10;
/// Append-only (`chattr +a`): data is only added at the end (opened for
/// writing only with `O_APPEND`), never cut; no attribute or extended
/// attribute set, no link made to it, no name of it removed; a
/// directory's entries may be made but not removed.
pub const FLAG_APPEND: u32 = 0x20;
/// No dump (`chattr +d`): kept, for backup tools to read.
pub const FLAG_NODUMP: u32 = 0x40;
/// No atime updates (`chattr +A`): kept (a mount updates no atime).
pub const FLAG_NOATIME: u32 = 0x80;
/// The flags an inode keeps; setting any other is `EOPNOTSUPP`, as on
/// tmpfs.
pub const KEPT_FLAGS: u32 = FLAG_IMMUTABLE | FLAG_APPEND | FLAG_NODUMP | FLAG_NOATIME;
/// In an open's `want`, beside `access(2)`'s bits: the open is
/// `O_APPEND`, the only way an append-only file opens for writing.
pub const WANT_APPEND: u32 = 0x100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileType {
    /// The `S_IF*` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
        }
    }

    /// The type in a mode's `S_IFMT` bits.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::Regular,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            _ => return None,
        })
    }
}

/// An inode's attributes, as `stat` shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileType,
    /// Permission bits with setuid, setgid and sticky (`mode & 07777`).
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    /// What its data takes on the server's disk, in 512-byte blocks
    /// (`st_blocks`): its data file's, as the local file system counted
    /// them after the last change; 0 for anything else. Below `size`
    /// over 512 for a sparse file, which is how `du` and `cp` tell one.
    pub blocks: u64,
    pub atime: Nanos,
    pub mtime: Nanos,
    pub ctime: Nanos,
    /// It has a POSIX ACL, access or default (version 21): a mount that
    /// knows an inode has none answers the kernel's look for one itself,
    /// with no round trip (the kernel looks at a file's ACL before it
    /// lets anyone but its owner at it).
    pub acl: bool,
}

impl Attr {
    /// The whole `st_mode`.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm
    }
}

/// Who asks: every request carries the caller's ids, and the namespace
/// checks permissions with them (as the kernel would on a local file
/// system).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn root() -> Cred {
        Cred { uid: 0, gid: 0, groups: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether [`Cred::squash`] would change these ids: uid 0, or gid 0
    /// among the groups. O(groups).
    pub fn has_root_ids(&self) -> bool {
        self.uid == 0 || self.in_group(0)
    }

    /// Squashes root, as an NFS server's `root_squash` does: a uid 0
    /// becomes `anon.0`, and a gid 0 (the primary group, or one of the
    /// supplementary groups) `anon.1`; other ids are kept. For a server
    /// that trusts its clients' hosts but not their root users.
    /// O(groups).
    pub fn squash(&mut self, anon: (u32, u32)) {
        if self.uid == 0 {
            self.uid = anon.0;
        }
        for gid in std::iter::once(&mut self.gid).chain(&mut self.groups) {
            if *gid == 0 {
                *gid = anon.1;
            }
        }
    }
}

/// Who uses a file's data, and how that use is checked: with `opened`,
/// through a handle opened for it, whose access was checked then (Linux
/// checks an open file's access once, at `open`: a chmod after it takes
/// nothing from the handle); otherwise on each call. Either way a write's
/// dropped setuid and setgid are `cred`'s to decide (Linux's
/// `file_remove_privs` looks at the writer, not at who opened the file).
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub cred: &'a Cred,
    pub opened: bool,
}

impl<'a> Caller<'a> {
    /// A call checked on its own: no handle vouches for it.
    pub fn checked(cred: &'a Cred) -> Caller<'a> {
        Caller { cred, opened: false }
    }
}

impl<'a> From<&'a Cred> for Caller<'a> {
    fn from(cred: &'a Cred) -> Caller<'a> {
        Caller::checked(cred)
    }
}

/// A time to set: now, or a given time (`utimensat`'s `UTIME_NOW` and a
/// value; `UTIME_OMIT` is `None` in [`SetAttr`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    At(Nanos),
}

/// What `setattr` changes; `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// Permission bits (`& 07777`).
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The caller holds the file open for writing (`ftruncate`): the
    /// write permission was checked at open.
    pub opened_for_write: bool,
    /// A `chown` (its ids may both be -1, `None` here): it clears setuid
    /// and setgid on non-directories even then, as Linux does.
    pub chown: bool,
}

/// `rename` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    /// `RENAME_NOREPLACE`: fail with `EEXIST` rather than replace.
    pub noreplace: bool,
    /// `RENAME_EXCHANGE`: swap the two names.
    pub exchange: bool,
    /// `RENAME_WHITEOUT` (not with `exchange`): leave a whiteout at the
    /// old name, a character device 0:0, in the same step (what an
    /// overlay file system's upper layer asks for).
    pub whiteout: bool,
}

/// `setxattr` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Any,
    /// `XATTR_CREATE`: fail with `EEXIST` if it exists.
    Create,
    /// `XATTR_REPLACE`: fail with `ENODATA` if it does not.
    Replace,
}

/// What `fallocate(2)` does to a range of a regular file: the modes
/// Linux's VFS lets through to a FUSE file system, each with its mode
/// bits (the kernel's, which a mount receives and the data file is given)
/// converted here and nowhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fallocate {
    /// Space for the range is reserved (mode 0: `posix_fallocate`), and
    /// the file grows to the range's end unless `keep_size`
    /// (`FALLOC_FL_KEEP_SIZE`).
    Allocate { keep_size: bool },
    /// The range becomes a hole and reads as zeros; the size stays
    /// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`, the only way Linux
    /// allows a punch).
    PunchHole,
    /// The range reads as zeros, its space reserved (`FALLOC_FL_ZERO_RANGE`),
    /// and the file grows to its end unless `keep_size`. Served where the
    /// server's own file system does it (ext4 and XFS do; tmpfs does not:
    /// `EOPNOTSUPP`).
    ZeroRange { keep_size: bool },
}

impl Fallocate {
    /// Every mode served.
    pub const ALL: [Fallocate; 5] = [
        Fallocate::Allocate { keep_size: false },
        Fallocate::Allocate { keep_size: true },
        Fallocate::PunchHole,
        Fallocate::ZeroRange { keep_size: false },
        Fallocate::ZeroRange { keep_size: true },
    ];

    /// The mode of `fallocate(2)`'s `mode` bits (the one whose
    /// [`mode`](Fallocate::mode) they are); `EOPNOTSUPP` for the others
    /// (collapse, insert, unshare, write-zeroes, a punch that would change
    /// the size), as a file system that cannot do them answers.
    pub fn from_mode(mode: u32) -> Result<Fallocate, crate::Errno> {
        Fallocate::ALL.into_iter().find(|how| how.mode() == mode).ok_or(crate::Errno::EOPNOTSUPP)
    }

    /// Its `fallocate(2)` mode bits.
    pub fn mode(self) -> u32 {
        let keep = |k: bool| if k { libc::FALLOC_FL_KEEP_SIZE as u32 } else { 0 };
        match self {
            Fallocate::Allocate { keep_size } => keep(keep_size),
            Fallocate::PunchHole => (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32,
            Fallocate::ZeroRange { keep_size } => libc::FALLOC_FL_ZERO_RANGE as u32 | keep(keep_size),
        }
    }

    /// Whether the file may grow to the range's end.
    pub fn grows(self) -> bool {
        matches!(self, Fallocate::Allocate { keep_size: false } | Fallocate::ZeroRange { keep_size: false })
    }
}

/// What `lseek(2)` looks for past an offset: the next data
/// (`SEEK_DATA`) or the next hole (`SEEK_HOLE`; the end of the file is
/// one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeekTo {
    Data,
    Hole,
}

/// Where a read may take a file's bytes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// The page cache only: a read that would wait for the disk is not
    /// made, and fails with `EAGAIN` (a server's worker, which serves
    /// other connections, tries this first and hands the rest to a
    /// thread that may wait).
    Cache,
    /// The disk if need be.
    Disk,
}

/// One entry of a directory listing. `cookie` resumes the listing after
/// this entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileType,
    pub cookie: u64,
}

/// `statfs`: the namespace's counts, and the space of the file system
/// that holds its files' data (in `block_size` units; zero for a
/// namespace with no store).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    /// Inodes in use.
    pub files: u64,
    /// Inodes that may still be made (version 20): by the namespace's
    /// memory budget, at most [`FILES_MAX`] with `files`.
    pub files_free: u64,
    pub name_max: u32,
    pub block_size: u32,
    pub blocks: u64,
    pub free: u64,
    /// Free to an unprivileged user.
    pub available: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each mode served has Linux's bits, and every other combination of
    /// the bits Linux defines is `EOPNOTSUPP`.
    #[test]
    fn fallocate_modes_have_linuxs_bits_and_the_rest_are_refused() {
        use libc::{FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH, FALLOC_FL_ZERO_RANGE as ZERO};
        let bits = [0, KEEP, PUNCH | KEEP, ZERO, ZERO | KEEP].map(|b| b as u32);
        assert_eq!(Fallocate::ALL.map(Fallocate::mode), bits);
        for mode in 0..0x80u32 {
            let served = bits.iter().position(|&b| b == mode).map(|at| Fallocate::ALL[at]);
            assert_eq!(Fallocate::from_mode(mode).ok(), served, "mode {mode:#x}");
        }
        assert_eq!(Fallocate::from_mode(PUNCH as u32), Err(crate::Errno::EOPNOTSUPP), "a punch must keep the size");
    }

    /// Root squash maps uid 0 and every gid 0 to the anonymous ids, and
    /// nothing else.
    #[test]
    fn squashing_maps_root_ids_alone() {
        let squashed = |mut c: Cred| {
            c.squash((65534, 65533));
            c
        };
        let root = Cred { uid: 0, gid: 0, groups: vec![4, 0, 27] };
        assert_eq!(squashed(root), Cred { uid: 65534, gid: 65533, groups: vec![4, 65533, 27] });
        let user = Cred { uid: 1000, gid: 1000, groups: vec![24, 1000] };
        assert_eq!(squashed(user.clone()), user);
        let setgid_root = Cred { uid: 1000, gid: 0, groups: Vec::new() };
        assert_eq!(squashed(setgid_root.clone()), Cred { uid: 1000, gid: 65533, groups: Vec::new() });
        // `has_root_ids` says which a squash changes.
        let in_root_group = Cred { uid: 1000, gid: 1000, groups: vec![0] };
        for c in [Cred::root(), setgid_root, in_root_group, user] {
            assert_eq!(c.has_root_ids(), squashed(c.clone()) != c, "{c:?}");
        }
    }
}
