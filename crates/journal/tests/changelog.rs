//! Changelog consumers against a simple model: register, deregister, read,
//! clear, checkpoint, GC and restarts, with small segments so that purge
//! happens often. The log must never be purged past the slowest consumer or
//! the checkpoint, every read must return exactly the model's records, and
//! all consumer state must survive a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use interlock_journal::changelog::{Changelog, ChangelogOptions, Mask, NAME_MAX, Record, RecordType, check_name};
use interlock_journal::{Error, Options};
use proptest::prelude::*;

fn record(n: u64, rtype: RecordType) -> Record {
    Record {
        rtype,
        flags: n as u32,
        time_ns: n * 1000,
        target: n,
        parent: n / 2,
        name: format!("f{n}").into_bytes(),
        source: (rtype == RecordType::RENME).then(|| interlock_journal::changelog::RenameSource {
            parent: 7,
            name: b"old".to_vec(),
            target: n,
        }),
        uid: 1000,
        gid: 100,
        jobid: n.is_multiple_of(3).then(|| format!("job{n}")),
    }
}

#[derive(Clone, Debug)]
struct MConsumer {
    mask: Mask,
    cleared: u64,
    active: u64,
}

#[derive(Clone, Debug)]
enum Op {
    Append { count: u8, rtype: usize },
    Register { mask: u32 },
    Deregister { pick: prop::sample::Index },
    Read { pick: prop::sample::Index },
    Clear { pick: prop::sample::Index, back: u8 },
    Checkpoint { back: u8 },
    Tick { secs: u8 },
    Gc,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let types = RecordType::ALL.len();
    prop_oneof![
        5 => (1u8..40, 0..types).prop_map(|(count, rtype)| Op::Append { count, rtype }),
        2 => any::<u32>().prop_map(|mask| Op::Register { mask: mask | 1 << 1 }),
        1 => any::<prop::sample::Index>().prop_map(|pick| Op::Deregister { pick }),
        3 => any::<prop::sample::Index>().prop_map(|pick| Op::Read { pick }),
        3 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(pick, back)| Op::Clear { pick, back }),
        1 => any::<u8>().prop_map(|back| Op::Checkpoint { back }),
        1 => (1u8..30).prop_map(|secs| Op::Tick { secs }),
        1 => Just(Op::Gc),
        1 => Just(Op::Restart),
    ]
}

const MAX_IDLE: u64 = 60;
const MAX_LAG: u64 = 150;

fn open(dir: &std::path::Path) -> Changelog {
    let journal = Options { segment_bytes: 2048, fsync: false, ..Options::default() };
    let options =
        ChangelogOptions { mask: Mask::ALL, max_idle: Some(Duration::from_secs(MAX_IDLE)), max_lag: Some(MAX_LAG) };
    Changelog::open(dir, journal, options).unwrap()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Some(open(dir.path()));
    let mut records: Vec<Record> = Vec::new(); // index i at records[i - 1]
    let mut consumers: BTreeMap<String, MConsumer> = BTreeMap::new();
    let mut checkpoint = 0u64;
    let mut now = 1u64;
    let ns = |s: u64| s * 1_000_000_000;
    for op in ops {
        let cl = log.as_ref().unwrap();
        let last = records.len() as u64;
        match op {
            Op::Append { count, rtype } => {
                for _ in 0..count {
                    let r = record(records.len() as u64 + 1, RecordType::ALL[rtype]);
                    let i = cl.append(&r).unwrap().unwrap();
                    prop_assert_eq!(i, records.len() as u64 + 1);
                    records.push(r);
                }
                cl.journal().wait_durable(records.len() as u64).unwrap();
            }
            Op::Register { mask } => {
                let c = cl.register(None, Mask(mask), ns(now)).unwrap();
                prop_assert_eq!(c.cleared, last);
                consumers.insert(c.id, MConsumer { mask: Mask(mask), cleared: last, active: now });
            }
            Op::Deregister { pick } => {
                if consumers.is_empty() {
                    continue;
                }
                let id = consumers.keys().nth(pick.index(consumers.len())).unwrap().clone();
                cl.deregister(&id).unwrap();
                consumers.remove(&id);
            }
            Op::Read { pick } => {
                if consumers.is_empty() {
                    continue;
                }
                let id = consumers.keys().nth(pick.index(consumers.len())).unwrap().clone();
                let c = &consumers[&id];
                let got = cl.read(&id, None, usize::MAX, None).unwrap();
                let want: Vec<(u64, Record)> = records
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (i as u64 + 1, r.clone()))
                    .filter(|(i, r)| *i > c.cleared && c.mask.contains(r.rtype))
                    .collect();
                let got: Vec<(u64, Record)> = got.into_iter().map(|e| (e.index, e.record)).collect();
                prop_assert_eq!(got, want);
            }
            Op::Clear { pick, back } => {
                if consumers.is_empty() {
                    continue;
                }
                let id = consumers.keys().nth(pick.index(consumers.len())).unwrap().clone();
                let upto = last.saturating_sub(back as u64 % 50);
                cl.clear(&id, upto, ns(now)).unwrap();
                let c = consumers.get_mut(&id).unwrap();
                c.cleared = c.cleared.max(upto);
                c.active = now;
                prop_assert!(cl.clear(&id, last + 1, ns(now)).is_err(), "clearing past the end is refused");
            }
            Op::Checkpoint { back } => {
                let at = last.saturating_sub(back as u64 % 80);
                cl.set_checkpoint(at).unwrap();
                checkpoint = checkpoint.max(at);
            }
            Op::Tick { secs } => now += secs as u64,
            Op::Gc => {
                let mut gone = cl.gc(ns(now)).unwrap();
                let mut want: Vec<String> = consumers
                    .iter()
                    .filter(|(_, c)| now - c.active > MAX_IDLE || last - c.cleared > MAX_LAG)
                    .map(|(id, _)| id.clone())
                    .collect();
                gone.sort();
                want.sort();
                prop_assert_eq!(&gone, &want);
                for id in want {
                    consumers.remove(&id);
                }
            }
            Op::Restart => {
                drop(log.take());
                log = Some(open(dir.path()));
            }
        }
        let cl = log.as_ref().unwrap();
        // Never purged past the slowest consumer or the checkpoint.
        let bound = consumers.values().map(|c| c.cleared).min().unwrap_or(u64::MAX).min(checkpoint) + 1;
        let first = cl.journal().first_index();
        prop_assert!(first <= bound.max(1), "purged to {first} past the bound {bound}");
        // Consumer state as the model has it.
        let got: BTreeMap<String, (u32, u64)> =
            cl.consumers().into_iter().map(|c| (c.id, (c.mask.0, c.cleared))).collect();
        let want: BTreeMap<String, (u32, u64)> =
            consumers.iter().map(|(id, c)| (id.clone(), (c.mask.0, c.cleared))).collect();
        prop_assert_eq!(got, want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn consumers_match_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(ops)?;
    }
}

#[test]
fn follow_wakes_on_a_new_record() {
    let dir = tempfile::tempdir().unwrap();
    let cl = std::sync::Arc::new(open(dir.path()));
    cl.register(Some("watcher"), Mask::ALL, 0).unwrap();
    let reader = {
        let cl = cl.clone();
        std::thread::spawn(move || cl.read("watcher", None, 10, Some(Duration::from_secs(10))).unwrap())
    };
    std::thread::sleep(Duration::from_millis(50));
    let started = std::time::Instant::now();
    cl.append(&record(1, RecordType::CREAT)).unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record.rtype, RecordType::CREAT);
    assert!(started.elapsed() < Duration::from_secs(5), "woken by the append, not the timeout");
    // Names must be unique; unknown consumers are refused.
    assert!(cl.register(Some("watcher"), Mask::ALL, 0).is_err());
    assert!(cl.read("cl99", None, 1, None).is_err());
}

/// A name that could be an id, or that `changelog list` could not print
/// back, is refused and uses up no id; with `cl5` allowed as a name, the
/// fifth register made it ambiguous and `clear cl5` moved the other
/// consumer's cursor.
#[test]
fn a_name_of_an_ids_form_or_unprintable_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cl = open(dir.path());
    let long = "n".repeat(NAME_MAX + 1);
    for bad in ["", "cl5", "cl0", "a b", "tab\t", "new\nline", "sl/ash", "é", long.as_str()] {
        assert!(check_name(bad).is_err(), "{bad:?}");
        assert!(matches!(cl.register(Some(bad), Mask::ALL, 0), Err(Error::Invalid(_))), "{bad:?}");
    }
    for good in ["cl", "cl5a", "clx", "audit-2.log_x", &"n".repeat(NAME_MAX)] {
        check_name(good).unwrap();
    }
    assert!(cl.consumers().is_empty(), "nothing was registered");
    let c = cl.register(Some("cl5a"), Mask::ALL, 0).unwrap();
    assert_eq!(c.id, "cl1", "the refusals took no id");
}

/// State written before such names were refused: a name that is another
/// consumer's id names neither (until session 44 it named the id's
/// consumer, whose cursor a `clear` by the other's name then moved).
#[test]
fn a_name_that_is_another_consumers_id_names_neither() {
    let dir = tempfile::tempdir().unwrap();
    let cl = open(dir.path());
    cl.register(Some("old"), Mask::ALL, 0).unwrap();
    cl.register(None, Mask::ALL, 0).unwrap();
    drop(cl);
    let path = dir.path().join("consumers.json");
    let state = std::fs::read_to_string(&path).unwrap();
    assert!(state.contains(r#""name": "old""#), "{state}");
    std::fs::write(&path, state.replace(r#""name": "old""#, r#""name": "cl2""#)).unwrap();
    let cl = open(dir.path());
    let ambiguous = |r: Result<(), Error>| matches!(r, Err(Error::Invalid(m)) if m.contains("id of one consumer"));
    assert!(ambiguous(cl.clear("cl2", 0, 0)));
    assert!(ambiguous(cl.read("cl2", None, 1, None).map(drop)));
    assert!(ambiguous(cl.deregister("cl2")));
    cl.deregister("cl1").unwrap();
    cl.clear("cl2", 0, 0).unwrap();
    assert_eq!(cl.consumers().len(), 1);
}

#[test]
fn global_mask_drops_records_at_append() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Options { fsync: false, ..Options::default() };
    let cl = Changelog::open(dir.path(), journal, ChangelogOptions::default()).unwrap();
    assert_eq!(cl.append(&record(1, RecordType::ATIME)).unwrap(), None, "ATIME is off by default");
    assert_eq!(cl.append(&record(1, RecordType::CREAT)).unwrap(), Some(1));
    assert_eq!("01CREAT".parse::<RecordType>().unwrap(), RecordType::CREAT);
    assert!("NOPE".parse::<RecordType>().is_err());
    assert_eq!(Mask::parse("creat,UNLNK").unwrap(), Mask::of(&[RecordType::CREAT, RecordType::UNLNK]));
}

/// A read stops once it has its records, rather than reading on to the
/// end of the log: a consumer far behind would otherwise pay for its whole
/// lag on every read. Damage far ahead, which a read to the end trips
/// over, shows it.
#[test]
fn a_read_stops_once_it_has_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let cl = open(dir.path());
    for n in 1..=10_000 {
        let rtype = if n % 2 == 1 { RecordType::CREAT } else { RecordType::UNLNK };
        cl.append(&record(n, rtype)).unwrap();
    }
    cl.journal().wait_durable(10_000).unwrap();
    cl.register(Some("all"), Mask::ALL, 0).unwrap();
    cl.register(Some("creates"), Mask::of(&[RecordType::CREAT]), 0).unwrap();
    // Garbage in the middle of a segment near the end.
    let mut segs: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    let damaged = &segs[segs.len() - 2];
    let mut bytes = std::fs::read(damaged).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid..mid + 16].fill(0xff);
    std::fs::write(damaged, &bytes).unwrap();
    let got = cl.read("all", Some(1), 10, None).unwrap();
    assert_eq!(got.iter().map(|e| e.index).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>());
    // Other types between them are looked at, and skipped.
    let got = cl.read("creates", Some(101), 10, None).unwrap();
    assert_eq!(got.iter().map(|e| e.index).collect::<Vec<_>>(), (101..120).step_by(2).collect::<Vec<_>>());
    assert!(cl.read("all", Some(1), 20_000, None).is_err(), "the damage is there, for a read that reaches it");
}

/// A consumer's change waits for its save, and nothing else does: while
/// one consumer's clear is saving, another's read, the list of
/// consumers and the purge bound are answered (until session 57 they
/// waited on the lock the save held: in the server, every changelog
/// read and `status` queued behind a clear's two fsyncs). A change whose
/// save fails is not shown, and so cannot purge the journal under a
/// cursor the disk does not have.
///
/// The save is held up by making its temporary file a FIFO: opening it
/// to write blocks until a reader opens it, and its fsync then fails.
#[test]
fn a_save_holds_up_only_other_changes_and_a_failed_one_shows_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cl = open(dir.path());
    let (a, b) = (cl.register(Some("a"), Mask::ALL, 0).unwrap().id, cl.register(Some("b"), Mask::ALL, 0).unwrap().id);
    for n in 1..=10 {
        cl.append(&record(n, RecordType::CREAT)).unwrap();
    }
    cl.journal().wait_durable(10).unwrap();
    let fifo = dir.path().join("consumers.json.tmp");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success(), "mkfifo");
    let unblock = || drop(std::fs::read(&fifo).unwrap());
    std::thread::scope(|s| {
        let clearing = s.spawn(|| cl.clear(&a, 10, 5));
        wait_opening_fifo();
        let (tx, rx) = std::sync::mpsc::channel();
        let (cl, b) = (&cl, &b);
        s.spawn(move || {
            let seen = (cl.read(b, None, 100, None).unwrap().len(), cl.consumers(), cl.purge_bound());
            tx.send(seen).unwrap();
        });
        // Looked at before the save goes on, and asserted after: a
        // failed assertion must not leave the clear blocked.
        let seen = rx.recv_timeout(Duration::from_secs(30));
        let saving = !clearing.is_finished();
        unblock();
        let failed = clearing.join().unwrap();
        let (read, consumers, bound) = seen.expect("a read, the list and the purge bound waited for another's save");
        assert_eq!(read, 10);
        assert!(consumers.iter().all(|c| c.cleared == 0), "a change shown before it was saved: {consumers:?}");
        assert_eq!(bound, 1);
        assert!(saving, "the clear ended with its save held up");
        assert!(failed.is_err(), "a FIFO's fsync fails: {failed:?}");
    });
    assert!(cl.consumers().iter().all(|c| c.cleared == 0), "a failed save's change was shown");
    assert_eq!(cl.purge_bound(), 1);
    std::fs::remove_file(&fifo).unwrap();
    cl.clear(&a, 10, 5).unwrap();
    drop(cl);
    let cl = open(dir.path());
    let cleared: Vec<u64> = cl.consumers().iter().map(|c| c.cleared).collect();
    assert_eq!(cleared, [10, 0]);
}

/// Waits until a thread of this process is opening a FIFO to write and
/// waits for a reader (the kernel's `wait_for_partner`).
fn wait_opening_fifo() {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_dir("/proc/self/task")
        .unwrap()
        .any(|t| std::fs::read_to_string(t.unwrap().path().join("wchan")).is_ok_and(|w| w == "wait_for_partner"))
    {
        assert!(std::time::Instant::now() < deadline, "nobody came to open the FIFO");
        std::thread::yield_now();
    }
}

/// Changes from many threads at once, each its own consumer's clears and
/// one thread's checkpoints, are each saved on top of the others: none
/// is lost, in memory or on disk (a change built on a state another
/// change then replaced would take that change back).
#[test]
fn changes_at_once_lose_none_of_each_other() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cl = open(dir.path());
    const UPTO: u64 = 40;
    for n in 1..=UPTO {
        cl.append(&record(n, RecordType::CREAT)).unwrap();
    }
    cl.journal().wait_durable(UPTO).unwrap();
    let ids: Vec<String> = (0..4).map(|_| cl.register(None, Mask::ALL, 0).unwrap().id).collect();
    std::thread::scope(|s| {
        for id in &ids {
            let cl = &cl;
            s.spawn(move || (1..=UPTO).for_each(|n| cl.clear(id, n, n).unwrap()));
        }
        s.spawn(|| (1..=UPTO).for_each(|n| cl.set_checkpoint(n).unwrap()));
    });
    let shown: Vec<u64> = cl.consumers().iter().map(|c| c.cleared).collect();
    assert_eq!(shown, [UPTO; 4], "a clear was lost in memory");
    let (saved, checkpoint) = interlock_journal::changelog::consumers_of(dir.path()).unwrap();
    assert_eq!(saved.iter().map(|c| c.cleared).collect::<Vec<_>>(), [UPTO; 4], "a clear was lost on disk");
    assert_eq!(checkpoint, UPTO, "a checkpoint was lost");
}
