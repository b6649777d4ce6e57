//! `interlock bench mount`: the file system through the mount, beside
//! the floor any FUSE file system pays here (`bindfs` over tmpfs, a
//! passthrough) and tmpfs itself: the mdtest shape (T threads create,
//! stat and unlink files in one shared directory), ctdb's `ping_pong` (1
//! process; 2 processes, on two mounts for interlock), `du` over a tree
//! of files on a cold mount, sequential write, read and copy
//! (`copy_file_range`, as `cp` copies) of one large file, and many
//! threads writing one file at distinct offsets with `O_DIRECT` (MPI-IO's
//! shared file, a database's pages). Needs root and /dev/fuse; bindfs and ping_pong where installed
//! (rows without them are left out, with a note).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::mdtest::PHASES;
use super::{Report, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// Files per mdtest run.
    #[arg(long, default_value = "20k", value_parser = parse_size)]
    files: u64,
    /// Thread counts for the mdtest shape, comma-separated.
    #[arg(long, default_value = "1,8", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Each mdtest thread in a directory of its own (mdtest's `-u`): how
    /// a file system scales once the kernel's per-directory lock, which
    /// makes creators in one directory take turns, is out of the way.
    #[arg(long)]
    unique_dirs: bool,
    /// Files in the du tree.
    #[arg(long, default_value = "100k", value_parser = parse_size)]
    du_files: u64,
    /// MiB to write and read sequentially.
    #[arg(long, default_value = "1024")]
    mib: u64,
    /// Threads writing 4 KiB blocks of one file, with `O_DIRECT`, each at
    /// offsets of its own (32 MiB in all).
    #[arg(long, default_value = "16", value_parser = clap::value_parser!(u64).range(1..=1024))]
    writers: u64,
    /// Seconds each ping_pong run lasts; at least 2 (it prints its rate
    /// once a second, from the second on).
    #[arg(long, default_value = "4", value_parser = clap::value_parser!(u64).range(2..))]
    seconds: u64,
    /// ctdb's ping_pong (default: $INTERLOCK_PING_PONG, else
    /// /usr/bin/ping_pong).
    #[arg(long)]
    ping_pong: Option<PathBuf>,
    /// Only these variants, comma-separated: interlock, interlock-nofsync
    /// (the server in its unsafe mode, `--unsafe-no-fsync`: what durability
    /// costs), bindfs, tmpfs, floor (the most a mount could do here that
    /// asks a server, caches nothing the kernel does not and acknowledges
    /// a change once it is durable: a loopback round trip and an fsync
    /// measured now, added to the FUSE cost seen in this run's bindfs and
    /// tmpfs rows; see docs/architecture.md).
    #[arg(long, default_value = "interlock,interlock-nofsync,bindfs,tmpfs,floor", value_delimiter = ',')]
    variants: Vec<String>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

const COLUMNS: &[(&str, &str)] = &[
    ("variant", "variant"),
    ("test", "test"),
    ("threads", "threads"),
    ("ops/s (MB/s)", "ops_per_sec"),
    ("seconds", "seconds"),
    ("cpu µs/op", "cpu_us_per_op"),
];

fn row(variant: &str, test: &str, threads: usize, rate: f64, seconds: f64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("scenario".into(), json!("mount"));
    m.insert("variant".into(), json!(variant));
    m.insert("test".into(), json!(test));
    m.insert("threads".into(), json!(threads));
    m.insert("ops_per_sec".into(), json!(rate));
    m.insert("seconds".into(), json!(seconds));
    m
}

/// A FUSE file system process mounted on a directory; unmounted on drop.
struct Mounted {
    child: Child,
    path: PathBuf,
}

impl Mounted {
    fn start(mut cmd: Command, path: &Path) -> Result<Mounted, String> {
        let child = cmd.stdout(Stdio::null()).spawn().map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
        let mut m = Mounted { child, path: path.to_path_buf() };
        let until = Instant::now() + Duration::from_secs(30);
        while !interlock_fs::is_mounted(path) {
            if let Ok(Some(s)) = m.child.try_wait() {
                return Err(format!("{cmd:?} ended ({s}) before mounting"));
            }
            if Instant::now() > until {
                return Err(format!("{} was not mounted in time", path.display()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(m)
    }

    fn interlock(addr: &str, path: &Path) -> Result<Mounted, String> {
        let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
        cmd.args(["mount", "--server", addr]).arg(path).env("INTERLOCK_LOG", "warn");
        Mounted::start(cmd, path)
    }
}

impl Mounted {
    fn bindfs(src: &Path, at: &Path) -> Result<Mounted, String> {
        let mut cmd = Command::new("bindfs");
        cmd.arg("-f").arg(src).arg(at);
        Mounted::start(cmd, at)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = interlock_fs::unmount(&self.path);
        let until = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dir_in(base: &Path, name: &str) -> Result<PathBuf, String> {
    let p = base.join(name);
    std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    std::fs::canonicalize(&p).map_err(|e| e.to_string())
}

pub fn run(args: Args) -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() || !nix::unistd::Uid::effective().is_root() {
        return Err("bench mount needs root and /dev/fuse".into());
    }
    let mut report = Report::new(args.json, COLUMNS);
    // Our mount points and bindfs's source live on tmpfs; the server's
    // data on the project's disk.
    let shm = tempfile::tempdir_in("/dev/shm").map_err(|e| format!("/dev/shm: {e}"))?;
    let pp = args
        .ping_pong
        .clone()
        .or_else(|| std::env::var_os("INTERLOCK_PING_PONG").map(PathBuf::from))
        .unwrap_or_else(|| "/usr/bin/ping_pong".into());
    let pp = pp.exists().then_some(pp);
    if pp.is_none() {
        eprintln!("note: no ping_pong (Debian package ctdb, or --ping-pong): its rows are left out");
    }
    // The mdtest seconds of bindfs and tmpfs, for the floor.
    let (mut bindfs, mut tmpfs) = (None, None);
    for variant in &args.variants {
        match variant.as_str() {
            "interlock" | "interlock-nofsync" => {
                let no_fsync = variant == "interlock-nofsync";
                let (addr, _, _own) =
                    super::netbench::server_addr(&None, super::netbench::Own { no_fsync, ..Default::default() })?;
                let (a, b) = (dir_in(shm.path(), "a")?, dir_in(shm.path(), "b")?);
                let ma = Mounted::interlock(&addr, &a)?;
                let mb = Mounted::interlock(&addr, &b)?;
                suite(&args, &mut report, variant, &a, Some(&b), pp.as_deref())?;
                drop(mb);
                drop(ma);
                // du on a cold mount: the tree is made through the client,
                // then a fresh mount walks it.
                let (name, _) = crate::remote::runtime().block_on(super::du::build(
                    &addr,
                    &Default::default(),
                    args.du_files,
                    !args.json,
                ))?;
                let cold = dir_in(shm.path(), "cold")?;
                let m = Mounted::interlock(&addr, &cold)?;
                report.row(du(&cold.join(name), variant, args.du_files)?);
                drop(m);
            }
            "bindfs" => {
                if Command::new("bindfs").arg("--version").output().is_err() {
                    eprintln!("note: no bindfs (Debian package bindfs): its rows are left out");
                    continue;
                }
                let (src, at) = (dir_in(shm.path(), "bsrc")?, dir_in(shm.path(), "bmnt")?);
                let m = Mounted::bindfs(&src, &at)?;
                bindfs = Some(suite(&args, &mut report, "bindfs", &at, None, pp.as_deref())?);
                drop(m);
                // du on a cold mount of a tree made underneath.
                tree(&src.join("du"), args.du_files)?;
                let m = Mounted::bindfs(&src, &at)?;
                report.row(du(&at.join("du"), "bindfs", args.du_files)?);
                drop(m);
            }
            "tmpfs" => {
                let d = dir_in(shm.path(), "t")?;
                tmpfs = Some(suite(&args, &mut report, "tmpfs", &d, None, pp.as_deref())?);
                tree(&d.join("du"), args.du_files)?;
                report.row(du(&d.join("du"), "tmpfs", args.du_files)?);
            }
            "floor" => floor(&args, &mut report, bindfs.as_deref().zip(tmpfs.as_deref()))?,
            other => {
                return Err(format!("unknown variant {other:?} (interlock, interlock-nofsync, bindfs, tmpfs, floor)"));
            }
        }
    }
    Ok(())
}

/// Seconds of each mdtest phase (create, stat, unlink) at each thread
/// count.
type Mdtest = Vec<(usize, [f64; 3])>;

/// A run's mdtest seconds as [`Mdtest`] holds them.
type MdtestRows<'a> = &'a [(usize, [f64; 3])];

/// mdtest, ping_pong, write, read and copy on `dir` (and `other`, a second
/// mount of the same tree, for two-node ping_pong); gives mdtest's
/// seconds.
fn suite(
    args: &Args,
    report: &mut Report,
    variant: &str,
    dir: &Path,
    other: Option<&Path>,
    pp: Option<&Path>,
) -> Result<Mdtest, String> {
    let mut mdtest = Vec::new();
    for &t in &args.threads {
        let d = dir.join(format!("mdtest.{t}"));
        std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        let took = super::mdtest::on_dir(&d, t, args.files, args.unique_dirs)?;
        for (test, took) in PHASES.iter().zip(took) {
            let mut r = row(variant, test, t, args.files as f64 / took.secs.max(1e-9), took.secs);
            r.insert("dirs".into(), json!(if args.unique_dirs { "unique" } else { "shared" }));
            // The machine's: the caller, the kernel's FUSE, the mount's
            // process and (for ours) the server.
            r.insert("cpu_us_per_op".into(), json!(took.cpu_us_per(args.files)));
            report.row(r);
        }
        mdtest.push((t, took.map(|took| took.secs)));
    }
    if let Some(pp) = pp {
        let file = dir.join("pingpong");
        std::fs::File::create(&file).map_err(|e| e.to_string())?;
        let one = ping_pong(pp, &[&file], args.seconds)?;
        report.row(row(variant, "pingpong1", 1, one, args.seconds as f64));
        let second = other.map_or(file.clone(), |o| o.join("pingpong"));
        let two = ping_pong(pp, &[&file, &second], args.seconds)?;
        report.row(row(variant, "pingpong2", 2, two, args.seconds as f64));
    }
    let (w, r, c) = sequential(&dir.join("big"), args.mib)?;
    let mb = (args.mib << 20) as f64 / 1e6;
    report.row(row(variant, "write", 1, mb / w, w));
    report.row(row(variant, "read", 1, mb / r, r));
    report.row(row(variant, "copy", 1, mb / c, c));
    let writers = args.writers as usize;
    let took = shared_write(&dir.join("shared"), writers)?;
    report.row(row(variant, "sharedwrite", writers, SHARED_BLOCKS as f64 / took, took));
    Ok(mdtest)
}

/// The 4 KiB blocks `shared_write` writes.
const SHARED_BLOCKS: u64 = 8192;

/// Seconds for `writers` threads to write [`SHARED_BLOCKS`] blocks of 4
/// KiB to one file of that size, opened `O_DIRECT`, thread `i` the blocks
/// `i`, `i + writers`, …, then `fsync`: writes that do not extend the
/// file, which a file system may run at once.
fn shared_write(path: &Path, writers: usize) -> Result<f64, String> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const BLOCK: usize = 4096;
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    std::fs::File::create(path).and_then(|f| f.set_len(SHARED_BLOCKS * BLOCK as u64)).map_err(err)?;
    let file = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).map_err(err)?;
    // `O_DIRECT` wants the buffer aligned to the block.
    let buf = vec![0x5au8; 2 * BLOCK];
    let at = buf.as_ptr().align_offset(BLOCK);
    let block = &buf[at..at + BLOCK];
    let start = Instant::now();
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..writers)
            .map(|i| {
                let file = &file;
                s.spawn(move || {
                    (i as u64..SHARED_BLOCKS)
                        .step_by(writers)
                        .try_for_each(|b| file.write_all_at(block, b * BLOCK as u64))
                })
            })
            .collect();
        threads.into_iter().try_for_each(|t| t.join().expect("a writer panicked"))
    })
    .map_err(err)?;
    file.sync_all().map_err(err)?;
    let took = start.elapsed().as_secs_f64();
    std::fs::remove_file(path).map_err(err)?;
    Ok(took)
}

/// Round trips to the server that one mdtest operation costs a mount
/// that caches nothing the kernel does not, in `PHASES` order, as
/// `strace` of the mount shows them. create: `GETATTR` of the directory
/// (the kernel drops a directory's attributes at every change in it, and
/// `default_permissions` needs them for the next path walk), `LOOKUP`,
/// `CREATE`; stat: `LOOKUP`; unlink: `GETATTR`, `LOOKUP`, `UNLINK`.
const ROUND_TRIPS: [f64; 3] = [3.0, 1.0, 3.0];

/// Whether the phase changes the namespace (then a durable write).
const DURABLE: [bool; 3] = [true, false, true];

/// The floor under the mount's mdtest cells on this machine: what no
/// mount that asks a server over loopback, caches nothing the kernel does
/// not, and acknowledges a change only once it is durable could beat.
/// Its parts are measured now: a loopback round trip and a record's
/// `fdatasync` (rows `roundtrip` and `fsync`), and the kernel's FUSE
/// requests themselves, as bindfs's time per operation less tmpfs's.
///
/// - T = 1: each operation waits for all of it in turn: FUSE, its round
///   trips ([`ROUND_TRIPS`]) and, for a change, one fsync.
/// - T > 1, create and unlink: the kernel holds the directory's `i_rwsem`
///   across the permission check on the directory (a `GETATTR`, as some
///   other thread's change has always just dropped its attributes),
///   `LOOKUP` and `CREATE` (`UNLINK`), so those round trips and the fsync
///   follow one another for every file, whatever T (the FUSE requests
///   themselves are left out: a lower floor). Stats run in parallel, and
///   so does everything with `--unique-dirs`: no row.
///
/// The stat row counts a round trip for every stat. Files made within
/// `entry_timeout` (1 s) before the stats begin are still in the kernel's
/// cache on every FUSE file system and need none: with so few `--files`
/// that their creates take about a second, the stat rows of every
/// variant, this one included, say little.
fn floor(args: &Args, report: &mut Report, fuse: Option<(MdtestRows, MdtestRows)>) -> Result<(), String> {
    // Medians in whole microseconds, at least one: an `fdatasync` on a
    // tmpfs (`TMPDIR=/dev/shm`) takes less, and a rate of 1/0 is no row.
    let median = |h: hdrhistogram::Histogram<u64>| h.value_at_quantile(0.5).max(1) as f64 / 1e6;
    let start = Instant::now();
    let rtt = median(super::floor::round_trips(Duration::ZERO, 5_000)?);
    report.row(row("floor", "roundtrip", 1, 1.0 / rtt, start.elapsed().as_secs_f64()));
    let start = Instant::now();
    let sync = median(super::floor::fdatasyncs(&std::env::temp_dir(), 500)?);
    report.row(row("floor", "fsync", 1, 1.0 / sync, start.elapsed().as_secs_f64()));
    let Some((bindfs, tmpfs)) = fuse else {
        eprintln!("note: the floor's mdtest rows need the bindfs and tmpfs variants before it in the same run");
        return Ok(());
    };
    let files = args.files as f64;
    for (&(t, b), &(_, k)) in bindfs.iter().zip(tmpfs) {
        for (p, test) in PHASES.iter().enumerate() {
            let durable = if DURABLE[p] { sync } else { 0.0 };
            let per_op = if t == 1 {
                (b[p] - k[p]).max(0.0) / files + ROUND_TRIPS[p] * rtt + durable
            } else if DURABLE[p] && !args.unique_dirs {
                ROUND_TRIPS[p] * rtt + durable
            } else {
                continue;
            };
            report.row(row("floor", test, t, 1.0 / per_op, per_op * files));
        }
    }
    Ok(())
}

/// `ping_pong FILE 3` in one process per file, at once, for `seconds`:
/// the median of the locks/s each reported, summed over the processes.
fn ping_pong(pp: &Path, files: &[&Path], seconds: u64) -> Result<f64, String> {
    let n = files.len() + 1;
    let children: Vec<Child> = files
        .iter()
        .map(|f| {
            Command::new("timeout")
                .args(["-s", "INT", &seconds.to_string()])
                .arg(pp)
                .arg(f)
                .arg(n.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("ping_pong: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut total = 0.0;
    for c in children {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut rates: Vec<f64> = text
            .split(['\r', '\n'])
            .filter_map(|l| l.trim().strip_suffix("locks/sec").and_then(|n| n.trim().parse().ok()))
            .collect();
        // The first figure covers the start-up.
        if rates.len() > 1 {
            rates.remove(0);
        }
        rates.sort_by(f64::total_cmp);
        total += rates.get(rates.len() / 2).copied().ok_or_else(|| format!("ping_pong printed no rate: {text}"))?;
    }
    Ok(total)
}

/// Seconds to write `mib` MiB to `path` in 1 MiB writes (then fsync),
/// to read it back, and to copy it as `cp` does (then fsync the copy).
fn sequential(path: &Path, mib: u64) -> Result<(f64, f64, f64), String> {
    use std::io::{Read, Write};
    let chunk = vec![0x5au8; 1 << 20];
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let start = Instant::now();
    let mut f = std::fs::File::create(path).map_err(err)?;
    for _ in 0..mib {
        f.write_all(&chunk).map_err(err)?;
    }
    f.sync_all().map_err(err)?;
    drop(f);
    let w = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut f = std::fs::File::open(path).map_err(err)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(err)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let r = start.elapsed().as_secs_f64();
    if total != mib << 20 {
        return Err(format!("read {total} bytes of {}", mib << 20));
    }
    let copy = path.with_extension("copy");
    let start = Instant::now();
    let copied = copy_file(path, &copy).map_err(err)?;
    let c = start.elapsed().as_secs_f64();
    std::fs::remove_file(path).map_err(err)?;
    std::fs::remove_file(&copy).map_err(err)?;
    if copied != mib << 20 {
        return Err(format!("copied {copied} bytes of {}", mib << 20));
    }
    Ok((w, r, c))
}

/// Copies `from` to a new file `to` as `cp` does: `copy_file_range` until
/// it has all (a file system may copy less a call), reading and writing
/// where the file system has no such copy; then makes the copy durable.
/// How many bytes.
fn copy_file(from: &Path, to: &Path) -> std::io::Result<u64> {
    let (src, dst) = (std::fs::File::open(from)?, std::fs::File::create(to)?);
    let mut total = 0u64;
    loop {
        match nix::fcntl::copy_file_range(&src, None, &dst, None, 1 << 30) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EXDEV | nix::errno::Errno::ENOSYS) => {
                total += std::io::copy(&mut &src, &mut &dst)?;
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    dst.sync_all()?;
    Ok(total)
}

/// Makes `files` empty files under `top`, 1,000 a directory (as
/// `bench du` does at the server).
fn tree(top: &Path, files: u64) -> Result<(), String> {
    for i in 0..files {
        let d = top.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        }
        std::fs::File::create(d.join(format!("file.{i}"))).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `du -s` of `top`, which holds `files` files.
fn du(top: &Path, variant: &str, files: u64) -> Result<Map<String, Value>, String> {
    let start = Instant::now();
    let out = Command::new("du").arg("-s").arg(top).output().map_err(|e| format!("du: {e}"))?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!("du {}: {}", top.display(), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(row(variant, "du", 1, files as f64 / secs.max(1e-9), secs))
}
