//! The namespace and its changelog through a server: every operation over
//! the wire with the caller's credentials and the kernel's errnos, paged
//! listings, files that outlive their names while open, acknowledged
//! changes surviving `kill -9`, and `interlock changelog` and `status` as
//! an operator uses them.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::*;
use interlock_client::ClientError;
use interlock_client::meta::{Cred, Fallocate, FileType, ROOT, RenameFlags, SetAttr, XattrMode};
use interlock_proto::RootSquashInfo;

fn root() -> Cred {
    Cred::root()
}

fn user() -> Cred {
    Cred { uid: 1000, gid: 1000, groups: vec![] }
}

fn errno<T: std::fmt::Debug>(r: Result<T, ClientError>) -> i32 {
    match r {
        Err(ClientError::Errno(e)) => e,
        other => panic!("expected an errno, got {other:?}"),
    }
}

fn cli(addr: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).env("INTERLOCK_SERVER", addr).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn the_namespace_over_the_wire() {
    let (_data, server) = long_lease_server();
    rt().block_on(async {
        let c = client(&server.addr).await;
        let d = c.create(&root(), ROOT, b"d", FileType::Directory, 0o755, b"").await.unwrap();
        assert_eq!(errno(c.create(&user(), d.ino, b"x", FileType::Regular, 0o644, b"").await), libc::EACCES);
        assert_eq!(errno(c.create(&root(), ROOT, b"d", FileType::Directory, 0o755, b"").await), libc::EEXIST);
        assert_eq!(errno(c.lookup(&root(), ROOT, b"nothing").await), libc::ENOENT);
        assert_eq!(errno(c.lookup(&root(), ROOT, b"a/b").await), libc::EINVAL);
        // Fifty files created at once (pipelined), then listed 7 at a time:
        // each once, then the end.
        let made = futures::future::join_all((0..50).map(|i| {
            let c = c.clone();
            async move { c.create(&root(), d.ino, format!("f{i}").as_bytes(), FileType::Regular, 0o644, b"").await }
        }))
        .await;
        assert!(made.iter().all(Result::is_ok));
        let (mut names, mut cookie) = (Vec::new(), 0);
        loop {
            let (page, end) = c.readdir(&root(), d.ino, cookie, 7, true).await.unwrap();
            assert!(page.len() <= 7);
            assert!(page.iter().all(|e| e.attr.as_ref().is_some_and(|a| a.ino == e.ino)), "readdirplus attributes");
            names.extend(page.iter().map(|e| String::from_utf8(e.name.clone()).unwrap()));
            if end {
                break;
            }
            cookie = page.last().unwrap().cookie;
        }
        names.sort();
        let mut want: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
        want.sort();
        assert_eq!(names, want);
        assert_eq!(c.getattr(&root(), d.ino).await.unwrap().size, (50 + 2) * 20);

        let f0 = c.lookup(&root(), d.ino, b"f0").await.unwrap();
        c.rename(&root(), (d.ino, b"f0"), (ROOT, b"moved"), RenameFlags::default()).await.unwrap();
        assert_eq!(c.lookup(&root(), ROOT, b"moved").await.unwrap().ino, f0.ino);
        let set = SetAttr { perm: Some(0o600), size: Some(4096), ..SetAttr::default() };
        let a = c.setattr(&root(), f0.ino, set).await.unwrap();
        assert_eq!((a.perm, a.size), (0o600, 4096));
        assert_eq!(
            errno(c.setattr(&user(), f0.ino, SetAttr { perm: Some(0o777), ..SetAttr::default() }).await),
            libc::EPERM
        );
        c.setxattr(&root(), f0.ino, b"user.k", b"v", XattrMode::Create).await.unwrap();
        assert_eq!(errno(c.setxattr(&root(), f0.ino, b"user.k", b"w", XattrMode::Create).await), libc::EEXIST);
        assert_eq!(c.getxattr(&root(), f0.ino, b"user.k").await.unwrap(), b"v");
        assert_eq!(c.listxattr(&root(), f0.ino).await.unwrap(), vec![b"user.k".to_vec()]);
        let big = vec![7u8; 65_536];
        c.setxattr(&root(), f0.ino, b"user.big", &big, XattrMode::Any).await.unwrap();
        assert_eq!(c.getxattr(&root(), f0.ino, b"user.big").await.unwrap(), big, "a 64 KiB value fits a frame");
        c.removexattr(&root(), f0.ino, b"user.k").await.unwrap();
        assert_eq!(errno(c.getxattr(&root(), f0.ino, b"user.k").await), libc::ENODATA);
        let l = c.create(&root(), ROOT, b"link", FileType::Symlink, 0o777, b"d/f1").await.unwrap();
        assert_eq!(c.readlink(&root(), l.ino).await.unwrap(), b"d/f1");
        let h = c.link(&root(), f0.ino, ROOT, b"hard").await.unwrap();
        assert_eq!(h.nlink, 2);
        assert_eq!(errno(c.rmdir(&root(), ROOT, b"d").await), libc::ENOTEMPTY);
        c.unlink(&root(), ROOT, b"hard").await.unwrap();
        assert_eq!(c.getattr(&root(), f0.ino).await.unwrap().nlink, 1);
        let s = c.statfs(&root()).await.unwrap();
        assert_eq!(s.name_max, 255);
        assert!(s.files >= 53, "{}", s.files);
        assert!(s.available <= s.free && s.free <= s.blocks && s.blocks > 0, "the server's disk: {s:?}");
        c.bye().await.unwrap();
    });
}

/// `serve --root-squash 2000:2001`: root's requests are served as uid
/// 2000, gid 2001, without root's exemptions, and other users' as they
/// say; `--no-squash-from` exempts a client's address. The tree is set
/// up by root from an exempt address, then served, after a restart, to
/// every address squashed: root's new file is the anonymous ids', a
/// private directory and a root-only file are closed to it, and it may
/// not give a file away; user 1000 is served as user 1000; `status`
/// reports the squash.
#[test]
fn a_server_with_root_squash_serves_root_as_the_anonymous_ids() {
    let data = tempfile::tempdir().unwrap();
    let squash = ["--root-squash", "2000:2001", "--recovery-ms", "0"];
    let mut server =
        ServerProc::start(data.path(), "127.0.0.1:0", &[&squash[..], &["--no-squash-from", "127.0.0.0/8"]].concat());
    let rt = rt();
    let (shared, private, secret) = rt.block_on(async {
        let c = client(&server.addr).await;
        let shared = c.create(&root(), ROOT, b"shared", FileType::Directory, 0o777, b"").await.unwrap();
        let private = c.create(&root(), ROOT, b"private", FileType::Directory, 0o700, b"").await.unwrap();
        let owner = SetAttr { uid: Some(1000), gid: Some(1000), ..SetAttr::default() };
        c.setattr(&root(), private.ino, owner).await.unwrap();
        let secret = c.create(&root(), ROOT, b"secret", FileType::Regular, 0o600, b"").await.unwrap();
        assert_eq!((secret.uid, secret.gid), (0, 0), "root from an exempt address is root");
        let squash = c.status().await.unwrap().root_squash;
        assert_eq!(squash, Some(RootSquashInfo { uid: 2000, gid: 2001, except: vec!["127.0.0.0/8".into()] }));
        c.bye().await.unwrap();
        (shared.ino, private.ino, secret.ino)
    });
    server.kill9();
    let server = ServerProc::start(data.path(), "127.0.0.1:0", &squash);
    rt.block_on(async {
        let c = client(&server.addr).await;
        let mine = c.create(&root(), shared, b"by-root", FileType::Regular, 0o644, b"").await.unwrap();
        assert_eq!((mine.uid, mine.gid), (2000, 2001), "root's new file is the anonymous ids'");
        assert_eq!(errno(c.create(&root(), ROOT, b"x", FileType::Regular, 0o644, b"").await), libc::EACCES);
        assert_eq!(errno(c.lookup(&root(), private, b"x").await), libc::EACCES, "a private directory");
        assert_eq!(errno(c.open(&root(), secret, libc::R_OK as u32).await), libc::EACCES, "a root-only file");
        let give = SetAttr { uid: Some(1000), ..SetAttr::default() };
        assert_eq!(errno(c.setattr(&root(), mine.ino, give).await), libc::EPERM, "a chown");
        let theirs = c.create(&user(), shared, b"by-user", FileType::Regular, 0o644, b"").await.unwrap();
        assert_eq!((theirs.uid, theirs.gid), (1000, 1000), "another user is served as they say");
        assert_eq!(errno(c.lookup(&user(), private, b"x").await), libc::ENOENT, "their own directory");
        c.bye().await.unwrap();
    });
    let (code, text, _) = cli(&server.addr, &["status"]);
    assert_eq!(code, 0);
    assert!(text.contains("root squash root's requests are served as uid 2000, gid 2001\n"), "{text}");
    let (_, json, _) = cli(&server.addr, &["status", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["root_squash"], serde_json::json!({"uid": 2000, "gid": 2001, "except": []}));
}

/// A client run by another user of the server's machine (here uid
/// 65534, its socket made with that file-system uid) is served as that
/// user, whatever ids it sends: root's ids get it nothing root has (a
/// new name in root's directory, a root-only file, a chown), its new
/// file is its own, with its primary group, not the groups it claims;
/// and it may not evict a session or use the changelog. Root's client on
/// the same server is served as root. Before session 38 every local
/// client was served with the ids it sent: any user could be root.
#[test]
fn a_user_of_the_servers_machine_is_served_as_that_user_whatever_ids_it_sends() {
    let (_data, server) = long_lease_server();
    let rt = rt();
    let (shared, secret, root_session) = rt.block_on(async {
        let c = client(&server.addr).await;
        let shared = c.create(&root(), ROOT, b"shared", FileType::Directory, 0o777, b"").await.unwrap();
        let secret = c.create(&root(), ROOT, b"secret", FileType::Regular, 0o600, b"").await.unwrap();
        (shared.ino, secret.ino, c.session())
    });
    let nobody = nix::unistd::User::from_uid(65534.into()).unwrap().expect("user 65534 in the user database");
    let addr = server.addr.clone();
    std::thread::spawn(move || {
        // SAFETY: setfsuid changes only this thread's file-system uid,
        // which the sockets this thread makes take as their owner.
        unsafe { libc::setfsuid(65534) };
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
            let c = client(&addr).await;
            let forged = Cred { uid: 0, gid: 0, groups: vec![0] };
            assert_eq!(errno(c.create(&forged, ROOT, b"x", FileType::Regular, 0o644, b"").await), libc::EACCES);
            assert_eq!(errno(c.open(&forged, secret, libc::R_OK as u32).await), libc::EACCES, "a root-only file");
            let mine = c.create(&forged, shared, b"mine", FileType::Regular, 0o644, b"").await.unwrap();
            assert_eq!((mine.uid, mine.gid), (65534, nobody.gid.as_raw()), "its own file, in its own group");
            let give = SetAttr { uid: Some(0), ..SetAttr::default() };
            assert_eq!(errno(c.setattr(&forged, mine.ino, give).await), libc::EPERM, "a chown");
            for refused in [c.evict(root_session).await, c.changelog_list().await.map(drop)] {
                assert!(
                    matches!(&refused, Err(ClientError::Denied(e)) if e.contains("only root or the server's own user")),
                    "{refused:?}"
                );
            }
        });
    })
    .join()
    .unwrap();
    // The commands say so, and exit 77 (EX_NOPERM).
    let (_place, bin) = runnable_by_anyone();
    for (cmd, rest) in [("evict", root_session.to_string()), ("changelog", "list".into())] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args([cmd, "--server", &server.addr, &rest])
            .output()
            .unwrap();
        let args = (cmd, &rest);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(77), "{args:?}: {err}");
        assert!(err.contains("permission denied: uid 65534"), "{args:?}: {err}");
    }
    rt.block_on(async {
        let c = client(&server.addr).await;
        let mine = c.lookup(&root(), shared, b"mine").await.unwrap();
        assert_eq!(mine.uid, 65534);
        c.create(&root(), ROOT, b"x", FileType::Regular, 0o644, b"").await.expect("root is root");
        assert!(c.changelog_list().await.is_ok());
    });
}

/// Many large reads pipelined at once, served from the page cache, are
/// answered in the session they were asked in: the lock the client holds
/// is not lost. (Before, the server ended the session once 4 MiB of
/// answers were unacknowledged, which the sockets' buffers alone hold
/// when the client lags, and it put every answer of a batch in the
/// stream before writing any: the reads failed and the lock was lost.
/// Through a mount, 32 `dd` readers of one file looped on that, with
/// `EIO`.)
#[test]
fn many_large_reads_at_once_keep_their_session() {
    let (_data, server) = long_lease_server();
    rt().block_on(async {
        let c = client(&server.addr).await;
        c.lock(&spec("held", 1)).await.unwrap();
        let f = c.create_open(&root(), ROOT, b"big", (0o644, 0)).await.unwrap();
        let chunk = 128 << 10;
        let pattern = |i: usize| vec![i as u8; chunk];
        for i in 0..16 {
            c.write(&root(), f.ino, (i * chunk) as u64, &pattern(i)).await.unwrap();
        }
        let (session, me) = (c.session(), root());
        // 256 MiB of answers asked for at once: more than a session may
        // keep unacknowledged, unless the server writes as it answers.
        let mut reads: futures::stream::FuturesUnordered<_> = (0..2048)
            .map(|n| {
                let read = c.read(&me, f.ino, ((n % 16) * chunk) as u64, chunk as u32);
                async move { (n, read.await) }
            })
            .collect();
        while let Some((n, r)) = futures::StreamExt::next(&mut reads).await {
            assert_eq!(r.expect("the read is answered"), pattern(n % 16), "read {n}");
        }
        assert_eq!(c.session(), session, "the same session");
        assert!(c.lost_since(0).is_empty(), "the lock is held");
    });
}

/// A file unlinked while open lives until its last handle is released,
/// or until the session holding it ends.
#[test]
fn an_open_file_outlives_its_name_until_released_or_its_session_ends() {
    let (_data, server) = long_lease_server();
    rt().block_on(async {
        let a = client(&server.addr).await;
        let b = client(&server.addr).await;
        for by_bye in [false, true] {
            let f = a.create(&root(), ROOT, b"f", FileType::Regular, 0o644, b"").await.unwrap();
            let holder = if by_bye { client(&server.addr).await } else { a.clone() };
            holder.open(&root(), f.ino, libc::R_OK as u32).await.unwrap();
            b.unlink(&root(), ROOT, b"f").await.unwrap();
            assert_eq!(b.getattr(&root(), f.ino).await.unwrap().nlink, 0, "an orphan while open");
            assert_eq!(errno(b.release(&root(), f.ino).await), libc::EBADF, "b holds no handle");
            if by_bye {
                holder.bye().await.unwrap();
            } else {
                holder.release(&root(), f.ino).await.unwrap();
            }
            assert_eq!(errno(b.getattr(&root(), f.ino).await), libc::ESTALE, "freed (session ended: {by_bye})");
        }
    });
}

/// A request on an inode that is gone, named by number, fails with
/// `ESTALE` (what makes a mount's kernel look the path up again, as with
/// NFS); a name that is not there is `ENOENT`, and so are a directory
/// that is gone, every name in it, and linking an open file whose last
/// name went (its inode is still there), as on Linux.
#[test]
fn a_gone_inode_is_estale_and_a_missing_name_enoent() {
    let (_data, server) = long_lease_server();
    rt().block_on(async {
        let c = client(&server.addr).await;
        let d = c.create(&root(), ROOT, b"d", FileType::Directory, 0o755, b"").await.unwrap();
        let f = c.create(&root(), d.ino, b"f", FileType::Regular, 0o644, b"").await.unwrap();
        assert_eq!(errno(c.lookup(&root(), d.ino, b"missing").await), libc::ENOENT, "a missing name");
        c.open(&root(), f.ino, libc::R_OK as u32).await.unwrap();
        c.unlink(&root(), d.ino, b"f").await.unwrap();
        assert_eq!(errno(c.link(&root(), f.ino, d.ino, b"g").await), libc::ENOENT, "an orphan linked");
        c.release(&root(), f.ino).await.unwrap();
        c.rmdir(&root(), ROOT, b"d").await.unwrap();
        let gone = [
            ("getattr of", errno(c.getattr(&root(), f.ino).await), libc::ESTALE),
            ("open of", errno(c.open(&root(), f.ino, libc::R_OK as u32).await), libc::ESTALE),
            ("link of", errno(c.link(&root(), f.ino, ROOT, b"x").await), libc::ESTALE),
            ("listing of a directory", errno(c.readdir(&root(), d.ino, 0, 10, true).await), libc::ENOENT),
            ("lookup in", errno(c.lookup(&root(), d.ino, b"f").await), libc::ENOENT),
            ("create in", errno(c.create(&root(), d.ino, b"x", FileType::Regular, 0o644, b"").await), libc::ENOENT),
            ("unlink in", errno(c.unlink(&root(), d.ino, b"x").await), libc::ENOENT),
        ];
        for (what, got, want) in gone {
            assert_eq!(got, want, "{what} a gone inode");
        }
        // As Linux's `fstat` of a removed directory still held.
        let last = c.getattr(&root(), d.ino).await.unwrap();
        assert_eq!(
            (last.kind, last.nlink, last.perm),
            (FileType::Directory, 0, 0o755),
            "a removed directory's attributes"
        );
    });
}

/// `create_open` creates a file held open by the session: another client
/// sees it, and unlinked it lives on until released or the session ends.
#[test]
fn create_open_holds_the_new_file_open() {
    let (_data, server) = long_lease_server();
    rt().block_on(async {
        let b = client(&server.addr).await;
        for by_bye in [false, true] {
            let a = client(&server.addr).await;
            let f = a.create_open(&root(), ROOT, b"f", (0o600, 0)).await.unwrap();
            assert_eq!(b.lookup(&root(), ROOT, b"f").await.unwrap().ino, f.ino);
            assert_eq!(errno(a.create_open(&root(), ROOT, b"f", (0o600, 0)).await), libc::EEXIST);
            b.unlink(&root(), ROOT, b"f").await.unwrap();
            assert_eq!(b.getattr(&root(), f.ino).await.unwrap().nlink, 0, "an orphan while open");
            if by_bye {
                a.bye().await.unwrap();
            } else {
                a.release(&root(), f.ino).await.unwrap();
            }
            assert_eq!(errno(b.getattr(&root(), f.ino).await), libc::ESTALE, "freed (session ended: {by_bye})");
        }
    });
}

/// Polls the server's status until `done` holds (30 s at most: a hang
/// fails the test rather than stall it).
async fn status_until(c: &interlock_client::Client, what: &str, done: impl Fn(&interlock_proto::StatusInfo) -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done(&c.status().await.unwrap()) {
        assert!(std::time::Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A file unlinked while open outlives a `kill -9` and restart of the
/// server: the client opens it again in the recovery window, so the
/// server's sweep of orphans nobody opened again (done before `status`
/// says the recovery is over) spares it. Its data reads back, its handles
/// are the new server's to count, and the last release frees it.
#[test]
fn a_file_unlinked_while_open_outlives_a_server_restart() {
    let data = tempfile::tempdir().unwrap();
    let args = ["--lease-ms", "3000", "--recovery-ms", "3000"];
    let mut server = ServerProc::start(data.path(), "127.0.0.1:0", &args);
    let addr = server.addr.clone();
    let rt = rt();
    let (c, f, g) = rt.block_on(async {
        let c = client(&addr).await;
        let f = c.create_open(&root(), ROOT, b"f", (0o644, 0)).await.unwrap();
        c.write(&root(), f.ino, 0, b"still here").await.unwrap();
        c.fsync(&root(), f.ino).await.unwrap();
        let g = c.create(&root(), ROOT, b"g", FileType::Regular, 0o644, b"").await.unwrap();
        c.open(&root(), g.ino, libc::R_OK as u32).await.unwrap();
        c.open(&root(), g.ino, libc::R_OK as u32).await.unwrap();
        for name in [b"f", b"g"] {
            c.unlink(&root(), ROOT, name).await.unwrap();
        }
        (c, f, g)
    });
    server.kill9();
    let _server = ServerProc::start(data.path(), &addr, &args);
    rt.block_on(async {
        let watcher = client(&addr).await;
        // c is back (its reconnect backs off to at most 2 s), then the
        // window ends.
        status_until(&watcher, "c to be back", |s| s.sessions >= 2).await;
        status_until(&watcher, "the recovery to end", |s| s.recovering_ms == 0).await;
        assert_eq!(c.read(&root(), f.ino, 0, 100).await.unwrap(), b"still here");
        c.release(&root(), f.ino).await.unwrap();
        assert_eq!(errno(c.getattr(&root(), f.ino).await), libc::ESTALE, "freed at its last release");
        c.release(&root(), g.ino).await.unwrap();
        assert_eq!(c.getattr(&root(), g.ino).await.unwrap().nlink, 0, "one handle left: still an orphan");
        c.release(&root(), g.ino).await.unwrap();
        assert_eq!(errno(c.getattr(&root(), g.ino).await), libc::ESTALE, "freed at its last release");
    });
}

/// Every change acknowledged before a `kill -9` of the server is there
/// after it restarts; in the unsafe mode too (a process's writes outlive
/// it: only a machine crash may lose what was not synced). So is every
/// write answered, fsynced or not: a write is answered once its record
/// is in the journal's file, as `write(2)` on a local file system
/// returns once the page cache has it. Before, a write was answered with
/// its record still in the journal's memory: the server's restart cut
/// the data past the recorded size, and files written by `tar` on a
/// mount came back empty, or with zeros where their first write was.
/// `status` says which mode the server is in.
#[test]
fn acknowledged_changes_survive_kill_9_of_the_server() {
    for mode in [&[][..], &["--unsafe-no-fsync"]] {
        changes_survive_kill_9(mode);
    }
}

fn changes_survive_kill_9(mode: &[&str]) {
    let data = tempfile::tempdir().unwrap();
    let mut server = ServerProc::start(data.path(), "127.0.0.1:0", mode);
    let unsafe_mode = !mode.is_empty();
    let (_, text, _) = cli(&server.addr, &["status"]);
    assert_eq!(text.contains("UNSAFE"), unsafe_mode, "{text}");
    let (_, out, _) = cli(&server.addr, &["status", "--json"]);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["durable"], !unsafe_mode, "{out}");
    let acked: Vec<String> = rt().block_on(async {
        let c = client(&server.addr).await;
        let made = futures::future::join_all((0..500).map(|i| {
            let c = c.clone();
            async move { c.create(&root(), ROOT, format!("n{i}").as_bytes(), FileType::Regular, 0o644, b"").await }
        }))
        .await;
        // The last thing before the kill: writes, none synced.
        let written = futures::future::join_all(made.iter().flatten().take(100).map(|a| {
            let c = c.clone();
            async move { c.write(&root(), a.ino, 0, format!("data of {}", a.ino).as_bytes()).await }
        }))
        .await;
        assert!(written.iter().all(Result::is_ok), "{written:?}");
        made.iter().enumerate().filter(|(_, r)| r.is_ok()).map(|(i, _)| format!("n{i}")).collect()
    });
    assert_eq!(acked.len(), 500);
    server.kill9();
    let server = ServerProc::start(data.path(), "127.0.0.1:0", mode);
    rt().block_on(async {
        let c = client(&server.addr).await;
        let mut lost = Vec::new();
        for (i, n) in acked.iter().enumerate() {
            let a = c.lookup(&root(), ROOT, n.as_bytes()).await.unwrap_or_else(|e| panic!("{n} lost: {e}"));
            let want = if i < 100 { format!("data of {}", a.ino).into_bytes() } else { Vec::new() };
            if c.read(&root(), a.ino, 0, 100).await.unwrap() != want {
                lost.push(n);
            }
        }
        assert!(lost.is_empty(), "answered writes lost ({mode:?}): {lost:?}");
    });
}

/// Changes that may not be made twice, on their way through a client
/// when the server is killed, are each made once: the client asks the
/// restarted server about each again (protocol 15), and the server
/// answers from its replay cache what it made, or makes it. Eight tasks
/// create, rename and remove files and append a line to a log each,
/// through one client, while the server is killed and started again 15
/// times: no call fails, no file is left, and every log holds each line
/// once, in order. (Before protocol 15 such calls failed with
/// `ConnectionLost`; made again blindly, with `EEXIST` and `ENOENT`.)
#[test]
fn changes_on_their_way_at_kills_of_the_server_are_made_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const TASKS: usize = 8;
    // The client must be back within the window (no lock waits for it).
    let flags = ["--lease-ms", "5000", "--recovery-ms", "5000"];
    let data = tempfile::tempdir().unwrap();
    let mut server = ServerProc::start(data.path(), "127.0.0.1:0", &flags);
    let addr = server.addr.clone();
    let rt = rt();
    let c = rt.block_on(client(&addr));
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (c, stop, done) = (c.clone(), stop.clone(), done.clone());
            rt.spawn(async move {
                let name = format!("log{t}");
                let log = c.create(&root(), ROOT, name.as_bytes(), FileType::Regular, 0o644, b"").await.unwrap().ino;
                let mut failed = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (a, b) = (format!("{t}-{i}"), format!("{t}-{i}.moved"));
                    let (a, b) = (a.as_bytes(), b.as_bytes());
                    let r = async {
                        let file = FileType::Regular;
                        c.create(&root(), ROOT, a, file, 0o644, b"").await.map_err(|e| ("create", e))?;
                        let renamed = c.rename(&root(), (ROOT, a), (ROOT, b), RenameFlags::default()).await;
                        renamed.map_err(|e| ("rename", e))?;
                        c.unlink(&root(), ROOT, b).await.map_err(|e| ("unlink", e))?;
                        c.append(&root(), log, format!("{i}\n").as_bytes()).await.map_err(|e| ("append", e))
                    };
                    if let Err((call, e)) = r.await {
                        failed.push(format!("{call} of {t}-{i}: {e}"));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                (log, failed)
            })
        })
        .collect();
    for _ in 0..15 {
        let before = done.load(Ordering::Relaxed);
        wait_for("the tasks to make progress", || done.load(Ordering::Relaxed) >= before + 100);
        server.kill9();
        server = ServerProc::start(data.path(), &addr, &flags);
    }
    let before = done.load(Ordering::Relaxed);
    wait_for("the tasks to go on after the last restart", || done.load(Ordering::Relaxed) >= before + 100);
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        let mut logs = Vec::new();
        let mut failed = Vec::new();
        for task in tasks {
            let (log, f) = task.await.unwrap();
            logs.push(log);
            failed.extend(f);
        }
        assert!(failed.is_empty(), "calls failed across kills:\n{}", failed.join("\n"));
        for (t, log) in logs.into_iter().enumerate() {
            let mut text = Vec::new();
            while let Ok(part) = c.read(&root(), log, text.len() as u64, 1 << 20).await {
                if part.is_empty() {
                    break;
                }
                text.extend(part);
            }
            let lines: Vec<usize> = String::from_utf8(text).unwrap().lines().map(|l| l.parse().unwrap()).collect();
            assert!(
                lines.iter().enumerate().all(|(k, &i)| k == i),
                "task {t}'s appends, each once, in order: {lines:?}"
            );
        }
        let (left, _) = c.readdir(&root(), ROOT, 0, 100, false).await.unwrap();
        let left: Vec<String> = left.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect();
        assert_eq!(left.len(), TASKS, "only the logs are left: {left:?}");
    });
}

#[test]
fn changelog_commands_and_status() {
    let (data, mut server) = long_lease_server();
    let addr = server.addr.clone();
    let (code, out, err) = cli(&addr, &["changelog", "register", "--name", "audit"]);
    assert_eq!((code, out.as_str()), (0, "cl1\n"), "{err}");
    let (code, _, err) = cli(&addr, &["changelog", "register", "--name", "audit"]);
    assert_eq!(code, 1, "a second consumer with the same name is refused");
    assert!(err.contains("already registered"), "{err}");
    let (code, _, err) = cli(&addr, &["changelog", "register", "--name", "cl2"]);
    assert_eq!(code, 2, "a name of an id's form is a usage error: {err}");
    assert!(err.contains("has the form of a consumer id"), "{err}");
    rt().block_on(async {
        let c = client(&addr).await;
        let d = c.create(&root(), ROOT, b"dir", FileType::Directory, 0o755, b"").await.unwrap();
        c.create(&user(), ROOT, b"nope", FileType::Regular, 0o644, b"").await.unwrap_err();
        c.create(&root(), d.ino, b"a", FileType::Regular, 0o644, b"").await.unwrap();
        c.rename(&root(), (d.ino, b"a"), (d.ino, b"b"), RenameFlags::default()).await.unwrap();
        c.unlink(&root(), d.ino, b"b").await.unwrap();
    });
    let (code, out, err) = cli(&addr, &["changelog", "read", "audit", "--json"]);
    assert_eq!(code, 0, "{err}");
    let records: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seen: Vec<(String, String)> =
        records.iter().map(|r| (r["type"].as_str().unwrap().into(), r["name"].as_str().unwrap().into())).collect();
    let want = [("MKDIR", "dir"), ("CREAT", "a"), ("RENME", "b"), ("UNLNK", "b")];
    assert_eq!(seen, want.map(|(t, n)| (t.to_string(), n.to_string())), "the refused create is not there");
    assert_eq!(records[2]["source"]["name"], "a");
    assert_eq!(records[3]["flags"], 1, "the last name went");
    let indices: Vec<u64> = records.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert!(indices.windows(2).all(|w| w[1] == w[0] + 1), "{indices:?}");
    let (_, text, _) = cli(&addr, &["changelog", "read", "cl1"]);
    assert!(text.lines().next().unwrap().contains("02MKDIR"), "Lustre's format: {text}");
    // `--server` after the subcommand too (refused there until session 42).
    let out = Command::new(BIN).args(["changelog", "read", "cl1", "--server", &addr]).output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    // Into a pipe nobody reads (`| head`): it ends by SIGPIPE, silently,
    // as other tools do; it panicked in `println!` until session 42.
    let (unread, pipe) = std::io::pipe().unwrap();
    drop(unread);
    let mut reader = Command::new(BIN);
    reader.args(["changelog", "read", "cl1"]).env("INTERLOCK_SERVER", &addr).stdout(pipe).stderr(Stdio::piped());
    let out = reader.spawn().unwrap().wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));

    let (code, _, _) = cli(&addr, &["changelog", "clear", "audit", "0"]);
    assert_eq!(code, 0);
    let (_, out, _) = cli(&addr, &["changelog", "read", "cl1"]);
    assert_eq!(out, "", "cleared");
    let (_, out, _) = cli(&addr, &["status", "--json"]);
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["consumers"][0]["id"], "cl1");
    assert_eq!(s["consumers"][0]["behind"], 0);
    assert!(s["inodes"].as_u64().unwrap() >= 2);
    let disk = nix::sys::statvfs::statvfs(data.path()).unwrap();
    assert_eq!(s["disk_bytes"].as_u64(), Some(disk.blocks() * disk.fragment_size()), "the data directory's disk");
    assert!(s["disk_available_bytes"].as_u64().unwrap() <= s["disk_bytes"].as_u64().unwrap());
    let (_, out, _) = cli(&addr, &["status"]);
    assert!(out.contains("GiB available of"), "{out}");

    // `follow` (`read --follow`) prints a record made after it started,
    // and goes on across a clean stop of the server and a kill of it
    // (before, it ended with "connection to the server lost").
    let mut follower = Command::new(BIN)
        .args(["changelog", "follow", "--user", "cl1", "--json"])
        .env("INTERLOCK_SERVER", &addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let out = follower.stdout.take().unwrap();
    std::thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).try_for_each(|l| tx.send(l)));
    let make = |name: &str| {
        rt().block_on(async {
            let c = client(&addr).await;
            c.create(&root(), ROOT, name.as_bytes(), FileType::Regular, 0o644, b"").await.unwrap();
        })
    };
    let next = || lines.recv_timeout(std::time::Duration::from_secs(30)).expect("a line from --follow");
    make("later");
    let first = next();
    assert!(first.contains("\"name\":\"later\""), "{first}");
    server.terminate();
    let mut server = ServerProc::start(data.path(), &addr, &["--lease-ms", "60000"]);
    make("after-a-stop");
    let line = next();
    assert!(line.contains("\"name\":\"after-a-stop\""), "{line}");
    server.kill9();
    let _server = ServerProc::start(data.path(), &addr, &["--lease-ms", "60000"]);
    make("after-a-kill");
    let line = next();
    assert!(line.contains("\"name\":\"after-a-kill\""), "{line}");
    follower.kill().unwrap();
    follower.wait().unwrap();

    let (code, _, _) = cli(&addr, &["changelog", "deregister", "audit"]);
    assert_eq!(code, 0);
    let (_, out, _) = cli(&addr, &["changelog", "list"]);
    assert_eq!(out, "");
    let (code, _, err) = cli(&addr, &["changelog", "read", "cl1"]);
    assert_eq!(code, 1);
    assert!(err.contains("no changelog consumer"), "{err}");
}

/// Data written through the server in 128 KiB pieces and fsynced reads
/// back whole after a `kill -9` and restart; a read past the end is short.
#[test]
fn written_copied_and_fsynced_data_survives_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let mut server = ServerProc::start(data.path(), "127.0.0.1:0", &[]);
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let ino = rt().block_on(async {
        let c = client(&server.addr).await;
        let f = c.create(&root(), ROOT, b"data", FileType::Regular, 0o644, b"").await.unwrap();
        for (i, chunk) in bytes.chunks(128 << 10).enumerate() {
            c.write(&root(), f.ino, (i * (128 << 10)) as u64, chunk).await.unwrap();
        }
        assert_eq!(errno(c.write(&user(), f.ino, 0, b"x").await), libc::EACCES, "not the owner, mode 0644");
        assert_eq!(errno(c.read(&root(), ROOT, 0, 10).await), libc::EISDIR);
        c.fsync(&root(), f.ino).await.unwrap();
        // A copy made by the server, and space reserved past it.
        let g = c.create(&root(), ROOT, b"copy", FileType::Regular, 0o644, b"").await.unwrap();
        let (n, a) = c.copy_range(&root(), (f.ino, 0), (g.ino, 1000), 400_000).await.unwrap();
        assert_eq!((n, a.size), (300_000, 301_000), "cut at the source's end");
        assert_eq!(errno(c.copy_range(&root(), (f.ino, 0), (f.ino, 100), 1000).await), libc::EINVAL, "overlapping");
        assert_eq!(errno(c.copy_range(&user(), (f.ino, 0), (g.ino, 0), 10).await), libc::EACCES);
        let reserve = Fallocate::Allocate { keep_size: false };
        assert_eq!(c.fallocate(&root(), g.ino, reserve, 0, 400_000).await.unwrap().size, 400_000);
        c.fsync(&root(), g.ino).await.unwrap();
        (f.ino, g.ino)
    });
    server.kill9();
    // The data out of the page cache (where the kernel can drop it: not
    // on tmpfs), so the reads below wait for the disk, on the server's
    // blocking threads.
    for fan in std::fs::read_dir(data.path().join("meta/data")).unwrap() {
        for file in std::fs::read_dir(fan.unwrap().path()).unwrap() {
            let f = std::fs::File::open(file.unwrap().path()).unwrap();
            nix::fcntl::posix_fadvise(&f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
        }
    }
    let server = ServerProc::start(data.path(), "127.0.0.1:0", &[]);
    rt().block_on(async {
        let c = client(&server.addr).await;
        let read_all = |ino, size: usize| {
            let c = &c;
            async move {
                let mut back = Vec::new();
                while back.len() < size {
                    back.extend(c.read(&root(), ino, back.len() as u64, 128 << 10).await.unwrap());
                }
                back
            }
        };
        assert_eq!(c.getattr(&root(), ino.0).await.unwrap().size, 300_000);
        assert!(read_all(ino.0, bytes.len()).await == bytes, "the data read back");
        assert_eq!(c.read(&root(), ino.0, 299_990, 100).await.unwrap().len(), 10, "short at the end");
        assert_eq!(c.getattr(&root(), ino.1).await.unwrap().size, 400_000, "the reserved size");
        let copy = read_all(ino.1, 400_000).await;
        assert!(copy[1000..301_000] == bytes[..], "the copy read back");
        assert!(copy[..1000].iter().chain(&copy[301_000..]).all(|&b| b == 0), "zeros around it");
    });
}

/// An `fsync` that writes out a lot of data does not hold up other
/// connections: with one worker, another client gets 20 answers while it
/// runs (it has 128 MiB to write out, a getattr nothing). The data goes
/// under the build's directory, on the project's disk: in a temporary
/// directory on a tmpfs (Debian's `/tmp` since 13) an `fsync` writes
/// nothing and ends at once.
#[test]
fn a_long_fsync_holds_up_no_other_connection() {
    let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let server = ServerProc::start(data.path(), "127.0.0.1:0", &["--threads", "1"]);
    rt().block_on(async {
        let (a, b, me) = (client(&server.addr).await, client(&server.addr).await, root());
        let f = a.create(&me, ROOT, b"big", FileType::Regular, 0o644, b"").await.unwrap();
        let chunk = vec![7u8; 128 << 10];
        for i in 0..1024u64 {
            a.write(&me, f.ino, i * (128 << 10), &chunk).await.unwrap();
        }
        let mut fsync = std::pin::pin!(a.fsync(&me, f.ino));
        let mut answered = 0;
        while answered < 20 {
            tokio::select! {
                biased;
                r = &mut fsync => panic!("the fsync ended ({r:?}) before the other client had 20 answers ({answered})"),
                r = b.getattr(&me, ROOT) => {
                    r.unwrap();
                    answered += 1;
                }
            }
        }
        fsync.await.unwrap();
    });
}

/// A changelog clear saves the consumers' state with two fsyncs, on a
/// blocking thread: with one worker, another client is answered while it
/// saves (until session 57 the worker made the save, and every other
/// connection waited for it). A clear whose save fails is refused, and
/// its cursor does not move.
///
/// The save is held up by making its temporary file a FIFO: opening it
/// to write blocks until a reader opens it, and its fsync then fails.
#[test]
fn a_changelog_clear_holds_up_no_other_connection() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProc::start(data.path(), "127.0.0.1:0", &["--threads", "1"]);
    let fifo = data.path().join("meta/consumers.json.tmp");
    let unblock = || drop(std::fs::read(&fifo).unwrap());
    rt().block_on(async {
        let (a, b, me) = (client(&server.addr).await, client(&server.addr).await, root());
        let id = a.changelog_register(Some("audit"), u32::MAX).await.unwrap().id;
        a.create(&me, ROOT, b"f", FileType::Regular, 0o644, b"").await.unwrap();
        assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success(), "mkfifo");
        let clear = tokio::spawn({
            let (a, id) = (a.clone(), id.clone());
            async move { a.changelog_clear(&id, 1).await }
        });
        let pid = server.child.id();
        tokio::task::spawn_blocking(move || wait_opening_fifo(pid)).await.unwrap();
        let others = async {
            for _ in 0..20 {
                b.getattr(&me, ROOT).await?;
            }
            b.changelog_list().await
        };
        // Looked at before the save goes on, and asserted after: a failed
        // assertion must not leave the server blocked.
        let listed = tokio::time::timeout(std::time::Duration::from_secs(20), others).await;
        let saving = !clear.is_finished();
        unblock();
        let cleared = clear.await.unwrap();
        let Ok(Ok(listed)) = listed else { panic!("another client was not answered while a clear saved: {listed:?}") };
        assert_eq!(listed.iter().map(|c| c.cleared).collect::<Vec<_>>(), [0], "shown before it was saved");
        assert!(saving, "the clear was answered with its save held up");
        assert!(cleared.is_err(), "a FIFO's fsync fails: {cleared:?}");
        assert_eq!(b.changelog_list().await.unwrap()[0].cleared, 0, "a failed save's change was shown");
        std::fs::remove_file(&fifo).unwrap();
        a.changelog_clear(&id, 1).await.unwrap();
        assert_eq!(b.changelog_list().await.unwrap()[0].cleared, 1);
    });
}

/// An ext4 image of 256 MiB on a 48 MiB tmpfs, mounted through a loop
/// device: once the tmpfs is full the device's writes fail, as a failing
/// disk's do (a sync fails, ext4 then goes read-only). Unmounted on drop,
/// the ext4 before the tmpfs under it.
struct FailingDisk {
    fs: tempfile::TempDir,
    _tmpfs: Tmpfs,
}

impl FailingDisk {
    /// The disk, if this machine lets a test make one; `None` said
    /// loudly. The tmpfs needs root, which `INTERLOCK_REQUIRE_FUSE`
    /// promises (without it, the test fails); loop devices and
    /// `mkfs.ext4` a machine (a container) may lack even as root.
    fn new(test: &str) -> Option<FailingDisk> {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(std::env::var_os("INTERLOCK_REQUIRE_FUSE").is_none(), "{test}: root was promised");
            eprintln!("!! SKIPPING {test}: a failing disk needs root");
            return None;
        }
        let disk = FailingDisk { fs: tempfile::tempdir().unwrap(), _tmpfs: Tmpfs::of("48m") };
        let image = disk._tmpfs.path().join("disk.img");
        let sh = |cmd: &mut Command| cmd.stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        let made = std::fs::File::create(&image).and_then(|f| f.set_len(256 << 20)).is_ok()
            && sh(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))
            && sh(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(disk.fs.path()));
        if !made {
            eprintln!("!! SKIPPING {test}: no loop device or no mkfs.ext4 here (e2fsprogs)");
            return None;
        }
        Some(disk)
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("--lazy").arg(self.fs.path()).stderr(Stdio::null()).status();
    }
}

/// A server whose disk fails under it stops with an error that says why,
/// for its supervisor to restart it, rather than serve on with a journal
/// that records nothing: until session 32 it kept answering every change
/// `EIO` and showing, to reads, changes whose records never became
/// durable, and nothing told a supervisor. A restart replays what is
/// durable (`a_server_restart_keeps_open_files_even_unlinked_and_locks`
/// in the mount's tests shows clients carrying on across one).
///
/// A changelog read waiting for records meanwhile is answered with the
/// failure, not with an empty page (which a follower would ask again at
/// once, and again, until the server stopped; session 55).
#[test]
fn a_server_whose_disk_fails_stops_with_an_error() {
    let Some(disk) = FailingDisk::new("a_server_whose_disk_fails_stops_with_an_error") else { return };
    let data = disk.fs.path().join("data");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .env("INTERLOCK_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("interlock: listening on ").expect("listening line").to_string();
    // Killed on drop if the test fails: a server left running would hold
    // the disk's loop device.
    let mut server = ServerProc { child, addr: addr.clone() };
    let follow = rt().block_on(async {
        let (c, me) = (client(&addr).await, root());
        let follower = client(&addr).await;
        let id = follower.changelog_register(None, u32::MAX).await.unwrap().id;
        // From far past the end: only the failure can end its wait early.
        let waiting = tokio::spawn(async move {
            follower.changelog_read(&id, Some(u64::MAX / 2), 16, std::time::Duration::from_secs(600)).await
        });
        let f = c.create(&me, ROOT, b"big", FileType::Regular, 0o644, b"").await.unwrap();
        let chunk = vec![7u8; 1 << 20];
        // Data until the disk fails (at 48 MiB at most). Then records of
        // 60 KiB (an xattr set again and again) until one fails: the
        // journal writes into zeros it wrote ahead, which the full device
        // still holds, but within about a MiB it must write new ones.
        for i in 0..256u64 {
            if c.write(&me, f.ino, i << 20, &chunk).await.is_err() || c.fsync(&me, f.ino).await.is_err() {
                break;
            }
        }
        let value = vec![1u8; 60 << 10];
        for _ in 0..1000 {
            if c.setxattr(&me, f.ino, b"user.v", &value, XattrMode::Any).await.is_err() {
                break;
            }
        }
        tokio::time::timeout(std::time::Duration::from_secs(30), waiting).await
    });
    let answer = follow.expect("the waiting read answered once the journal failed").unwrap();
    assert!(
        matches!(&answer, Err(ClientError::Server(e)) if e.contains("the journal failed")),
        "the waiting read's answer: {answer:?}"
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < until, "the server still runs on a failed disk");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut server.child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the journal failed") && stderr.contains("a restart recovers"), "{stderr}");
}

/// Makes files `name-N` in the root from 32 tasks at once until the
/// server refuses one with `ENOSPC` (or, with `unlink`, removes the first
/// `made` of them until refused): how many it made (removed).
async fn names_until_refused(c: &interlock_client::Client, unlink: bool, made: usize) -> usize {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (c, next) = (c.clone(), next.clone());
            tokio::spawn(async move {
                let mut done = 0;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let name = format!("name-{i}");
                    let r = if unlink {
                        if i >= made {
                            return done;
                        }
                        c.unlink(&root(), ROOT, name.as_bytes()).await
                    } else {
                        c.create(&root(), ROOT, name.as_bytes(), FileType::Regular, 0o644, b"").await.map(drop)
                    };
                    match r {
                        Ok(()) => done += 1,
                        Err(e) => {
                            assert!(matches!(e, ClientError::Errno(libc::ENOSPC)), "name-{i}: {e:?}");
                            return done;
                        }
                    }
                }
            })
        })
        .collect();
    let mut all = 0;
    for t in tasks {
        all += t.await.unwrap();
    }
    all
}

/// A file removed while open, closed once the server's disk has no room
/// left even for a removal's record: the close succeeds, and once room
/// is made (another program's file removed) the server frees the orphan
/// and its data by itself, within a tick of its checkpointer
/// (`Namespace::retry_forgets`). No session holds it then, so without
/// that call nothing would free it before a restart. Needs root (a small
/// tmpfs).
#[test]
fn an_orphan_closed_on_a_full_disk_is_freed_by_the_server_once_there_is_room() {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(std::env::var_os("INTERLOCK_REQUIRE_FUSE").is_none(), "root was promised");
        eprintln!("!! SKIPPING an_orphan_closed_on_a_full_disk_is_freed_by_the_server_once_there_is_room: needs root");
        return;
    }
    let disk = Tmpfs::of("6m");
    let ballast = disk.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; 2 << 20]).unwrap();
    let server = ServerProc::start(&disk.path().join("data"), "127.0.0.1:0", &[]);
    rt().block_on(async {
        let c = client(&server.addr).await;
        let held = c.create_open(&root(), ROOT, b"held", (0o644, 0)).await.unwrap().ino;
        c.write(&root(), held, 0, &[9u8; 64 << 10]).await.unwrap();
        c.unlink(&root(), ROOT, b"held").await.unwrap();
        let made = names_until_refused(&c, false, 0).await;
        let removed = names_until_refused(&c, true, made).await;
        assert!(removed < made, "the reserve took every removal of {made}");
        c.release(&root(), held).await.unwrap();
        assert_eq!(c.getattr(&root(), held).await.unwrap().nlink, 0, "the orphan waits for room");
        std::fs::remove_file(&ballast).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while c.getattr(&root(), held).await.is_ok() {
            assert!(std::time::Instant::now() < until, "the orphan is still there with room on the disk");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(errno(c.getattr(&root(), held).await), libc::ESTALE, "freed");
    });
}
