//! `FUSE_IOCTL`: the file attribute flags (`lsattr`, `chattr`), which the
//! namespace does not keep, and `ENOTTY` for every other command. No I/O
//! here.
//!
//! The kernel turns `FS_IOC_GETFLAGS`, `FS_IOC_SETFLAGS`,
//! `FS_IOC_FSGETXATTR` and `FS_IOC_FSSETXATTR` on a regular file or a
//! directory into an `OPEN` (or `OPENDIR`) of its own, a `FUSE_IOCTL`
//! with the kernel's command and a `RELEASE`. The kernel checks the
//! caller's right to change flags first (the owner or root; root alone
//! for immutable and append-only), so what reaches us is already allowed.
//!
//! No file has a flag: a get answers none, a set of none succeeds (so
//! `chattr -i` is a no-op, as on any file without it) and a set of any
//! is `EOPNOTSUPP`, as on file systems that keep no flags. Keeping
//! immutable and append-only would mean the server refusing every change
//! they forbid (writes, truncation, links, renames, removals, attribute
//! changes), for every client; until then a flag that is not enforced is
//! not pretended. Before session 48 every such call was `ENOTTY`, and
//! `lsattr` failed on every file of a mount.
//!
//! Cost: O(1), no request to the server (the kernel's `OPEN` and
//! `RELEASE` around it go there, and check that the file exists).

use crate::abi::Args;
use crate::ops::Answer;

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

/// Answers a `fuse_ioctl_in` (then the command's input, `in_size`
/// bytes) with a `fuse_ioctl_out` (result, flags, in and out iovecs:
/// 16 bytes) and `out_size` bytes of output, the exact size the kernel
/// waits for.
pub fn answer(a: &mut Args<'_>) -> Answer {
    let (_fh, _flags, cmd, _arg) = (a.u64()?, a.u32()?, a.u32()?, a.u64()?);
    let (in_size, out_size) = (a.u32()? as usize, a.u32()? as usize);
    let input = a.bytes(in_size)?;
    let out = match cmd {
        GETFLAGS | FSGETXATTR => out_size,
        // Every field of the input must be zero but the padding.
        SETFLAGS | FSSETXATTR if input.iter().take(FSXATTR - 8).all(|&b| b == 0) => 0,
        SETFLAGS | FSSETXATTR => return Err(libc::EOPNOTSUPP),
        _ => return Err(libc::ENOTTY),
    };
    Ok(vec![0; 16 + out])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{put32, put64};

    fn ioctl(cmd: u32, input: &[u8], out_size: u32) -> Answer {
        let mut buf = Vec::new();
        put64(&mut buf, 3);
        put32(&mut buf, 0);
        put32(&mut buf, cmd);
        put64(&mut buf, 0);
        put32(&mut buf, input.len() as u32);
        put32(&mut buf, out_size);
        buf.extend_from_slice(input);
        answer(&mut Args::new(&buf))
    }

    #[test]
    fn flags_read_as_none_and_only_none_can_be_set() {
        assert_eq!(ioctl(GETFLAGS, &[], 4), Ok(vec![0; 20]));
        assert_eq!(ioctl(FSGETXATTR, &[], FSXATTR as u32), Ok(vec![0; 16 + FSXATTR]));
        assert_eq!(ioctl(SETFLAGS, &[0; 4], 0), Ok(vec![0; 16]));
        // Immutable (0x10).
        assert_eq!(ioctl(SETFLAGS, &0x10u32.to_ne_bytes(), 0), Err(libc::EOPNOTSUPP));
        let mut x = [0u8; FSXATTR];
        x[FSXATTR - 1] = 0xff; // padding
        assert_eq!(ioctl(FSSETXATTR, &x, 0), Ok(vec![0; 16]));
        x[12] = 1; // a project id
        assert_eq!(ioctl(FSSETXATTR, &x, 0), Err(libc::EOPNOTSUPP));
        assert_eq!(ioctl(0x5401, &[], 0), Err(libc::ENOTTY));
        // A request shorter than it says is malformed.
        let mut short = Vec::new();
        for v in [3, 0, 0] {
            put64(&mut short, v);
        }
        put32(&mut short, 4);
        put32(&mut short, 0);
        assert_eq!(answer(&mut Args::new(&short)), Err(libc::EIO));
    }
}
