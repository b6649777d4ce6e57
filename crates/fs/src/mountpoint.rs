//! Attaching `/dev/fuse` to a directory and detaching it.
//!
//! The mount is made with mount(2) directly, as root: `allow_other`
//! (every user of the machine goes through it, as with NFS and Lustre)
//! and `default_permissions` (the kernel checks the mode bits too, so
//! `access(2)` answers right; the server checks every request again with
//! the caller's ids). Unmounting: `umount2`, lazily if the mount is busy.

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
    #[error("interlock mount needs root (as mount.nfs does): a root mount serves every user of the machine")]
    NotRoot,
    #[error("mount point {0}: {1}")]
    MountPoint(PathBuf, String),
    #[error(
        "mount point {0} is busy: something is mounted there already (unmount it with `fusermount3 -u {0}` or `umount {0}`)"
    )]
    Busy(PathBuf),
    #[error("mount(2) of {0} failed: {1}")]
    Mount(PathBuf, Errno),
}

/// Mount options.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    pub read_only: bool,
}

/// Opens `/dev/fuse` and mounts it at `path`; the device, whose reads are
/// the kernel's requests.
pub fn mount(path: &Path, options: &MountOptions) -> Result<File, MountError> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(MountError::NotRoot);
    }
    let path = check(path)?;
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
    let Ok(table) = std::fs::read_to_string("/proc/self/mounts") else { return false };
    let want = path.to_string_lossy().replace(' ', "\\040");
    table.lines().any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// Unmounts `path`; lazily (detached now, gone when the last user leaves)
/// if it is busy.
pub fn unmount(path: &Path) -> Result<(), Errno> {
    match nix::mount::umount2(path, MntFlags::empty()) {
        Err(Errno::EBUSY) => nix::mount::umount2(path, MntFlags::MNT_DETACH),
        r => r,
    }
}
