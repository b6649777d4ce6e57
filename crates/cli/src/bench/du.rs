//! `bench du`: seed 004's `du` (GFS2 with its DLM took 300 s for 2 million
//! files; 10–20 s without it). Builds a tree of N files, 10,000 per
//! directory, through a server (50 creators on their own connections;
//! progress on stderr), then walks it as `du -s` does, through one
//! client: each directory listed with its entries' attributes
//! (readdirplus), a page per round trip, the space its files and
//! directories take on the server's disk summed as `du` sums it
//! (`st_blocks`, a file of many names counted once). The walk is what is
//! timed.

use std::time::Instant;

use interlock_client::meta::{Cred, Entry, FileType, Ino, ROOT};
use interlock_client::{Client, ClientOptions};
use serde_json::{Map, Value, json};

use super::Report;

#[derive(clap::Args)]
pub struct Args {
    /// Files in the tree, e.g. 2M.
    #[arg(long, default_value = "200k", value_parser = super::parse_size)]
    files: u64,
    /// Measure this server (HOST:PORT) instead of starting one.
    #[arg(long, value_parser = crate::args::server)]
    server: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

const PER_DIR: u64 = 10_000;
const BUILDERS: u64 = 50;

const COLUMNS: &[(&str, &str)] = &[
    ("variant", "variant"),
    ("files", "files"),
    ("seconds", "seconds"),
    ("files/s", "files_per_sec"),
    ("MB", "megabytes"),
];

pub fn run(args: Args) -> Result<(), String> {
    let (addr, options, _own) = super::netbench::server_addr(&args.server, Default::default())?;
    let mut report = Report::new(args.json, COLUMNS);
    let rt = crate::remote::runtime();
    rt.block_on(async {
        let (_, top) = build(&addr, &options, args.files, !args.json).await?;
        let client = Client::connect(&addr, options.clone()).await.map_err(|e| e.to_string())?;
        let start = Instant::now();
        let (files, bytes) = walk(&client, top).await?;
        let secs = start.elapsed().as_secs_f64();
        let _ = client.bye().await;
        if files != args.files {
            return Err(format!("the walk found {files} files of {}", args.files));
        }
        let mut r = Map::new();
        r.insert("scenario".into(), json!("du"));
        r.insert("variant".into(), json!("net"));
        r.insert("files".into(), json!(files));
        r.insert("seconds".into(), json!(secs));
        r.insert("files_per_sec".into(), json!(files as f64 / secs.max(1e-9)));
        r.insert("megabytes".into(), Value::from(bytes as f64 / 1e6));
        report.row(r);
        Ok(())
    })
}

/// Makes `du.TIME/dK/file.I` for I < `files`; returns the top
/// directory's name and inode.
pub(super) async fn build(
    addr: &str,
    options: &ClientOptions,
    files: u64,
    progress: bool,
) -> Result<(String, Ino), String> {
    let root = Cred::root();
    let c = Client::connect(addr, options.clone()).await.map_err(|e| e.to_string())?;
    let top_name = format!(
        "du.{}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );
    let top =
        c.create(&root, ROOT, top_name.as_bytes(), FileType::Directory, 0o755, b"").await.map_err(|e| e.to_string())?;
    let mut dirs = Vec::new();
    for d in 0..files.div_ceil(PER_DIR) {
        let a = c.create(&root, top.ino, format!("d{d}").as_bytes(), FileType::Directory, 0o755, b"").await;
        dirs.push(a.map_err(|e| e.to_string())?.ino);
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ticker = progress.then(|| {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                eprint!("\r  built {} of {files} files ", done.load(std::sync::atomic::Ordering::Relaxed));
            }
        })
    });
    let mut tasks = Vec::new();
    for b in 0..BUILDERS {
        let client = Client::connect(addr, options.clone()).await.map_err(|e| e.to_string())?;
        let (dirs, done, root) = (dirs.clone(), done.clone(), root.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = b;
            while i < files {
                let name = format!("file.{i}");
                client
                    .create(&root, dirs[(i / PER_DIR) as usize], name.as_bytes(), FileType::Regular, 0o644, b"")
                    .await
                    .map_err(|e| format!("create {name}: {e}"))?;
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                i += BUILDERS;
            }
            let _ = client.bye().await;
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    if let Some(t) = ticker {
        t.abort();
        eprintln!();
    }
    let _ = c.bye().await;
    Ok((top_name, top.ino))
}

/// `du -s`: the files under `top`, and the bytes that they and the
/// directories under it take (`top` itself not counted).
async fn walk(c: &Client, top: Ino) -> Result<(u64, u64), String> {
    let root = Cred::root();
    let mut usage = Usage::default();
    let mut todo = vec![top];
    while let Some(dir) = todo.pop() {
        let mut cookie = 0;
        loop {
            let (page, end) = c.readdir(&root, dir, cookie, 4096, true).await.map_err(|e| e.to_string())?;
            // The listing holds no `.` or `..` (the mount adds those).
            todo.extend(page.iter().filter_map(|e| usage.add(e)));
            match page.last() {
                Some(last) if !end => cookie = last.cookie,
                _ => break,
            }
        }
    }
    Ok((usage.files, usage.bytes))
}

/// What `du` sums: 512-byte blocks (`st_blocks`) of every file and
/// directory, an inode of several names once (as GNU `du` does), and the
/// files counted beside. O(1) expected per entry.
#[derive(Default)]
struct Usage {
    files: u64,
    bytes: u64,
    /// Files of more than one name already counted.
    linked: std::collections::HashSet<Ino>,
}

impl Usage {
    /// Counts an entry of a listing with its attributes; a directory
    /// comes back, to be walked. An entry removed while it was listed
    /// (no attributes) counts for nothing.
    fn add(&mut self, e: &Entry) -> Option<Ino> {
        let dir = e.kind == FileType::Directory;
        if let Some(a) = &e.attr
            && (dir || a.nlink < 2 || self.linked.insert(e.ino))
        {
            self.bytes += a.blocks * 512;
            self.files += u64::from(!dir);
        }
        dir.then_some(e.ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_client::meta::Attr;

    fn entry(ino: Ino, kind: FileType, nlink: u32, blocks: u64, listed: bool) -> Entry {
        let attr = Attr {
            ino,
            kind,
            perm: 0o644,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            // A sparse file: du goes by blocks, not by size.
            size: 1 << 30,
            blocks,
            atime: 0,
            mtime: 0,
            ctime: 0,
            acl: false,
        };
        Entry { name: format!("e{ino}").into_bytes(), ino, kind, cookie: ino, attr: listed.then_some(attr) }
    }

    #[test]
    fn usage_sums_blocks_counts_a_linked_file_once_and_returns_directories() {
        let mut u = Usage::default();
        let page = [
            entry(2, FileType::Regular, 1, 8, true),
            entry(3, FileType::Regular, 2, 16, true),
            entry(3, FileType::Regular, 2, 16, true),
            entry(4, FileType::Directory, 2, 0, true),
            entry(5, FileType::Regular, 1, 64, false),
            entry(6, FileType::Symlink, 1, 0, true),
        ];
        let dirs: Vec<Ino> = page.iter().filter_map(|e| u.add(e)).collect();
        assert_eq!(dirs, [4]);
        assert_eq!((u.files, u.bytes), (3, (8 + 16) * 512));
    }
}
