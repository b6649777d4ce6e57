//! Crash safety of the namespace: a process running creates, writes,
//! renames across directories and unlinks from three threads, with
//! checkpoints going on, is killed with SIGKILL at random moments, again
//! and again on the same store. After each kill the store must open with
//! no dangling entry; every acknowledged change must be there; a change
//! not acknowledged must be wholly there or wholly absent (a file renamed
//! is under one name, never two or none; one renamed with
//! `RENAME_WHITEOUT` left its whiteout behind or was not moved; a write's
//! data all there or none); and the changelog must hold each change once, in order, without
//! gaps. A write counts as acknowledged when `Store::write` returns, not
//! synced: a crash of the process must not lose it.
//!
//! The worker is this test binary itself, run again with
//! `META_CRASH_DIR` set (see `worker`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use interlock_journal::changelog::{Mask, RecordType};
use interlock_meta::{Cred, FileType, Ino, NewInode, ROOT, ReadFrom, RenameFlags, Store, StoreOptions};

fn file() -> NewInode {
    NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 }
}

fn dirs(store: &Store) -> (Ino, Ino) {
    let root = Cred::root();
    let a = store.ns().lookup(&root, ROOT, b"a").unwrap().ino;
    let b = store.ns().lookup(&root, ROOT, b"b").unwrap().ino;
    (a, b)
}

/// What the workload writes into file `R.T.N`.
fn data(round: u64, t: u64, n: u64) -> String {
    format!("data of {round}.{t}.{n}")
}

/// The child: three threads, each making `f.R.T.N` in `a`, writing
/// [`data`] into it, renaming it to `g.R.T.N` in `b` (the odd ones with a
/// whiteout left at the old name), and unlinking the even ones, printing `C|W|R|U T N` once each change is durable (the
/// write: once it returns); a fourth thread checkpoints.
#[test]
fn worker() {
    let Ok(dir) = std::env::var("META_CRASH_DIR") else { return };
    let round: u64 = std::env::var("META_CRASH_ROUND").unwrap().parse().unwrap();
    let (store, _) = Store::open(dir.as_ref(), StoreOptions::default(), 1).unwrap();
    let store = Arc::new(store);
    let (a, b) = dirs(&store);
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let say = |out: &Mutex<std::io::Stdout>, what: char, t: u64, n: u64| {
        let mut o = out.lock().unwrap();
        writeln!(o, "{what} {t} {n}").unwrap();
        o.flush().unwrap();
    };
    {
        let store = store.clone();
        std::thread::spawn(move || {
            loop {
                store.checkpoint().unwrap();
                std::thread::sleep(Duration::from_millis(15));
            }
        });
    }
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (store, out) = (store.clone(), out.clone());
            std::thread::spawn(move || {
                let ns = store.ns();
                let root = Cred::root();
                for n in 0.. {
                    let f = format!("f.{round}.{t}.{n}");
                    let g = format!("g.{round}.{t}.{n}");
                    let (made, s) = ns.create(&root, a, f.as_bytes(), file(), b"", n as i64).unwrap();
                    store.wait(s).unwrap();
                    say(&out, 'C', t, n);
                    store.write((&root).into(), made.ino, Some(0), data(round, t, n).as_bytes(), 1).unwrap();
                    say(&out, 'W', t, n);
                    // Every other file leaves a whiteout behind it in `a`.
                    let flags = RenameFlags { whiteout: n % 2 == 1, ..RenameFlags::default() };
                    let s = ns.rename(&root, (a, f.as_bytes()), (b, g.as_bytes()), flags, 1).unwrap();
                    store.wait(s).unwrap();
                    say(&out, 'R', t, n);
                    if n % 2 == 0 {
                        store.wait(ns.unlink(&root, b, g.as_bytes(), 2).unwrap()).unwrap();
                        say(&out, 'U', t, n);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Which of its two names a file of the workload has after a restart.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Place {
    F,
    G,
}

#[test]
fn kill_9_under_load_keeps_every_acknowledged_change_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = Store::open(dir.path(), StoreOptions::default(), 1).unwrap();
        let root = Cred::root();
        let mkdir = NewInode { kind: FileType::Directory, perm: 0o755, rdev: 0, umask: 0 };
        for name in [b"a", b"b"] {
            let (_, s) = store.ns().create(&root, ROOT, name, NewInode { ..mkdir }, b"", 1).unwrap();
            store.wait(s).unwrap();
        }
        store.changelog().register(Some("crash"), Mask::ALL, 0).unwrap();
    }
    let rounds: u64 = std::env::var("CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    // The last acknowledged step of every file: (round, thread, n) -> C|W|R|U.
    let mut acked: BTreeMap<(u64, u64, u64), char> = BTreeMap::new();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "worker", "--nocapture", "--test-threads=1"])
            .env("META_CRASH_DIR", dir.path())
            .env("META_CRASH_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = std::thread::spawn(move || {
            let mut got = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let w: Vec<&str> = line.split(' ').collect();
                if let [c, t, n] = w[..]
                    && let (Some(c), Ok(t), Ok(n)) = (c.chars().next(), t.parse::<u64>(), n.parse::<u64>())
                {
                    got.push((c, t, n));
                }
            }
            got
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(80 + seed % 300));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        for (c, t, n) in lines.join().unwrap() {
            acked.insert((round, t, n), c);
        }

        let fsck = interlock_meta::fsck::check_dir(dir.path()).unwrap_or_else(|e| panic!("round {round}: fsck: {e}"));
        assert!(fsck.damage.is_empty(), "round {round}: fsck finds {:?}", fsck.damage);
        let (store, opened) = Store::open(dir.path(), StoreOptions::default(), 1)
            .unwrap_or_else(|e| panic!("round {round}: the store does not open: {e}"));
        assert!(opened.dangling.is_empty(), "round {round}: dangling entries {:?}", opened.dangling);
        let (a, b) = dirs(&store);
        let root = Cred::root();
        let names = |d: Ino| -> BTreeSet<String> {
            let mut out = BTreeSet::new();
            let mut cookie = 0;
            while let Some(last) = store
                .ns()
                .readdir(&root, d, cookie, 500)
                .unwrap()
                .into_iter()
                .inspect(|e| {
                    out.insert(String::from_utf8(e.name.clone()).unwrap());
                })
                .last()
            {
                cookie = last.cookie;
            }
            out
        };
        let (in_a, in_b) = (names(a), names(b));
        let attr = |d| store.ns().getattr(d).unwrap();
        assert_eq!(attr(a).size, 20 * (in_a.len() as u64 + 2), "round {round}: a's entry count");
        assert_eq!(attr(b).size, 20 * (in_b.len() as u64 + 2), "round {round}: b's entry count");
        assert_eq!(attr(ROOT).nlink, 4, "round {round}: root links");
        let (mut seen, mut whiteouts) = (BTreeSet::new(), BTreeSet::new());
        for (set, place) in [(&in_a, Place::F), (&in_b, Place::G)] {
            for name in set {
                let k: Vec<u64> = name.split('.').skip(1).map(|x| x.parse().unwrap()).collect();
                let key = (k[0], k[1], k[2]);
                let dir = if place == Place::F { a } else { b };
                let ino = store.ns().lookup(&root, dir, name.as_bytes()).unwrap().ino;
                if store.ns().getattr(ino).unwrap().kind == FileType::CharDevice {
                    assert_eq!((place, key.2 % 2), (Place::F, 1), "round {round}: a whiteout at {name}");
                    whiteouts.insert(key);
                    continue;
                }
                assert!(seen.insert(key), "round {round}: {key:?} under two names");
                let ok = match acked.get(&key) {
                    Some('C' | 'W') => true,
                    Some('R') => place == Place::G,
                    Some(_) => false,
                    // Not acknowledged: only the change in flight when
                    // the worker died may be there.
                    None => place == Place::F && (k[2] == 0 || acked.contains_key(&(k[0], k[1], k[2] - 1))),
                };
                assert!(ok, "round {round}: {name} is in {place:?}, last acknowledged {:?}", acked.get(&key));
                // A rename with a whiteout moved the file and left the
                // whiteout in one step: both or neither.
                if key.2 % 2 == 1 && place == Place::G {
                    assert!(whiteouts.contains(&key), "round {round}: {name} moved, and no whiteout left");
                }
                let held = store.read((&root).into(), ino, (0, 100), ReadFrom::Disk).unwrap();
                let want = data(key.0, key.1, key.2).into_bytes();
                let written = matches!(acked.get(&key), Some('W' | 'R'));
                assert!(
                    held == want || (!written && held.is_empty()),
                    "round {round}: {name} holds {:?}, its write {}acknowledged",
                    String::from_utf8_lossy(&held),
                    if written { "" } else { "not " }
                );
            }
        }
        assert!(
            whiteouts.is_subset(&seen),
            "round {round}: whiteouts {:?} of files not in b",
            whiteouts.difference(&seen)
        );
        for (key, c) in &acked {
            let there = seen.contains(key);
            let expect = match c {
                'C' | 'W' => Some(true),
                'R' => None, // the unlink may have happened, unacknowledged
                _ => Some(false),
            };
            if let Some(e) = expect {
                assert_eq!(there, e, "round {round}: {key:?}, acknowledged {c}, there: {there}");
            }
        }
    }
    assert!(acked.len() > 100, "the worker made progress: {} files acknowledged", acked.len());

    // The changelog: contiguous, each change once, every acknowledged one
    // there.
    let (store, _) = Store::open(dir.path(), StoreOptions::default(), 1).unwrap();
    let entries = store.changelog().read("crash", None, usize::MAX, None).unwrap();
    let mut once = BTreeSet::new();
    for (next, e) in (entries[0].index..).zip(&entries) {
        assert_eq!(e.index, next, "the changelog has no gaps");
        let name = String::from_utf8(e.record.name.clone()).unwrap();
        // A write's record (MTIME) names no entry: its inode tells it.
        let target = if name.is_empty() { e.record.target } else { 0 };
        assert!(
            once.insert((e.record.rtype, name.clone(), target)),
            "{:?} {name} {target} logged twice",
            e.record.rtype
        );
    }
    for ((r, t, n), c) in &acked {
        let f = format!("f.{r}.{t}.{n}");
        let g = format!("g.{r}.{t}.{n}");
        assert!(once.contains(&(RecordType::CREAT, f, 0)), "CREAT {r}.{t}.{n} in the changelog");
        if matches!(c, 'R' | 'U') {
            assert!(once.contains(&(RecordType::RENME, g.clone(), 0)), "RENME {r}.{t}.{n} in the changelog");
        }
        if *c == 'U' {
            assert!(once.contains(&(RecordType::UNLNK, g, 0)), "UNLNK {r}.{t}.{n} in the changelog");
        }
    }
}
