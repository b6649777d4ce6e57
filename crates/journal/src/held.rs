//! One writer per log directory: `DIR/lock`, held with an exclusive
//! `flock` for as long as a [`Journal`](crate::Journal) has the directory
//! open.
//!
//! Opening a journal cuts a torn tail off its last segment, and a journal
//! another process is writing always has one: a second opener (an
//! `fsck --repair` beside a running server) would cut records that
//! process had acknowledged, then append its own among them. The lock
//! refuses it instead. Offline readers (`check`, `read_dir`) take no lock
//! and change nothing; a tool that wants a still picture asks
//! [`in_use`] first.

use std::fs::{File, TryLockError};
use std::path::Path;

use crate::Error;

const FILE: &str = "lock";

/// Holds `dir` for a writer: the returned file keeps it until dropped.
/// [`Error::InUse`] if another holds it. O(1).
pub(crate) fn hold(dir: &Path) -> Result<File, Error> {
    let path = dir.join(FILE);
    let file = File::options().create(true).truncate(false).write(true).open(&path).map_err(|e| Error::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(Error::InUse(dir.to_path_buf())),
        Err(TryLockError::Error(e)) => Err(Error::io(&path, e)),
    }
}

/// Whether a writer has `dir` open now (in this process or another).
/// Creates nothing. O(1).
pub fn in_use(dir: &Path) -> Result<bool, Error> {
    let path = dir.join(FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(&path, e)),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(false),
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(Error::io(&path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_directory_is_refused_to_a_second_writer_and_seen_in_use() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!in_use(dir.path()).unwrap(), "no lock file yet");
        let held = hold(dir.path()).unwrap();
        assert!(in_use(dir.path()).unwrap());
        assert!(matches!(hold(dir.path()), Err(Error::InUse(_))));
        drop(held);
        assert!(!in_use(dir.path()).unwrap());
        hold(dir.path()).unwrap();
    }
}
