//! Permission checks, as Linux's `generic_permission` makes them for a
//! caller's uid, gid and supplementary groups: owner, group or other
//! bits (the first class that matches decides), root's exemptions, the
//! sticky bit, who may chown and chmod.

use crate::errno::{Errno, Result};
use crate::types::{Cred, FileType};

pub const READ: u32 = 4;
pub const WRITE: u32 = 2;
pub const EXEC: u32 = 1;

/// What a check needs of an inode.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub kind: FileType,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Whether `cred` may do `want` (a mix of [`READ`], [`WRITE`], [`EXEC`]).
/// Root may read and write anything, and execute (search) what anyone
/// may, and any directory.
pub fn permits(cred: &Cred, o: &Owner, want: u32) -> bool {
    if cred.is_root() {
        return want & EXEC == 0 || o.kind == FileType::Directory || o.perm & 0o111 != 0;
    }
    let bits = if cred.uid == o.uid {
        o.perm >> 6
    } else if cred.in_group(o.gid) {
        o.perm >> 3
    } else {
        o.perm
    } & 7;
    bits & want == want
}

/// `permits`, as an error: `EACCES`.
pub fn check(cred: &Cred, o: &Owner, want: u32) -> Result<()> {
    if permits(cred, o, want) { Ok(()) } else { Err(Errno::EACCES) }
}

/// The sticky-bit rule for removing or renaming `victim` out of `dir`:
/// in a sticky directory only the victim's owner, the directory's owner
/// or root may (`EPERM` otherwise).
pub fn check_sticky(cred: &Cred, dir: &Owner, victim: &Owner) -> Result<()> {
    if dir.perm & libc::S_ISVTX == 0 || cred.is_root() || cred.uid == victim.uid || cred.uid == dir.uid {
        Ok(())
    } else {
        Err(Errno::EPERM)
    }
}

/// Whether `cred` owns the inode or is root (chmod, utimes with explicit
/// times, and the like).
pub fn owns(cred: &Cred, o: &Owner) -> bool {
    cred.is_root() || cred.uid == o.uid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(perm: u32) -> Owner {
        Owner { kind: FileType::Regular, perm, uid: 10, gid: 20 }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred { uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn the_first_matching_class_decides() {
        // The owner is refused by the owner bits even where others may.
        assert!(!permits(&user(10, 99, &[]), &file(0o077), READ));
        assert!(permits(&user(11, 20, &[]), &file(0o070), READ | WRITE));
        assert!(permits(&user(11, 1, &[20]), &file(0o070), READ), "supplementary groups count");
        assert!(!permits(&user(11, 20, &[]), &file(0o607), READ), "the group bits decide for a member");
        assert!(permits(&user(12, 1, &[]), &file(0o004), READ));
    }

    #[test]
    fn root_reads_and_writes_but_executes_only_what_someone_may() {
        let root = Cred::root();
        assert!(permits(&root, &file(0), READ | WRITE));
        assert!(!permits(&root, &file(0o600), EXEC));
        assert!(permits(&root, &file(0o001), EXEC));
        assert!(permits(&root, &Owner { kind: FileType::Directory, perm: 0, uid: 1, gid: 1 }, EXEC));
    }

    #[test]
    fn sticky_directories_protect_others_files() {
        let dir = Owner { kind: FileType::Directory, perm: 0o1777, uid: 1, gid: 1 };
        let victim = file(0o644);
        assert_eq!(check_sticky(&user(12, 1, &[]), &dir, &victim), Err(Errno::EPERM));
        assert_eq!(check_sticky(&user(10, 1, &[]), &dir, &victim), Ok(()), "the victim's owner");
        assert_eq!(check_sticky(&user(1, 1, &[]), &dir, &victim), Ok(()), "the directory's owner");
    }
}
