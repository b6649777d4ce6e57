//! The caller of a request, as the server checks it: the kernel gives the
//! uid, gid and pid of the thread that made the call, but not its
//! supplementary groups, which are read from `/proc/PID/status` (the
//! kernel's own view of that thread; one small read per request of a
//! non-root caller; root's are never needed, root passes every check a
//! group could).
//!
//! The same files answer the two questions FUSE's requests leave open:
//! what call an attribute change with nothing in it came from (see
//! [`in_chown`]), and whether an interrupted caller is dying (see
//! [`dying`]).

use interlock_client::meta::Cred;

use crate::abi::InHeader;

/// The credentials the server checks `h`'s request with.
pub fn of(h: &InHeader) -> Cred {
    let groups = if h.uid == 0 || h.pid == 0 { Vec::new() } else { groups(h.pid) };
    Cred { uid: h.uid, gid: h.gid, groups }
}

/// Thread `pid`'s supplementary groups; none if it is gone.
fn groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    parse_groups(&status)
}

/// Whether thread `pid` is in a `chown(2)` call (`chown`, `fchown`,
/// `lchown`, `fchownat`), as `/proc/PID/syscall` shows while the thread
/// waits for our answer; false if it is gone, in another call, or hidden
/// (Yama's `ptrace_scope` 3 hides it even from root).
///
/// Why: the kernel sends an attribute change that sets nothing both for a
/// `chown(-1, -1)` (which Linux refuses someone other than the owner
/// where it would clear setuid or setgid) and, with `HANDLE_KILLPRIV`,
/// for a `fallocate` through a handle (whose own request clears them, and
/// which must not fail for want of ownership); nothing in the request
/// tells them apart. One small read, only for such a request from a
/// caller other than root, of a file open here (before the look-up of
/// its owner, a round trip to the server).
pub fn in_chown(pid: u32) -> bool {
    syscall(pid).is_some_and(|nr| CHOWNS.contains(&nr))
}

/// The call thread `pid` is in; none if it is gone, running, or stopped
/// outside a call.
fn syscall(pid: u32) -> Option<libc::c_long> {
    if pid == 0 {
        return None;
    }
    parse_syscall(&std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?)
}

/// The `chown(2)` family's numbers on this architecture (the newer ones
/// have only the last two).
const CHOWNS: &[libc::c_long] = &[
    libc::SYS_fchown,
    libc::SYS_fchownat,
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    libc::SYS_chown,
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    libc::SYS_lchown,
];

/// The call number `/proc/PID/syscall` begins with; none if the thread is
/// running or stopped outside a call (`running`, `-1 …`).
fn parse_syscall(line: &str) -> Option<libc::c_long> {
    line.split_whitespace().next()?.parse().ok().filter(|&nr| nr >= 0)
}

/// Whether thread `pid` is dying: `SIGKILL` is pending for it, as the
/// kernel makes it for every thread of a process a fatal signal ends
/// (`kill -9`, or `SIGINT`, `SIGTERM`, … unhandled), or a signal that
/// dumps core (`SIGQUIT`, `SIGSEGV`, …), for which the kernel does not,
/// is pending with no handler, not ignored and not blocked. False if the
/// thread is gone or hidden. One small read, only for an interrupted
/// request.
pub fn dying(pid: u32) -> bool {
    pid != 0 && std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| parse_dying(&s))
}

/// The signals whose default action dumps core (`signal(7)`).
const CORE: [i32; 10] = [
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGSEGV,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSYS,
];

/// [`dying`] from a `/proc/PID/status`: pending for the thread (`SigPnd`)
/// or its process (`ShdPnd`), neither caught (`SigCgt`), ignored
/// (`SigIgn`) nor blocked (`SigBlk`), which `SIGKILL` never is. The masks
/// are hexadecimal, bit `n - 1` for signal `n`.
fn parse_dying(status: &str) -> bool {
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0)
    };
    let bit = |sig: i32| 1u64 << (sig - 1);
    let ending = CORE.iter().fold(bit(libc::SIGKILL), |m, &sig| m | bit(sig));
    let pending = mask("SigPnd:") | mask("ShdPnd:");
    let kept = mask("SigCgt:") | mask("SigIgn:") | mask("SigBlk:");
    pending & ending & !kept != 0
}

fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_from_the_status_line() {
        assert_eq!(parse_groups("Name:\tx\nGroups:\t4 24 1000 \nNSpid:\t1\n"), vec![4, 24, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
    }

    #[test]
    fn a_pending_sigkill_or_unhandled_core_signal_is_dying() {
        let status = |pnd, shd, cgt| {
            format!("Name:\tx\nSigPnd:\t{pnd}\nShdPnd:\t{shd}\nSigBlk:\t0\nSigIgn:\t1000\nSigCgt:\t{cgt}\n")
        };
        // SIGKILL (bit 8), for the thread or its process.
        assert!(parse_dying(&status("100", "0", "0")));
        assert!(parse_dying(&status("0", "100", "0")));
        // SIGINT (bit 1) and SIGTERM (bit 14) pending, a handler to run:
        // not dying (unhandled, the kernel would have made them SIGKILL).
        assert!(!parse_dying(&status("4002", "0", "4002")));
        // SIGQUIT (bit 2): dying unless caught; SIGPIPE (bit 12, ignored here).
        assert!(parse_dying(&status("4", "0", "0")));
        assert!(!parse_dying(&status("4", "0", "4")));
        assert!(!parse_dying(&status("1000", "0", "0")));
        assert!(!parse_dying("Name:\tx\n"));
    }

    #[test]
    fn the_call_number_leads_the_syscall_line() {
        assert_eq!(parse_syscall("92 0x7ffd 0xffffffff 0xffffffff 0x0 0x0 0x0 0x7ffd 0x7f12\n"), Some(92));
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffd 0x7f12\n"), None);
        assert_eq!(parse_syscall(""), None);
    }

    /// A thread blocked in a `read` is seen in that call, and so not in a
    /// chown (the mount's tests see one in a chown).
    #[test]
    fn a_thread_is_seen_in_the_call_it_waits_in() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            // `/proc/thread-self` links to `PID/task/TID`.
            let me = std::fs::read_link("/proc/thread-self").unwrap();
            tx.send(me.file_name().unwrap().to_str().unwrap().parse::<u32>().unwrap()).unwrap();
            nix::unistd::read(&r, &mut [0u8; 1])
        });
        let tid = rx.recv().unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while syscall(tid) != Some(libc::SYS_read) {
            assert!(std::time::Instant::now() < until, "never seen in read: {:?}", syscall(tid));
            std::thread::yield_now();
        }
        assert!(!in_chown(tid));
        nix::unistd::write(&w, b"x").unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), 1);
        assert_eq!(syscall(0), None);
    }

    #[test]
    fn this_process_reads_its_own_groups() {
        let me = std::process::id();
        let want = nix::unistd::getgroups().unwrap().into_iter().map(|g| g.as_raw()).collect::<Vec<_>>();
        let mut got = groups(me);
        let mut want = want;
        got.sort();
        want.sort();
        want.dedup();
        got.dedup();
        assert_eq!(got, want);
    }
}
