//! `FUSE_IOCTL`: the file attribute flags (`lsattr`, `chattr`, and
//! `xfs_io`'s `lsattr`/`chattr` through `struct fsxattr`), which the
//! server keeps and enforces, and `ENOTTY` for every other command. The
//! requests are read and the answers made here; `Fs::ioctl` asks the
//! server in between. No I/O here.
//!
//! The kernel turns `FS_IOC_GETFLAGS`, `FS_IOC_SETFLAGS`,
//! `FS_IOC_FSGETXATTR` and `FS_IOC_FSSETXATTR` on a regular file or a
//! directory into an `OPEN` (or `OPENDIR`) of its own, a `FUSE_IOCTL`
//! with the kernel's command and a `RELEASE`. Before a set it reads the
//! flags (`FSGETXATTR`) and checks the caller's right to change them (the
//! owner or root; root alone for immutable and append-only); the server
//! checks again, for clients that are not a kernel.
//!
//! The kernel's inode never learns the flags (FUSE's attributes carry
//! none), so the kernel enforces nothing of them: the server refuses
//! each change they forbid, for every mount. Until session 58 no file
//! had a flag here: a get answered none and a set of any was
//! `EOPNOTSUPP`; before session 48 every such call was `ENOTTY`, and
//! `lsattr` failed on every file of a mount.
//!
//! Cost: O(1) here; the get or set is one round trip.

use interlock_client::meta::{FLAG_APPEND, FLAG_IMMUTABLE, FLAG_NOATIME, FLAG_NODUMP};

use crate::abi::Args;

/// `_IOR('f', 1, long)`: the flags as `unsigned int` (4 bytes).
const GETFLAGS: u32 = 0x8008_6601;
/// `_IOW('f', 2, long)`.
const SETFLAGS: u32 = 0x4008_6602;
/// `_IOR('X', 31, struct fsxattr)` (28 bytes).
const FSGETXATTR: u32 = 0x801c_581f;
/// `_IOW('X', 32, struct fsxattr)`.
const FSSETXATTR: u32 = 0x401c_5820;
/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize, then
/// 8 bytes of padding.
const FSXATTR: usize = 28;

/// Each kept flag (`FS_*_FL`) and its `FS_XFLAG_*` in `struct fsxattr`.
const XFLAGS: [(u32, u32); 4] =
    [(FLAG_IMMUTABLE, 0x08), (FLAG_APPEND, 0x10), (FLAG_NOATIME, 0x40), (FLAG_NODUMP, 0x80)];

/// `flags` (`FS_*_FL`) as `struct fsxattr`'s `FS_XFLAG_*`.
fn xflags_of(flags: u32) -> u32 {
    XFLAGS.iter().filter(|&&(f, _)| flags & f != 0).fold(0, |all, &(_, x)| all | x)
}

/// `FS_XFLAG_*` as the flags kept (`FS_*_FL`); `None` if any other
/// `FS_XFLAG_*` is asked for.
fn flags_of(xflags: u32) -> Option<u32> {
    let flags = XFLAGS.iter().filter(|&&(_, x)| xflags & x != 0).fold(0, |all, &(f, _)| all | f);
    (xflags_of(flags) == xflags).then_some(flags)
}

/// What an ioctl asks of the flags.
#[derive(Debug, PartialEq, Eq)]
pub struct Asked {
    /// Through `struct fsxattr` (the `FSGETXATTR` and `FSSETXATTR`
    /// commands), not a plain flags word.
    fsx: bool,
    /// The flags to set (`FS_*_FL`), or `None` to read them.
    pub set: Option<u32>,
    /// The bytes of output the kernel waits for.
    out_size: usize,
}

/// Reads a `fuse_ioctl_in` (then the command's input, `in_size` bytes):
/// what it asks, `ENOTTY` for a command other than the four, and
/// `EOPNOTSUPP` for an `fsxattr` set of anything but kept flags (an
/// extent size, a project id), as on tmpfs.
pub fn asked(a: &mut Args<'_>) -> Result<Asked, i32> {
    let (_fh, _flags, cmd, _arg) = (a.u64()?, a.u32()?, a.u32()?, a.u64()?);
    let (in_size, out_size) = (a.u32()? as usize, a.u32()? as usize);
    let input = a.bytes(in_size)?;
    let word = |at: usize| {
        input.get(at..at + 4).map_or(Err(libc::EINVAL), |b| Ok(u32::from_ne_bytes(b.try_into().expect("4 bytes"))))
    };
    let (fsx, set) = match cmd {
        GETFLAGS => (false, None),
        FSGETXATTR => (true, None),
        SETFLAGS => (false, Some(word(0)?)),
        // Every field but the flags and the padding must be zero.
        FSSETXATTR if input.len() >= FSXATTR && input[4..FSXATTR - 8].iter().all(|&b| b == 0) => {
            (true, Some(flags_of(word(0)?).ok_or(libc::EOPNOTSUPP)?))
        }
        FSSETXATTR => return Err(libc::EOPNOTSUPP),
        _ => return Err(libc::ENOTTY),
    };
    Ok(Asked { fsx, set, out_size })
}

/// The answer to `asked`, the inode's flags being `flags` (after a
/// set): a `fuse_ioctl_out` (result, flags, in and out iovecs: 16 bytes)
/// and the exact output the kernel waits for (the flags word, a
/// `struct fsxattr`, or nothing for a set).
pub fn answer(asked: &Asked, flags: u32) -> Vec<u8> {
    let mut out = vec![0; 16 + asked.out_size];
    if asked.set.is_none() {
        let word = if asked.fsx { xflags_of(flags) } else { flags };
        if let Some(at) = out.get_mut(16..20) {
            at.copy_from_slice(&word.to_ne_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{put32, put64};

    fn ioctl(cmd: u32, input: &[u8], out_size: u32) -> Result<Asked, i32> {
        let mut buf = Vec::new();
        put64(&mut buf, 3);
        put32(&mut buf, 0);
        put32(&mut buf, cmd);
        put64(&mut buf, 0);
        put32(&mut buf, input.len() as u32);
        put32(&mut buf, out_size);
        buf.extend_from_slice(input);
        asked(&mut Args::new(&buf))
    }

    /// Gets and sets of both forms, the flags mapped to and from
    /// `fsxattr`'s, and the refusals.
    #[test]
    fn flags_are_read_and_set_in_both_forms() {
        let get = ioctl(GETFLAGS, &[], 4).unwrap();
        assert_eq!(get.set, None);
        let mut word = vec![0; 16];
        word.extend_from_slice(&(FLAG_APPEND | FLAG_NODUMP).to_ne_bytes());
        assert_eq!(answer(&get, FLAG_APPEND | FLAG_NODUMP), word);
        let fsget = ioctl(FSGETXATTR, &[], FSXATTR as u32).unwrap();
        let out = answer(&fsget, FLAG_IMMUTABLE | FLAG_NOATIME);
        assert_eq!(out.len(), 16 + FSXATTR);
        assert_eq!(out[16..20], (0x08u32 | 0x40).to_ne_bytes(), "FS_XFLAG_IMMUTABLE | FS_XFLAG_NOATIME");
        assert!(out[20..].iter().all(|&b| b == 0));
        let set = ioctl(SETFLAGS, &FLAG_IMMUTABLE.to_ne_bytes(), 0).unwrap();
        assert_eq!(set.set, Some(FLAG_IMMUTABLE));
        assert_eq!(answer(&set, FLAG_IMMUTABLE), vec![0; 16], "a set answers nothing more");
        let mut x = [0u8; FSXATTR];
        x[..4].copy_from_slice(&(0x10u32 | 0x80).to_ne_bytes());
        x[FSXATTR - 1] = 0xff; // padding
        assert_eq!(ioctl(FSSETXATTR, &x, 0).unwrap().set, Some(FLAG_APPEND | FLAG_NODUMP));
        x[12] = 1; // a project id
        assert_eq!(ioctl(FSSETXATTR, &x, 0), Err(libc::EOPNOTSUPP));
        x[12] = 0;
        x[..4].copy_from_slice(&0x1u32.to_ne_bytes()); // FS_XFLAG_REALTIME
        assert_eq!(ioctl(FSSETXATTR, &x, 0), Err(libc::EOPNOTSUPP));
        assert_eq!(ioctl(SETFLAGS, &[1], 0), Err(libc::EINVAL), "a flags word too short");
        assert_eq!(ioctl(0x5401, &[], 0), Err(libc::ENOTTY));
        // A request shorter than it says is malformed.
        let mut short = Vec::new();
        for v in [3, 0, 0] {
            put64(&mut short, v);
        }
        put32(&mut short, 4);
        put32(&mut short, 0);
        assert_eq!(asked(&mut Args::new(&short)), Err(libc::EIO));
    }
}
