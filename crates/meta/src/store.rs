//! The namespace with its journal: what a server runs. A change is
//! recorded in the journal under its locks and applied (see `log`); the
//! caller acknowledges it once [`Store::wait`] says its record is durable
//! (the journal's group commit: one fsync for every record published
//! before it). The same records are the changelog (see `record`), so a
//! change costs one write whether or not anyone consumes the changelog.
//!
//! Recovery is checkpoint + replay: [`Store::open`] loads `meta.ckpt`,
//! replays the journal from the checkpoint's start and recounts the links.
//! [`Store::checkpoint`] writes a new image while operations go on and
//! lets the journal be purged behind it and behind the slowest changelog
//! consumer.
//!
//! ```
//! use interlock_meta::{Cred, FileType, NewInode, ROOT, Store, StoreOptions};
//! let dir = tempfile::tempdir().unwrap();
//! let (store, _) = Store::open(dir.path(), StoreOptions::default(), 1).unwrap();
//! let new = NewInode { kind: FileType::Regular, perm: 0o644, rdev: 0, umask: 0 };
//! let (file, seq) = store.ns().create(&Cred::root(), ROOT, b"f", new, b"", 2).unwrap();
//! store.wait(seq).unwrap(); // durable: now it may be acknowledged
//! drop(store);
//! let (again, opened) = Store::open(dir.path(), StoreOptions::default(), 3).unwrap();
//! assert_eq!(opened.replayed, 1);
//! assert_eq!(again.ns().lookup(&Cred::root(), ROOT, b"f").unwrap().ino, file.ino);
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use interlock_journal::changelog::{Changelog, ChangelogOptions};
use interlock_journal::{Error, Options};
use parking_lot::Mutex;

use crate::checkpoint::{self, Written};
use crate::data::Data;
use crate::errno::{Errno, Result};
use crate::log::{Log, Room, Seq};
use crate::mutation::Mutation;
use crate::namespace::Namespace;
use crate::record;
use crate::replies::Tag;
use crate::types::{Attr, Caller, Cred, Fallocate, Ino, Nanos, ReadFrom, SeekTo, SetAttr, StatFs};

/// How a store keeps its journal and changelog.
#[derive(Clone, Debug, Default)]
pub struct StoreOptions {
    pub journal: Options,
    pub changelog: ChangelogOptions,
}

/// Inodes freed by records not yet durable: their data goes once the
/// record is (a crash before leaves the data of an inode that still
/// exists after replay).
type Freed = Arc<Mutex<Vec<(Seq, Ino)>>>;

/// What [`Store::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// No checkpoint was there: a new namespace.
    pub created: bool,
    /// Replay started at this index.
    pub start: u64,
    /// Records replayed.
    pub replayed: u64,
    /// Bytes of a torn journal tail cut off (never acknowledged).
    pub torn_bytes: Option<u64>,
    /// Entries whose inode does not exist: damage (`fsck` reports it).
    pub dangling: Vec<(Ino, Vec<u8>, Ino)>,
    /// Data files removed (their inodes were freed) and cut (past their
    /// file's size), left so by a crash.
    pub data_removed: u64,
    pub data_cut: u64,
}

/// The namespace, its journal and its changelog.
pub struct Store {
    ns: Namespace,
    data: Data,
    freed: Freed,
    changelog: Arc<Changelog>,
    dir: PathBuf,
    /// One checkpoint at a time.
    checkpointing: Mutex<()>,
    /// Where the last checkpoint's replay starts.
    checkpoint_start: std::sync::atomic::AtomicU64,
    /// See [`Store::id`].
    id: u64,
}

/// The journal, as the namespace's [`Log`].
struct JournalLog {
    changelog: Arc<Changelog>,
    freed: Freed,
}

impl Log for JournalLog {
    /// O(record) on the caller's thread, no lock (the journal's append).
    fn record(&self, cred: &Cred, m: &Mutation, tag: Option<Tag>) -> Result<Seq> {
        record::encoded(cred, m, tag, |bytes| self.changelog.journal().append(bytes)).map_err(|e| {
            tracing::error!(error = %e, "journal append failed");
            Errno::EIO
        })
    }

    /// Notes the freed inode, for [`Store::collect_freed`]: one lock.
    fn freed(&self, seq: Seq, ino: Ino) {
        self.freed.lock().push((seq, ino));
    }

    /// The journal's disk is full while it writes into the zeros it set
    /// aside ([`interlock_journal::RESERVE`]); the last quarter of them is
    /// left to records already appended when a look said there was room
    /// (thousands of removals' records).
    fn room(&self) -> Room {
        let journal = self.changelog.journal();
        if !journal.space_low() {
            Room::Enough
        } else if journal.reserve_left() > interlock_journal::RESERVE / 4 {
            Room::Reserve
        } else {
            Room::None
        }
    }
}

impl Store {
    /// Opens the store in `dir` (creating it, with a root made at `now`,
    /// if it is new): loads the checkpoint, replays the journal after it,
    /// recounts links. O(inodes + entries + records since the
    /// checkpoint).
    pub fn open(dir: &Path, options: StoreOptions, now: Nanos) -> std::result::Result<(Store, Opened), Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io { path: dir.to_path_buf(), source: e })?;
        let (changelog, recovery) = Changelog::open_with(dir, options.journal, options.changelog, record::project)?;
        let loaded = checkpoint::load(dir)?;
        let created = loaded.is_none();
        let (mut ns, start, id) = match loaded {
            Some(l) => (l.ns, l.start, l.id),
            None => (Namespace::new(random(), now), 1, None),
        };
        let identified = id.is_some();
        if start < recovery.first {
            return Err(Error::Corrupt {
                path: dir.join(checkpoint::FILE),
                offset: 0,
                what: format!("replay must start at {start}, but the journal starts at {}", recovery.first),
            });
        }
        let replayed = record::replay(&ns, dir, |apply| changelog.journal().read(start, usize::MAX, apply))?;
        let dangling = ns.rebuild_counts();
        let io = |e| Error::Io { path: dir.join("data"), source: e };
        let data = Data::open(dir).map_err(io)?;
        let (data_removed, data_cut) = data.reconcile(&ns).map_err(io)?;
        let changelog = Arc::new(changelog);
        let freed = Freed::default();
        ns.set_log(Arc::new(JournalLog { changelog: changelog.clone(), freed: freed.clone() }));
        let store = Store {
            ns,
            data,
            freed,
            changelog,
            dir: dir.to_path_buf(),
            checkpointing: Mutex::new(()),
            checkpoint_start: std::sync::atomic::AtomicU64::new(start),
            id: id.unwrap_or_else(random),
        };
        if !identified {
            // The seed, the root and the identity reach the disk before
            // any record (or, for an image from before identities, before
            // any client is told the identity).
            store.checkpoint()?;
        }
        let opened =
            Opened { created, start, replayed, torn_bytes: recovery.torn_bytes, dangling, data_removed, data_cut };
        Ok((store, opened))
    }

    /// The namespace's identity: a random number chosen when it was made
    /// and kept with it for its life. Inode numbers mean something only
    /// within one namespace, so a client that knew one must not take the
    /// same numbers in another (a fresh data directory served at the same
    /// address) for the same files. O(1).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The namespace: its operations return the [`Seq`] to
    /// [`wait`](Store::wait) for.
    pub fn ns(&self) -> &Namespace {
        &self.ns
    }

    /// Blocks until the record at `seq` is durable (at once for 0, or
    /// if it already is). `EIO` if the journal failed.
    pub fn wait(&self, seq: Seq) -> Result<()> {
        if seq == 0 {
            return Ok(());
        }
        self.changelog.journal().wait_durable(seq).map_err(|_| Errno::EIO)
    }

    /// Returns once the record at `seq` is in the journal's files,
    /// synced or not: a change to a file's data returns then, as
    /// `write(2)` returns once the page cache has the data. Its data is
    /// in the data file's page cache by then, so a crash of the server's
    /// process loses neither (recovery would cut data past a size whose
    /// record was lost); a crash of the machine may lose both, until an
    /// `fsync`. One `write` of the journal's pending records, on the
    /// calling thread, unless another change's call wrote it already.
    fn written(&self, seq: Seq) -> Result<()> {
        if seq == 0 {
            return Ok(());
        }
        self.changelog.journal().write_out(seq + 1).map_err(|_| Errno::EIO)
    }

    /// `len` bytes of regular file `ino` from `offset` (fewer at its end);
    /// `EAGAIN` if `from` is the cache and they are not all in it.
    pub fn read(&self, who: Caller, ino: Ino, (offset, len): (u64, usize), from: ReadFrom) -> Result<Vec<u8>> {
        let a = self.ns.readable(who, ino)?;
        self.data.read(ino, offset, len, a.size, from)
    }

    /// Writes `bytes` at `offset` of regular file `ino` (see
    /// [`Namespace::write_with`]); the data reaches the disk at
    /// [`fsync`](Store::fsync), the size and times with the record, which
    /// is in the journal's files when this returns (see `written`).
    /// `offset` `None` appends: the write goes at the end of the file, as
    /// the file is under the inode's lock.
    pub fn write(&self, who: Caller, ino: Ino, offset: Option<u64>, bytes: &[u8], now: Nanos) -> Result<(Attr, Seq)> {
        let (a, seq) =
            self.ns.write_with(who, ino, (offset, bytes.len() as u64), now, |at| self.data.write(ino, at, bytes))?;
        self.written(seq)?;
        Ok((a, seq))
    }

    /// `fallocate(2)` on regular file `ino` (see
    /// [`Namespace::fallocate_with`]): the data file's range reserved or
    /// zeroed as `how` says, then the size and times, which reach the
    /// disk with the record, as a write's do (in the journal's files on
    /// return, durable at [`fsync`](Store::fsync)).
    pub fn fallocate(&self, who: Caller, ino: Ino, how: Fallocate, at: (u64, u64), now: Nanos) -> Result<(Attr, Seq)> {
        let (a, seq) = self.ns.fallocate_with(who, ino, how, at, now, || self.data.fallocate(ino, how, at.0, at.1))?;
        self.written(seq)?;
        Ok((a, seq))
    }

    /// `lseek(2)`'s `SEEK_DATA` or `SEEK_HOLE` in regular file `ino`
    /// (checked as a read is): see `Data::seek`. O(1) expected, plus the
    /// local file system's extent look-up.
    pub fn seek(&self, who: Caller, ino: Ino, at: u64, to: SeekTo) -> Result<u64> {
        let size = self.ns.readable(who, ino)?.size;
        self.data.seek(ino, at, to, size)
    }

    /// `copy_file_range(2)` between regular files (see
    /// [`Namespace::copy_range_with`]): the bytes copied by the local file
    /// system, then the destination's size and times, in the journal's
    /// files on return and durable at [`fsync`](Store::fsync), as a
    /// write's are. Returns how many bytes.
    pub fn copy_range(
        &self,
        who: Caller,
        src: (Ino, u64),
        dst: (Ino, u64),
        len: u64,
        now: Nanos,
    ) -> Result<(u64, Attr, Seq)> {
        let (n, attr, seq) = self.ns.copy_range_with(who, src, dst, len, now, |n| self.data.copy(src, dst, n))?;
        self.written(seq)?;
        Ok((n, attr, seq))
    }

    /// [`Namespace::setattr`], with the data file cut or extended to a
    /// new size under the inode's lock.
    pub fn setattr(&self, cred: &Cred, ino: Ino, set: &SetAttr, now: Nanos) -> Result<(Attr, Seq)> {
        self.ns.setattr_with(cred, ino, set, now, |size| self.data.truncate(ino, size))
    }

    /// The namespace's counts, and the space of the file system its
    /// files' data are on (`df` on a mount shows that disk). One
    /// `statvfs`.
    pub fn statfs(&self) -> Result<StatFs> {
        let mut s = self.ns.statfs();
        (s.blocks, s.free, s.available) = self.data.space(s.block_size)?;
        Ok(s)
    }

    /// Makes `ino`'s data durable, and returns the [`Seq`] to wait for so
    /// that its size and times (every record so far) are too.
    pub fn fsync(&self, ino: Ino) -> Result<Seq> {
        self.ns.getattr(ino)?;
        self.data.sync(ino)?;
        Ok(self.changelog.journal().next_index().saturating_sub(1))
    }

    /// Removes the data of inodes whose freeing record is durable. O(freed).
    pub fn collect_freed(&self) -> usize {
        let durable = self.changelog.journal().durable_end();
        let ready: Vec<(Seq, Ino)> = {
            let mut f = self.freed.lock();
            let (ready, later) = std::mem::take(&mut *f).into_iter().partition(|(s, _)| *s < durable);
            *f = later;
            ready
        };
        for (_, ino) in &ready {
            self.data.remove(*ino);
        }
        ready.len()
    }

    /// The changelog: the journal read through consumers.
    pub fn changelog(&self) -> &Changelog {
        &self.changelog
    }

    /// Writes a checkpoint while operations go on (see `checkpoint`): a
    /// pause of O(stripes) to pick its start, the walk, then a wait until
    /// every record whose effect the image may hold is durable (so a
    /// crash cannot leave half a change in it), then the file replaces
    /// the old one and the journal may be purged below its start.
    pub fn checkpoint(&self) -> std::result::Result<Written, Error> {
        let _one = self.checkpointing.lock();
        let journal = self.changelog.journal();
        let paused = std::time::Instant::now();
        let start = self.ns.stripes.quiesce(|| journal.next_index());
        let pause = paused.elapsed();
        let mut written = checkpoint::write(&self.ns, self.id, start, &self.dir, || {
            journal.wait_for(journal.next_index(), None).map(drop)
        })?;
        written.pause = pause;
        self.changelog.set_checkpoint(start - 1)?;
        self.checkpoint_start.store(start, std::sync::atomic::Ordering::Relaxed);
        Ok(written)
    }

    /// Records a restart would replay now: those since the last
    /// checkpoint's start.
    pub fn since_checkpoint(&self) -> u64 {
        let start = self.checkpoint_start.load(std::sync::atomic::Ordering::Relaxed);
        self.changelog.journal().next_index().saturating_sub(start)
    }
}

impl Store {
    /// Repairs what [`check_dir`](crate::fsck::check_dir) found in this
    /// store (before it was opened): dangling entries, entries in
    /// non-directories and the extra names of directories are removed,
    /// leaked inodes freed, directories cut off by a cycle moved to
    /// `/lost+found` as `#INO`. Every repair is a journal record, then the
    /// counts are rebuilt and a checkpoint written. Returns the records
    /// written.
    pub fn repair(&self, damage: &[crate::fsck::Damage], now: Nanos) -> std::result::Result<usize, Error> {
        let root = Cred::root();
        let eio = |e: Errno| Error::Invalid(format!("repair failed: {e}"));
        let cut_off = damage.iter().any(|d| matches!(d, crate::fsck::Damage::Unreachable { .. }));
        let lost = if cut_off {
            match self.ns.lookup(&root, crate::ROOT, b"lost+found") {
                Ok(a) => a.ino,
                Err(_) => {
                    let new = crate::NewInode { kind: crate::FileType::Directory, perm: 0o700, rdev: 0, umask: 0 };
                    let (a, seq) = self.ns.create(&root, crate::ROOT, b"lost+found", new, b"", now).map_err(eio)?;
                    self.wait(seq).map_err(eio)?;
                    a.ino
                }
            }
        } else {
            crate::ROOT
        };
        let fixes = Namespace::repairs(damage, lost, now);
        for m in &fixes {
            let seq = self.ns.commit(&root, m).map_err(eio)?;
            self.wait(seq).map_err(eio)?;
        }
        self.ns.rebuild_counts();
        self.checkpoint()?;
        Ok(fixes.len())
    }
}

/// A fresh namespace's hash seed, or its identity.
fn random() -> u64 {
    let mut s = [0u8; 8];
    getrandom::fill(&mut s).expect("the operating system's random source");
    u64::from_le_bytes(s)
}
