//! The checkpoint: an image of the namespace on disk, and the journal
//! index replay starts from.
//!
//! A checkpoint is taken while operations go on. It first waits for the
//! changes between their record and their apply to finish, holding every
//! name stripe for that moment ([`Stripes::quiesce`](crate::locks)), and
//! notes the log position `start`: every record below it is applied.
//! Then, with the stripes released, it walks the inode table and the
//! entries' table (in no order) and writes what it finds. Changes made
//! during the walk may or may not be in the image, object by object, and
//! an entry may be met twice while the table grows; since every record
//! is a blind write (see `mutation`), replaying every record from
//! `start`, in order, over the image ends in the state those records
//! describe, and [`Namespace::rebuild_counts`] recounts the links.
//!
//! The file (`meta.ckpt`) is a sequence of frames, each a little-endian
//! `u32` length and a postcard [`Item`]: a header, the namespace's
//! identity (version 3), the inodes, the entries, the replay cache's
//! clients (version 2: see `replies`), an end that counts the inodes and
//! entries; then the CRC-32C of every byte before it. It is written to a temporary file, synced, renamed over the
//! old one and the directory synced, so a crash leaves the old checkpoint
//! or the new one, never a mix. Costs: O(n) to write, O(n log n) to load
//! (the entries' listing order is built from their keys sorted), for n
//! inodes and entries (loading decodes on one thread and inserts on
//! another); the pause before the walk is O(stripes), not O(n).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use interlock_journal::Error;
use serde::{Deserialize, Serialize};

use crate::access::Owner;
use crate::inode::{Inode, Meta, with_flags};
use crate::namespace::Namespace;
use crate::replies::Recent;
use crate::types::{FileType, Ino, Nanos};

/// The checkpoint's file name in the store's directory.
pub const FILE: &str = "meta.ckpt";
const MAGIC: &[u8; 8] = b"ILNSCKP1";
/// Version 2 (session 36) added the replay cache's items; version 1
/// images, which have none, are read as they are. Version 3 (session 44)
/// added the identity; an older image has none, and is given one
/// ([`Store::open`](crate::Store::open) checkpoints it at once).
const VERSION: u32 = 3;
/// Items handed from the reading thread to the inserting one at a time.
const BATCH: usize = 4096;

#[derive(Serialize, Deserialize)]
enum Item {
    Header {
        version: u32,
        seed: u64,
        start: u64,
        next_ino: u64,
    },
    Inode(InodeImage),
    Entry {
        parent: Ino,
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        ino: Ino,
    },
    End {
        inodes: u64,
        entries: u64,
    },
    /// A client's changes it may ask about again.
    Replies {
        origin: u64,
        recent: Recent,
    },
    /// The namespace's identity (see [`Store::id`](crate::Store::id)),
    /// right after the header.
    Identity {
        id: u64,
    },
}

/// An inode as the checkpoint holds it: link and entry counts are left
/// out (recounted on load).
#[derive(Serialize, Deserialize)]
struct InodeImage {
    ino: Ino,
    kind: FileType,
    /// The mode's bits, and from session 58 its attribute flags above
    /// them (see `inode::with_flags`): an older image has none there,
    /// and reads as an inode without flags.
    perm: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    size: u64,
    atime: Nanos,
    mtime: Nanos,
    ctime: Nanos,
    /// 0: named (or a directory); 1: an orphan; 2: an orphan a link may
    /// name (a linkable `O_TMPFILE`). A `bool` until session 31, which
    /// postcard writes as the byte 0 or 1: older checkpoints read alike.
    orphan: u8,
    xattrs: Vec<(serde_bytes::ByteBuf, serde_bytes::ByteBuf)>,
    #[serde(with = "serde_bytes")]
    target: Vec<u8>,
}

impl InodeImage {
    fn of(i: &Inode) -> InodeImage {
        let o = i.owner();
        let (mtime, ctime) = i.times();
        let m = i.meta.lock();
        InodeImage {
            ino: i.ino,
            kind: i.kind,
            perm: with_flags(o.perm, i.flags()),
            uid: o.uid,
            gid: o.gid,
            rdev: m.rdev(),
            size: i.size.load(Relaxed),
            atime: m.atime,
            mtime,
            ctime,
            orphan: u8::from(i.orphan.load(Relaxed)) + u8::from(i.linkable.load(Relaxed)),
            xattrs: m.xattrs().iter().map(|(n, v)| (n.to_vec().into(), v.to_vec().into())).collect(),
            target: m.target().to_vec(),
        }
    }

    fn into_inode(self) -> Inode {
        let mut meta = Meta::new(self.atime, &self.target, self.rdev);
        if !self.xattrs.is_empty() {
            *meta.xattrs_mut() =
                self.xattrs.into_iter().map(|(n, v)| (n.into_vec().into(), v.into_vec().into())).collect();
        }
        let owner = Owner { kind: self.kind, perm: self.perm, uid: self.uid, gid: self.gid };
        let i = Inode::new(self.ino, owner, meta, self.mtime, self.ino);
        i.size.store(self.size, Relaxed);
        i.set_times(None, self.ctime);
        i.orphan.store(self.orphan > 0, Relaxed);
        i.linkable.store(self.orphan > 1, Relaxed);
        i
    }
}

/// What a checkpoint wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// Replay starts here: every record below it is in the image.
    pub start: u64,
    pub inodes: u64,
    pub entries: u64,
    pub bytes: u64,
    /// How long changes were held back while the start was chosen.
    pub pause: std::time::Duration,
}

/// A writer that counts and checksums what passes.
struct Summing<W> {
    inner: W,
    crc: u32,
    bytes: u64,
}

impl<W: Write> Summing<W> {
    fn frame(&mut self, item: &Item, buf: &mut Vec<u8>) -> std::io::Result<()> {
        buf.clear();
        let body = postcard::to_extend(item, std::mem::take(buf)).expect("images serialize");
        self.put(&(body.len() as u32).to_le_bytes())?;
        self.put(&body)?;
        *buf = body;
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.bytes += bytes.len() as u64;
        self.inner.write_all(bytes)
    }
}

/// Writes `ns`'s image to `dir`, replay to start at `start` (the caller
/// chose it with every change quiesced, see the module docs). Operations
/// may go on meanwhile. `durable` is called after the walk and before the
/// image replaces the old one: it returns once every record appended so
/// far is durable. On an error the partial image is removed: left, it
/// would hold the disk's room until the next checkpoint (on a full disk,
/// all of it).
pub fn write(
    ns: &Namespace,
    id: u64,
    start: u64,
    dir: &Path,
    durable: impl FnOnce() -> Result<(), Error>,
) -> Result<Written, Error> {
    let path = dir.join(FILE);
    let tmp = dir.join(format!("{FILE}.tmp"));
    let written = image(ns, id, start, &tmp).and_then(|w| {
        durable()?;
        std::fs::rename(&tmp, &path).map_err(|e| io_error(&path, e))?;
        Ok(w)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let written = written?;
    sync_dir(dir)?;
    Ok(written)
}

/// Writes and syncs `ns`'s image to `tmp`.
fn image(ns: &Namespace, id: u64, start: u64, tmp: &Path) -> Result<Written, Error> {
    let io = |e| io_error(tmp, e);
    let file = File::create(tmp).map_err(io)?;
    let mut out = Summing { inner: BufWriter::with_capacity(1 << 20, file), crc: 0, bytes: 0 };
    let mut buf = Vec::with_capacity(256);
    out.put(MAGIC).map_err(io)?;
    let header = Item::Header { version: VERSION, seed: ns.seed(), start, next_ino: ns.next_ino.load(Relaxed) };
    out.frame(&header, &mut buf).map_err(io)?;
    out.frame(&Item::Identity { id }, &mut buf).map_err(io)?;
    let (mut inodes, mut entries) = (0u64, 0u64);
    let mut failed = None;
    ns.inodes.iter_sync(|_, i| {
        inodes += 1;
        match out.frame(&Item::Inode(InodeImage::of(i)), &mut buf) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    });
    if let Some(e) = failed {
        return Err(io(e));
    }
    let guard = scc::Guard::new();
    for e in ns.entries.iter(&guard) {
        entries += 1;
        out.frame(&Item::Entry { parent: e.parent, name: e.name.to_vec(), ino: e.ino }, &mut buf).map_err(io)?;
    }
    for (origin, recent) in ns.replies.image() {
        out.frame(&Item::Replies { origin, recent }, &mut buf).map_err(io)?;
    }
    out.frame(&Item::End { inodes, entries }, &mut buf).map_err(io)?;
    let crc = out.crc;
    out.inner.write_all(&crc.to_le_bytes()).map_err(io)?;
    let file = out.inner.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(Written { start, inodes, entries, bytes: out.bytes + 4, pause: std::time::Duration::ZERO })
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error(dir, e))
}

/// A loaded checkpoint: the namespace as imaged (counts not yet rebuilt),
/// where replay starts, and the namespace's identity (`None` in an image
/// older than version 3).
pub struct Loaded {
    pub ns: Namespace,
    pub start: u64,
    pub id: Option<u64>,
}

/// Loads the checkpoint in `dir`, or `None` if there is none. Damage
/// (a bad checksum, a short file, an undecodable frame) is an error that
/// names the file and offset: never a namespace silently missing a part.
pub fn load(dir: &Path) -> Result<Option<Loaded>, Error> {
    let path = dir.join(FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(&path, e)),
    };
    let mut r = Reader { inner: BufReader::with_capacity(1 << 20, file), crc: 0, offset: 0, path: path.clone() };
    let mut magic = [0u8; 8];
    r.read(&mut magic)?;
    if &magic != MAGIC {
        return Err(r.corrupt("not an interlock namespace checkpoint"));
    }
    let mut buf = Vec::new();
    let Item::Header { version, seed, start, next_ino } = r.item(&mut buf)? else {
        return Err(r.corrupt("no header"));
    };
    if !(1..=VERSION).contains(&version) {
        return Err(r.corrupt(&format!("checkpoint version {version}; this build reads 1 to {VERSION}")));
    }
    let ns = Namespace::empty(seed);
    ns.next_ino.store(next_ino, Relaxed);
    let mut id = None;
    // This thread reads and decodes; another inserts, in batches.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Item>>(8);
    std::thread::scope(|s| {
        let ns = &ns;
        s.spawn(move || {
            let mut entries = ns.entries.loading();
            let mut inodes = 0;
            for item in rx.into_iter().flatten() {
                match item {
                    Item::Inode(img) => {
                        ns.place_inode(Arc::new(img.into_inode()));
                        inodes += 1;
                    }
                    Item::Entry { parent, name, ino } => {
                        // The inodes come first: about one entry each.
                        if inodes > 0 {
                            entries.reserve(std::mem::take(&mut inodes));
                        }
                        entries.add(ns.key(parent, &name), ino);
                    }
                    Item::Replies { origin, recent } => ns.replies.load(origin, recent),
                    Item::Header { .. } | Item::End { .. } | Item::Identity { .. } => {}
                }
            }
            entries.finish();
        });
        let (mut inodes, mut entries) = (0u64, 0u64);
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            let item = r.item(&mut buf)?;
            match &item {
                Item::Identity { id: i } if id.is_none() && (inodes, entries) == (0, 0) => {
                    id = Some(*i);
                    continue;
                }
                Item::Identity { .. } => return Err(r.corrupt("an identity not after the header")),
                Item::Inode(_) => inodes += 1,
                Item::Entry { .. } => entries += 1,
                Item::End { inodes: i, entries: e } if (*i, *e) != (inodes, entries) => {
                    return Err(r.corrupt(&format!("counts {inodes}/{entries}, end says {i}/{e}")));
                }
                Item::End { .. } => break,
                Item::Header { .. } => return Err(r.corrupt("a second header")),
                Item::Replies { .. } => {}
            }
            batch.push(item);
            if batch.len() == BATCH {
                // The inserter ends only when this sender goes.
                let _ = tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)));
            }
        }
        let _ = tx.send(batch);
        drop(tx);
        Ok(())
    })?;
    if version >= 3 && id.is_none() {
        return Err(r.corrupt("no identity"));
    }
    let want = r.crc;
    let mut crc = [0u8; 4];
    r.inner.read_exact(&mut crc).map_err(|e| io_error(&path, e))?;
    if u32::from_le_bytes(crc) != want {
        return Err(r.corrupt("checksum mismatch"));
    }
    Ok(Some(Loaded { ns, start, id }))
}

struct Reader {
    inner: BufReader<File>,
    crc: u32,
    offset: u64,
    path: PathBuf,
}

impl Reader {
    fn corrupt(&self, what: &str) -> Error {
        Error::Corrupt { path: self.path.clone(), offset: self.offset, what: what.to_string() }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        self.inner.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => self.corrupt("cut short"),
            _ => io_error(&self.path, e),
        })?;
        self.crc = crc32c::crc32c_append(self.crc, buf);
        self.offset += buf.len() as u64;
        Ok(())
    }

    fn item(&mut self, buf: &mut Vec<u8>) -> Result<Item, Error> {
        let mut len = [0u8; 4];
        self.read(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > interlock_journal::MAX_PAYLOAD * 4 {
            return Err(self.corrupt(&format!("a frame of {len} bytes")));
        }
        buf.resize(len, 0);
        self.read(buf)?;
        postcard::from_bytes(buf).map_err(|e| self.corrupt(&format!("undecodable frame: {e}")))
    }
}
