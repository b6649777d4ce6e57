//! What an operator does through the binary: `status --resource` lists
//! who holds and who waits for a resource; `evict` forces a session out.

use crate::common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use interlock_client::LockSpec;
use interlock_core::{Mode, Range};
use interlock_proto::Kind;

fn run(addr: &str, args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("INTERLOCK_SERVER", addr).output().unwrap()
}

fn inspect(addr: &str, name: &str) -> serde_json::Value {
    let out = run(addr, &["status", "--resource", name, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn posix(owner: u32, mode: Mode, start: u64, end: u64) -> LockSpec {
    LockSpec { resource: b"file".to_vec(), kind: Kind::Posix, owner, mode, range: Range::new(start, end).unwrap() }
}

#[test]
fn status_resource_lists_holders_and_waiters_and_evict_frees_them() {
    let (_data, server) = long_lease_server();
    let addr = server.addr.clone();
    rt().block_on(async {
        let a = client(&addr).await;
        let b = client(&addr).await;
        let taken = Instant::now();
        a.lock(&posix(7, Mode::PR, 10, 19)).await.unwrap();
        a.lock(&spec("file", 3)).await.unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.lock(&posix(9, Mode::EX, 0, 99)).await })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let r = loop {
            let addr = addr.clone();
            let r = tokio::task::spawn_blocking(move || inspect(&addr, "file")).await.unwrap();
            if r["waiters_total"] == 1 {
                break r;
            }
            assert!(Instant::now() < deadline, "the wait never showed: {r}");
        };
        assert_eq!(r["holders_total"], 2, "{r}");
        let holders = r["holders"].as_array().unwrap();
        let rec = holders.iter().find(|h| h["kind"] == "posix").unwrap();
        assert_eq!((rec["session"].as_u64(), rec["owner"].as_u64()), (Some(a.session()), Some(7)));
        assert_eq!(
            (rec["mode"].as_str(), rec["start"].as_u64(), rec["end"].as_u64()),
            (Some("read"), Some(10), Some(19))
        );
        assert!(rec["for_ms"].as_u64().unwrap() as u128 <= taken.elapsed().as_millis());
        let dlm = holders.iter().find(|h| h["kind"] == "dlm").unwrap();
        assert_eq!(
            (dlm["session"].as_u64(), dlm["owner"].as_u64(), dlm["mode"].as_str()),
            (Some(a.session()), Some(3), Some("ex"))
        );
        let w = &r["waiters"][0];
        assert_eq!(
            (w["session"].as_u64(), w["owner"].as_u64(), w["mode"].as_str()),
            (Some(b.session()), Some(9), Some("write"))
        );
        assert_eq!((w["start"].as_u64(), w["end"].as_u64()), (Some(0), Some(99)));

        // Evicted: A's locks go at once (the lease is 60 s), B's wait is
        // granted, and A learns it lost both.
        let mut lost = a.lost_locks();
        let session = a.session().to_string();
        let out = tokio::task::spawn_blocking({
            let addr = addr.clone();
            move || run(&addr, &["evict", &session])
        })
        .await
        .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let granted = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("the wait is granted");
        assert!(granted.unwrap().is_ok());
        tokio::time::timeout(Duration::from_secs(10), lost.wait_for(|&n| n >= 2)).await.unwrap().unwrap();
        let r = tokio::task::spawn_blocking(move || inspect(&addr, "file")).await.unwrap();
        assert_eq!((r["holders_total"].as_u64(), r["waiters_total"].as_u64()), (Some(1), Some(0)), "{r}");
        assert_eq!(r["holders"][0]["session"].as_u64(), Some(b.session()));
    });
}

#[test]
fn evicting_no_session_fails_and_says_so() {
    let (_data, server) = long_lease_server();
    let out = run(&server.addr, &["evict", "12345"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session 12345"));
    let out = run(&server.addr, &["evict", "x"]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let out = run(&server.addr, &["status", "--resource", "none"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no one holds or waits"));
}

/// `GET /metrics` over plain HTTP: the body.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample `name` (with its labels) in a scrape.
fn sample(text: &str, name: &str) -> f64 {
    let line =
        text.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn metrics_count_what_happened() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap();
    let args = ["--data", dir, "--listen", "127.0.0.1:0", "--lease-ms", "300", "--metrics", "127.0.0.1:0"];
    let (server, lines) = ServerProc::spawn_lines(&args, 2);
    let metrics =
        lines[1].strip_prefix("interlock: metrics at http://").unwrap().strip_suffix("/metrics").unwrap().to_string();
    let addr = server.addr.clone();
    rt().block_on(async {
        // Four grants: three at once, one after waiting (freed by an
        // eviction); one session evicted, one whose lease runs out.
        let a = client(&addr).await;
        let b = client(&addr).await;
        a.lock(&spec("m", 1)).await.unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.lock(&spec("m", 2)).await })
        };
        let r = loop {
            let r = b.inspect(b"m").await.unwrap();
            if r.waiters_total == 1 {
                break r;
            }
        };
        assert_eq!(r.holders_total, 1);
        b.evict(a.session()).await.unwrap();
        waiter.await.unwrap().unwrap();
        b.lock(&spec("other", 3)).await.unwrap();
        // A client that goes silent (killed while it holds a lock): its
        // lease runs out.
        let mut wrapper = lock_cmd(&addr, &["gone", "--", "sleep", "60"]).spawn().unwrap();
        while b.inspect(b"gone").await.unwrap().holders_total == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        wrapper.kill().unwrap();
        wrapper.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = tokio::task::spawn_blocking({
                let m = metrics.clone();
                move || scrape(&m)
            })
            .await
            .unwrap();
            if sample(&text, "interlock_lease_expiries_total") >= 1.0 {
                assert_eq!(sample(&text, "interlock_evictions_total"), 1.0);
                assert_eq!(sample(&text, "interlock_grants_total"), 4.0, "{text}");
                assert!(sample(&text, "interlock_requests_total{op=\"lock\"}") >= 4.0);
                assert!(sample(&text, "interlock_requests_total{op=\"evict\"}") == 1.0);
                let count = sample(&text, "interlock_request_duration_seconds_count");
                let inf = sample(&text, "interlock_request_duration_seconds_bucket{le=\"+Inf\"}");
                assert_eq!(count, inf, "every request falls in a bucket");
                assert!(sample(&text, "interlock_sessions") >= 1.0);
                assert!(sample(&text, "interlock_inodes") >= 1.0, "the root at least");
                let disk = sample(&text, "interlock_disk_bytes");
                assert!(disk > 0.0 && sample(&text, "interlock_disk_available_bytes") <= disk, "{text}");
                assert_eq!(sample(&text, "interlock_disk_full"), 0.0, "a disk with room");
                assert_eq!(sample(&text, "interlock_replay_clients"), 0.0, "no change asked for yet");
                break;
            }
            assert!(Instant::now() < deadline, "the killed client's session never expired:\n{text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}
