//! Attaching `/dev/fuse` to a directory and detaching it.
//!
//! As root, the mount is made with mount(2) directly: `allow_other`
//! (every user of the machine goes through it, as with NFS and Lustre)
//! and `default_permissions` (the kernel checks the mode bits too, so
//! `access(2)` answers right; the server checks every request again with
//! the caller's ids). Unmounting: `umount2`, lazily if the mount is busy.
//!
//! Any other user mounts through `fusermount3` (the setuid helper of the
//! `fuse3` package), as every FUSE file system does: it opens the device,
//! makes the mount for that user alone (the kernel lets no one else in,
//! root included, unless the mount asks for `allow_other`, which
//! `/etc/fuse.conf` must allow), and
//! hands the device back over a socket (`_FUSE_COMMFD`). It also
//! unmounts (`fusermount3 -u`).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

/// Why the mount could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(
        "/dev/fuse is missing or cannot be opened ({0}); load the fuse module (modprobe fuse) or, in a container, pass the device through"
    )]
    NoDevice(std::io::Error),
    #[error(
        "cannot run fusermount3 ({0}), which mounts for users other than root: install the fuse3 package, or mount as root"
    )]
    NoHelper(std::io::Error),
    #[error("fusermount3 could not mount {0} (it said why above)")]
    Helper(PathBuf),
    #[error("mount point {0}: {1}")]
    MountPoint(PathBuf, String),
    #[error(
        "mount point {0} is busy: something is mounted there already (unmount it with `fusermount3 -u {0}` or `umount {0}`)"
    )]
    Busy(PathBuf),
    #[error(
        "mount point {0} is left by an interlock mount process that ended, and unmounting it failed ({1}): unmount it with `fusermount3 -u {0}` or `umount -l {0}`"
    )]
    Dead(PathBuf, Errno),
    #[error("mount(2) of {0} failed: {1}")]
    Mount(PathBuf, Errno),
}

/// Mount options.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    pub read_only: bool,
    /// A user's mount open to every user of the machine (root's always
    /// is); `fusermount3` allows it only where `/etc/fuse.conf` says
    /// `user_allow_other`.
    pub allow_other: bool,
}

/// Opens `/dev/fuse` and mounts it at `path`; the device, whose reads are
/// the kernel's requests.
pub fn mount(path: &Path, options: &MountOptions) -> Result<File, MountError> {
    let path = check(path)?;
    if !nix::unistd::Uid::effective().is_root() {
        return user_mount(&path, options);
    }
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/fuse")
        .map_err(MountError::NoDevice)?;
    let opts = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions,max_read={}",
        dev.as_raw_fd(),
        crate::session::MAX_WRITE
    );
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME;
    if options.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    // "fuse.interlock" names us in /proc/mounts; kernels without
    // subtypes take plain "fuse".
    let mut r = nix::mount::mount(Some("interlock"), &path, Some("fuse.interlock"), flags, Some(opts.as_str()));
    if r == Err(Errno::ENODEV) {
        r = nix::mount::mount(Some("interlock"), &path, Some("fuse"), flags, Some(opts.as_str()));
    }
    r.map_err(|e| MountError::Mount(path.clone(), e))?;
    Ok(dev)
}

/// Mounts `path` through `fusermount3`, for the user who runs us; the
/// device it hands back, made non-blocking as the root mount's is.
fn user_mount(path: &Path, options: &MountOptions) -> Result<File, MountError> {
    use rustix::net::{AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SocketFlags, SocketType};
    let io = |e: rustix::io::Errno| MountError::NoHelper(e.into());
    // Ours closes on exec; theirs is inherited by fusermount3.
    let (ours, theirs) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None).map_err(io)?;
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).map_err(io)?;
    let opts = format!(
        "default_permissions,max_read={},fsname=interlock,subtype=interlock,nosuid,nodev,noatime{}{}",
        crate::session::MAX_WRITE,
        if options.read_only { ",ro" } else { "" },
        if options.allow_other { ",allow_other" } else { "" }
    );
    let status = std::process::Command::new("fusermount3")
        .arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(path)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .status()
        .map_err(MountError::NoHelper)?;
    drop(theirs);
    if !status.success() {
        return Err(MountError::Helper(path.to_path_buf()));
    }
    // Mounted: a failure from here on takes the mount down again.
    let taken = || -> rustix::io::Result<File> {
        let mut byte = [0u8; 1];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        rustix::net::recvmsg(&ours, &mut [std::io::IoSliceMut::new(&mut byte)], &mut control, RecvFlags::empty())?;
        let dev = control
            .drain()
            .find_map(|m| match m {
                RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
                _ => None,
            })
            .ok_or(rustix::io::Errno::PROTO)?;
        let flags = rustix::fs::fcntl_getfl(&dev)?;
        rustix::fs::fcntl_setfl(&dev, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(File::from(dev))
    };
    taken().map_err(|e| {
        let _ = helper_unmount(path);
        MountError::Mount(path.to_path_buf(), Errno::from_raw(e.raw_os_error()))
    })
}

/// The mount point, made absolute: an existing directory nothing is
/// mounted on.
pub fn check(path: &Path) -> Result<PathBuf, MountError> {
    let bad = |m: String| MountError::MountPoint(path.to_path_buf(), m);
    let meta = std::fs::metadata(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTCONN) => MountError::Busy(path.to_path_buf()),
        _ => bad(e.to_string()),
    })?;
    if !meta.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let abs = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
    if is_mounted(&abs) {
        return Err(MountError::Busy(abs));
    }
    Ok(abs)
}

/// Whether something is mounted at `path` (absolute), per the kernel's
/// mount table.
pub fn is_mounted(path: &Path) -> bool {
    top_mount(path).is_some()
}

/// The source and type of what is mounted at `path` (absolute) on top
/// of anything else there, per the kernel's mount table. O(mounts).
fn top_mount(path: &Path) -> Option<(String, String)> {
    let table = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let want = path.to_string_lossy().replace(' ', "\\040");
    table.lines().rev().find_map(|l| {
        let mut fields = l.split(' ');
        let (source, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (at == want).then(|| (source.to_string(), kind.to_string()))
    })
}

/// The mount point `path` (made absolute), if it is the mount of an
/// interlock mount process that ended (killed, or crashed), which fails
/// every call on it with `ENOTCONN` until it is unmounted. Nothing else
/// mounted there counts.
///
/// `ENOTCONN` on a FUSE mount means the kernel's connection to its
/// process is gone for good: nobody can use that mount again, and its
/// locks are the server's to end with its lease, as for any client that
/// stopped answering. Asked with `statfs`, which the kernel always sends
/// to the mount's process: a `stat` is answered from the attributes the
/// kernel keeps (for a second here), and succeeds on a mount just killed.
pub fn dead(path: &Path) -> Option<PathBuf> {
    let dead = rustix::fs::statfs(path).err() == Some(rustix::io::Errno::NOTCONN);
    // The dead mount point cannot be resolved itself; its parent can.
    let abs = match (dead, path.parent(), path.file_name()) {
        (true, Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
            std::fs::canonicalize(parent).map(|p| p.join(name)).ok()
        }
        _ => None,
    }?;
    let (source, kind) = top_mount(&abs)?;
    (source == "interlock" && kind.starts_with("fuse")).then_some(abs)
}

/// Takes away the [`dead`] mount at `path`, if there is one, so that a new
/// mount can take its place: a mount restarted by its supervisor would
/// otherwise find its mount point busy for ever. Call it only once the
/// new mount is ready to be made (its server reached): until then the
/// dead mount fails calls rather than let programs write into the
/// directory beneath. Whether it took one away.
pub fn clear_dead(path: &Path) -> Result<bool, MountError> {
    let Some(abs) = dead(path) else { return Ok(false) };
    unmount(&abs).map_err(|e| MountError::Dead(abs.clone(), e))?;
    Ok(true)
}

/// Unmounts `path`; lazily (detached now, gone when the last user leaves)
/// if it is busy.
/// A user's mount (made by `fusermount3`) is unmounted by `fusermount3
/// -u` (`-z`: lazily).
pub fn unmount(path: &Path) -> Result<(), Errno> {
    if !nix::unistd::Uid::effective().is_root() {
        return helper_unmount(path);
    }
    match nix::mount::umount2(path, MntFlags::empty()) {
        Err(Errno::EBUSY) => nix::mount::umount2(path, MntFlags::MNT_DETACH),
        r => r,
    }
}

fn helper_unmount(path: &Path) -> Result<(), Errno> {
    let run = |flags: &str| {
        std::process::Command::new("fusermount3")
            .arg(flags)
            .arg("--")
            .arg(path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if run("-u") || run("-uz") { Ok(()) } else { Err(Errno::EPERM) }
}
