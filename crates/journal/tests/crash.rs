//! Crash safety: a writer process is killed with SIGKILL at random moments,
//! again and again on the same log; after each kill the log must open, hold
//! every record the writer had seen acknowledged as durable, or as written
//! out (`Journal::write_out`: only a crash of the machine, not of the
//! process, may lose those), with its exact bytes, and be contiguous.
//!
//! The writer is this test binary itself, run again with `CRASH_WRITER_DIR`
//! set (see `writer`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use interlock_journal::{Journal, Options};

fn opts() -> Options {
    Options { segment_bytes: 256 << 10, ..Options::default() }
}

fn payload(thread: u64, n: u64) -> Vec<u8> {
    let mut p = format!("t{thread}:{n}:").into_bytes();
    p.resize(64 + (n * 31 % 150) as usize, b'a' + (thread % 26) as u8);
    p
}

/// The child: appends from 4 threads until killed, printing
/// `INDEX THREAD N` for each record once it is durable (threads 0 and 1)
/// or written out (threads 2 and 3).
#[test]
fn writer() {
    let Ok(dir) = std::env::var("CRASH_WRITER_DIR") else { return };
    let (j, _) = Journal::open(dir.as_ref(), opts()).unwrap();
    let j = Arc::new(j);
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (j, out) = (j.clone(), out.clone());
            std::thread::spawn(move || {
                for n in 0.. {
                    let i = if t < 2 {
                        j.append_durable(&payload(t, n)).unwrap()
                    } else {
                        let i = j.append(&payload(t, n)).unwrap();
                        j.write_out(i + 1).unwrap();
                        i
                    };
                    let mut o = out.lock().unwrap();
                    writeln!(o, "{i} {t} {n}").unwrap();
                    o.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn kill_9_at_random_moments_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let rounds: u64 = std::env::var("CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let mut acked: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "writer", "--nocapture", "--test-threads=1"])
            .env("CRASH_WRITER_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = std::thread::spawn(move || {
            let mut got = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let f: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
                if let [i, t, n] = f[..] {
                    got.push((i, t, n));
                }
            }
            got
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(30 + seed % 250));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let got = lines.join().unwrap();
        for (i, t, n) in got {
            acked.insert(i, (t, n));
        }
        let (j, rec) = Journal::open(dir.path(), opts()).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let mut count = 0u64;
        let mut expect = rec.first;
        j.read(rec.first, usize::MAX, |i, p| {
            assert_eq!(i, expect, "round {round}: contiguous");
            expect += 1;
            if let Some(&(t, n)) = acked.get(&i) {
                assert_eq!(p, payload(t, n), "round {round}: record {i} holds what was acknowledged");
            }
            count += 1;
        })
        .unwrap();
        assert_eq!(expect, rec.next);
        if let Some((&last, _)) = acked.last_key_value() {
            assert!(rec.next > last, "round {round}: acknowledged record {last} lost (log ends before {})", rec.next);
        }
        assert!(count > 0 || acked.is_empty());
    }
    assert!(acked.len() > 100, "the writer made progress: {} records acknowledged", acked.len());
}
