//! The floor under a durable change over loopback, beside Redis in the
//! same round (`bench mdtest --variant floor`): a server that does only
//! what every durable server must, and nothing else. One thread waits for
//! what arrived (`epoll_wait`), reads every connection that has something,
//! appends a 64-byte record (the key) per SET to one buffer, writes the
//! buffer after the records before it (in a file of written zeros made
//! before the run, as the journal's segments are extended ahead of their
//! records, but all at once: the floor never pays for the extending),
//! makes it durable with
//! one `fdatasync`, answers every request it read, and waits again.
//! That is the shape session 19 found fastest here: no other thread is
//! woken for the sync. No namespace, no sessions, no framing but RESP's,
//! no checksum: a durable server's cost when all but the network and the
//! disk is free. `redis-benchmark` drives it as it drives Redis (SET with
//! `-r N`, then GET, answered nil), so its SET rate is the most that any
//! durable create over loopback can reach on this machine, and the gap
//! between it and our `net` rows is what our server's own work costs.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::machine::{Server, Took};
use super::scratch_dir;

/// What `requests` SETs took, then as many GETs, by `clients`
/// connections each waiting for its answer, against a floor server with
/// its file in `dir`.
pub(super) fn run(dir: &Option<PathBuf>, clients: usize, requests: u64) -> Result<[Took; 2], String> {
    let data = scratch_dir(dir, "interlock-bench-floor")?;
    let floor = Floor::start(data.path(), requests * RECORD as u64)?;
    // It runs on a thread of this process, and the calling thread only
    // waits for `redis-benchmark`: every other thread's time is its.
    let took = super::redis::benchmark(&floor.port.to_string(), Server::OtherThreads, clients, requests);
    floor.stop()?;
    took
}

/// The server's thread, and the way to stop it.
struct Floor {
    port: u16,
    stop: UnixStream,
    thread: JoinHandle<std::io::Result<()>>,
}

impl Floor {
    /// Listens on a free loopback port and serves from a thread of its
    /// own, its records in a file under `dir` made `bytes` long first.
    fn start(dir: &Path, bytes: u64) -> Result<Floor, String> {
        let err = |e: std::io::Error| format!("the floor server: {e}");
        let listener = TcpListener::bind("127.0.0.1:0").map_err(err)?;
        let port = listener.local_addr().map_err(err)?.port();
        let file = super::floor::preallocated(&dir.join("records"), bytes).map_err(err)?;
        let (stop, stopped) = UnixStream::pair().map_err(err)?;
        let thread = std::thread::Builder::new()
            .name("floor-server".into())
            .spawn(move || serve(listener, stopped, file))
            .map_err(err)?;
        Ok(Floor { port, stop, thread })
    }

    /// Stops the server; its error, if it failed.
    fn stop(mut self) -> Result<(), String> {
        let _ = self.stop.write_all(&[1]);
        match self.thread.join() {
            Ok(result) => result.map_err(|e| format!("the floor server: {e}")),
            Err(_) => Err("the floor server panicked".into()),
        }
    }
}

/// Epoll tokens of the listener and of the stop signal; a connection's is
/// its index in the table, from [`FIRST`].
const LISTENER: u64 = 0;
const STOP: u64 = 1;
const FIRST: u64 = 2;

/// A SET's record: its key, padded (or cut) to this.
const RECORD: usize = 64;

/// A connection: its bytes not yet parsed into commands, and its answers
/// to send once the records before them are durable.
struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
}

/// The loop: wait, read all that arrived (recording each SET), one sync,
/// answer, until `stop` is readable.
fn serve(listener: TcpListener, stop: UnixStream, file: File) -> std::io::Result<()> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    listener.set_nonblocking(true)?;
    epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
    epoll.add(&stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))?;
    let mut conns: Vec<Option<Conn>> = Vec::new();
    // Where the next group goes.
    let mut end = 0u64;
    let mut events = vec![EpollEvent::empty(); 256];
    let mut group = Vec::new();
    let mut answering = Vec::new();
    loop {
        let n = match epoll.wait(&mut events, EpollTimeout::NONE) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for event in &events[..n] {
            match event.data() {
                STOP => return Ok(()),
                LISTENER => accept(&listener, &epoll, &mut conns)?,
                token => {
                    let at = (token - FIRST) as usize;
                    let Some(conn) = conns[at].as_mut() else { continue };
                    if read(conn, &mut group) {
                        if !conn.output.is_empty() {
                            answering.push(at);
                        }
                    } else {
                        epoll.delete(&conn.stream)?;
                        conns[at] = None;
                    }
                }
            }
        }
        if !group.is_empty() {
            file.write_all_at(&group, end)?;
            file.sync_data()?;
            end += group.len() as u64;
            group.clear();
        }
        for at in answering.drain(..) {
            let Some(conn) = conns[at].as_mut() else { continue };
            let sent = write_all(&conn.stream, &conn.output);
            conn.output.clear();
            if sent.is_err() {
                epoll.delete(&conn.stream)?;
                conns[at] = None;
            }
        }
    }
}

/// Takes every pending connection.
fn accept(listener: &TcpListener, epoll: &Epoll, conns: &mut Vec<Option<Conn>>) -> std::io::Result<()> {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        };
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let at = conns.iter().position(Option::is_none).unwrap_or(conns.len());
        epoll.add(&stream, EpollEvent::new(EpollFlags::EPOLLIN, FIRST + at as u64))?;
        let conn = Conn { stream, input: Vec::new(), output: Vec::new() };
        match conns.get_mut(at) {
            Some(slot) => *slot = Some(conn),
            None => conns.push(Some(conn)),
        }
    }
}

/// Reads what the connection has, records each whole SET into `group`
/// and queues every whole command's answer. False if the connection is
/// done (closed, failed, or not speaking RESP).
fn read(conn: &mut Conn, group: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 16 << 10];
    loop {
        match (&conn.stream).read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => conn.input.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    let mut done = 0;
    loop {
        match command(&conn.input[done..]) {
            Parsed::Whole(len, args) => {
                let named = |want: &[u8]| args.first().is_some_and(|a| a.eq_ignore_ascii_case(want));
                let answer: &[u8] = if named(b"SET") && args.len() >= 3 {
                    let mut record = [0u8; RECORD];
                    let key = &args[1][..args[1].len().min(RECORD)];
                    record[..key.len()].copy_from_slice(key);
                    group.extend_from_slice(&record);
                    b"+OK\r\n"
                } else if named(b"GET") {
                    b"$-1\r\n"
                } else {
                    b"-ERR not served by the floor\r\n"
                };
                conn.output.extend_from_slice(answer);
                done += len;
            }
            Parsed::Partial => break,
            Parsed::Bad => return false,
        }
    }
    conn.input.drain(..done);
    true
}

/// A RESP command at the start of some bytes.
enum Parsed<'a> {
    /// Its length in bytes, and its arguments.
    Whole(usize, Vec<&'a [u8]>),
    /// More bytes are needed.
    Partial,
    /// Not a RESP array of bulk strings.
    Bad,
}

/// Parses one command: `*N\r\n` then N times `$LEN\r\n` and LEN bytes and
/// `\r\n`. O(its length).
fn command(bytes: &[u8]) -> Parsed<'_> {
    /// A `PREFIX<number>\r\n` line at `at`: the number and the index after
    /// the line, or why not.
    fn line(bytes: &[u8], at: usize, prefix: u8) -> Result<(usize, usize), Parsed<'static>> {
        match bytes.get(at) {
            None => return Err(Parsed::Partial),
            Some(&b) if b != prefix => return Err(Parsed::Bad),
            Some(_) => {}
        }
        let Some(cr) = bytes[at..].iter().position(|&b| b == b'\r') else { return Err(Parsed::Partial) };
        let end = at + cr + 2;
        if bytes.len() < end {
            return Err(Parsed::Partial);
        }
        let number = std::str::from_utf8(&bytes[at + 1..at + cr]).ok().and_then(|s| s.parse().ok());
        number.map(|n| (n, end)).ok_or(Parsed::Bad)
    }
    let (count, mut at) = match line(bytes, 0, b'*') {
        Ok(found) => found,
        Err(why) => return why,
    };
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, start) = match line(bytes, at, b'$') {
            Ok(found) => found,
            Err(why) => return why,
        };
        if bytes.len() < start + len + 2 {
            return Parsed::Partial;
        }
        args.push(&bytes[start..start + len]);
        at = start + len + 2;
    }
    Parsed::Whole(at, args)
}

/// Writes all of `bytes` to a non-blocking socket (answers are a few
/// bytes: the socket's buffer takes them at once in practice).
fn write_all(mut stream: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::thread::yield_now()
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_whole_partial_and_bad_commands() {
        let set = b"*3\r\n$3\r\nSET\r\n$5\r\nkey:1\r\n$3\r\nxxx\r\n";
        match command(set) {
            Parsed::Whole(len, args) => {
                assert_eq!(len, set.len());
                assert_eq!(args, [&b"SET"[..], b"key:1", b"xxx"]);
            }
            _ => panic!("a whole SET not parsed"),
        }
        for cut in 0..set.len() {
            assert!(matches!(command(&set[..cut]), Parsed::Partial), "cut at {cut}");
        }
        assert!(matches!(command(b"PING\r\n"), Parsed::Bad));
        assert!(matches!(command(b"*1\r\n:3\r\n"), Parsed::Bad));
        assert!(matches!(command(b"*x\r\n"), Parsed::Bad));
    }

    /// Pipelined commands are answered in order, and a SET leaves its key
    /// in the records' file.
    #[test]
    fn answers_in_order_and_records_each_set() {
        let dir = tempfile::tempdir().unwrap();
        let floor = Floor::start(dir.path(), 4096).unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", floor.port)).unwrap();
        client.write_all(b"*3\r\n$3\r\nSET\r\n$5\r\nkey:1\r\n$1\r\nx\r\n*2\r\n$3\r\nGET\r\n$5\r\nkey:1\r\n").unwrap();
        let mut got = Vec::new();
        let want = b"+OK\r\n$-1\r\n";
        while got.len() < want.len() {
            let mut b = [0u8; 64];
            let n = client.read(&mut b).unwrap();
            assert!(n > 0, "closed early");
            got.extend_from_slice(&b[..n]);
        }
        assert_eq!(got, want);
        let written = std::fs::read(dir.path().join("records")).unwrap();
        assert_eq!(&written[..5], b"key:1");
        drop(client);
        floor.stop().unwrap();
    }
}
