//! Exit statuses of the commands, in one place (documented in `--help`
//! and the README). sysexits(3) numbers where one fits.

/// The lock could not be had: held by others (`--nowait`, `--timeout`),
/// or the server is in its recovery window after a restart (`--nowait`).
pub const NOT_OBTAINED: u8 = 1;
/// `fsck`: damage was found (and repaired, with `--repair`).
pub const DAMAGED: u8 = 1;
/// `fsck`: the store's checkpoint or journal cannot be read (e2fsck's
/// "errors left uncorrected").
pub const UNREADABLE: u8 = 4;
/// `fsck`: a writer (a running server) has the store open: an offline
/// check would see it change underneath, and a repair would write beside
/// it (e2fsck's "operational error", as for a mounted file system).
pub const IN_USE: u8 = 8;
/// A usage error: a bad flag or value (clap's own status).
pub const USAGE: u8 = 2;
/// The server cannot be reached, or did not answer in time
/// (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// The lock was lost while the command ran (the session's lease ran out:
/// a partition, a stopped process): the command was stopped
/// (EX_TEMPFAIL: running it again may succeed).
pub const LOCK_LOST: u8 = 75;
/// The server refused the token, or its TLS certificate is not trusted,
/// or it refused the request to this user (`evict` and `changelog` by a
/// user of the server's machine other than root or the server's own)
/// (EX_NOPERM).
pub const AUTH: u8 = 77;
/// The command was found but could not be run.
pub const CANNOT_RUN: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
