//! Lock calls through two mounts against the kernel's own locks on
//! tmpfs: random OFD, POSIX and flock calls give what they give there,
//! call by call, and their locks come back whole after a `kill -9` of the
//! server.

use super::*;

/// One call of [`random_lock_calls_through_two_mounts_give_what_tmpfs_gives`],
/// on open file `fd` of a side's four (0 and 1 opened through mount a, 2
/// and 3 through mount b).
#[derive(Debug, Clone, Copy)]
enum LockCall {
    /// `F_OFD_SETLK`, or `F_SETLK` (this process's lock) if `process`;
    /// `wait`: `F_OFD_SETLKW` or `F_SETLKW` on the mount wherever tmpfs
    /// granted it at once.
    Set { fd: usize, process: bool, wait: bool, lock: LockArg },
    /// `F_OFD_GETLK`, or `F_GETLK` if `process`.
    Get { fd: usize, process: bool, lock: LockArg },
    /// `flock(2)`, without `LOCK_NB` on the mount if `wait` and tmpfs
    /// granted it at once.
    Flock { fd: usize, op: FlockArg, wait: bool },
    /// `lseek` to `pos`, where a `SEEK_CUR` range starts.
    Seek { fd: usize, pos: u64 },
    /// A `dup` of the open file closed: this process's POSIX locks on the
    /// file go, its OFD and flock locks stay (the open file is still
    /// open).
    CloseDup { fd: usize },
}

/// A `struct flock` as a call gives it.
#[derive(Debug, Clone, Copy)]
struct LockArg {
    typ: i32,
    whence: i32,
    start: i64,
    len: i64,
}

impl LockArg {
    fn flock(self) -> libc::flock {
        libc::flock {
            l_type: self.typ as i16,
            l_whence: self.whence as i16,
            l_start: self.start,
            l_len: self.len,
            l_pid: 0,
        }
    }
}

/// Random lock calls. This process's POSIX locks go through mount a's
/// files only, and only a close there drops them: a process is on one
/// node, and its locks through two mounts are two nodes' locks, which
/// conflict where tmpfs's do not.
fn lock_call() -> impl proptest::strategy::Strategy<Value = LockCall> {
    use proptest::prelude::*;
    let typ = prop_oneof![Just(libc::F_RDLCK), Just(libc::F_WRLCK), Just(libc::F_UNLCK)];
    // 7 is no whence: EINVAL from both.
    let whence =
        prop_oneof![8 => Just(libc::SEEK_SET), 1 => Just(libc::SEEK_CUR), 1 => Just(libc::SEEK_END), 1 => Just(7)];
    // Negative starts, and ranges at and past the largest offset
    // (EINVAL, EOVERFLOW, or a lock to the end).
    let start = prop_oneof![8 => 0i64..40, 1 => (i64::MAX - 3)..=i64::MAX, 1 => -3i64..0];
    let len = prop_oneof![2 => Just(0i64), 6 => 1i64..20, 1 => -10i64..0, 1 => Just(i64::MAX)];
    let lock = (typ, whence, start, len).prop_map(|(typ, whence, start, len)| LockArg { typ, whence, start, len });
    let wait = || proptest::bool::weighted(0.3);
    let flock =
        prop_oneof![Just(FlockArg::LockSharedNonblock), Just(FlockArg::LockExclusiveNonblock), Just(FlockArg::Unlock)];
    prop_oneof![
        4 => (0..4usize, wait(), lock.clone()).prop_map(|(fd, wait, lock)| LockCall::Set { fd, process: false, wait, lock }),
        2 => (0..2usize, wait(), lock.clone()).prop_map(|(fd, wait, lock)| LockCall::Set { fd, process: true, wait, lock }),
        2 => (0..4usize, lock.clone()).prop_map(|(fd, lock)| LockCall::Get { fd, process: false, lock }),
        1 => (0..2usize, lock).prop_map(|(fd, lock)| LockCall::Get { fd, process: true, lock }),
        2 => (0..4usize, flock, wait()).prop_map(|(fd, op, wait)| LockCall::Flock { fd, op, wait }),
        1 => (0..4usize, 0u64..120).prop_map(|(fd, pos)| LockCall::Seek { fd, pos }),
        1 => (0..2usize).prop_map(|fd| LockCall::CloseDup { fd }),
    ]
}

/// What a lock call gave: an errno, or for a query the lock it found
/// (type, whence, start, length) with its `l_pid` apart.
type LockGot = nix::Result<Option<((i16, i16, i64, i64), i32)>>;

impl LockCall {
    /// Whether the call is to wait, where it can be granted.
    fn waits(self) -> bool {
        matches!(self, LockCall::Set { wait: true, .. } | LockCall::Flock { wait: true, .. })
    }
}

/// Makes `call` on one side's four open files, in its waiting form if
/// `wait`.
fn apply_lock(files: &[File], call: LockCall, wait: bool) -> LockGot {
    match call {
        LockCall::Set { fd, process, lock, .. } => {
            let l = lock.flock();
            let arg = match (process, wait) {
                (true, false) => FcntlArg::F_SETLK(&l),
                (true, true) => FcntlArg::F_SETLKW(&l),
                (false, false) => FcntlArg::F_OFD_SETLK(&l),
                (false, true) => FcntlArg::F_OFD_SETLKW(&l),
            };
            fcntl(files[fd].as_fd(), arg).map(|_| None)
        }
        LockCall::Get { fd, process, lock } => {
            let mut l = lock.flock();
            let arg = if process { FcntlArg::F_GETLK(&mut l) } else { FcntlArg::F_OFD_GETLK(&mut l) };
            fcntl(files[fd].as_fd(), arg)?;
            Ok(Some(((l.l_type, l.l_whence, l.l_start, l.l_len), l.l_pid)))
        }
        LockCall::Flock { fd, op, .. } => {
            let op = match op {
                FlockArg::LockSharedNonblock if wait => FlockArg::LockShared,
                FlockArg::LockExclusiveNonblock if wait => FlockArg::LockExclusive,
                op => op,
            };
            flock(&files[fd], op).map(|()| None)
        }
        LockCall::Seek { fd, pos } => {
            (&files[fd]).seek(SeekFrom::Start(pos)).unwrap();
            Ok(None)
        }
        LockCall::CloseDup { fd } => {
            drop(files[fd].try_clone().unwrap());
            Ok(None)
        }
    }
}

/// `call()`, a lock call on the mount that tmpfs granted at once, made
/// in its waiting form on a thread of its own. Still waiting after a
/// minute, it fails the whole test binary at once, saying which: a
/// thread blocked in the kernel cannot be taken back.
fn at_once(what: &str, call: impl FnOnce() -> LockGot + Send) -> LockGot {
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        s.spawn(move || tx.send(call()));
        rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            eprintln!("{what}: still waiting on the mount after 60 s where tmpfs granted it at once");
            std::process::abort()
        })
    })
}

/// Whether a lock call gave on a mount what it gave on tmpfs: the same
/// errno, the same lock found, and the pid it may carry here. The FUSE
/// kernel gives an OFD query's holder pid -1 whoever holds it (tmpfs
/// gives a POSIX holder's pid). A process's query can only find an OFD
/// lock (its own POSIX locks never conflict), which tmpfs gives pid -1;
/// the mount, which is sent POSIX and OFD requests alike, gives the pid
/// that took it through the same mount, and 0 for another mount's.
///
/// With `others` (after a server restart: the locks tmpfs holds that the
/// query may find, from [`others_locks`]) a query may find another of
/// them than tmpfs's. Of several conflicts Linux reports the first in its
/// list, where owners stand in the order they came; a restarted server
/// has them in the order the mounts reclaimed them.
fn lock_alike(call: LockCall, mount: &LockGot, tmpfs: &LockGot, others: Option<&[(i16, i64, i64)]>) -> bool {
    let found = |l: &(i16, i16, i64, i64)| i32::from(l.0) != libc::F_UNLCK;
    match (mount, tmpfs) {
        (Ok(Some((m, m_pid))), Ok(Some((t, t_pid)))) if found(m) && found(t) => {
            let same = m == t || others.is_some_and(|o| o.contains(&(m.0, m.2, m.3)));
            same && match call {
                LockCall::Get { process: false, .. } => *m_pid == -1,
                _ => *t_pid == -1 && [0, std::process::id() as i32].contains(m_pid),
            }
        }
        _ => mount == tmpfs,
    }
}

/// The POSIX and OFD locks tmpfs holds on the file, but those of the
/// query's own owner (open file `asker`, or this process if `process`),
/// as `F_GETLK` gives them: (type, start, length). Read from
/// `/proc/self/fdinfo`, which lists each lock under the open file that
/// took it: `lock:  1: OFDLCK ADVISORY  WRITE -1 00:1b:2 5 14`.
fn others_locks(kernel: &[File], asker: usize, process: bool) -> Vec<(i16, i64, i64)> {
    let mut out = Vec::new();
    for (i, f) in kernel.iter().enumerate() {
        let fd = std::os::fd::AsRawFd::as_raw_fd(f);
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        for line in info.lines().filter(|l| l.starts_with("lock:")) {
            let w: Vec<&str> = line.split_whitespace().collect();
            let own = if process { w[2] == "POSIX" } else { w[2] == "OFDLCK" && i == asker };
            if w[2] == "FLOCK" || own {
                continue;
            }
            let typ = if w[4] == "WRITE" { libc::F_WRLCK } else { libc::F_RDLCK } as i16;
            let start: i64 = w[7].parse().unwrap();
            let len = if w[8] == "EOF" { 0 } else { w[8].parse::<i64>().unwrap() - start + 1 };
            out.push((typ, start, len));
        }
    }
    out
}

/// Random sequences of lock calls on four open files of one file, two
/// opened through mount a and two through mount b, give what the same
/// calls give on four open files of one file on tmpfs (the kernel's own
/// locks: the oracle). OFD locks, this process's POSIX locks and flocks,
/// taken, split, merged, converted and dropped (POSIX ones by closing a
/// `dup` too), with `F_OFD_GETLK`'s `F_UNLCK` query, with ranges from
/// `SEEK_SET`, `SEEK_CUR` and `SEEK_END`, to the end, near `i64::MAX` and
/// invalid: every errno must be tmpfs's, and every lock a query finds
/// (type, start, length) the one tmpfs finds. A call drawn to wait is
/// made in its waiting form on the mount (`F_SETLKW`, `F_OFD_SETLKW`,
/// `flock` without `LOCK_NB`) wherever tmpfs granted it at once, and must
/// be granted at once there too. After each sequence each
/// open file asks for every byte of the first 60 and the last few before
/// `i64::MAX`, and tries an exclusive flock, on both sides alike.
#[test]
fn random_lock_calls_through_two_mounts_give_what_tmpfs_gives() {
    let Some((_data, _server, a, b)) = two_mounts("random_lock_calls_through_two_mounts_give_what_tmpfs_gives") else {
        return;
    };
    let shm = Tmpfs::nodev();
    let case = std::cell::Cell::new(0);
    let probes = lock_probes();
    lock_runner(200)
        .run(&proptest::collection::vec(lock_call(), 1..40), |calls| {
            case.set(case.get() + 1);
            let sides = LockSides::open(&format!("f{}", case.get()), (&a, &b), shm.path());
            sides.run("call", &calls, &calls, false)?;
            sides.run("probe", &probes, &calls, false)
        })
        .unwrap();
}

/// The random lock calls' runner: `cases` sequences (or `PROPTEST_CASES`).
fn lock_runner(cases: u32) -> proptest::test_runner::TestRunner {
    use proptest::test_runner::{Config, TestRunner};
    TestRunner::new(Config { cases: proptest_cases(cases), failure_persistence: None, ..Config::default() })
}

/// What each open file asks after a sequence: every byte of the first 60
/// and the last few before `i64::MAX`, and an exclusive flock.
fn lock_probes() -> Vec<LockCall> {
    (0..4)
        .flat_map(|fd| {
            let bytes = (0..60).chain(i64::MAX - 3..i64::MAX).map(move |start| LockCall::Get {
                fd,
                process: false,
                lock: LockArg { typ: libc::F_WRLCK, whence: libc::SEEK_SET, start, len: 1 },
            });
            bytes.chain([LockCall::Flock { fd, op: FlockArg::LockExclusiveNonblock, wait: false }])
        })
        .collect()
}

/// One file of 100 bytes opened four times on each side of the random
/// lock calls: through mount a twice and mount b twice, and on tmpfs.
struct LockSides {
    ours: [File; 4],
    kernel: [File; 4],
}

impl LockSides {
    fn open(name: &str, (a, b): (&Mount, &Mount), tmpfs: &Path) -> LockSides {
        let sized = |path: PathBuf| {
            let f = rw(&path);
            f.set_len(100).unwrap();
            f
        };
        LockSides {
            kernel: std::array::from_fn(|_| sized(tmpfs.join(name))),
            ours: [sized(a.join(name)), rw(&a.join(name)), rw(&b.join(name)), rw(&b.join(name))],
        }
    }

    /// Makes `calls` on both sides, the first that differs a failure
    /// (`what` they are, and `after` what sequence, to say so). After a
    /// server restart (`restarted`), a query may find another of the
    /// conflicting locks than tmpfs's (see [`lock_alike`]).
    fn run(&self, what: &str, calls: &[LockCall], after: &[LockCall], restarted: bool) -> Result<(), Differs> {
        for (i, &call) in calls.iter().enumerate() {
            let want = apply_lock(&self.kernel, call, false);
            let got = if call.waits() && want.is_ok() {
                at_once(&format!("{what} {i} {call:?} after {after:?}"), || apply_lock(&self.ours, call, true))
            } else {
                apply_lock(&self.ours, call, false)
            };
            let others = match call {
                LockCall::Get { fd, process, lock } if restarted && lock.typ != libc::F_UNLCK => {
                    Some(others_locks(&self.kernel, fd, process))
                }
                _ => None,
            };
            if !lock_alike(call, &got, &want, others.as_deref()) {
                return Err(Differs::fail(format!(
                    "{what} {i} {call:?}: mount {got:?}, tmpfs {want:?} (after {after:?})"
                )));
            }
        }
        Ok(())
    }
}

/// The random lock calls' locks, on 30 files at once, come back whole
/// after a `kill -9` of the server: the mounts reclaim them, and once the
/// recovery window is over every open file's probe finds on each file
/// what tmpfs finds (every range, type and flock, split and merged as
/// they were), and more random calls go on giving what they give on tmpfs.
/// A lock the mount's client holds in its own table and not at the
/// server (as a refused flock conversion left one until session 61)
/// would come back here.
#[test]
fn random_locks_through_two_mounts_are_reclaimed_whole_after_a_server_restart() {
    let test = "random_locks_through_two_mounts_are_reclaimed_whole_after_a_server_restart";
    let Some((data, server)) = restartable(test) else { return };
    let addr = server.addr.clone();
    let server = std::cell::RefCell::new(server);
    let (a, b) = (Mount::new(&addr), Mount::new(&addr));
    let shm = Tmpfs::nodev();
    let case = std::cell::Cell::new(0);
    let probes = lock_probes();
    let sequence = || proptest::collection::vec(lock_call(), 1..40);
    lock_runner(3)
        .run(&proptest::collection::vec((sequence(), sequence()), 30), |files| {
            case.set(case.get() + 1);
            let mut sides = Vec::new();
            for (n, (before, _)) in files.iter().enumerate() {
                sides.push(LockSides::open(&format!("c{}f{n}", case.get()), (&a, &b), shm.path()));
                sides[n].run("call", before, before, false)?;
            }
            server.borrow_mut().kill9();
            *server.borrow_mut() = ServerProc::start(data.path(), &addr, &RESTARTED);
            wait_for("the recovery window to end", || {
                common::rt().block_on(async { common::client(&addr).await.status().await.unwrap().recovering_ms == 0 })
            });
            for (s, (before, after)) in sides.iter().zip(&files) {
                s.run("probe after the restart", &probes, before, true)?;
                s.run("call after the restart", after, before, true)?;
            }
            Ok(())
        })
        .unwrap();
}
