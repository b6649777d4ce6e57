//! Namespace and changelog requests onto the store (`interlock-meta`):
//! each runs on the connection's task (the namespace's operations take
//! no lock for long and never wait for the disk; a copy between files,
//! an `fsync` and a `fallocate`, which may keep the disk busy for long,
//! and a read whose bytes are not all in the page cache run on a
//! blocking thread), and its answer goes through the acker
//! (`durable`) when it made a change. The files a session holds open
//! are tracked here, so that its end closes them (an orphan goes with
//! its last handle).
//!
//! Costs: each request is one namespace operation (see `interlock-meta`:
//! O(log n) for entry operations, O(log n + k) for a listing of k);
//! opening and closing cost O(1) expected more here.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use interlock_journal::changelog::{Changelog, Consumer, FOLLOW_BATCH, FOLLOW_LINGER, Mask};
use interlock_meta::ReadFrom::{Cache, Disk};
use interlock_meta::{Caller, Cred, Errno, FileType, Ino, NewInode, Seq, Tag};
use interlock_proto::Reply;
use interlock_proto::meta::{
    Asking, ChangelogOp, ChangelogRecord, ChangelogReply, ConsumerInfo, Entry, MAX_DATA, MAX_WRITE, MetaOp, MetaReply,
    Once,
};

use crate::origins::Ending;
use crate::{Inner, durable};

/// Most records in one changelog read (each at most ~600 bytes: under a
/// frame).
const MAX_RECORDS: u32 = 256;
/// The longest a changelog read waits for its first record (a follower
/// asks again: `interlock changelog read --follow` waits 5 s a read).
/// Until session 48 a client could ask for 49 days.
const FOLLOW_WAIT_MAX: Duration = Duration::from_secs(30);
/// A listing stops when its entries reach this many bytes (estimated):
/// under a frame.
const LISTING_BYTES: usize = 192 << 10;
/// How often the checkpointer looks at the store.
const TICK: Duration = Duration::from_millis(500);
/// The most ticks the checkpointer waits after failed checkpoints before
/// it tries again (a minute): each failure doubles the wait from one
/// tick. A checkpoint of 10M files writes ~700 MB; tried every tick on a
/// full disk it would fill what room a removal made.
const CHECKPOINT_BACKOFF_MAX: u64 = 120;

/// The wall clock in the namespace's nanoseconds: the time a change is
/// stamped with (the engine reads no clock; its callers pass this).
pub fn now() -> interlock_meta::Nanos {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// Open handles per session: session -> inode -> count.
#[derive(Default)]
pub(crate) struct Opens(scc::HashMap<u64, HashMap<Ino, u32>, foldhash::fast::RandomState>);

impl Opens {
    fn add(&self, sid: u64, ino: Ino) {
        *self.0.entry_sync(sid).or_default().get_mut().entry(ino).or_default() += 1;
    }

    /// Takes one of the session's handles of `ino`; whether it had one.
    fn take(&self, sid: u64, ino: Ino) -> bool {
        self.0
            .update_sync(&sid, |_, m| match m.get_mut(&ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    true
                }
                Some(_) => m.remove(&ino).is_some(),
                None => false,
            })
            .unwrap_or(false)
    }

    /// Whether the session holds `ino` open. O(1) expected.
    fn holds(&self, sid: u64, ino: Ino) -> bool {
        self.0.read_sync(&sid, |_, m| m.contains_key(&ino)).unwrap_or(false)
    }

    /// Every handle of a session that ended.
    fn end(&self, sid: u64) -> HashMap<Ino, u32> {
        self.0.remove_sync(&sid).map(|(_, m)| m).unwrap_or_default()
    }
}

/// Closes the files a session that ended held open, and sees to its
/// client's replay cache (see [`Origins::end`]).
pub(crate) fn end_session(inner: &Inner, sid: u64, ending: Ending) {
    let ns = inner.store.ns();
    inner.origins.end(sid, ending, Instant::now(), |origin| ns.replies().forget(origin));
    for (ino, n) in inner.opens.end(sid) {
        for _ in 0..n {
            if let Err(e) = ns.release(&Cred::root(), ino) {
                tracing::warn!(session = sid, ino, error = %e, "closing a file of an ended session");
            }
        }
    }
}

/// Serves a namespace request; `None` when the answer will be pushed.
/// A change that may not be made twice (`once`) is made tagged, or, sent
/// again after a restart, answered from the replay cache if it was made
/// (and, asked `IfMade`, answered `NotMade` if it was not).
pub(crate) fn request(inner: &Inner, sid: u64, id: u64, cred: &Cred, op: MetaOp, once: Option<Once>) -> Option<Reply> {
    let tag = once.zip(inner.origins.of(sid)).map(|(o, origin)| Tag { origin, id, settled: o.settled });
    if let (Some(tag), Some(Once { asking: asking @ (Asking::Again | Asking::IfMade), .. })) = (tag, once) {
        match inner.store.ns().replies().find(tag.origin, id) {
            Some(ino) => {
                // Its record may not be durable yet (made on a connection
                // of the client's that this one's hello superseded): the
                // answer waits for every record appended so far.
                let journal = inner.store.changelog().journal();
                let seq = journal.next_index().saturating_sub(1);
                let reply = made_before(inner, sid, &op, ino);
                return inner.acker.answer(journal, &*inner.sessions, (seq, sid, id), reply);
            }
            None if asking == Asking::IfMade => return Some(Reply::NotMade),
            None => {}
        }
    }
    let offload = match &op {
        MetaOp::CopyRange { .. } | MetaOp::Fsync { .. } | MetaOp::Fallocate { .. } => true,
        // A read the page cache holds is served here; one that would
        // wait for the disk (milliseconds on a spinning disk, more under
        // load) is not.
        &MetaOp::Read { ino, offset, size, opened } => {
            match inner.store.read(caller(inner, sid, cred, opened, &[ino]), ino, (offset, read_len(size)), Cache) {
                Ok(bytes) => return Some(Reply::Meta(MetaReply::Bytes(bytes))),
                Err(Errno::EAGAIN) => true,
                Err(e) => return Some(Reply::Errno(stale_or(inner, e, [Some(ino), None]).0)),
            }
        }
        _ => false,
    };
    if offload {
        // The disk's work, which may take it long (megabytes copied, a
        // file's dirty data written out, a terabyte's extents reserved,
        // a read from the disk): on a blocking thread, not on a worker
        // that serves other connections meanwhile. That thread then
        // waits for (and makes) the records durable itself: no worker's
        // park would, the workers being idle.
        // Counted until answered: a clean stop waits for it (`stop`).
        let (task, cred) = (crate::stop::offload(inner.me.upgrade()?), cred.clone());
        // Its answer's bytes count as the stream's until it is pushed:
        // the connection serves no more while they would fill it.
        let promised = match &op {
            MetaOp::Read { size, .. } => read_len(*size),
            _ => 0,
        };
        let wire = inner.sessions.wire(sid).inspect(|w| w.promise(promised));
        tokio::task::spawn_blocking(move || {
            let server = task.server();
            let reply = run(server, sid, &cred, op)
                .and_then(|(reply, seq)| server.store.wait(seq).map(|()| Reply::Meta(reply)));
            durable::push(&server.sessions, sid, id, reply.unwrap_or_else(|e| Reply::Errno(e.0)));
            if let Some(w) = wire {
                w.fulfil(promised);
            }
        });
        return None;
    }
    let ran = match tag {
        Some(tag) => interlock_meta::tagged(tag, || run(inner, sid, cred, op)),
        None => run(inner, sid, cred, op),
    };
    match ran {
        Ok((reply, seq)) => {
            inner.acker.answer(inner.store.changelog().journal(), &*inner.sessions, (seq, sid, id), Reply::Meta(reply))
        }
        Err(e) => Some(Reply::Errno(e.0)),
    }
}

/// The answer to change `op`, made before (by a server that died, or on
/// an earlier connection of the client), whose record named inode `ino`:
/// what the first answer was, with the inode's attributes as they are
/// now (`ESTALE` if it is gone since); a file made open is opened in this
/// session, as it was in the first.
fn made_before(inner: &Inner, sid: u64, op: &MetaOp, ino: Ino) -> Reply {
    let ns = inner.store.ns();
    let made = match op {
        MetaOp::CreateOpen { .. } | MetaOp::Tmpfile { .. } => ns.open(&Cred::root(), ino, 0).map(|a| {
            inner.opens.add(sid, ino);
            MetaReply::Attr(a)
        }),
        MetaOp::Create { .. } | MetaOp::Link { .. } | MetaOp::Write { .. } => ns.stat(ino).map(MetaReply::Attr),
        _ => Ok(MetaReply::Done),
    };
    made.map_or_else(|_| Reply::Errno(Errno::ESTALE.0), Reply::Meta)
}

/// Runs `op`; an `ENOENT` because an inode it names is gone is `ESTALE`
/// (see `MetaOp::inodes`).
fn run(inner: &Inner, sid: u64, cred: &Cred, op: MetaOp) -> Result<(MetaReply, Seq), Errno> {
    let named = op.inodes();
    perform(inner, sid, cred, op).map_err(|e| stale_or(inner, e, named))
}

/// `e`, or `ESTALE` if it is `ENOENT` and one of the inodes `named` no
/// longer exists and was not a directory (a removed directory is
/// `ENOENT`, as on Linux: see `interlock_meta`'s `freed_dir`). O(1)
/// expected, and only on the way out of a failure.
fn stale_or(inner: &Inner, e: Errno, named: [Option<Ino>; 2]) -> Errno {
    let ns = inner.store.ns();
    if e == Errno::ENOENT && named.into_iter().flatten().any(|ino| ns.getattr(ino).is_err() && !ns.freed_dir(ino)) {
        Errno::ESTALE
    } else {
        e
    }
}

/// `op` on the store: its answer, and the record it made (0 for none).
fn perform(inner: &Inner, sid: u64, cred: &Cred, op: MetaOp) -> Result<(MetaReply, Seq), Errno> {
    let ns = inner.store.ns();
    let now = now();
    let attr = |(a, s)| (MetaReply::Attr(a), s);
    let done = |s| (MetaReply::Done, s);
    Ok(match op {
        MetaOp::Lookup { parent, name } => (MetaReply::Attr(ns.lookup(cred, parent, &name)?), 0),
        MetaOp::Getattr { ino } => (MetaReply::Attr(ns.stat(ino)?), 0),
        MetaOp::Setattr { ino, set } => attr(inner.store.setattr(cred, ino, &set, now)?),
        MetaOp::Create { parent, name, kind, perm, rdev, target, umask } => {
            if kind == FileType::Symlink && target.is_empty() {
                return Err(Errno::ENOENT);
            }
            attr(ns.create(cred, parent, &name, NewInode { kind, perm, rdev, umask }, &target, now)?)
        }
        MetaOp::CreateOpen { parent, name, perm, umask } => {
            let (a, seq) = ns.create_open(cred, parent, &name, (perm, umask), now)?;
            inner.opens.add(sid, a.ino);
            (MetaReply::Attr(a), seq)
        }
        MetaOp::Tmpfile { parent, perm, linkable, umask } => {
            let (a, seq) = ns.tmpfile(cred, parent, (perm, umask), linkable, now)?;
            inner.opens.add(sid, a.ino);
            (MetaReply::Attr(a), seq)
        }
        MetaOp::Link { ino, parent, name } => attr(ns.link(cred, ino, parent, &name, now)?),
        MetaOp::Unlink { parent, name } => done(ns.unlink(cred, parent, &name, now)?),
        MetaOp::Rmdir { parent, name } => done(ns.rmdir(cred, parent, &name, now)?),
        MetaOp::Rename { parent, name, new_parent, new_name, flags } => {
            done(ns.rename(cred, (parent, &name), (new_parent, &new_name), flags, now)?)
        }
        MetaOp::Readlink { ino } => (MetaReply::Bytes(ns.readlink(ino)?), 0),
        // A listing that goes on from a page already checked is taken at
        // the client's word, as `Setattr`'s `opened_for_write` is: a
        // directory handle is the mount's alone (the server sees no
        // `opendir`).
        MetaOp::Readdir { ino, cookie, max, plus, opened } => {
            (listing(inner, Caller { cred, opened }, ino, (cookie, max), plus)?, 0)
        }
        MetaOp::Getxattr { ino, name } => (MetaReply::Bytes(ns.getxattr(cred, ino, &name)?), 0),
        MetaOp::Setxattr { ino, name, value, mode } => done(ns.setxattr(cred, ino, &name, &value, mode, now)?),
        MetaOp::Listxattr { ino } => {
            (MetaReply::Names(ns.listxattr(cred, ino)?.into_iter().map(serde_bytes::ByteBuf::from).collect()), 0)
        }
        MetaOp::Removexattr { ino, name } => done(ns.removexattr(cred, ino, &name, now)?),
        MetaOp::Statfs => (MetaReply::StatFs(inner.store.statfs()?), 0),
        MetaOp::Open { ino, want } => {
            let a = ns.open(cred, ino, want)?;
            inner.opens.add(sid, ino);
            (MetaReply::Attr(a), 0)
        }
        MetaOp::Release { ino } => {
            if !inner.opens.take(sid, ino) {
                return Err(Errno::EBADF);
            }
            done(ns.release(cred, ino)?)
        }
        MetaOp::Read { ino, offset, size, opened } => {
            let who = caller(inner, sid, cred, opened, &[ino]);
            (MetaReply::Bytes(inner.store.read(who, ino, (offset, read_len(size)), Disk)?), 0)
        }
        MetaOp::Write { ino, offset, append, data, opened } => {
            if data.len() > MAX_WRITE {
                return Err(Errno::EINVAL);
            }
            // Answered once its record is in the journal's file (the
            // store's `write`), not once synced, as write(2) returns
            // before its data is on disk: the record, like the data, is
            // durable by the next fsync (which waits for every record so
            // far), and a crash of this process loses neither.
            let who = caller(inner, sid, cred, opened, &[ino]);
            let (a, _durable_at) = inner.store.write(who, ino, (!append).then_some(offset), &data, now)?;
            (MetaReply::Attr(a), 0)
        }
        MetaOp::Fallocate { ino, how, offset, len, opened } => {
            // Answered as a write is (and as fallocate(2) on a local
            // file system returns before a sync).
            let who = caller(inner, sid, cred, opened, &[ino]);
            (MetaReply::Attr(inner.store.fallocate(who, ino, how, (offset, len), now)?.0), 0)
        }
        MetaOp::CopyRange { src, src_off, dst, dst_off, len, opened } => {
            // Answered as a write is: once its record is in the
            // journal's file, not once durable.
            let who = caller(inner, sid, cred, opened, &[src, dst]);
            let (bytes, attr, _) = inner.store.copy_range(who, (src, src_off), (dst, dst_off), len, now)?;
            (MetaReply::Copied { bytes, attr }, 0)
        }
        MetaOp::Seek { ino, offset, to, opened } => {
            (MetaReply::Offset(inner.store.seek(caller(inner, sid, cred, opened, &[ino]), ino, offset, to)?), 0)
        }
        MetaOp::Fsync { ino } => done(inner.store.fsync(ino)?),
        MetaOp::Flags { ino, set } => {
            let seq = match set {
                Some(flags) => ns.set_flags(cred, ino, flags, now)?,
                None => 0,
            };
            (MetaReply::Flags(ns.flags(ino)?), seq)
        }
    })
}

/// Who makes a data call: through handles the session opened (and so
/// not checked again) only if it still holds every one of `inos` open;
/// a handle the server no longer knows of (its session ended, and the
/// file was gone before the client opened it again) vouches for nothing.
fn caller<'a>(inner: &Inner, sid: u64, cred: &'a Cred, opened: bool, inos: &[Ino]) -> Caller<'a> {
    Caller { cred, opened: opened && inos.iter().all(|&ino| inner.opens.holds(sid, ino)) }
}

/// The bytes a read of `size` returns at most: what fits a frame.
fn read_len(size: u32) -> usize {
    (size as usize).min(MAX_DATA)
}

/// A page of a listing: at most `max` entries after `cookie` and what fits
/// a frame.
fn listing(inner: &Inner, who: Caller, ino: Ino, (cookie, max): (u64, u32), plus: bool) -> Result<MetaReply, Errno> {
    let ns = inner.store.ns();
    let want = (max as usize).clamp(1, 4096);
    let page: Vec<Entry> = if plus {
        ns.readdirplus(who, ino, cookie, want)?
            .into_iter()
            .map(|(e, attr)| Entry { name: e.name, ino: e.ino, kind: e.kind, cookie: e.cookie, attr })
            .collect()
    } else {
        ns.readdir(who, ino, cookie, want)?
            .into_iter()
            .map(|e| Entry { name: e.name, ino: e.ino, kind: e.kind, cookie: e.cookie, attr: None })
            .collect()
    };
    let mut end = page.len() < want;
    let mut bytes = 0;
    let mut entries = Vec::with_capacity(page.len());
    for e in page {
        bytes += e.name.len() + if plus { 96 } else { 24 };
        if bytes > LISTING_BYTES {
            end = false;
            break;
        }
        entries.push(e);
    }
    Ok(MetaReply::Entries { entries, end })
}

fn consumer_info(c: Consumer) -> ConsumerInfo {
    ConsumerInfo { id: c.id, name: c.name, mask: c.mask.0, cleared: c.cleared }
}

/// Serves a changelog request; `None` when the answer will be pushed (a
/// read that waits for records: see [`follow`]; a change of the
/// consumers, see [`change_consumers`]).
pub(crate) fn changelog(inner: &Inner, sid: u64, id: u64, op: ChangelogOp) -> Option<Reply> {
    match op {
        ChangelogOp::Register { name, mask } => change_consumers(inner, sid, id, move |cl, now| {
            cl.register(name.as_deref(), Mask(mask), now).map(|c| ChangelogReply::Consumer(consumer_info(c)))
        }),
        ChangelogOp::Deregister { id: who } => {
            change_consumers(inner, sid, id, move |cl, _| cl.deregister(&who).map(|()| ChangelogReply::Done))
        }
        ChangelogOp::Clear { id: who, upto } => {
            change_consumers(inner, sid, id, move |cl, now| cl.clear(&who, upto, now).map(|()| ChangelogReply::Done))
        }
        ChangelogOp::List => {
            let consumers = inner.store.changelog().consumers().into_iter().map(consumer_info).collect();
            Some(Reply::Changelog(ChangelogReply::Consumers(consumers)))
        }
        ChangelogOp::Read { id: who, from, max, wait_ms } if wait_ms > 0 => {
            let server = inner.me.upgrade()?;
            let wait = Duration::from_millis(u64::from(wait_ms)).min(FOLLOW_WAIT_MAX);
            tokio::spawn(async move {
                let reply = match follow(&server, &who, from, max, wait).await {
                    Ok(()) => read(&server, &who, from, max),
                    Err(e) => Reply::Error(e.to_string()),
                };
                durable::push(&server.sessions, sid, id, reply);
            });
            None
        }
        ChangelogOp::Read { id, from, max, .. } => Some(read(inner, &id, from, max)),
    }
}

/// Registers, deregisters or clears on a blocking thread, which pushes
/// the answer: each saves the consumers' state with two fsyncs (and a
/// clear may purge segments), which on a worker would hold up every
/// other connection it serves meanwhile. Counted until answered, as the
/// namespace's offloaded calls are.
fn change_consumers(
    inner: &Inner,
    sid: u64,
    id: u64,
    change: impl FnOnce(&Changelog, u64) -> Result<ChangelogReply, interlock_journal::Error> + Send + 'static,
) -> Option<Reply> {
    let task = crate::stop::offload(inner.me.upgrade()?);
    tokio::task::spawn_blocking(move || {
        let server = task.server();
        let r = change(server.store.changelog(), now().max(0) as u64);
        durable::push(&server.sessions, sid, id, r.map_or_else(|e| Reply::Error(e.to_string()), Reply::Changelog));
    });
    None
}

/// A follower's wait, on no thread (see `follow`): up to `wait` for a
/// first record past where its read begins, then up to [`FOLLOW_LINGER`]
/// for [`FOLLOW_BATCH`] of them (or `max`, if fewer), as
/// [`Changelog::read`](interlock_journal::changelog::Changelog::read)
/// waits on a thread. O(log w) for w reads waiting.
async fn follow(
    inner: &Inner,
    who: &str,
    from: Option<u64>,
    max: u32,
    wait: Duration,
) -> Result<(), interlock_journal::Error> {
    let (cl, waiting) = (inner.store.changelog(), &inner.following);
    let start = cl.start(who, from)?;
    waiting.until(cl.journal(), start.saturating_add(1), Instant::now() + wait).await;
    if cl.journal().durable_end() > start {
        let batch = FOLLOW_BATCH.min(u64::from(max.clamp(1, MAX_RECORDS)));
        waiting.until(cl.journal(), start.saturating_add(batch), Instant::now() + FOLLOW_LINGER).await;
    }
    // Not an empty answer at once, which the follower would ask again at
    // once, and again, until the server stops (as it does on a failed
    // journal).
    if cl.journal().failed() {
        return Err(interlock_journal::Error::Failed("the journal failed: no record is made durable".into()));
    }
    Ok(())
}

fn read(inner: &Inner, who: &str, from: Option<u64>, max: u32) -> Reply {
    let max = max.clamp(1, MAX_RECORDS) as usize;
    let mut records = Vec::new();
    let read = inner.store.changelog().read_each(who, from, max, None, |e| {
        let r = e.record;
        records.push(ChangelogRecord {
            index: e.index,
            rtype: r.rtype as u8,
            flags: r.flags,
            time: r.time_ns as i64,
            target: r.target,
            parent: r.parent,
            name: r.name,
            source: r.source.map(|s| (s.parent, s.name.into(), s.target)),
            uid: r.uid,
            gid: r.gid,
        })
    });
    match read {
        Ok(_) => Reply::Changelog(ChangelogReply::Records(records)),
        Err(e) => Reply::Error(e.to_string()),
    }
}

/// The checkpointer's thread: freed files' data removed once their
/// records are durable, a checkpoint every `checkpoint_every` records
/// (which also purges the journal behind it and the slowest consumer;
/// none while the journal's disk is full, and after a failure not again
/// for a wait that doubles up to [`CHECKPOINT_BACKOFF_MAX`] ticks),
/// idle changelog consumers deregistered, orphans whose last close found
/// the disk full freed once it has room, and once the recovery window
/// is over, orphans nobody reopened freed and the replay cache of clients
/// that did not come back let go of (at once when it ends: until
/// then `status` says the server is recovering). Runs until the server
/// is gone.
pub(crate) fn checkpointer(inner: std::sync::Weak<Inner>) {
    let mut ticks = 0u64;
    // After a failed checkpoint: the tick to try again at, and the wait
    // after the next failure.
    let (mut retry_at, mut backoff) = (0u64, 1u64);
    loop {
        let Some(server) = inner.upgrade() else { return };
        let pending = server.orphans_pending.load(Ordering::Relaxed);
        if pending && server.recovering().is_none() {
            if let Err(e) = server.store.ns().forget_orphans(&Cred::root()) {
                tracing::error!(error = %e, "freeing orphans after the restart");
            }
            // Those that did not come back lost their sessions: they ask
            // about none of their requests again.
            server.origins.retain_live(server.store.ns().replies());
            server.orphans_pending.store(false, Ordering::Relaxed);
        }
        let nap = server.recovering().filter(|_| pending).map_or(TICK, |left| left.min(TICK));
        drop(server);
        std::thread::sleep(nap);
        let Some(server) = inner.upgrade() else { return };
        let store = &server.store;
        if store.changelog().journal().failed() {
            server.journal_failed.notify_one();
        }
        if let Err(e) = store.ns().retry_forgets(&Cred::root()) {
            tracing::error!(error = %e, "freeing orphans closed while the disk was full");
        }
        store.collect_freed();
        // Not while the journal's disk is full: an image needs more room
        // than a record (see `docs/namespace.md`).
        if store.since_checkpoint() >= server.config.checkpoint_every
            && ticks >= retry_at
            && !store.changelog().journal().space_low()
        {
            match store.checkpoint() {
                Ok(_) => backoff = 1,
                Err(e) => {
                    tracing::error!(error = %e, retry_in_s = backoff as f64 * TICK.as_secs_f64(), "checkpoint failed");
                    retry_at = ticks + backoff;
                    backoff = (backoff * 2).min(CHECKPOINT_BACKOFF_MAX);
                }
            }
        }
        ticks += 1;
        if ticks.is_multiple_of(120)
            && let Err(e) = store.changelog().gc(now().max(0) as u64)
        {
            tracing::error!(error = %e, "changelog consumer gc");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_meta::ROOT;

    /// A change asked again on a new connection of its client, while the
    /// record the first connection made is not durable yet, is answered
    /// only once the record is: said `Ok` earlier, the change would be
    /// lost to a crash before the sync, and the client would never ask
    /// again. The journal syncs when a worker goes idle (none does here:
    /// no runtime's park hook runs this test's calls) or when its flusher
    /// finds a record left for a backstop (300 µs); so whether an answer
    /// came at once is not up to the test, but an answer that came must
    /// have its record durable, and one that did not must come with the
    /// sync.
    #[tokio::test]
    async fn an_answer_from_the_replay_cache_waits_for_its_record() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = crate::Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            data: dir.path().into(),
            ..Default::default()
        };
        let server = crate::Server::bind(config).await.expect("bind");
        let inner = &*server.inner;
        let journal = inner.store.changelog().journal();
        let (first, second, origin) = (1, 2, 77);
        inner.origins.set(first, origin);
        inner.origins.set(second, origin);
        let mut waited = 0;
        for id in 1..=50 {
            let op = MetaOp::CreateOpen { parent: ROOT, name: format!("f{id}").into_bytes(), perm: 0o644, umask: 0 };
            let once = |asking| Some(Once { settled: 0, asking });
            request(inner, first, id, &Cred::root(), op.clone(), once(Asking::First));
            let record = journal.next_index() - 1;
            let again = request(inner, second, id, &Cred::root(), op, once(Asking::Again));
            match again {
                Some(reply) => {
                    assert!(journal.durable_end() > record, "answered {reply:?} before record {record} was durable");
                }
                None => {
                    waited += 1;
                    assert!(inner.acker.is_parked(second, id), "not answered, so parked");
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while inner.acker.is_parked(second, id) {
                        assert!(Instant::now() < deadline, "record {record} synced, answer still parked");
                        journal.sync_wanted();
                        std::thread::yield_now();
                    }
                }
            }
        }
        // Mostly the second request comes well inside the backstop.
        assert!(waited > 0, "no answer ever waited: the test saw nothing");
    }
}
