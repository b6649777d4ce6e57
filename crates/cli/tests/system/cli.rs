//! The binary as a user runs it.

use std::io::Write;
use std::process::{Command, Stdio};

fn interlock(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_interlock"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// The Redis anchor of `bench mdtest`: for Redis in memory and Redis with
/// `appendfsync always`, a SET row (as `create`) and a GET row (as
/// `stat`), each from its own `redis-benchmark` run, with its rate and the
/// machine's CPU per request. Needs redis-server and redis-benchmark
/// (`scripts/test` installs them when root; elsewhere this says it
/// skipped).
#[test]
fn bench_mdtest_redis_rows_give_set_and_get_each_a_rate_and_a_cost() {
    let installed = |p: &str| Command::new(p).arg("--version").output().is_ok();
    if !installed("redis-server") || !installed("redis-benchmark") {
        assert!(
            std::env::var_os("INTERLOCK_REQUIRE_REDIS").is_none(),
            "redis-benchmark is not installed, and this run requires it"
        );
        eprintln!("!! SKIPPED bench_mdtest_redis_rows: redis-server and redis-benchmark are not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = ["bench", "mdtest", "--variant", "redis", "--threads", "4", "--files", "20000", "--json", "--dir"];
    let (code, out, err) = interlock(&[&args[..], &[dir.path().to_str().unwrap()]].concat(), "");
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let shape: Vec<_> = rows.iter().map(|r| (r["variant"].as_str().unwrap(), r["phase"].as_str().unwrap())).collect();
    assert_eq!(
        shape,
        [("redis", "create"), ("redis", "stat"), ("redis-aof", "create"), ("redis-aof", "stat")],
        "{out}"
    );
    for r in &rows {
        assert!(r["ops_per_sec"].as_f64().is_some_and(|x| x > 0.0 && x.is_finite()), "{r}");
        // 20,000 requests take tenths of a second: many of /proc/stat's
        // hundredths.
        assert!(r["cpu_us_per_op"].as_f64().is_some_and(|us| us > 0.0 && us.is_finite()), "{r}");
        // redis-server's own share of it.
        let server = r["server_cpu_us_per_op"].as_f64();
        assert!(server.is_some_and(|us| us >= 0.0 && us.is_finite()), "{r}");
    }
    // Its SETs (20,000 in tenths of a second) cost redis-server some ticks.
    assert!(rows.iter().any(|r| r["server_cpu_us_per_op"].as_f64().is_some_and(|us| us > 0.0)), "{out}");
}

/// `--version` names the protocol version, and the clients' versions a
/// server serves (it refuses any other).
#[test]
fn the_version_names_the_protocol() {
    let (code, out, _) = interlock(&["--version"], "");
    assert_eq!(code, 0);
    let (own, oldest) = (interlock_proto::VERSION, interlock_proto::OLDEST_CLIENT);
    let served = if oldest == own { own.to_string() } else { format!("{oldest} to {own}") };
    assert!(
        out.trim_end().ends_with(&format!(" (protocol {own}; a server serves clients of protocol {served})")),
        "{out}"
    );
}

#[test]
fn posix_replay_exit_status_reports_bad_lines() {
    let (code, out, err) = interlock(&["debug", "posix-replay"], "1 setlk wr 0 10\n2 getlk rd 5 1\n");
    assert_eq!((code, out.as_str(), err.as_str()), (0, "ok\nconflict 1 wr 0 10\n", ""));
    let (code, out, err) = interlock(&["debug", "posix-replay"], "1 setlk wr 0\n1 setlk rd 0 1\n");
    assert_eq!(code, 2);
    assert_eq!(out, "ok\n");
    assert!(err.contains("line 1:"), "{err}");
}

/// Of several conflicting locks, F_GETLK reports the one Linux does (the
/// issue's case: the kernel says `wr 0 10`, the first in its list).
#[test]
fn posix_replay_getlk_reports_the_kernels_choice() {
    let (code, out, _) = interlock(&["debug", "posix-replay"], "1 setlk wr 0 10\n1 setlk rd 100 10\n2 getlk wr 0 0\n");
    assert_eq!((code, out.as_str()), (0, "ok\nok\nconflict 1 wr 0 10\n"));
    // Owners in the order they came: 2 before 1 here, whatever the offsets.
    let (_, out, _) = interlock(&["debug", "posix-replay"], "2 setlk rd 50 1\n1 setlk rd 0 10\n3 getlk wr 0 0\n");
    assert_eq!(out, "ok\nok\nconflict 2 rd 50 1\n");
}

#[test]
fn bench_flocks_json_rows() {
    let (code, out, err) =
        interlock(&["bench", "flocks", "--n", "200,400", "--no-kernel", "--repeat", "1", "--json"], "");
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 8, "4 variants x 2 sizes");
    for row in &rows {
        assert_eq!(row["scenario"], "flocks");
        for key in ["variant", "n", "seconds", "ops_per_sec"] {
            assert!(!row[key].is_null(), "{key} missing in {row}");
        }
        assert!(row["kernel_seconds"].is_null());
    }
}

#[test]
fn bench_flocks_runs_the_kernel_beside_us() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("SKIPPED bench_flocks_runs_the_kernel_beside_us: no /dev/shm");
        return;
    }
    let (code, out, err) =
        interlock(&["bench", "flocks", "--n", "300", "--variant", "plain,split", "--repeat", "1", "--json"], "");
    assert_eq!(code, 0, "{err}");
    for line in out.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(row["kernel_seconds"].as_f64().is_some_and(|s| s > 0.0), "{row}");
    }
}

/// The variants that need no disk of their own: one row per variant,
/// phase, thread count and (for the server's) connection shape, however
/// many rounds `--repeat` runs.
#[test]
fn bench_mdtest_json_rows_one_per_variant_phase_and_threads_whatever_repeat() {
    let args = [
        "bench",
        "mdtest",
        "--variant",
        "memory,memory-apart,net,net-nofsync",
        "--threads",
        "1,2",
        "--files",
        "300",
        "--json",
    ];
    let shaped = ["--repeat", "3", "--server-threads", "3", "--connections", "each,1", "--changelog", "off,on"];
    let (code, out, err) = interlock(&[&args[..], &shaped].concat(), "");
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        rows.len(),
        2 * (2 + 2 * 2 * 2) * 3,
        "2 thread counts x (2 in memory + 2 variants x 2 shapes x changelog off and on) x 3 phases: {out}"
    );
    for row in &rows {
        assert_eq!(row["scenario"], "mdtest");
        // Apart, each creator makes N in a namespace of its own.
        let files = if row["variant"] == "memory-apart" { 300 * row["threads"].as_u64().unwrap() } else { 300 };
        assert_eq!(row["files"], files, "{row}");
        assert!(row["ops_per_sec"].as_f64().is_some_and(|r| r > 0.0), "{row}");
        // Only the server's variants have a consumer to follow them, over
        // the protocol on a thread of its own, whose time is its figure.
        if row["variant"].as_str().is_some_and(|v| v.starts_with("memory")) {
            assert_eq!(row["changelog"], false, "{row}");
        }
        let consumer = &row["consumer_ns_per_record"];
        match row["changelog"].as_bool() {
            Some(true) => assert!(consumer.as_f64().is_some_and(|ns| ns > 0.0), "{row}"),
            _ => assert!(consumer.is_null(), "{row}"),
        }
        // No journal of the benchmark's own: no flusher to time.
        assert!(row["flusher_ns_per_record"].is_null(), "{row}");
        // A phase this short may pass within one tick of /proc/stat: null
        // then, never a negative or a missing field.
        let cpu = row.get("cpu_us_per_op").unwrap_or_else(|| panic!("no cpu_us_per_op: {row}"));
        assert!(cpu.is_null() || cpu.as_f64().is_some_and(|us| us >= 0.0), "{row}");
    }
    // Each says what its server reported of itself: the unsafe variant's
    // server answers before fsync.
    for (variant, durable) in [("net", true), ("net-nofsync", false)] {
        let net: Vec<_> = rows.iter().filter(|r| r["variant"] == variant).collect();
        assert_eq!(net.len(), 24, "{variant}");
        // `each`: a connection per creator; 1: all on one; each without a
        // consumer, then with one.
        for t in [1, 2] {
            let shapes: Vec<_> = net
                .iter()
                .filter(|r| r["threads"] == t)
                .map(|r| (r["connections"].as_u64().unwrap(), r["changelog"].as_bool().unwrap()))
                .collect();
            let (t, mut want) = (t as u64, Vec::new());
            for shape in [(t, false), (t, true), (1, false), (1, true)] {
                want.extend([shape; 3]);
            }
            assert_eq!(shapes, want, "{variant}, {t} threads, a row per phase: {net:?}");
        }
        assert!(net.iter().all(|r| r["ack"] == "each" && r["durable"] == durable), "{variant}: {net:?}");
        // Not the default on 1, 2 or 4+ cores: a setting dropped on its
        // way to the server shows.
        assert!(net.iter().all(|r| r["server_threads"] == 3), "{variant}: {net:?}");
    }
    // The server's own share: measured for `net`'s in-process server (0
    // when too short for a tick), never for `memory`.
    for r in &rows {
        let server = r.get("server_cpu_us_per_op").unwrap_or_else(|| panic!("no server_cpu_us_per_op: {r}"));
        match r["variant"].as_str() {
            Some("net" | "net-nofsync") => assert!(server.as_f64().is_some_and(|us| us >= 0.0), "{r}"),
            _ => assert!(server.is_null(), "{r}"),
        }
    }
    let (code, _, err) = interlock(&[&args[..], &["--repeat", "0"]].concat(), "");
    assert_eq!(code, 2);
    assert!(err.contains("--repeat"), "{err}");
    let (code, _, err) = interlock(&[&args[..], &["--connections", "0"]].concat(), "");
    assert_eq!(code, 2);
    assert!(err.contains("--connections") && err.contains("each or a number"), "{err}");
    // The unsafe variant's server is its own: never someone else's.
    let (code, _, err) = interlock(&[&args[..], &["--server", "127.0.0.1:1"]].concat(), "");
    assert_eq!(code, 1);
    assert!(err.contains("net-nofsync") && err.contains("--server"), "{err}");
    // Someone else's server runs as it was started.
    let (code, _, err) = interlock(&["bench", "mdtest", "--server", "127.0.0.1:1", "--server-threads", "1"], "");
    assert_eq!(code, 2);
    assert!(err.contains("--server-threads") && err.contains("--server"), "{err}");
}

/// `net`'s own server keeps its journal in `--dir`, as the engine does:
/// the system's temporary directory may be a tmpfs, where its durable
/// figures would cost no fsync. A `--dir` that cannot hold a directory
/// stops it.
#[test]
fn bench_mdtest_net_keeps_its_journal_in_dir() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().to_str().unwrap();
    let args = ["bench", "mdtest", "--variant", "net", "--threads", "1", "--files", "10", "--json", "--dir", path];
    let (code, out, err) = interlock(&args, "");
    assert_eq!(code, 1, "a file as --dir must stop the net variant: {out}{err}");
    assert!(err.contains(path), "the error names the directory: {err}");
}

#[test]
fn bench_rsb_json_rows() {
    let (code, out, err) = interlock(&["bench", "rsb", "--r", "1000", "--repeat", "1", "--json"], "");
    assert_eq!(code, 0, "{err}");
    let row: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(row["scenario"], "rsb");
    assert_eq!(row["n"], 1000);
    assert!(row["bytes_per_resource"].as_f64().is_some_and(|b| b > 0.0));
}

#[test]
fn bad_arguments_get_clear_errors() {
    let (code, _, err) = interlock(&["bench", "flocks", "--n", "0"], "");
    assert_eq!(code, 2);
    assert!(err.contains("not a positive size"), "{err}");
    let (code, _, err) = interlock(&["serve", "--listen", "not-an-address"], "");
    assert_eq!(code, 2);
    assert!(err.contains("invalid value"), "{err}");
    // Counts of zero, refused before anything runs: until session 45
    // `bench journal --threads 0` panicked (a division by zero),
    // `--durable-threads 0` printed rows of nothing, and `--records 0` or
    // `--repeat 0` ran once in silence.
    for args in [
        &["bench", "journal", "--threads", "0"][..],
        &["bench", "journal", "--durable-threads", "0"],
        &["bench", "journal", "--records", "0"],
        &["bench", "journal", "--repeat", "0"],
        &["bench", "mdtest", "--threads", "1,0"],
        &["bench", "rsb", "--repeat", "0"],
        &["bench", "flocks", "--repeat", "0"],
        &["bench", "handover", "--repeat", "0"],
        &["serve", "--max-namespace-memory", "1k"],
        &["serve", "--max-output-memory", "1k"],
        &["serve", "--max-total-locks", "0"],
    ] {
        let (code, _, err) = interlock(args, "");
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("invalid value '") && (err.contains("at least") || err.contains("positive")),
            "{args:?}: {err}"
        );
    }
}

/// Writes a small changelog with the library, then looks at it with the
/// CLI: check lists segments and consumers, dump prints and filters.
#[test]
fn journal_check_and_dump() {
    use interlock_journal::Options;
    use interlock_journal::changelog::{Changelog, ChangelogOptions, Mask, Record, RecordType};
    let dir = tempfile::tempdir().unwrap();
    {
        let cl = Changelog::open(dir.path(), Options::default(), ChangelogOptions::default()).unwrap();
        for (i, t) in [RecordType::CREAT, RecordType::MKDIR, RecordType::UNLNK].into_iter().enumerate() {
            let r = Record {
                rtype: t,
                flags: 0,
                time_ns: 1_795_303_329_000_000_000,
                target: 100 + i as u64,
                parent: 1,
                name: format!("n{i}").into_bytes(),
                source: None,
                uid: 0,
                gid: 0,
                jobid: None,
            };
            let idx = cl.append(&r).unwrap().unwrap();
            cl.journal().wait_durable(idx).unwrap();
        }
        cl.register(Some("backup"), Mask::ALL, 0).unwrap();
        cl.clear("backup", 3, 0).unwrap();
    }
    let d = dir.path().to_str().unwrap();
    let (code, out, err) = interlock(&["journal", "check", d], "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("records 1..=3 (3)"), "{out}");
    assert!(out.contains("consumer cl1 name backup cleared 3"), "{out}");
    let (code, out, _) = interlock(&["journal", "dump", d, "--type", "CREAT,UNLNK"], "");
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("1 01CREAT 23:22:09.000000000 2026.11.21 0x0 t=100 p=1 n0"), "{}", lines[0]);
    assert!(lines[1].starts_with("3 06UNLNK"), "{}", lines[1]);
    let (_, out, _) = interlock(&["journal", "dump", d, "--from", "2"], "");
    assert_eq!(out.lines().count(), 2);
    // Damage a record: check fails, naming the file and offset.
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[30] ^= 1;
    std::fs::write(&seg, &bytes).unwrap();
    let (code, _, err) = interlock(&["journal", "check", d], "");
    assert_eq!(code, 1);
    assert!(err.contains("corrupt at offset 24"), "{err}");
    let (code, _, err) = interlock(&["journal", "check", "/nonexistent/dir"], "");
    assert_eq!(code, 1);
    assert!(err.contains("no such log directory"), "{err}");
    let (code, _, err) = interlock(&["journal", "dump", d, "--type", "BOGUS"], "");
    assert_eq!(code, 2);
    assert!(err.contains("unknown record type"), "{err}");
}

#[test]
fn bench_journal_json_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = interlock(
        &[
            "bench",
            "journal",
            "--threads",
            "1,4",
            "--durable-threads",
            "2",
            "--records",
            "2000",
            "--seconds",
            "0.2",
            "--repeat",
            "1",
            "--json",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let variants: Vec<&str> = rows.iter().map(|r| r["variant"].as_str().unwrap()).collect();
    assert_eq!(variants, ["append", "append-mutex", "append", "append-mutex", "durable-group", "durable-each"]);
    for r in &rows {
        assert_eq!(r["scenario"], "journal");
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0);
        assert!(r["threads"].as_u64().is_some() && r["records"].as_u64().is_some());
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "runs clean up after themselves");
}

/// `interlock fsck`: 0 on a clean store (found under a data directory's
/// `meta/`), 1 with the damage named and nothing changed, 1 again on
/// `--repair` (which repairs), then 0; 8 while a writer has the store
/// open; 4 for a checkpoint that cannot be read; a clear error for a
/// directory with no store.
#[test]
fn fsck_exit_statuses_and_repair() {
    use interlock_meta::{Cred, FileType, Mutation, NewInode, ROOT, Store, StoreOptions};
    let data = tempfile::tempdir().unwrap();
    let meta = data.path().join("meta");
    {
        let (store, _) = Store::open(&meta, StoreOptions::default(), 1).unwrap();
        let new = NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
        let (_, s) = store.ns().create(&Cred::root(), ROOT, b"f", new, b"", 2).unwrap();
        store.wait(s).unwrap();
    }
    let dir = data.path().to_str().unwrap();
    let (code, out, _) = interlock(&["fsck", dir], "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("clean"), "{out}");
    {
        let (store, _) = Store::open(&meta, StoreOptions::default(), 3).unwrap();
        store.ns().apply(&Mutation::Link { parent: ROOT, name: b"ghost".to_vec(), ino: 4242, time: 3 });
        store.checkpoint().unwrap();
    }
    // Open in a writer (as a running server has it): refused, with or
    // without --repair. Before, --repair opened the journal beside the
    // writer, cut off the tail it was writing as torn, and appended its
    // repairs among the writer's records.
    {
        let (_writer, _) = Store::open(&meta, StoreOptions::default(), 4).unwrap();
        for args in [&["fsck", dir][..], &["fsck", dir, "--repair"]] {
            let (code, _, err) = interlock(args, "");
            assert_eq!(code, 8, "{args:?}: {err}");
            assert!(err.contains("in use"), "{err}");
        }
    }
    let ckpt = std::fs::read(meta.join("meta.ckpt")).unwrap();
    let (code, out, _) = interlock(&["fsck", dir], "");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DAMAGE: entry \"ghost\" in directory 1 names inode 4242"), "{out}");
    assert_eq!(std::fs::read(meta.join("meta.ckpt")).unwrap(), ckpt, "fsck without --repair changes nothing");
    let (code, _, err) = interlock(&["fsck", dir, "--repair"], "");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("repaired"), "{err}");
    let (code, out, _) = interlock(&["fsck", dir, "--json"], "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"damage\":[]"), "{out}");

    let mut bad = std::fs::read(meta.join("meta.ckpt")).unwrap();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(meta.join("meta.ckpt"), bad).unwrap();
    let (code, _, err) = interlock(&["fsck", dir], "");
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("meta.ckpt"), "names the file: {err}");

    let empty = tempfile::tempdir().unwrap();
    let (code, _, err) = interlock(&["fsck", empty.path().to_str().unwrap()], "");
    assert_eq!(code, 4);
    assert!(err.contains("no namespace checkpoint"), "{err}");
    // Not a directory at all: a usage error that says so (until session
    // 42, "FILE/lock: Not a directory" and 4).
    let file = empty.path().join("file");
    std::fs::write(&file, b"").unwrap();
    for (path, said) in [(file, "is not a directory"), (empty.path().join("none"), "does not exist")] {
        let (code, _, err) = interlock(&["fsck", path.to_str().unwrap()], "");
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(said), "{err}");
    }
}
