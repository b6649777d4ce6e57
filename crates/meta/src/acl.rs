//! POSIX access control lists, as Linux keeps and applies them
//! (`fs/posix_acl.c`): their extended-attribute form, the check an access
//! ACL makes, the mode it implies, and what a new inode inherits from its
//! directory's default ACL.
//!
//! An ACL lives in its inode's extended attributes, in the form the
//! kernel sends and `getfacl` reads (`system.posix_acl_access`,
//! `system.posix_acl_default`): a 4-byte version (2), then 8-byte entries
//! of tag, permission bits and id, in the order [`check`] requires. An
//! access ACL's owner, group-class and other entries are the file's mode
//! bits, as on Linux, where a chmod rewrites them: here the mode is their
//! one home (a chmod changes only the mode), and an access ACL read back
//! has them filled from it ([`with_mode`]). The group class is the mask
//! entry when there is one, else the owning group's.
//!
//! Every function is O(entries); an ACL holds at most
//! [`MAX_ENTRIES`].

use crate::access::{EXEC, Owner, READ, WRITE};
use crate::errno::{Errno, Result};
use crate::types::Cred;

/// The access ACL's extended attribute.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// A directory's default ACL: what a new inode in it inherits.
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;

/// The most entries an ACL may hold: what fits an extended attribute's
/// largest value (Linux's limit is the file system's; tmpfs takes this).
pub const MAX_ENTRIES: usize = (crate::types::XATTR_SIZE_MAX - HEADER) / ENTRY;

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// One entry: tag, permission bits (read 4, write 2, execute 1), id (of
/// a named user or group; none for the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u32,
    id: u32,
}

/// The entries of an ACL [`check`] accepted.
fn entries(acl: &[u8]) -> impl Iterator<Item = Entry> + '_ {
    acl.get(HEADER..).unwrap_or_default().chunks_exact(ENTRY).map(|e| Entry {
        tag: u16::from_le_bytes([e[0], e[1]]),
        perm: u32::from(u16::from_le_bytes([e[2], e[3]])),
        id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
    })
}

/// Checks an ACL's form as Linux does as it reads one
/// (`posix_acl_from_xattr`): version 2, whole entries, at most
/// [`MAX_ENTRIES`]; `EINVAL` otherwise. An ACL of no entries means none
/// (the caller removes it). The entries are checked by [`check`], after
/// the caller's other checks, in Linux's order.
pub fn check_form(acl: &[u8]) -> Result<()> {
    let body = acl.get(HEADER..).ok_or(Errno::EINVAL)?;
    if u32::from_le_bytes(acl[..HEADER].try_into().expect("4 bytes")) != VERSION || body.len() % ENTRY != 0 {
        return Err(Errno::EINVAL);
    }
    if body.len() / ENTRY > MAX_ENTRIES {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Checks an ACL as Linux does before it takes one ([`check_form`], then
/// `posix_acl_valid`): known tags with no bits but read, write and
/// execute; the owner's entry first, then named users, the owning
/// group's, named groups, a mask (required if any entry is named), the
/// others' last; named ids not -1. `EINVAL` otherwise.
pub fn check(acl: &[u8]) -> Result<()> {
    check_form(acl)?;
    // The next tags allowed, as Linux's state machine has them.
    let mut state = USER_OBJ;
    let mut named = false;
    for e in entries(acl) {
        if e.perm & !7 != 0 {
            return Err(Errno::EINVAL);
        }
        state = match (e.tag, state) {
            (USER_OBJ, USER_OBJ) => USER,
            (USER, USER) | (GROUP, GROUP) if e.id != u32::MAX => {
                named = true;
                state
            }
            (GROUP_OBJ, USER) => GROUP,
            (MASK, GROUP) => OTHER,
            (OTHER, OTHER) => 0,
            (OTHER, GROUP) if !named => 0,
            _ => return Err(Errno::EINVAL),
        };
    }
    if state == 0 || is_empty(acl) { Ok(()) } else { Err(Errno::EINVAL) }
}

/// Where a class entry's bits sit in the mode: the owner's at 6, the
/// group class's at 3 (the mask, or without one the owning group's), the
/// others' at 0; `None` for a named entry, and for the owning group's
/// under a mask. What [`mode_of`], [`with_mode`] and [`inherit`] map.
fn class_shift(tag: u16, has_mask: bool) -> Option<u32> {
    match tag {
        USER_OBJ => Some(6),
        GROUP_OBJ if !has_mask => Some(3),
        MASK => Some(3),
        OTHER => Some(0),
        _ => None,
    }
}

/// Sets the permission bits of the entry at byte `at` of `acl`.
fn set_entry_perm(acl: &mut [u8], at: usize, perm: u32) {
    acl[at + 2..at + 4].copy_from_slice(&(perm as u16).to_le_bytes());
}

/// An ACL of no entries: what removes one.
pub const NONE: &[u8] = &VERSION.to_le_bytes();

/// Whether a checked ACL holds no entry.
pub fn is_empty(acl: &[u8]) -> bool {
    acl.len() <= HEADER
}

/// The owner, group-class and other bits of a checked access ACL (the
/// mode it sets), and whether it says no more than they do (three
/// entries: Linux then keeps the mode and drops the ACL,
/// `posix_acl_equiv_mode`).
pub fn mode_of(acl: &[u8]) -> (u32, bool) {
    let has_mask = entries(acl).any(|e| e.tag == MASK);
    let bits = entries(acl).filter_map(|e| Some(e.perm << class_shift(e.tag, has_mask)?)).fold(0, |a, b| a | b);
    (bits, entries(acl).count() == 3)
}

/// A checked access ACL with its owner, group-class and other entries
/// set from `perm`, the inode's mode: what a read of it answers.
pub fn with_mode(acl: &[u8], perm: u32) -> Vec<u8> {
    let has_mask = entries(acl).any(|e| e.tag == MASK);
    let mut out = acl.to_vec();
    for (e, at) in entries(acl).zip((HEADER..).step_by(ENTRY)) {
        if let Some(shift) = class_shift(e.tag, has_mask) {
            set_entry_perm(&mut out, at, perm >> shift & 7);
        }
    }
    out
}

/// Whether `cred` may do `want` (of [`READ`], [`WRITE`], [`EXEC`]) to an
/// inode owned as `o` whose access ACL is `acl` (checked), as Linux's
/// `posix_acl_permission` decides for anyone but the owner (whose bits
/// are the mode's) and root (whose exemptions come first): a named user
/// entry for the caller; else the owning group's and named groups'
/// entries the caller is in, the first that grants all of `want`
/// deciding, or refusal if the caller is in some but none grants it;
/// else the others' bits. A named entry, or a group's, grants no more
/// than the mask. The group class and the others' bits are `o.perm`'s.
pub fn permits(acl: &[u8], cred: &Cred, o: &Owner, want: u32) -> bool {
    let want = want & (READ | WRITE | EXEC);
    let mask = o.perm >> 3 & 7;
    let has_mask = entries(acl).any(|e| e.tag == MASK);
    let masked = |perm: u32| if has_mask { perm & mask } else { perm };
    if let Some(e) = entries(acl).find(|e| e.tag == USER && e.id == cred.uid) {
        return masked(e.perm) & want == want;
    }
    let mut member = false;
    for e in entries(acl) {
        let (perm, ours) = match e.tag {
            GROUP_OBJ => (if has_mask { e.perm } else { mask }, cred.in_group(o.gid)),
            GROUP => (e.perm, cred.in_group(e.id)),
            _ => continue,
        };
        if ours {
            member = true;
            if perm & want == want {
                return masked(perm) & want == want;
            }
        }
    }
    !member && o.perm & want == want
}

/// What a new inode of mode `perm` (its permission bits as asked, no
/// umask) inherits from its directory's default ACL `default` (checked,
/// not empty), as Linux's `posix_acl_create` makes it: the mode's owner,
/// group-class and other bits are cut to the ACL's, and the ACL's to the
/// mode's. Returns the new mode and, if it says more than the mode, the
/// new inode's access ACL. A new directory also keeps `default` as its
/// own default ACL (the caller's part).
pub fn inherit(default: &[u8], perm: u32) -> (u32, Option<Vec<u8>>) {
    let has_mask = entries(default).any(|e| e.tag == MASK);
    let mut acl = default.to_vec();
    let mut bits = perm & 0o777;
    for (e, at) in entries(default).zip((HEADER..).step_by(ENTRY)) {
        let Some(shift) = class_shift(e.tag, has_mask) else { continue };
        let p = e.perm & (bits >> shift & 7);
        bits = bits & !(7 << shift) | p << shift;
        set_entry_perm(&mut acl, at, p);
    }
    let perm = perm & !0o777 | bits;
    let (_, plain) = mode_of(&acl);
    (perm, (!plain).then_some(acl))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::types::FileType;

    /// An ACL of `(tag, perm, id)` entries, in the form `setfacl` sends.
    pub(crate) fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut out = VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    const NONE: u32 = u32::MAX;

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred { uid, gid, groups: groups.to_vec() }
    }

    fn file(perm: u32) -> Owner {
        Owner { kind: FileType::Regular, perm, uid: 10, gid: 20 }
    }

    /// `u::rw-,u:30:rw-,g::r--,g:40:-w-,m::rw-,o::---`, as a file of mode
    /// 0660 holds it.
    fn named() -> Vec<u8> {
        acl(&[
            (USER_OBJ, 6, NONE),
            (USER, 6, 30),
            (GROUP_OBJ, 4, NONE),
            (GROUP, 2, 40),
            (MASK, 6, NONE),
            (OTHER, 0, NONE),
        ])
    }

    #[test]
    fn what_linux_takes_and_refuses() {
        assert_eq!(check(&named()), Ok(()));
        assert_eq!(check(&acl(&[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 4, NONE)])), Ok(()));
        assert_eq!(check(&acl(&[])), Ok(()), "no entries: no ACL");
        let bad: [&[(u16, u16, u32)]; 7] = [
            &[(GROUP_OBJ, 4, NONE), (USER_OBJ, 6, NONE), (OTHER, 4, NONE)],
            &[(USER_OBJ, 6, NONE), (USER, 6, 30), (GROUP_OBJ, 4, NONE), (OTHER, 4, NONE)],
            &[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE)],
            &[(USER_OBJ, 8, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 4, NONE)],
            &[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 4, NONE), (OTHER, 4, NONE)],
            &[(USER_OBJ, 6, NONE), (USER, 6, NONE), (GROUP_OBJ, 4, NONE), (MASK, 6, NONE), (OTHER, 4, NONE)],
            &[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (0x40, 4, NONE), (OTHER, 4, NONE)],
        ];
        for b in bad {
            assert_eq!(check(&acl(b)), Err(Errno::EINVAL), "{b:?}");
        }
        let mut v1 = named();
        v1[0] = 1;
        assert_eq!(check(&v1), Err(Errno::EINVAL), "version 1");
        assert_eq!(check(&named()[..10]), Err(Errno::EINVAL), "a cut entry");
        assert_eq!(check(&[2, 0]), Err(Errno::EINVAL), "a cut header");
    }

    #[test]
    fn the_mode_is_the_owner_mask_and_other_entries() {
        assert_eq!(mode_of(&named()), (0o660, false));
        assert_eq!(mode_of(&acl(&[(USER_OBJ, 7, NONE), (GROUP_OBJ, 5, NONE), (OTHER, 1, NONE)])), (0o751, true));
        // A chmod to 0751 reads back in the entries; the owning group's
        // keeps its bits under a mask.
        let read = with_mode(&named(), 0o751);
        assert_eq!(mode_of(&read).0, 0o751);
        assert!(entries(&read).any(|e| e.tag == GROUP_OBJ && e.perm == 4));
        let plain = with_mode(&acl(&[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 4, NONE)]), 0o640);
        assert_eq!(mode_of(&plain), (0o640, true));
    }

    /// Each case as Linux decides it (`posix_acl_permission`), for the
    /// ACL of [`named`] on a file of mode 0660 owned by 10:20.
    #[test]
    fn named_entries_grant_within_the_mask_and_groups_decide_before_others() {
        let a = named();
        let o = file(0o660);
        assert!(permits(&a, &user(30, 1, &[]), &o, READ | WRITE), "named user");
        assert!(!permits(&a, &user(30, 1, &[]), &o, EXEC));
        assert!(!permits(&a, &user(30, 1, &[]), &file(0o640), WRITE), "the mask cuts the named user");
        assert!(permits(&a, &user(31, 20, &[]), &o, READ), "the owning group");
        assert!(!permits(&a, &user(31, 20, &[]), &o, WRITE), "the owning group's entry, not the mask");
        assert!(permits(&a, &user(31, 1, &[40]), &o, WRITE), "a named group, as a supplementary one");
        assert!(permits(&a, &user(31, 20, &[40]), &o, WRITE), "any group entry that grants all");
        assert!(!permits(&a, &user(31, 20, &[40]), &o, READ | WRITE), "none grants both");
        assert!(!permits(&a, &user(31, 1, &[40]), &file(0o666), READ), "a member is refused, not another");
        assert!(permits(&a, &user(31, 1, &[]), &file(0o664), READ), "others: the mode's bits");
        assert!(!permits(&a, &user(31, 1, &[]), &o, READ));
    }

    #[test]
    fn without_a_mask_the_group_class_is_the_owning_group() {
        let a = acl(&[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 0, NONE)]);
        assert!(permits(&a, &user(31, 20, &[]), &file(0o670), WRITE), "the mode's group bits");
        assert!(!permits(&a, &user(31, 20, &[]), &file(0o607), READ));
    }

    /// As `posix_acl_create` does: tmpfs with `setfacl -d
    /// u::rwx,u:30:rwx,g::r-x,m::rwx,o::---`, then `mkdir -m 750`, gives
    /// `u::rwx,u:30:rwx,g::r-x,m::r-x,o::---`, mode 0750; `open(0644)`
    /// gives mode 0640 and `m::r--`.
    #[test]
    fn a_new_inode_inherits_the_default_acl_cut_to_its_mode() {
        let d = acl(&[(USER_OBJ, 7, NONE), (USER, 7, 30), (GROUP_OBJ, 5, NONE), (MASK, 7, NONE), (OTHER, 0, NONE)]);
        let (perm, got) = inherit(&d, 0o750);
        assert_eq!(perm, 0o750);
        let got = got.expect("a named entry");
        assert_eq!(
            got,
            acl(&[(USER_OBJ, 7, NONE), (USER, 7, 30), (GROUP_OBJ, 5, NONE), (MASK, 5, NONE), (OTHER, 0, NONE)])
        );
        let (perm, got) = inherit(&d, 0o644);
        assert_eq!(perm, 0o640);
        assert_eq!(mode_of(&got.expect("named")).0, 0o640);
        let plain = acl(&[(USER_OBJ, 7, NONE), (GROUP_OBJ, 5, NONE), (OTHER, 0, NONE)]);
        assert_eq!(inherit(&plain, 0o4777), (0o4750, None), "special bits kept; no ACL where the mode says it all");
    }
}
