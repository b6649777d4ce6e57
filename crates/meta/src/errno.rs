//! Errors as the errno values a file system returns: the mount hands them
//! to the kernel verbatim.

/// A Linux errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

/// A failed system call's errno (nix's), as the file system returns it.
impl From<nix::errno::Errno> for Errno {
    fn from(e: nix::errno::Errno) -> Errno {
        Errno(e as i32)
    }
}

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    /// Attribute flags asked of an inode that has none (see
    /// `Namespace::flags`).
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    /// A read from the page cache only would wait for the disk.
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    /// An inode a request named by number is gone (the server's answer;
    /// see `interlock_proto::meta::MetaOp::inodes`).
    pub const ESTALE: Errno = Errno(libc::ESTALE);
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}

pub type Result<T> = std::result::Result<T, Errno>;
