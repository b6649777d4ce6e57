//! Permission checks, as Linux's `generic_permission` makes them for a
//! caller's uid, gid and supplementary groups: owner, group or other
//! bits (the first class that matches decides), root's exemptions, the
//! sticky bit, who may chown and chmod, and the setuid and setgid bits a
//! change drops.

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

/// The mode a change leaves a file with once it drops the privileges
/// Linux drops (`setattr_should_drop_suidgid`), or `None` if that changes
/// nothing: setuid always; setgid if the file is group-executable, or if
/// the caller is neither in the file's group nor root
/// (`setattr_should_drop_sgid`). A chown drops them whoever makes it (of
/// a non-directory); a write or a truncate only when someone other than
/// root makes it (root has `CAP_FSETID`): see [`dropped_by_data`].
pub fn dropped(cred: &Cred, o: &Owner) -> Option<u32> {
    let mut p = o.perm & !libc::S_ISUID;
    if p & libc::S_IXGRP != 0 || !(cred.is_root() || cred.in_group(o.gid)) {
        p &= !libc::S_ISGID;
    }
    (p != o.perm).then_some(p)
}

/// What a write or a truncate of a regular file by `cred` drops
/// ([`dropped`], for anyone but root).
pub fn dropped_by_data(cred: &Cred, o: &Owner) -> Option<u32> {
    if cred.is_root() { None } else { dropped(cred, o) }
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

    /// As Linux 6.x drops them (checked there on tmpfs as root and as an
    /// unprivileged fsuid).
    #[test]
    fn a_change_drops_setuid_always_and_setgid_when_executable_or_outside_the_group() {
        let (root, member, outsider) = (user(0, 0, &[]), user(11, 20, &[]), user(12, 1, &[]));
        assert_eq!(dropped(&member, &file(0o4755)), Some(0o755));
        assert_eq!(dropped(&root, &file(0o4755)), Some(0o755), "a chown by root drops setuid too");
        assert_eq!(dropped(&member, &file(0o2775)), Some(0o775));
        assert_eq!(dropped(&member, &file(0o2764)), None, "a member keeps setgid on a file not group-executable");
        assert_eq!(dropped(&outsider, &file(0o2764)), Some(0o764));
        assert_eq!(dropped(&root, &file(0o2764)), None);
        assert_eq!(dropped(&outsider, &file(0o6777)), Some(0o777));
        assert_eq!(dropped(&member, &file(0o755)), None);
        assert_eq!(dropped_by_data(&root, &file(0o6777)), None, "root's writes keep both");
        assert_eq!(dropped_by_data(&outsider, &file(0o6764)), Some(0o764));
    }
}
