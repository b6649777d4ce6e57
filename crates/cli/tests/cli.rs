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

#[test]
fn posix_replay_exit_status_reports_bad_lines() {
    let (code, out, err) = interlock(&["debug", "posix-replay"], "1 setlk wr 0 10\n2 getlk rd 5 1\n");
    assert_eq!((code, out.as_str(), err.as_str()), (0, "ok\nconflict 1 wr 0 10\n", ""));
    let (code, out, err) = interlock(&["debug", "posix-replay"], "1 setlk wr 0\n1 setlk rd 0 1\n");
    assert_eq!(code, 2);
    assert_eq!(out, "ok\n");
    assert!(err.contains("line 1:"), "{err}");
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
    let (code, _, err) = interlock(&["serve"], "");
    assert_eq!(code, 2);
    assert!(err.contains("not built yet"), "{err}");
}
