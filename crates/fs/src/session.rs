//! The loop that reads the kernel's requests from `/dev/fuse` and answers
//! them.
//!
//! One thread reads; each request becomes a task on the client's runtime,
//! so any number are in flight and a blocked `F_SETLKW` holds no thread.
//! Answers are written from the tasks (one `write` each; the kernel
//! matches them by unique id). Reading on one thread also orders each
//! `FUSE_INTERRUPT` after the request it names, so the interrupt always
//! finds a blocking lock request that is still waiting: it fires the
//! request's cancel, the wait is withdrawn at the server and the caller
//! gets `EINTR`. Interrupts of anything else are ignored (those requests
//! finish soon on their own).

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::Arc;

use foldhash::HashMap;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::abi::{self, Args, InHeader, init, op};
use crate::ops::{Answer, Fs};

/// Largest write (and read) the kernel sends in one request.
pub const MAX_WRITE: usize = 1 << 20;

/// What we ask of the kernel at `FUSE_INIT`. Readdirplus always (not
/// `READDIRPLUS_AUTO`, which lists without attributes after the first
/// page): `du` and `ls -l` then stat from the kernel's cache, with no
/// lookup per file.
const WANT: u64 = init::ASYNC_READ
    | init::POSIX_LOCKS
    | init::FLOCK_LOCKS
    | init::BIG_WRITES
    | init::DO_READDIRPLUS
    | init::PARALLEL_DIROPS
    | init::MAX_PAGES
    | init::INIT_EXT
    | init::DIRECT_IO_ALLOW_MMAP;

/// Serves the mount until it is unmounted. Blocks the calling thread.
pub fn run(fs: Arc<Fs>, rt: tokio::runtime::Handle) -> io::Result<()> {
    let dev = fs.dev.clone();
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    let waits: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>> = Arc::default();
    let mut initialized = false;
    loop {
        let n = match (&*dev).read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // The request was interrupted before we read it; a signal.
                Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => continue,
                // Unmounted.
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(e),
            },
        };
        let (h, args) = match abi::parse(&buf[..n]) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("{e}");
                continue;
            }
        };
        match h.opcode {
            op::INIT => {
                let r = handshake(args);
                initialized = r.is_ok();
                send(&dev, h.unique, r);
            }
            _ if !initialized => send(&dev, h.unique, Err(libc::EIO)),
            op::INTERRUPT => {
                if let Ok(target) = Args::new(args).u64()
                    && let Some(tx) = waits.lock().remove(&target)
                {
                    let _ = tx.send(());
                }
            }
            op::FORGET | op::BATCH_FORGET => {}
            op::DESTROY => {
                send(&dev, h.unique, Ok(Vec::new()));
                return Ok(());
            }
            _ => {
                let cancel = (h.opcode == op::SETLKW).then(|| {
                    let (tx, rx) = oneshot::channel();
                    waits.lock().insert(h.unique, tx);
                    rx
                });
                let (fs, dev, waits, body) = (fs.clone(), dev.clone(), waits.clone(), args.to_vec());
                rt.spawn(async move {
                    let answer = fs.handle(h, &body, cancel).await;
                    if h.opcode == op::SETLKW {
                        waits.lock().remove(&h.unique);
                    }
                    if let Some(a) = answer {
                        trace(&h, &a);
                        send(&dev, h.unique, a);
                    }
                });
            }
        }
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
