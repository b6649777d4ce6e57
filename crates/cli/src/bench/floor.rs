//! The floor under any lock server's hand-over on this machine: one round
//! trip over loopback TCP (the unlock in, the grant out), taken after the
//! machine sat idle for a hold, as it does between hand-overs. A server
//! that did no work at all could not hand a lock over faster, so `H / (H +
//! round trip)` bounds the blocking benchmark's efficiency from above.
//!
//! On a virtual machine, waking an idle CPU is a trip through the
//! hypervisor: this is where the floor shows it.
//!
//! And the floor under a durable change: one small record written into a
//! segment extended ahead of it and made durable with `fdatasync`, as the
//! journal does ([`fdatasyncs`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Round trips in microseconds, each after an idle pause of `hold`.
pub fn round_trips(hold: Duration, samples: usize) -> Result<hdrhistogram::Histogram<u64>, String> {
    let err = |e: std::io::Error| format!("loopback floor: {e}");
    let listener = TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let mut ours = TcpStream::connect(listener.local_addr().map_err(err)?).map_err(err)?;
    let (mut echo, _) = listener.accept().map_err(err)?;
    ours.set_nodelay(true).map_err(err)?;
    echo.set_nodelay(true).map_err(err)?;
    let echoer = std::thread::spawn(move || {
        let mut b = [0u8; 1];
        while echo.read_exact(&mut b).is_ok() && echo.write_all(&b).is_ok() {}
    });
    let mut hist = hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds");
    let mut b = [0u8; 1];
    for _ in 0..samples {
        std::thread::sleep(hold);
        let t = Instant::now();
        ours.write_all(&b).map_err(err)?;
        ours.read_exact(&mut b).map_err(err)?;
        hist.saturating_record(t.elapsed().as_micros() as u64);
    }
    drop(ours);
    let _ = echoer.join();
    Ok(hist)
}

/// `samples` writes of a 64-byte record, each followed by `fdatasync`, in
/// a file under `dir` extended ahead of them with zeros (as the journal's
/// segments are): the latency of one durable change on that disk, in
/// microseconds.
pub fn fdatasyncs(dir: &Path, samples: usize) -> Result<hdrhistogram::Histogram<u64>, String> {
    let err = |e: std::io::Error| format!("fsync floor in {}: {e}", dir.display());
    let tmp = tempfile::tempdir_in(dir).map_err(err)?;
    let record = [0x5au8; 64];
    let file = preallocated(&tmp.path().join("floor"), (samples * record.len()) as u64).map_err(err)?;
    let mut hist = hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds");
    for i in 0..samples {
        let t = Instant::now();
        file.write_all_at(&record, (i * record.len()) as u64).map_err(err)?;
        file.sync_data().map_err(err)?;
        hist.saturating_record(t.elapsed().as_micros() as u64);
    }
    Ok(hist)
}

/// A new file at `path` of `bytes` written zeros (and a page more),
/// synced: records written over them later land inside the file's size
/// on blocks it has, so each `fdatasync` writes the data and neither a
/// new size nor an allocation, as in the journal's segments, which are
/// extended ahead of their records in the same way.
pub fn preallocated(path: &Path, bytes: u64) -> std::io::Result<std::fs::File> {
    let file = std::fs::File::options().create_new(true).write(true).open(path)?;
    file.write_all_at(&vec![0; bytes as usize + 4096], 0)?;
    file.sync_all()?;
    Ok(file)
}
