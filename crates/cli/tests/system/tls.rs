//! TLS through the binary: `tls-init` makes a CA and a server certificate,
//! the server speaks TLS with them, clients trust the CA; a client without
//! it, or with another CA, is refused with a message that says why; off
//! loopback the server will not serve in clear unless told.

use crate::common;

use std::process::{Command, Stdio};

use common::*;

/// `interlock lock` with `args`: exit status and stderr.
fn lock(addr: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut c = lock_cmd(addr, args);
    let out = c.stderr(Stdio::piped()).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_tls_server_serves_clients_that_trust_its_ca_and_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
    tls_init(&ours);
    tls_init(&theirs);
    let p = |d: &std::path::Path, f: &str| d.join(f).to_str().unwrap().to_string();
    let (cert, key) = (p(&ours, "server.pem"), p(&ours, "server.key"));
    let server = ServerProc::start(&dir.path().join("data"), "127.0.0.1:0", &["--tls-cert", &cert, "--tls-key", &key]);
    let ca = p(&ours, "ca.pem");
    // Trusted: the lock is held and the command sees its fencing token.
    let out =
        lock_cmd(&server.addr, &["--tls-ca", &ca, "n", "--", "sh", "-c", "echo $INTERLOCK_FENCE"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap() > 0);
    // The same through INTERLOCK_TLS_CA.
    let mut c = lock_cmd(&server.addr, &["n", "--", "true"]);
    assert!(c.env("INTERLOCK_TLS_CA", &ca).status().unwrap().success());
    // In clear: not welcomed, and told about --tls-ca.
    let (code, err) = lock(&server.addr, &["n", "--", "true"]);
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("--tls-ca"), "{err}");
    // Another CA: not trusted, the authentication status.
    let (code, err) = lock(&server.addr, &["--tls-ca", &p(&theirs, "ca.pem"), "n", "--", "true"]);
    assert_eq!(code, Some(77), "{err}");
    assert!(err.contains("TLS") && err.contains("certificate"), "{err}");
    // A name the certificate does not carry.
    let port = server.addr.rsplit_once(':').unwrap().1;
    let addr = format!("127.0.0.2:{port}");
    let (code, err) = lock(&addr, &["--tls-ca", &ca, "--connect-timeout", "5", "n", "--", "true"]);
    assert!(code == Some(77) || code == Some(69), "{code:?} {err}");
}

#[test]
fn off_loopback_the_server_refuses_to_serve_in_clear_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "secret").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--token-file"])
        .arg(&token)
        .arg("--data")
        .arg(dir.path().join("a"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tls-cert") && err.contains("--insecure-plaintext"), "{err}");
    let token = token.to_str().unwrap();
    let data = dir.path().join("b");
    let server = ServerProc::start(&data, "0.0.0.0:0", &["--token-file", token, "--insecure-plaintext"]);
    let port = server.addr.rsplit_once(':').unwrap().1;
    let mut c = lock_cmd(&format!("127.0.0.1:{port}"), &["n", "--", "true"]);
    assert!(c.env("INTERLOCK_TOKEN", "secret").status().unwrap().success());
}

#[test]
fn tls_init_never_overwrites_and_keeps_the_key_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    tls_init(dir.path());
    let mode = std::fs::metadata(dir.path().join("server.key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    let before = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let out = Command::new(BIN).arg("tls-init").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not overwriting"));
    assert_eq!(std::fs::read(dir.path().join("ca.pem")).unwrap(), before);
}
