//! interlock mount: a FUSE file system over the interlock client, where
//! unmodified programs share files and cluster-wide fcntl, OFD and flock
//! locks.
//!
//! # Design
//!
//! - `abi`: the kernel protocol (`linux/fuse.h`), parsed and encoded by
//!   hand; no FUSE crate gave flock, interruptible blocking locks and
//!   answers from any task together (see `docs/dependencies.md`).
//! - [`mountpoint`]: mount(2) of `/dev/fuse` and the unmount.
//! - `session`: one task reads requests; each runs as a task on the
//!   client's runtime and answers when done, so requests overlap and a
//!   blocked lock holds no thread. `FUSE_INTERRUPT` withdraws a blocked
//!   lock at the server; a soft mount gives up calls not answered in
//!   time.
//! - `ops`: requests → client calls; the server checks permissions with
//!   the caller's uid, gid and supplementary groups (`creds`).
//! - `locks`: the kernel's lock owners → the client's owners; what
//!   `FUSE_FLUSH` and `FUSE_RELEASE` release.
//! - `handles`: open files.
//! - `fileattr`: `FUSE_IOCTL`, the file attribute flags (`chattr`), read
//!   and set at the server.
//! - `acls`: which inodes have POSIX ACLs, so the kernel's look for a
//!   file's ACL is answered here for the many that have none.
//! - `unsynced`: writes not yet synced, so that an `fsync` after the
//!   server's machine restarted fails rather than vouch for them.
//!
//! Node ids are inode numbers (the root is 1 in both; inode numbers are
//! never reused, so no generation is needed and `FORGET` needs no work).
//!
//! What is cached: names and attributes for the mount's `entry_timeout`
//! and `attr_timeout` (1 s by default, as libfuse's); attributes are
//! dropped at every open and lock grant (close-to-open, and coherence
//! under a lock). File data is never cached: every read and write goes to
//! the server (`FOPEN_DIRECT_IO`).
//!
//! ```no_run
//! # async fn run(client: interlock_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use interlock_fs::{Config, mount};
//! let cfg = Config { mountpoint: "/mnt/shared".into(), ..Config::default() };
//! let mounted = mount(client, &cfg)?;
//! mounted.serve().await?; // until unmounted
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod abi;
mod acls;
mod creds;
mod fileattr;
mod handles;
mod locks;
pub mod mountpoint;
mod names;
mod ops;
mod session;
mod unsynced;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use mountpoint::{MountError, MountOptions, check, clear_dead, dead, is_mounted, unmount};

/// A mount's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub mountpoint: PathBuf,
    pub options: MountOptions,
    /// How long the kernel may keep a name.
    pub entry_timeout: Duration,
    /// How long the kernel may keep attributes.
    pub attr_timeout: Duration,
    /// A soft mount: a call the server has not answered within this long
    /// fails with `EIO`, as on a soft NFS mount, instead of waiting for
    /// the server (`None`, the default: a hard mount). A blocking lock
    /// wait is not timed: it waits for the lock. See `session`.
    pub soft_timeout: Option<Duration>,
    /// The server squashes root (`serve --root-squash`, as its status
    /// said when the mount started): root's `opendir` is then asked of the
    /// server, which serves root as another user, where the kernel would
    /// let root open any directory.
    pub root_squashed: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            mountpoint: PathBuf::new(),
            options: MountOptions::default(),
            entry_timeout: Duration::from_secs(1),
            attr_timeout: Duration::from_secs(1),
            soft_timeout: None,
            root_squashed: false,
        }
    }
}

/// A live mount, not yet served.
pub struct Mounted {
    fs: Arc<ops::Fs>,
}

/// Mounts the file system `client` serves at `cfg.mountpoint`. The mount
/// answers nothing until [`Mounted::serve`] runs.
pub fn mount(client: interlock_client::Client, cfg: &Config) -> Result<Mounted, MountError> {
    let dev = mountpoint::mount(&cfg.mountpoint, &cfg.options)?;
    Ok(Mounted { fs: Arc::new(ops::Fs::new(client, Arc::new(dev), cfg)) })
}

impl Mounted {
    /// Answers the kernel until the file system is unmounted.
    pub async fn serve(self) -> std::io::Result<()> {
        let fs = self.fs;
        let watcher = {
            let fs = fs.clone();
            tokio::spawn(async move { fs.watch_losses().await })
        };
        let r = session::run(fs).await;
        watcher.abort();
        r
    }
}
