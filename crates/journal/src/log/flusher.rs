//! The writer of the segments: gathering published records into groups,
//! writing and syncing them (on the flusher thread, or on a caller's),
//! and the flusher thread's own loops.

use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use super::Shared;
use super::tail::{PREALLOCATE, RESERVE, Tail};
#[cfg(doc)]
use super::{Journal, Options};
use crate::Error;
use crate::frame;
use crate::segment;

/// The segments' writer: the file being written, the ring position of the
/// next record to gather, the group's buffer (kept between groups),
/// whether the file holds records written but not yet synced, and
/// whether someone waited for a record of the last group written.
pub(super) struct Writer {
    pub(super) file: Tail,
    pub(super) pos: u64,
    pub(super) group: Vec<u8>,
    pub(super) unsynced: bool,
    pub(super) waited: bool,
}

/// Whether a [`flush`] makes what it writes durable.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Durably {
    /// Written and synced (with what earlier flushes wrote unsynced), the
    /// durable watermark advanced, the durable hook called.
    Yes,
    /// Written only ([`Journal::write_out`]).
    No,
}

/// What [`flush`] did.
#[derive(PartialEq)]
pub(super) enum Flushed {
    /// No record was published to write.
    Nothing,
    Wrote,
    /// The write or the sync failed: the journal has failed (and said so).
    Failed,
}

/// The flusher thread: gathers published records into groups, writes and
/// syncs each group, advances the durable watermark.
pub(super) fn flusher(s: &Shared) {
    if s.options.callers_sync {
        return backstop(s);
    }
    loop {
        let mut w = s.writer.lock();
        match flush(s, &mut w, true, Durably::Yes) {
            Flushed::Failed => return,
            Flushed::Wrote => {}
            Flushed::Nothing => {
                let pos = w.pos;
                if s.shutdown.load(Ordering::SeqCst) && s.ring.reserved() == pos {
                    return w.file.trim(s.state.lock().segments.last().expect("a current segment"));
                }
                drop(w);
                idle(s, pos, 32);
            }
        }
    }
}

/// Gathers the published records into one group (while nobody waits for
/// them and `linger` allows, for as long as appenders keep adding), writes
/// it, and if `durably` says so syncs it (and whatever was written unsynced
/// before it), advances the watermark and calls the durable hook. O(1)
/// per record plus a copy, one `write` and one `fdatasync`.
pub(super) fn flush(s: &Shared, w: &mut Writer, may_linger: bool, durably: Durably) -> Flushed {
    let Writer { file, pos, group, unsynced, waited } = w;
    group.clear();
    let durable_before = s.durable_end.load(Ordering::Relaxed).saturating_sub(1);
    let first = s.base + *pos;
    let full = s.options.linger_bytes.min(s.options.max_group_bytes);
    loop {
        gather(s, pos, group, durable_before);
        if group.is_empty() || s.options.fsync_each || group.len() >= full || !may_linger || !linger(s, *pos, !*waited)
        {
            break;
        }
    }
    s.gathered.store(*pos, Ordering::Release);
    let end = s.base + *pos;
    if end > first {
        *waited = s.wanted.load(Ordering::SeqCst) > first;
    }
    let done = if !group.is_empty() {
        write_group(s, file, unsynced, group, first, end, durably)
    } else if durably == Durably::Yes && *unsynced {
        // Nothing new, but records written unsynced to make durable.
        let path = s.state.lock().segments.last().expect("a current segment").path.clone();
        file.sync_written(s, unsynced, &path)
    } else {
        return Flushed::Nothing;
    };
    if let Err(e) = done {
        s.fail(e.to_string());
        s.tell(true);
        return Flushed::Failed;
    }
    s.written_end.store(end, Ordering::SeqCst);
    if durably == Durably::Yes {
        s.advance(end);
        s.tell(false);
    }
    Flushed::Wrote
}

/// Syncs, on the calling thread, until every record below `end` is
/// durable, or with `None` until every record anyone waits for is (what
/// the wanted mark says at each look). A writer already at work (the
/// backstop, another caller) is waited for, not left the sync: the caller
/// then writes what remains itself, so its answers leave from its own
/// thread and the backstop never becomes the one that syncs (session 21: a
/// backstop that kept syncing while callers left their records to it took
/// every sync from the server's worker for a whole run, and sent every
/// answer from its own thread, at 22 µs of server CPU a create against
/// 13-15). A caller that waits for its own record stops once that record
/// is durable: made to sync until nobody wanted anything, 64 threads each
/// waiting for its own create synced one another's records in turn, a few
/// at a time, for as long as the others kept appending (6.1k creates/s
/// against 147k with the flusher syncing for them, session 29).
pub(super) fn sync_waited(s: &Shared, end: Option<u64>) {
    let target = || end.unwrap_or_else(|| s.wanted.load(Ordering::SeqCst));
    let done = || target() <= s.durable_end.load(Ordering::SeqCst) || s.failed.load(Ordering::SeqCst);
    let mut tries = 0;
    loop {
        if done() {
            return;
        }
        let mut w = s.writer.lock();
        // The writer it waited for may have synced what it wanted.
        if done() {
            return;
        }
        match flush(s, &mut w, false, Durably::Yes) {
            Flushed::Failed => return,
            Flushed::Wrote => tries = 0,
            // A record before the wanted one is still being copied into
            // its slot: a moment's wait. Past that, the flusher's backstop
            // writes it.
            Flushed::Nothing if tries < 64 => {
                tries += 1;
                drop(w);
                std::thread::yield_now();
            }
            Flushed::Nothing => return,
        }
    }
}

/// The flusher when callers sync ([`Options::callers_sync`]): each
/// period it writes the records that sat unwritten for a whole period,
/// and syncs those written unsynced ([`Journal::write_out`]) that no sync
/// covered for a whole period; once appends stop for a period and all is
/// durable it sleeps until the next append wakes it (so an idle journal
/// costs no wake-ups). The period is [`Options::backstop`] while it finds
/// such records, and doubles up to [`Options::backstop_max`] while it
/// finds the callers writing and syncing them; an idle sleep keeps it.
fn backstop(s: &Shared) {
    // The writer's position, the ring's reserved count and the durable
    // watermark at the last look.
    let mut seen: Option<(u64, u64, u64)> = None;
    let mut pace = Pace::new(s.options.backstop, s.options.backstop_max);
    loop {
        if s.failed.load(Ordering::SeqCst) {
            return;
        }
        let reserved = s.ring.reserved();
        if s.shutdown.load(Ordering::SeqCst) {
            // Everything appended before the journal was dropped.
            let mut w = s.writer.lock();
            while w.pos < reserved || w.unsynced {
                match flush(s, &mut w, false, Durably::Yes) {
                    Flushed::Failed => return,
                    Flushed::Wrote => {}
                    Flushed::Nothing => std::thread::yield_now(),
                }
            }
            return w.file.trim(s.state.lock().segments.last().expect("a current segment"));
        }
        let pos = s.gathered.load(Ordering::Acquire);
        let durable = s.durable_end.load(Ordering::SeqCst);
        let lagging = s.written_end.load(Ordering::SeqCst) > durable;
        let unwritten = pos < reserved && seen.is_some_and(|(p, _, _)| p == pos);
        if unwritten || (lagging && seen.is_some_and(|(_, _, d)| d == durable)) {
            // One group, then back to sleep: what callers want meanwhile,
            // they write themselves.
            if flush(s, &mut s.writer.lock(), false, Durably::Yes) == Flushed::Failed {
                return;
            }
            pace.reset();
        } else if pos == reserved && !lagging && seen.is_some_and(|(_, r, _)| r == reserved) {
            // No spin: the callers write what comes next. The pace is
            // kept: a server whose creates come one at a time, each
            // synced by its caller before the next (a mount's, in one
            // directory), would otherwise wake the flusher 3-4 times a
            // create (the append's wake-up, the first look a `backstop`
            // later, the yields), which on two cores takes those
            // creates' callers the core.
            idle(s, pos, 0);
            seen = None;
            continue;
        } else if seen.is_some_and(|(p, _, d)| p != pos || d != durable) {
            pace.kept_up();
        }
        seen = Some((pos, reserved, durable));
        std::thread::park_timeout(pace.period);
    }
}

/// The backstop's period between looks: [`Options::backstop`] after a
/// look that had to write (or found the journal idle), doubled by each
/// look that found the callers writing, up to [`Options::backstop_max`]
/// (never below the shortest).
#[derive(Debug)]
struct Pace {
    shortest: Duration,
    longest: Duration,
    period: Duration,
}

impl Pace {
    fn new(shortest: Duration, longest: Duration) -> Pace {
        Pace { shortest, longest: longest.max(shortest), period: shortest }
    }

    /// The callers wrote since the last look: look less often.
    fn kept_up(&mut self) {
        self.period = (self.period * 2).min(self.longest);
    }

    /// Records sat unwritten a whole period, or appends stopped: look
    /// often again.
    fn reset(&mut self) {
        self.period = self.shortest;
    }
}

/// Moves the published records from `pos` on into `group` (sealing each
/// with `durable_before`), up to the group's limit, freeing their slots.
fn gather(s: &Shared, pos: &mut u64, group: &mut Vec<u8>, durable_before: u64) {
    let mut took = false;
    while group.len() < s.options.max_group_bytes {
        let taken = s.ring.consume(*pos, |rec| {
            let at = group.len();
            group.extend_from_slice(rec);
            frame::seal(&mut group[at..], durable_before);
        });
        if !taken {
            break;
        }
        *pos += 1;
        took = true;
        if s.options.fsync_each {
            break;
        }
    }
    if took {
        s.freed_space();
    }
}

/// A group is gathered and nobody waits for it yet: lets it grow while
/// appenders keep adding. True if more records came and still nobody
/// waits (gather them too); false to write now.
///
/// How it waits for the next record depends on whether anyone waited
/// for the last group. If nobody did (appenders that never wait), it
/// naps up to [`Options::linger_nap`] at a time, woken early by a
/// waiter ([`want`]) or by the appender that fills half the ring, but
/// by no other appender: it used to yield, which beside one such
/// appender kept the other core of two busy, 2.4-3.1 µs of the
/// flusher's CPU a record against 0.11-0.15 napping (session 56,
/// `bench mdtest --variant engine --ack end`). If someone did, it
/// yields a few times, as before: the waiters' records come within a
/// moment, and a flusher asleep would be woken by a waiter only to
/// queue for a core behind dozens of them (a first trial with 64
/// waiting creators napped too, and made no more creates). Either way a
/// group is written once the appenders pause. O(1).
///
/// [`want`]: super::Journal::want
fn linger(s: &Shared, pos: u64, nap: bool) -> bool {
    let waited = || s.wanted.load(Ordering::SeqCst) > s.durable_end.load(Ordering::Relaxed);
    if nap {
        if waited() {
            return false;
        }
        if s.ring.ready(pos) {
            return true;
        }
        s.flusher_napping.store(pos + 1, Ordering::Relaxed);
        // Pairs with the fence in `want`.
        fence(Ordering::SeqCst);
        if !waited() && !s.shutdown.load(Ordering::SeqCst) {
            std::thread::park_timeout(s.options.linger_nap);
        }
        s.flusher_napping.store(0, Ordering::Relaxed);
        return !waited() && s.ring.ready(pos);
    }
    for _ in 0..32 {
        if waited() {
            return false;
        }
        if s.ring.ready(pos) {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// While the disk is full, tries again to extend the segment being
/// written (one failing `write` a try; a group being written is waited
/// for, and the look is not missed: a caller refused `ENOSPC` must not
/// be refused for want of a look). Room
/// made by anything but a record (a removed file's data, deleted once
/// its removal is durable; another program's files) is then found by the
/// next change that asks ([`Journal::space_low`]) or within an idle
/// period: the writer alone would find it only at the next record, and
/// while the disk is full every change but a removal waits for room, so
/// none may come.
pub(super) fn retry_room(s: &Shared) {
    if !s.space_low.load(Ordering::Relaxed) {
        return;
    }
    let mut w = s.writer.lock();
    let len = s.state.lock().segments.last().expect("a current segment").len;
    let extended = w.file.extend((len + RESERVE).next_multiple_of(PREALLOCATE));
    s.zeros_left.store(w.file.size - len, Ordering::Relaxed);
    if extended.is_ok() {
        note_space(s, false);
    }
}

/// Nothing to write: yield `spins` times while no record comes, then
/// sleep until an appender wakes us (looking for room first if the disk
/// was full).
fn idle(s: &Shared, pos: u64, spins: u32) {
    retry_room(s);
    for _ in 0..spins {
        if s.ring.ready(pos) {
            return;
        }
        std::thread::yield_now();
    }
    s.flusher_sleeping.store(true, Ordering::Relaxed);
    // Pairs with the fence in `append`: either we see the record now, or
    // its appender sees that we sleep and wakes us.
    fence(Ordering::SeqCst);
    if !s.ring.ready(pos) && !s.shutdown.load(Ordering::SeqCst) {
        std::thread::park_timeout(Duration::from_millis(100));
    }
    s.flusher_sleeping.store(false, Ordering::Relaxed);
}

/// Records whether the disk was found full, and says so when that
/// changes.
fn note_space(s: &Shared, full: bool) {
    if s.space_low.swap(full, Ordering::Relaxed) != full {
        if full {
            tracing::warn!(
                dir = %s.dir.display(),
                "the journal's disk is full: records go into the {} KiB set aside until it has room",
                RESERVE >> 10
            );
        } else {
            tracing::info!(dir = %s.dir.display(), "the journal's disk has room again");
        }
    }
}

/// Writes one group (records `first..end`) to the segments: as much as
/// fits in the current one, then, after that segment is synced, into a
/// new segment (so a segment that is not the last is always wholly
/// durable). The last part is synced if `sync` says so; `unsynced` says
/// whether the current file holds records not yet synced.
fn write_group(
    s: &Shared,
    file: &mut Tail,
    unsynced: &mut bool,
    group: &[u8],
    first: u64,
    end: u64,
    durably: Durably,
) -> Result<(), Error> {
    let (mut off, mut index) = (0usize, first);
    while index < end {
        let mut state = s.state.lock();
        let cur = state.segments.last().expect("a current segment");
        // While the disk is full the current segment goes on past its
        // size: a new one would need room, the current one has zeros.
        let full = s.space_low.load(Ordering::Relaxed);
        if cur.len >= s.options.segment_bytes && cur.end > cur.first && !full {
            let path = cur.path.clone();
            drop(state);
            file.sync_written(s, unsynced, &path)?;
            state = s.state.lock();
            match segment::create(&s.dir, index, s.options.fsync) {
                Ok((f, seg)) => {
                    file.trim(state.segments.last().expect("a current segment"));
                    *file = Tail { file: f, size: seg.len };
                    state.segments.push(seg);
                }
                Err(e) if e.is_no_space() => note_space(s, true),
                Err(e) => return Err(e),
            }
        }
        let cur = state.segments.last().expect("a current segment");
        let (path, base) = (cur.path.clone(), cur.len);
        drop(state);
        let full = s.space_low.load(Ordering::Relaxed);
        // Whole records, at least one, until the segment is full.
        let mut starts = Vec::new();
        let mut cut = off;
        while cut < group.len() && (starts.is_empty() || full || base + ((cut - off) as u64) < s.options.segment_bytes)
        {
            starts.push(cut);
            let len = u32::from_le_bytes(group[cut..cut + 4].try_into().expect("4 bytes")) as usize;
            cut += frame::RECORD_HEADER + len;
        }
        if let Some(full) = file.write_at(&path, &group[off..cut], base)? {
            note_space(s, full);
        }
        s.zeros_left.store(file.size - (base + (cut - off) as u64), Ordering::Relaxed);
        *unsynced = true;
        if durably == Durably::Yes {
            file.sync_written(s, unsynced, &path)?;
        }
        let mut state = s.state.lock();
        let cur = state.segments.last_mut().expect("a current segment");
        for &at in &starts {
            cur.note(index, base + (at - off) as u64);
            index += 1;
        }
        cur.len += (cut - off) as u64;
        cur.end = index;
        off = cut;
    }
    Ok(())
}

#[cfg(test)]
mod pace_tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Doubling stops at the longest, a reset goes back to the shortest,
    /// and a longest below the shortest is the shortest.
    #[test]
    fn the_backstop_period_doubles_up_to_its_cap_and_resets() {
        let mut pace = Pace::new(MS, 5 * MS);
        let mut seen = Vec::new();
        for _ in 0..5 {
            pace.kept_up();
            seen.push(pace.period);
        }
        assert_eq!(seen, [2 * MS, 4 * MS, 5 * MS, 5 * MS, 5 * MS]);
        pace.reset();
        assert_eq!(pace.period, MS);
        let mut flat = Pace::new(10 * MS, MS);
        flat.kept_up();
        assert_eq!(flat.period, 10 * MS);
    }
}
