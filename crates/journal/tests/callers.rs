//! A journal whose callers sync ([`Options::callers_sync`]): the threads
//! that wait write and sync the groups, the flusher only writes what sits
//! unwritten for a whole backstop period. Every record still
//! becomes durable when nobody calls in, everything
//! appended is there after the journal is dropped, and with a backstop
//! that never comes (an hour) the waiters alone make every record durable,
//! each sync on the waiter's own thread.

use std::sync::Arc;
use std::time::Duration;

use interlock_journal::{Journal, Options};
use parking_lot::Mutex;

fn callers() -> Options {
    Options { segment_bytes: 64 << 10, callers_sync: true, ..Options::default() }
}

/// A backstop that never comes within a test: what becomes durable, the
/// callers made so.
fn callers_alone() -> Options {
    Options { backstop: Duration::from_secs(3600), ..callers() }
}

/// Long enough for a backstop of a few hundred microseconds on a loaded
/// machine; a broken backstop waits it out and fails.
const PATIENCE: Duration = Duration::from_secs(10);

fn read_all(dir: &std::path::Path) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    interlock_journal::read_dir(dir, 1, |i, p| out.push((i, p.to_vec()))).unwrap();
    out
}

#[test]
fn a_waited_record_becomes_durable_though_no_caller_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), callers()).unwrap();
    let i = j.append(b"waited").unwrap();
    j.want(i + 1);
    // Watching does not sync: only the flusher's backstop can end this.
    assert!(j.watch_for(i + 1, Some(PATIENCE)).unwrap() > i, "the backstop never wrote a waited record");
}

#[test]
fn records_nobody_waits_for_become_durable_by_the_backstop() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), callers()).unwrap();
    let mut last = 0;
    for k in 0..50u32 {
        last = j.append(&k.to_le_bytes()).unwrap();
    }
    assert!(j.watch_for(last + 1, Some(PATIENCE)).unwrap() > last, "unwaited records left unwritten");
    // And again after the flusher went to sleep for want of appends.
    std::thread::sleep(Duration::from_millis(20));
    let again = j.append(b"after a pause").unwrap();
    assert!(j.watch_for(again + 1, Some(PATIENCE)).unwrap() > again, "the sleeping flusher was not woken");
}

/// While the callers keep up, the flusher looks less and less often
/// (`Options::backstop_max`); a record nobody takes after that is still
/// written.
#[test]
fn a_record_nobody_takes_after_the_callers_kept_up_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options { backstop: Duration::from_millis(1), backstop_max: Duration::from_millis(20), ..callers() };
    let (j, _) = Journal::open(dir.path(), options).unwrap();
    // Long enough for the flusher to find the callers writing at many
    // looks, and so to lengthen its sleep to the longest.
    let until = std::time::Instant::now() + Duration::from_millis(200);
    while std::time::Instant::now() < until {
        let i = j.append(b"synced by its caller").unwrap();
        j.want(i + 1);
        j.sync_wanted();
    }
    let i = j.append(b"nobody takes this one").unwrap();
    j.want(i + 1);
    assert!(j.watch_for(i + 1, Some(PATIENCE)).unwrap() > i, "the lengthened backstop never wrote the record");
}

/// `write_out` puts records in the files without syncing them: another
/// reader of the directory finds them at once, the durable watermark has
/// not moved, and the backstop (here, the drop's last flush) makes them
/// durable later.
#[test]
fn written_out_records_are_in_the_files_before_any_sync() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (j, _) = Journal::open(dir.path(), callers_alone()).unwrap();
        let before = j.durable_end();
        let mut last = 0;
        for k in 0..100u32 {
            last = j.append(&k.to_le_bytes()).unwrap();
        }
        j.write_out(last + 1).unwrap();
        assert!(j.written_end() > last);
        assert_eq!(j.durable_end(), before, "written, not synced");
        assert_eq!(read_all(dir.path()).len(), 100, "in the files");
        // Written out again: nothing to do.
        j.write_out(last + 1).unwrap();
    }
    assert_eq!(read_all(dir.path()).len(), 100);
}

/// Records written out and not synced become durable by the backstop,
/// and a waiter for one syncs it without waiting for the backstop.
#[test]
fn written_out_records_become_durable_by_the_backstop_or_a_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), callers()).unwrap();
    let i = j.append(b"written out").unwrap();
    j.write_out(i + 1).unwrap();
    assert!(j.watch_for(i + 1, Some(PATIENCE)).unwrap() > i, "the backstop never synced a written record");

    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), callers_alone()).unwrap();
    let i = j.append(b"written out, then waited for").unwrap();
    j.write_out(i + 1).unwrap();
    assert!(j.wait_for(i + 1, Some(PATIENCE)).unwrap() > i, "a waiter left a written record unsynced");
}

/// With no backstop to write them first, only the drop's last flush can.
#[test]
fn a_dropped_journal_has_written_everything_appended() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (j, _) = Journal::open(dir.path(), callers_alone()).unwrap();
        for k in 0..1000u32 {
            j.append(&k.to_le_bytes()).unwrap();
        }
    }
    let got = read_all(dir.path());
    assert_eq!(got.len(), 1000);
    for (n, (i, p)) in got.iter().enumerate() {
        assert_eq!((*i, p.as_slice()), (n as u64 + 1, (n as u32).to_le_bytes().as_slice()));
    }
}

/// `sync_wanted` is the sync itself, not a request to the flusher: the
/// durable hook runs on the caller's thread, every time.
#[test]
fn a_waiter_syncs_its_own_records_on_its_own_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), callers_alone()).unwrap();
    let me = std::thread::current().id();
    let (mine, theirs) = (Arc::new(Mutex::new(0u32)), Arc::new(Mutex::new(0u32)));
    let (m, t) = (mine.clone(), theirs.clone());
    assert!(
        j.on_durable(Box::new(move |_, _| {
            *(if std::thread::current().id() == me { &m } else { &t }).lock() += 1;
        }))
        .is_ok()
    );
    const ROUNDS: u32 = 200;
    for k in 0..ROUNDS {
        let i = j.append(&k.to_le_bytes()).unwrap();
        j.want(i + 1);
        j.sync_wanted();
        assert!(j.watch_for(i + 1, Some(PATIENCE)).unwrap() > i);
    }
    let (mine, theirs) = (*mine.lock(), *theirs.lock());
    assert_eq!((mine, theirs), (ROUNDS, 0), "groups synced by the caller and by the flusher");
}

/// A caller that wants its record while another thread is writing (here
/// the backstop, held inside its durable hook) waits for that writer and
/// then syncs its record itself: `sync_wanted` returns with the record
/// durable, made so on the caller's thread. A caller that left its sync to
/// the writer it found at work returned at once with the record unwritten
/// (and in session 21 such a backstop kept every sync for a whole run,
/// sending every answer from its own thread).
#[test]
fn a_caller_that_finds_the_writer_busy_waits_and_syncs_itself() {
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    // A period long beside a wake-up: the caller, once the hook lets go,
    // takes the writer well before the backstop could look again and
    // write the wanted record itself.
    let (j, _) = Journal::open(dir.path(), Options { backstop: Duration::from_millis(100), ..callers() }).unwrap();
    let me = std::thread::current().id();
    let (entered, in_hook) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let (entered, released) = (Mutex::new(Some(entered)), Mutex::new(released));
    let mine = Arc::new(Mutex::new(Vec::new()));
    let m = mine.clone();
    assert!(
        j.on_durable(Box::new(move |end, _| {
            if std::thread::current().id() == me {
                m.lock().push(end);
            } else if let Some(entered) = entered.lock().take() {
                // The backstop's first group: hold the writer a while.
                entered.send(()).unwrap();
                let _ = released.lock().recv_timeout(Duration::from_millis(200));
            }
        }))
        .is_ok()
    );
    // Nobody waits for this one: the backstop writes it, and stops in the hook.
    j.append(b"unwaited").unwrap();
    in_hook.recv_timeout(PATIENCE).expect("the backstop never wrote the unwaited record");
    let i = j.append(b"waited").unwrap();
    j.want(i + 1);
    j.sync_wanted();
    assert!(j.durable_end() > i, "sync_wanted returned with the wanted record not durable");
    assert_eq!(*mine.lock(), vec![i + 1], "the wanted record was not made durable on the caller's thread");
    let _ = release.send(());
}

/// Many threads appending and waiting, each syncing when it waits (a
/// server's workers): every record durable, once, in index order, and
/// every wait answered, with no backstop to rescue a waiter: a waiter that
/// finds the writer held waits for it, and one that returned with its
/// record unwritten waits here until it fails. (Until session 21 a waiter
/// left its sync to the holder; it failed so while the backstop took the
/// writer's lock just to look at its position, a holder that would not
/// sync.)
#[test]
fn concurrent_waiters_that_sync_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (j, _) = Journal::open(dir.path(), callers_alone()).unwrap();
        let j = Arc::new(j);
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let j = j.clone();
                std::thread::spawn(move || {
                    for k in 0..500u32 {
                        let i = j.append(&(t << 16 | k).to_le_bytes()).unwrap();
                        if k % 3 == 0 {
                            // Some wait through wait_durable, some through
                            // want and the sync a server's worker calls.
                            j.wait_durable(i).unwrap();
                        } else {
                            j.want(i + 1);
                            j.sync_wanted();
                            assert!(j.watch_for(i + 1, Some(PATIENCE)).unwrap() > i);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    let got = read_all(dir.path());
    assert_eq!(got.len(), 2000);
    let mut seen: Vec<u32> = got.iter().map(|(_, p)| u32::from_le_bytes(p[..4].try_into().unwrap())).collect();
    assert!(got.iter().enumerate().all(|(n, (i, _))| *i == n as u64 + 1), "a hole or reordering");
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 2000, "a record twice or lost");
}

/// A thread that waits for its own record (a server's blocking task: a
/// file's `fsync`, a checkpoint) returns once that record is durable,
/// though others go on appending records they want: it syncs what is
/// there, not every record anyone wants for as long as they keep coming.
/// Until session 29 it synced until nobody wanted anything, so while
/// others always had a wanted record on the way it never returned; here
/// it stayed until the loader ran out of its records.
#[test]
fn a_waiter_returns_once_its_record_is_durable_while_others_keep_wanting() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), callers_alone()).unwrap();
    let j = Arc::new(j);
    let waited = Arc::new(AtomicBool::new(false));
    // Far more records than one or two syncs take to write, on any disk.
    const LOAD: u32 = 2_000_000;
    let loader = {
        let (j, waited) = (j.clone(), waited.clone());
        std::thread::spawn(move || {
            let mut k = 0;
            while k < LOAD && !waited.load(Ordering::SeqCst) {
                // Never a full ring (nobody but the waiter writes here).
                if j.next_index() - j.durable_end() > 4096 {
                    std::thread::yield_now();
                    continue;
                }
                let i = j.append(&k.to_le_bytes()).unwrap();
                // Its next record too, as one that always has another on
                // the way: wanted is then always ahead of what is durable.
                j.want(i + 2);
                k += 1;
            }
            k
        })
    };
    // Once the load is under way.
    while j.next_index() < 1000 {
        std::thread::yield_now();
    }
    let mine = j.append(b"mine").unwrap();
    j.wait_durable(mine).unwrap();
    waited.store(true, Ordering::SeqCst);
    let appended = loader.join().unwrap();
    assert!(appended < LOAD, "the waiter returned only once the others stopped appending");
}
