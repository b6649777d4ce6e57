//! The changelog: the journal read through durable consumers.
//!
//! The metadata journal and the changelog are one log, so a changelog
//! record costs no second write (Lustre writes both). Records carry the
//! fields of Lustre's changelog (type, flags, time, target, parent, name,
//! both ends of a rename, uid/gid, job id); their types keep Lustre's
//! numbers, so `01CREAT` means what a Lustre user expects.
//!
//! Consumers (`cl1`, `cl2`, …, with an optional name) are registered
//! durably, each with its own mask and a cursor: the index it has cleared
//! (acknowledged) up to. A consumer reads from its cursor, may follow (wait
//! for new records), and clears. Whole segments are purged once every
//! consumer and the checkpoint are past them, never before. A consumer that
//! stays idle too long (no clear since, as Lustre's
//! `changelog_max_idle_time` counts it), or lags too far, is deregistered
//! with a warning, so a forgotten consumer cannot fill the disk.
//!
//! Consumer state lives in `consumers.json` beside the segments, replaced
//! atomically (write, fsync, rename, fsync the directory) on every change:
//! O(consumers) bytes and two fsyncs (the file's, the directory's) per
//! register, deregister, clear, checkpoint or GC that changes something.
//! What the changelog shows (cursors, consumers, the purge bound) is
//! always what is on disk: a change is shown once saved, never before,
//! so the journal is never purged under a cursor a crash would take
//! back. Changes are saved one at a time, and nobody else waits for a
//! save: reads, lists and the purge bound look at the state shown
//! meanwhile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::{Error, Journal, Options};

macro_rules! record_types {
    ($($name:ident = $n:literal),* $(,)?) => {
        /// A changelog record type, numbered as in Lustre.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[allow(clippy::upper_case_acronyms)]
        pub enum RecordType { $($name = $n),* }

        impl RecordType {
            /// Every type, in number order.
            pub const ALL: &'static [RecordType] = &[$(RecordType::$name),*];

            /// The upper-case name Lustre prints (`CREAT`, `RENME`, …).
            pub fn name(self) -> &'static str {
                match self { $(RecordType::$name => stringify!($name)),* }
            }
        }
    };
}

record_types! {
    MARK = 0, CREAT = 1, MKDIR = 2, HLINK = 3, SLINK = 4, MKNOD = 5, UNLNK = 6, RMDIR = 7,
    RENME = 8, RNMTO = 9, OPEN = 10, CLOSE = 11, TRUNC = 13, SATTR = 14, XATTR = 15,
    MTIME = 17, CTIME = 18, ATIME = 19,
}

impl std::str::FromStr for RecordType {
    type Err = Error;

    /// `CREAT`, `creat`, or with Lustre's number prefix (`01CREAT`).
    fn from_str(s: &str) -> Result<RecordType, Error> {
        let bare = s.trim_start_matches(|c: char| c.is_ascii_digit()).to_ascii_uppercase();
        RecordType::ALL.iter().copied().find(|t| t.name() == bare).ok_or_else(|| {
            let names: Vec<&str> = RecordType::ALL.iter().map(|t| t.name()).collect();
            Error::Invalid(format!("unknown record type {s:?}; known: {}", names.join(",")))
        })
    }
}

/// A set of record types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mask(pub u32);

impl Mask {
    /// Every type.
    pub const ALL: Mask = Mask(u32::MAX);

    /// Lustre's default: everything but OPEN and ATIME, the two that
    /// would log every read.
    pub fn default_mask() -> Mask {
        Mask(!(1 << RecordType::OPEN as u32) & !(1 << RecordType::ATIME as u32))
    }

    pub fn of(types: &[RecordType]) -> Mask {
        Mask(types.iter().fold(0, |m, &t| m | 1 << t as u32))
    }

    pub fn contains(self, t: RecordType) -> bool {
        self.0 & (1 << t as u32) != 0
    }

    /// Parses `CREAT,UNLNK,...` (or `all`).
    pub fn parse(s: &str) -> Result<Mask, Error> {
        if s.eq_ignore_ascii_case("all") {
            return Ok(Mask::ALL);
        }
        let types: Result<Vec<RecordType>, Error> = s.split(',').map(|w| w.trim().parse()).collect();
        Ok(Mask::of(&types?))
    }
}

/// The source end of a rename (the record's own name and parent are the
/// target end).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameSource {
    pub parent: u64,
    pub name: Vec<u8>,
    /// The file being renamed.
    pub target: u64,
}

/// A changelog record, without its index (the journal assigns that).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub rtype: RecordType,
    pub flags: u32,
    /// Nanoseconds since the Unix epoch, from the caller's clock.
    pub time_ns: u64,
    pub target: u64,
    pub parent: u64,
    pub name: Vec<u8>,
    pub source: Option<RenameSource>,
    pub uid: u32,
    pub gid: u32,
    pub jobid: Option<String>,
}

impl Record {
    /// The record's bytes in the journal (postcard).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("records always serialize")
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, Error> {
        postcard::from_bytes(bytes).map_err(|e| Error::Invalid(format!("not a changelog record: {e}")))
    }
}

/// A record with its index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    pub record: Record,
}

/// One registered consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumer {
    /// `cl1`, `cl2`, …: never reused.
    pub id: String,
    pub name: Option<String>,
    pub mask: Mask,
    /// Every record up to this index is acknowledged (0: none).
    pub cleared: u64,
    /// When it last cleared (or registered), by the caller's clock. Reads
    /// do not count: a consumer that reads but never clears holds the log
    /// back all the same. Durable, like the cursor, so a restart neither
    /// forgets recent activity nor forgives idleness.
    pub last_active_ns: u64,
}

/// What survives a restart besides the records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Persisted {
    next_id: u32,
    /// Records up to here are covered by a metadata checkpoint.
    checkpoint: u64,
    consumers: BTreeMap<String, Consumer>,
}

/// Changelog policy.
#[derive(Clone, Debug)]
pub struct ChangelogOptions {
    /// Types written at all; others are dropped at append.
    pub mask: Mask,
    /// A consumer that has not cleared for longer than this is
    /// deregistered by [`Changelog::gc`].
    pub max_idle: Option<Duration>,
    /// A consumer more than this many records behind is deregistered by
    /// [`Changelog::gc`].
    pub max_lag: Option<u64>,
}

impl Default for ChangelogOptions {
    fn default() -> Self {
        ChangelogOptions {
            mask: Mask::default_mask(),
            max_idle: Some(Duration::from_secs(7 * 24 * 3600)),
            max_lag: Some(100_000_000),
        }
    }
}

/// How a changelog reads its journal's records: the changelog record a
/// journal record shows its consumers, or `None` for a record they do
/// not see. A journal whose records are changelog records reads them with
/// [`Record::decode`]; the namespace's journal holds its own records and
/// projects each onto the changelog record it stands for, so that one
/// write serves replay and consumers.
pub type Projection = fn(&[u8]) -> Result<Option<Record>, Error>;

/// A follower woken by a durable record waits up to [`FOLLOW_LINGER`]
/// for this many before it reads: a follower of a busy log then wakes
/// about once a millisecond, not once a record. Each wake-up costs CPU
/// the writers share: a consumer woken for each of one creator's durable
/// creates (6,400 a second, each its own sync) took 15% off them on two
/// cores (session 27); the price is that a follower sees a record up to
/// a millisecond after it is durable.
pub const FOLLOW_BATCH: u64 = 64;

/// See [`FOLLOW_BATCH`].
pub const FOLLOW_LINGER: Duration = Duration::from_millis(1);

/// The changelog over a journal.
pub struct Changelog {
    journal: Journal,
    dir: PathBuf,
    options: ChangelogOptions,
    project: Projection,
    /// The state as saved: taken only to look or to swap, never over a
    /// save, which would stall every read of every consumer behind a
    /// clear's fsyncs.
    state: Mutex<Persisted>,
    /// Held over a change and its save: changes are saved in the order
    /// they are shown, each built on the one before.
    saving: Mutex<()>,
}

const CONSUMERS: &str = "consumers.json";

/// Reads the consumer state of a log directory (empty if none yet).
fn load(dir: &Path) -> Result<Persisted, Error> {
    let path = dir.join(CONSUMERS);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path,
            offset: e.column() as u64,
            what: format!("consumer state: {e}"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Persisted { next_id: 1, ..Persisted::default() }),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// The consumers of a log directory and the checkpoint, for `journal check`.
pub fn consumers_of(dir: &Path) -> Result<(Vec<Consumer>, u64), Error> {
    let p = load(dir)?;
    Ok((p.consumers.into_values().collect(), p.checkpoint))
}

impl Changelog {
    /// Opens the log in `dir`, whose records are changelog records, with
    /// its consumers.
    pub fn open(dir: &Path, journal: Options, options: ChangelogOptions) -> Result<Changelog, Error> {
        Ok(Changelog::open_with(dir, journal, options, |bytes| Record::decode(bytes).map(Some))?.0)
    }

    /// Opens the log in `dir`, whose records `project` reads as changelog
    /// records, with its consumers; and says what recovery found. The
    /// global mask then filters what consumers read, not what is written.
    pub fn open_with(
        dir: &Path,
        journal: Options,
        options: ChangelogOptions,
        project: Projection,
    ) -> Result<(Changelog, crate::Recovery), Error> {
        let (journal, recovery) = Journal::open(dir, journal)?;
        let state = Mutex::new(load(dir)?);
        let saving = Mutex::new(());
        Ok((Changelog { journal, dir: dir.to_path_buf(), options, project, state, saving }, recovery))
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Appends a record unless the global mask drops it; returns its index.
    /// Durable once `journal().wait_durable(index)` returns.
    pub fn append(&self, record: &Record) -> Result<Option<u64>, Error> {
        if !self.options.mask.contains(record.rtype) {
            return Ok(None);
        }
        self.journal.append(&record.encode()).map(Some)
    }

    /// Applies `change` to a copy of the state, saves the copy if it
    /// differs, and only then shows it. O(consumers), with two fsyncs
    /// where something changed. Nothing but another change waits for it;
    /// a change that fails (or whose save does) leaves the state as it
    /// was.
    fn change<T>(&self, change: impl FnOnce(&mut Persisted) -> Result<T, Error>) -> Result<T, Error> {
        let _one_at_a_time = self.saving.lock();
        let mut next = self.state.lock().clone();
        let out = change(&mut next)?;
        if next != *self.state.lock() {
            self.save(&next)?;
            *self.state.lock() = next;
        }
        Ok(out)
    }

    fn save(&self, p: &Persisted) -> Result<(), Error> {
        let path = self.dir.join(CONSUMERS);
        let tmp = self.dir.join(format!("{CONSUMERS}.tmp"));
        let bytes = serde_json::to_vec_pretty(p).expect("state serializes");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| Error::io(&path, e))?;
        crate::segment::sync_dir(&self.dir)
    }

    /// Registers a consumer; it starts at the current end of the log (it
    /// sees records appended from now on). Durable before it returns.
    ///
    /// A name must pass [`check_name`]: every command that takes a
    /// consumer takes its id or its name, so a name that could be an id
    /// would one day mean two consumers.
    pub fn register(&self, name: Option<&str>, mask: Mask, now_ns: u64) -> Result<Consumer, Error> {
        if let Some(n) = name {
            check_name(n)?;
        }
        self.change(|p| {
            if let Some(n) = name
                && p.consumers.values().any(|c| c.name.as_deref() == Some(n))
            {
                return Err(Error::Invalid(format!("a consumer named {n:?} is already registered")));
            }
            let id = format!("cl{}", p.next_id.max(1));
            let c = Consumer {
                id: id.clone(),
                name: name.map(str::to_string),
                mask,
                cleared: self.journal.durable_end().saturating_sub(1),
                last_active_ns: now_ns,
            };
            p.next_id = p.next_id.max(1) + 1;
            p.consumers.insert(id, c.clone());
            Ok(c)
        })
    }

    /// Removes a consumer (by id or name); the log may then be purged past
    /// it.
    pub fn deregister(&self, who: &str) -> Result<(), Error> {
        self.change(|p| {
            p.consumers.remove(&find(p, who)?);
            Ok(())
        })?;
        self.purge()
    }

    /// Every registered consumer.
    pub fn consumers(&self) -> Vec<Consumer> {
        self.state.lock().consumers.values().cloned().collect()
    }

    /// Up to `max` records for consumer `who` (id or name) from `from`
    /// (default: after its cursor), of the types in its mask. With `wait`,
    /// blocks up to that long for a first record if none is there yet
    /// (follow), and once one comes, up to [`FOLLOW_LINGER`] more for
    /// [`FOLLOW_BATCH`]. Reading does not move the cursor:
    /// [`clear`](Self::clear) does.
    ///
    /// O(log s + SPARSE_EVERY + r) per call for the r records it looks at
    /// until it has `max` of the consumer's types (or reaches the end): a
    /// consumer that lags far behind pays for what it reads, not for the
    /// whole lag on every call.
    pub fn read(&self, who: &str, from: Option<u64>, max: usize, wait: Option<Duration>) -> Result<Vec<Entry>, Error> {
        let mut out = Vec::new();
        self.read_each(who, from, max, wait, |e| out.push(e))?;
        Ok(out)
    }

    /// As [`read`](Self::read), handing each record to `f` as it is
    /// decoded, in order; how many it handed. A consumer that handles
    /// records one by one needs no vector of them: one of a few thousand
    /// records is megabytes, which the allocator takes from the system
    /// and gives back on every read (page faults, and TLB shootdowns
    /// that interrupt the writers' cores: in `bench mdtest`, its reader
    /// took 409 ns of CPU per record through vectors of up to 8,192 and
    /// 303 through this, session 55). Same cost otherwise.
    pub fn read_each(
        &self,
        who: &str,
        from: Option<u64>,
        max: usize,
        wait: Option<Duration>,
        mut f: impl FnMut(Entry),
    ) -> Result<usize, Error> {
        let (mask, from) = self.reading(who, from)?;
        if let Some(w) = wait
            && self.journal.durable_end() <= from
            && self.journal.watch_for(from.saturating_add(1), Some(w))? > from
        {
            // Woken by the first new record: more get a moment to come.
            self.journal.watch_for(from.saturating_add(FOLLOW_BATCH), Some(FOLLOW_LINGER))?;
        }
        let mut handed = 0;
        let mut next = from;
        // In batches of as many as are still wanted: records of other
        // types make another batch, never a read to the end.
        while handed < max {
            let want = max - handed;
            let mut bad = None;
            let seen = self.journal.read(next, want, |index, bytes| {
                if bad.is_some() {
                    return;
                }
                match (self.project)(bytes) {
                    Ok(Some(record)) if mask.contains(record.rtype) => {
                        f(Entry { index, record });
                        handed += 1;
                    }
                    Ok(_) => {}
                    Err(e) => bad = Some((index, e)),
                }
            })?;
            if let Some((index, e)) = bad {
                return Err(Error::Invalid(format!("record {index}: {e}")));
            }
            if seen < want {
                break;
            }
            next += seen as u64;
        }
        Ok(handed)
    }

    /// Where a read of consumer `who` from `from` begins (`from`, else
    /// after its cursor; never before the first record kept): for a
    /// follower that waits for records past it by other means than
    /// [`read`](Self::read)'s. O(consumers).
    pub fn start(&self, who: &str, from: Option<u64>) -> Result<u64, Error> {
        Ok(self.reading(who, from)?.1)
    }

    /// The types consumer `who` sees, and where its read from `from`
    /// begins (see [`start`](Self::start)).
    fn reading(&self, who: &str, from: Option<u64>) -> Result<(Mask, u64), Error> {
        let (mask, cursor) = {
            let p = self.state.lock();
            let c = &p.consumers[&find(&p, who)?];
            (Mask(c.mask.0 & self.options.mask.0), c.cleared)
        };
        // Any `from` a client sends, the largest included, is taken
        // without wrapping (a wrapped one would not wait).
        Ok((mask, from.unwrap_or(cursor.saturating_add(1)).max(self.journal.first_index())))
    }

    /// Acknowledges every record up to `upto` for consumer `who`, then
    /// purges segments every consumer and the checkpoint are past.
    pub fn clear(&self, who: &str, upto: u64, now_ns: u64) -> Result<(), Error> {
        let last = self.journal.durable_end().saturating_sub(1);
        if upto > last {
            return Err(Error::Invalid(format!("cannot clear up to {upto}: the last record is {last}")));
        }
        self.change(|p| {
            let c = p.consumers.get_mut(&find(p, who)?).expect("found");
            c.cleared = c.cleared.max(upto);
            c.last_active_ns = now_ns;
            Ok(())
        })?;
        self.purge()
    }

    /// Records up to `index` are covered by a metadata checkpoint.
    pub fn set_checkpoint(&self, index: u64) -> Result<(), Error> {
        self.change(|p| {
            p.checkpoint = p.checkpoint.max(index);
            Ok(())
        })?;
        self.purge()
    }

    /// The index below which nothing is needed any more: past the
    /// checkpoint and every consumer's cursor.
    pub fn purge_bound(&self) -> u64 {
        let p = self.state.lock();
        let slowest = p.consumers.values().map(|c| c.cleared).min().unwrap_or(u64::MAX);
        p.checkpoint.min(slowest).saturating_add(1)
    }

    fn purge(&self) -> Result<(), Error> {
        self.journal.purge_below(self.purge_bound()).map(drop)
    }

    /// Deregisters consumers idle longer than `max_idle` or lagging more
    /// than `max_lag` records, with a warning each; returns their ids.
    /// O(consumers).
    pub fn gc(&self, now_ns: u64) -> Result<Vec<String>, Error> {
        let last = self.journal.durable_end().saturating_sub(1);
        let mut gone = Vec::new();
        self.change(|p| {
            p.consumers.retain(|id, c| {
                let idle = Duration::from_nanos(now_ns.saturating_sub(c.last_active_ns));
                let lag = last.saturating_sub(c.cleared);
                let why = match (self.options.max_idle, self.options.max_lag) {
                    (Some(max), _) if idle > max => Some(format!("idle for {}s", idle.as_secs())),
                    (_, Some(max)) if lag > max => Some(format!("{lag} records behind")),
                    _ => None,
                };
                if let Some(why) = &why {
                    tracing::warn!(consumer = %id, name = ?c.name, reason = %why, "deregistering changelog consumer");
                    gone.push(id.clone());
                }
                why.is_none()
            });
            Ok(())
        })?;
        if !gone.is_empty() {
            self.purge()?;
        }
        Ok(gone)
    }
}

/// The id of the consumer named or numbered `who`.
/// The longest consumer name, in bytes.
pub const NAME_MAX: usize = 64;

/// Whether `name` may name a consumer: 1 to [`NAME_MAX`] bytes of letters,
/// digits, `-`, `_` and `.`, and not of an id's form (`cl` and digits),
/// which the next register could hand out: `read cl5` would then read
/// one consumer and `clear cl5` move another's cursor, letting the
/// journal be purged under records it never read. The characters are
/// those a name can be printed with and typed back (`changelog list`
/// separates its fields with spaces). O(name).
pub fn check_name(name: &str) -> Result<(), Error> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let id_like = name.strip_prefix("cl").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if name.is_empty() || name.len() > NAME_MAX || !name.chars().all(allowed) {
        Err(Error::Invalid(format!("consumer name {name:?}: 1 to {NAME_MAX} letters, digits, '-', '_' or '.'")))
    } else if id_like {
        Err(Error::Invalid(format!("consumer name {name:?} has the form of a consumer id (cl1, cl2, ...)")))
    } else {
        Ok(())
    }
}

/// The id of the consumer `who` names, by id or name. O(consumers).
///
/// A name of an id's form can only come from a `consumers.json` written
/// before [`check_name`] refused such names; where it is also another
/// consumer's id, `who` is refused rather than taken for either.
fn find(p: &Persisted, who: &str) -> Result<String, Error> {
    let named = p.consumers.values().find(|c| c.name.as_deref() == Some(who));
    match (p.consumers.contains_key(who), named) {
        (true, Some(c)) if c.id != who => Err(Error::Invalid(format!(
            "{who:?} is the id of one consumer and the name of another ({}): name them by id",
            c.id
        ))),
        (true, _) => Ok(who.to_string()),
        (false, Some(c)) => Ok(c.id.clone()),
        (false, None) => Err(Error::Invalid(format!("no changelog consumer {who:?}"))),
    }
}
