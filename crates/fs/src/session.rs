//! The loop that reads the kernel's requests from `/dev/fuse` and answers
//! them.
//!
//! One task reads; each request becomes a task on the client's runtime,
//! so any number are in flight and a blocked `F_SETLKW` holds no thread.
//! Answers are written from the tasks (one `write` each; the kernel
//! matches them by unique id). Reading in one task also orders each
//! `FUSE_INTERRUPT` after the request it names, so the interrupt always
//! finds the request in the table of those being served:
//!
//! - a blocking lock request: its cancel fires, the wait is withdrawn at
//!   the server and the caller gets `EINTR`;
//! - any other: once its caller is dying (a fatal signal, `kill -9`: at
//!   once, or watched until it is or the answer comes), a lock request is
//!   withdrawn as a blocking one is (a grant on its way is given back),
//!   anything else answered `EINTR`.
//!   Once the kernel has read a request, its caller waits for our answer
//!   even through `SIGKILL`: with the server down (a mount waits for it
//!   to come back, as a hard NFS mount does) a killed program would stay
//!   in `D` state until then. A call another signal interrupts is not
//!   failed: a program would see `EINTR` from calls no local file system
//!   fails so (`stat`, `unlink`), even with `SA_RESTART`. The call goes on
//!   at the server, as a killed program's call to an NFS server may; an
//!   open it made is closed again when it is done (`Fs::abandoned`).
//!
//! On a soft mount (`Config::soft_timeout`) a request not answered in
//! time is given up as a dying caller's is, but with `EIO`: a lock
//! request is withdrawn, anything else answered at once. The call may
//! still be made at the server once it answers (a soft NFS mount's
//! timed-out write may have been written too); an open it made is closed
//! again. A blocking lock wait is not timed: it waits for the lock, as
//! long as the holder holds it, and a signal interrupts it.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use parking_lot::Mutex;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::abi::{self, Args, InHeader, init, op};
use crate::ops::{Answer, Fs};

/// Largest write (and read) the kernel sends in one request: the most
/// one `Write` to the server carries, so each is made whole there.
pub use interlock_proto::meta::MAX_WRITE;

/// What we ask of the kernel at `FUSE_INIT`. Readdirplus always (not
/// `READDIRPLUS_AUTO`, which lists without attributes after the first
/// page): `du` and `ls -l` then stat from the kernel's cache, with no
/// lookup per file. The server drops setuid and setgid on a write, a
/// truncate and a chown (`HANDLE_KILLPRIV`), by the caller's ids as
/// Linux does: left to it, the kernel's FUSE client sends a truncate the
/// dropped mode as a chmod, which the server refuses a writer who is not
/// the owner (`EPERM` where Linux truncates), and it keeps setgid when
/// the writer is not in the file's group (Linux drops it). POSIX ACLs
/// (`POSIX_ACL`): the kernel checks them with the mode, caches them, and
/// leaves the server to keep them and the mode in step and to give new
/// inodes theirs; and, as Linux does on a file system with ACLs, leaves
/// the umask to it too (`DONT_MASK`), since a directory's default ACL
/// takes its place.
const WANT: u64 = init::ASYNC_READ
    | init::POSIX_LOCKS
    | init::FLOCK_LOCKS
    | init::BIG_WRITES
    | init::DO_READDIRPLUS
    | init::PARALLEL_DIROPS
    | init::HANDLE_KILLPRIV
    | init::POSIX_ACL
    | init::DONT_MASK
    | init::MAX_PAGES
    | init::INIT_EXT
    | init::DIRECT_IO_ALLOW_MMAP;

/// How often a request whose caller was interrupted, but is not dying,
/// is looked at again: a fatal signal after the first does not interrupt
/// the request again.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// A request being served: what an interrupt of it needs.
struct Serving {
    opcode: u32,
    /// The calling thread, as the kernel names it.
    pid: u32,
    /// For a lock request: fires to withdraw it, with the errno its
    /// caller gets.
    cancel: Option<oneshot::Sender<i32>>,
    /// On a soft mount: when it is given up (not for a blocking lock
    /// wait, nor for a lock request already withdrawn).
    deadline: Option<Instant>,
}

/// The requests being served, by unique id. Whoever takes a request out
/// answers it: its task, or the interrupt of a dying caller, once.
type Table = Arc<Mutex<HashMap<u64, Serving>>>;

/// What wakes the reader: a request, or the end of the connection (the
/// device then polls as an error, not as readable).
const WAKE: Interest = Interest::READABLE.add(Interest::ERROR);

/// Serves the mount until it is unmounted.
///
/// `/dev/fuse` is read by a task of the runtime (the descriptor is made
/// non-blocking and waited on with the runtime's other sockets), not by a
/// thread of its own: a thread that read a request and handed it to a
/// worker cost two wake-ups and two context switches per request, most
/// of a lookup's time on a small machine. The handler is spawned on the
/// reading worker, which runs it as soon as the reader waits again.
pub async fn run(fs: Arc<Fs>) -> io::Result<()> {
    // Deprecated as unsound for a handle that may close its descriptor
    // while registered (the safe replacement is `unsafe`); the registration
    // owns an `Arc` of the device file, which stays open until it is gone.
    #[allow(deprecated)]
    let dev = AsyncFd::with_interest(fs.dev.clone(), WAKE)?;
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    let serving: Table = Arc::default();
    let mut initialized = false;
    let _timer = fs.soft_timeout.map(|timeout| Timer(tokio::spawn(give_up(fs.clone(), serving.clone(), timeout))));
    loop {
        let n = {
            let mut ready = dev.ready(WAKE).await?;
            match ready.try_io(|d| (&**d.get_ref()).read(&mut buf)) {
                Ok(Ok(0)) => return Ok(()),
                Ok(Ok(n)) => n,
                Ok(Err(e)) => match e.raw_os_error() {
                    // The request was interrupted before we read it; a signal.
                    Some(libc::ENOENT | libc::EINTR) => continue,
                    // Unmounted.
                    Some(libc::ENODEV) => return Ok(()),
                    _ => return Err(e),
                },
                // Nothing to read after all: wait again.
                Err(_would_block) => continue,
            }
        };
        let (h, args) = match abi::parse(&buf[..n]) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("{e}");
                continue;
            }
        };
        let dev = &fs.dev;
        match h.opcode {
            op::INIT => {
                let r = handshake(args);
                initialized = r.is_ok();
                send(dev, h.unique, r);
            }
            _ if !initialized => send(dev, h.unique, Err(libc::EIO)),
            op::INTERRUPT => {
                if let Ok(target) = Args::new(args).u64() {
                    interrupt(&fs, &serving, target);
                }
            }
            op::FORGET | op::BATCH_FORGET => {}
            op::DESTROY => {
                send(dev, h.unique, Ok(Vec::new()));
                return Ok(());
            }
            _ => {
                let (tx, cancel) = match h.opcode {
                    op::SETLK | op::SETLKW => {
                        let (tx, rx) = oneshot::channel();
                        (Some(tx), Some(rx))
                    }
                    _ => (None, None),
                };
                let deadline = fs.soft_timeout.filter(|_| h.opcode != op::SETLKW).map(|t| Instant::now() + t);
                serving.lock().insert(h.unique, Serving { opcode: h.opcode, pid: h.pid, cancel: tx, deadline });
                let (fs, serving, body) = (fs.clone(), serving.clone(), args.to_vec());
                tokio::spawn(async move {
                    let answer = fs.handle(h, &body, cancel).await;
                    let ours = serving.lock().remove(&h.unique).is_some();
                    match answer {
                        Some(a) if ours => {
                            trace(&h, &a);
                            send(&fs.dev, h.unique, a);
                        }
                        Some(a) => fs.abandoned(&h, a).await,
                        None => {}
                    }
                });
            }
        }
    }
}

/// `FUSE_INTERRUPT` of request `target`: a blocking lock request is
/// withdrawn; any other waits for its caller to be dying (see the
/// module's docs), then a lock request is withdrawn (so that a grant on
/// its way is given back: the kernel will never know of it) and anything
/// else is answered `EINTR`. O(1); then a read of the caller's
/// `/proc/PID/status` every [`WATCH_EVERY`] while it waits.
fn interrupt(fs: &Arc<Fs>, serving: &Table, target: u64) {
    let pid = {
        let mut table = serving.lock();
        // None: answered already.
        let Some(s) = table.get_mut(&target) else { return };
        if s.opcode == op::SETLKW {
            withdraw(s, libc::EINTR);
            return;
        }
        s.pid
    };
    let (fs, serving) = (fs.clone(), serving.clone());
    tokio::spawn(async move {
        loop {
            if !serving.lock().contains_key(&target) {
                return;
            }
            if crate::creds::dying(pid) {
                let mut table = serving.lock();
                if give_up_one(&mut table, target, libc::EINTR) {
                    drop(table);
                    send(&fs.dev, target, Err(libc::EINTR));
                }
                return;
            }
            tokio::time::sleep(WATCH_EVERY).await;
        }
    });
}

/// Gives request `target` up, if it is still being served, with `errno`:
/// a lock request is withdrawn (its task answers); anything else is
/// taken out of the table for the caller to answer (true), so that its
/// task's answer, when it comes, is
/// [`Fs::abandoned`](crate::ops::Fs::abandoned). O(1).
fn give_up_one(table: &mut HashMap<u64, Serving>, target: u64, errno: i32) -> bool {
    match table.get_mut(&target) {
        Some(s) if s.cancel.is_some() => {
            withdraw(s, errno);
            false
        }
        Some(_) => table.remove(&target).is_some(),
        None => false,
    }
}

/// Fires a lock request's cancel: its task withdraws it and answers
/// `errno`, unless the answer came first. Given up once: no deadline
/// after.
fn withdraw(s: &mut Serving, errno: i32) {
    s.deadline = None;
    if let Some(tx) = s.cancel.take() {
        let _ = tx.send(errno);
    }
}

/// A soft mount's timer: every quarter of `timeout` (from 10 ms to 1 s),
/// gives up with `EIO` every request past its deadline. O(requests being
/// served) a look.
async fn give_up(fs: Arc<Fs>, serving: Table, timeout: Duration) {
    let every = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        let now = Instant::now();
        let (late, answer) = {
            let mut table = serving.lock();
            let late: Vec<u64> =
                table.iter().filter(|(_, s)| s.deadline.is_some_and(|d| d <= now)).map(|(&u, _)| u).collect();
            let answer: Vec<u64> = late.iter().copied().filter(|&u| give_up_one(&mut table, u, libc::EIO)).collect();
            (late.len(), answer)
        };
        if late > 0 {
            tracing::warn!(calls = late, ?timeout, "no answer from the server in the soft mount's time: EIO");
        }
        for unique in answer {
            send(&fs.dev, unique, Err(libc::EIO));
        }
    }
}

/// The soft mount's timer task, stopped when the mount's loop ends.
struct Timer(tokio::task::JoinHandle<()>);

impl Drop for Timer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn trace(h: &InHeader, a: &Answer) {
    if let Err(e) = a {
        tracing::trace!(opcode = h.opcode, nodeid = h.nodeid, errno = e, "failed");
    }
}

/// Answers `FUSE_INIT`: the protocol version and what we ask for.
/// Without `POSIX_LOCKS` and `FLOCK_LOCKS` the kernel would keep locks on
/// this machine only, so a kernel that does not offer them is refused.
fn handshake(args: &[u8]) -> Answer {
    let mut a = Args::new(args);
    let (major, minor, max_readahead, flags) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
    let flags2 = if u64::from(flags) & init::INIT_EXT != 0 { a.u32()? } else { 0 };
    if major != abi::MAJOR {
        tracing::error!(major, minor, "the kernel speaks FUSE {major}.{minor}; we speak 7.x");
        return Err(libc::EPROTO);
    }
    let offered = u64::from(flags) | (u64::from(flags2) << 32);
    let need = init::POSIX_LOCKS | init::FLOCK_LOCKS;
    if offered & need != need {
        tracing::error!(
            "the kernel does not pass POSIX and flock locks to FUSE file systems; locks would not be shared"
        );
        return Err(libc::EPROTO);
    }
    let granted = offered & WANT;
    tracing::debug!(major, minor, offered = format!("{offered:#x}"), granted = format!("{granted:#x}"), "FUSE init");
    let mut out = Vec::with_capacity(64);
    abi::put32(&mut out, abi::MAJOR);
    abi::put32(&mut out, minor.min(abi::MINOR));
    abi::put32(&mut out, max_readahead);
    abi::put32(&mut out, granted as u32);
    out.extend_from_slice(&64u16.to_ne_bytes()); // max_background
    out.extend_from_slice(&48u16.to_ne_bytes()); // congestion_threshold
    abi::put32(&mut out, MAX_WRITE as u32);
    abi::put32(&mut out, 1); // time_gran: nanoseconds
    out.extend_from_slice(&((MAX_WRITE / 4096) as u16).to_ne_bytes()); // max_pages
    out.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    abi::put32(&mut out, (granted >> 32) as u32);
    out.resize(64, 0);
    Ok(out)
}

/// Writes one answer. `ENOENT`: the request was interrupted and the
/// kernel no longer waits for it.
fn send(dev: &File, unique: u64, a: Answer) {
    let msg = abi::reply(unique, a.as_deref().map_err(|e| *e));
    match (&*dev).write(&msg) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => tracing::warn!(unique, error = %e, "answering the kernel"),
    }
}
