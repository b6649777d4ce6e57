//! The Linux kernel's own locks on the benchmark shapes: `fcntl` on a
//! tmpfs file, as in `shared/anchors/flocks_scale.c`. Process-owned POSIX
//! locks for one owner; OFD locks (one `open` per owner) for many.

use std::ffi::CString;

use super::flocks::Variant;
use super::timed;

/// A file in /dev/shm, removed on drop, with its descriptors.
struct TmpFile {
    path: CString,
    fds: Vec<libc::c_int>,
}

impl TmpFile {
    fn new() -> Result<TmpFile, String> {
        let path = format!("/dev/shm/interlock-bench-{}", std::process::id());
        let path = CString::new(path).expect("no NUL");
        Ok(TmpFile { path, fds: Vec::new() })
    }

    fn open(&mut self) -> Result<libc::c_int, String> {
        // SAFETY: a valid C string and flags.
        let fd = unsafe { libc::open(self.path.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            return Err(format!("open {:?}: {}", self.path, std::io::Error::last_os_error()));
        }
        self.fds.push(fd);
        Ok(fd)
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        for &fd in &self.fds {
            // SAFETY: our own descriptors.
            unsafe { libc::close(fd) };
        }
        // SAFETY: a valid C string.
        unsafe { libc::unlink(self.path.as_ptr()) };
    }
}

fn setlk(fd: libc::c_int, cmd: libc::c_int, ty: i32, start: u64, len: u64) -> Result<libc::flock, String> {
    // SAFETY: a zeroed `struct flock` is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: the lock commands take a pointer to a `struct flock`.
    if unsafe { libc::fcntl(fd, cmd, &mut fl) } != 0 {
        return Err(format!("fcntl: {}", std::io::Error::last_os_error()));
    }
    Ok(fl)
}

/// Raises the open-file limit to hold `n` descriptors.
fn allow_fds(n: u64) -> Result<(), String> {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        if lim.rlim_cur >= n {
            return Ok(());
        }
        lim.rlim_cur = n.min(lim.rlim_max);
        if lim.rlim_cur < n {
            lim.rlim_max = n;
            lim.rlim_cur = n;
        }
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return Err(format!("cannot raise the open-file limit to {n} for the kernel same-range run"));
        }
    }
    Ok(())
}

/// Seconds the kernel takes for one run of `variant` with `n`.
pub fn flocks(variant: Variant, n: u64) -> Result<f64, String> {
    let mut file = TmpFile::new()?;
    let (rd, wr, un) = (libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK);
    let fd = file.open()?;
    let mut result = Ok(());
    let seconds = match variant {
        Variant::Plain => timed(|| {
            result = (0..n).try_for_each(|i| setlk(fd, libc::F_SETLK, wr, 3 * i, 1).map(drop));
        }),
        Variant::Split => timed(|| {
            result = (0..n).try_for_each(|i| {
                setlk(fd, libc::F_SETLK, rd, 10 * i, 10)?;
                setlk(fd, libc::F_SETLK, wr, 10 * i + 4, 2).map(drop)
            });
        }),
        Variant::Merge => timed(|| {
            result = (0..n)
                .try_for_each(|i| setlk(fd, libc::F_SETLK, wr, 2 * i, 1).map(drop))
                .and_then(|()| setlk(fd, libc::F_SETLK, wr, 0, 2 * n).map(drop));
        }),
        Variant::SameRange => {
            allow_fds(n + 64)?;
            let mut fds = Vec::with_capacity(n as usize);
            for _ in 0..n {
                fds.push(file.open()?);
            }
            timed(|| {
                result = fds
                    .iter()
                    .try_for_each(|&f| setlk(f, libc::F_OFD_SETLK, rd, 0, 100).map(drop))
                    .and_then(|()| {
                        let fl = setlk(fd, libc::F_OFD_GETLK, wr, 0, 100)?;
                        if fl.l_type == un as libc::c_short { Err("kernel saw no readers".into()) } else { Ok(()) }
                    })
                    .and_then(|()| fds.iter().try_for_each(|&f| setlk(f, libc::F_OFD_SETLK, un, 0, 100).map(drop)));
            })
        }
    };
    result.map_err(|e| format!("kernel {variant:?} n={n}: {e}"))?;
    Ok(seconds)
}

/// The seed 002 loop on the kernel: `p` threads, each its own open file
/// description (an OFD owner), blocking write lock on byte 0, hold, unlock,
/// sleep, for `d` seconds. Returns the grants per owner and the seconds.
pub fn blocking(p: usize, hold: std::time::Duration, d: f64) -> Result<(Vec<u64>, f64), String> {
    allow_fds(p as u64 + 64)?;
    let mut file = TmpFile::new()?;
    let fds: Vec<libc::c_int> = (0..p).map(|_| file.open()).collect::<Result<_, _>>()?;
    let start = std::time::Instant::now();
    let threads: Vec<_> = fds
        .into_iter()
        .map(|fd| {
            std::thread::spawn(move || -> Result<u64, String> {
                let mut n = 0;
                while start.elapsed().as_secs_f64() < d {
                    setlk(fd, libc::F_OFD_SETLKW, libc::F_WRLCK, 0, 1)?;
                    n += 1;
                    std::thread::sleep(hold);
                    setlk(fd, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 1)?;
                    std::thread::sleep(hold);
                }
                Ok(n)
            })
        })
        .collect();
    let counts: Vec<u64> = threads
        .into_iter()
        .map(|t| t.join().map_err(|_| "kernel thread panicked".to_string())?)
        .collect::<Result<_, _>>()?;
    Ok((counts, start.elapsed().as_secs_f64()))
}
