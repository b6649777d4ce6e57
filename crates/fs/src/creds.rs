//! The caller of a request, as the server checks it: the kernel gives the
//! uid, gid and pid of the thread that made the call, but not its
//! supplementary groups, which are read from `/proc/PID/status` (the
//! kernel's own view of that thread; one small read per request of a
//! non-root caller; root's are never needed, root passes every check a
//! group could).

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
