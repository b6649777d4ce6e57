//! Applying a [`Mutation`]: the one place the namespace changes. A live
//! operation checks, locks, journals and applies; replay applies the
//! journal's records in order over a checkpoint's image. Applying never
//! fails and decides nothing from the state it finds: each record is a
//! blind write of what it changes (see `mutation`), so applying a record
//! twice, or over an image that already holds part of its effect, ends
//! in the same state once the records after it are applied too. Link and
//! entry counts are kept relatively here (cheap, and exact on the live
//! path, where records are applied once each, in order per object) and
//! rebuilt from the entries after replay ([`Namespace::rebuild_counts`]).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::access::Owner;
use crate::acl;
use crate::entries::Entry;
use crate::inode::{Inode, Meta};
use crate::mutation::{Gone, Mutation, Renamed};
use crate::namespace::Namespace;
use crate::types::{FileType, Ino, Nanos, ROOT};
use crate::usage;

impl Namespace {
    /// Applies `m`. Replay calls this on each journal record in order;
    /// live operations call it under their locks, after journaling `m`.
    /// O(log n).
    pub fn apply(&self, m: &Mutation) {
        self.apply_held(m, &[]);
    }

    /// [`apply`](Self::apply), taking the inodes in `held` as they are
    /// rather than from the table: a live operation has already looked up
    /// the directory it changes (and holds it under its locks), and a
    /// second look-up would write the table's bucket lock and the
    /// directory's reference count again, lines every creator in that
    /// directory shares.
    pub(crate) fn apply_held(&self, m: &Mutation, held: &[&Inode]) {
        match m {
            Mutation::Create { parent, name, ino, kind, perm, uid, gid, rdev, target, time } => {
                let owner = Owner { kind: *kind, perm: *perm, uid: *uid, gid: *gid };
                self.put_inode(self.made(*ino, owner, Meta::new(*time, target, *rdev), *time, *parent));
                self.add_entry(held, *parent, name, *ino, *kind == FileType::Directory, *time);
            }
            Mutation::Tmpfile { parent, ino, perm, uid, gid, linkable, time } => {
                let owner = Owner { kind: FileType::Regular, perm: *perm, uid: *uid, gid: *gid };
                let i = self.made(*ino, owner, Meta::new(*time, b"", 0), *time, *parent);
                i.nlink.store(0, Relaxed);
                i.orphan.store(true, Relaxed);
                i.linkable.store(*linkable, Relaxed);
                self.put_inode(i);
            }
            Mutation::Link { parent, name, ino, time } => {
                if let Ok(i) = self.find(held, *ino) {
                    i.nlink.fetch_add(1, Relaxed);
                    // An `O_TMPFILE` named: no orphan now.
                    i.orphan.store(false, Relaxed);
                    i.linkable.store(false, Relaxed);
                    i.changed(*time);
                }
                self.add_entry(held, *parent, name, *ino, false, *time);
            }
            Mutation::Remove { parent, name, ino, gone, time, .. } => {
                let Ok(p) = self.find(held, *parent) else { return };
                self.remove_entry(&p, name, *time);
                if let Ok(i) = self.find(held, *ino) {
                    self.drop_link(&p, &i, *gone, *time);
                }
            }
            Mutation::Rename(r) => self.renamed(held, r),
            Mutation::RenameWhiteout { rename: r, whiteout, uid, gid } => {
                self.renamed(held, r);
                let owner = Owner { kind: FileType::CharDevice, perm: 0, uid: *uid, gid: *gid };
                self.put_inode(self.made(*whiteout, owner, Meta::new(r.time, b"", 0), r.time, r.parent));
                self.add_entry(held, r.parent, &r.name, *whiteout, false, r.time);
            }
            Mutation::SetAttr { ino, perm, uid, gid, size, atime, mtime, ctime } => {
                let Ok(i) = self.find(held, *ino) else { return };
                if let Some(p) = perm {
                    i.set_perm(*p);
                }
                i.set_ids(*uid, *gid);
                if let Some(a) = atime {
                    i.meta.lock().atime = *a;
                }
                if let Some(s) = size {
                    i.size.store(*s, Relaxed);
                }
                i.set_times(*mtime, *ctime);
            }
            Mutation::Write { ino, size, perm, time } => {
                let Ok(i) = self.find(held, *ino) else { return };
                if let Some(p) = perm {
                    i.set_perm(*p);
                }
                if let Some(s) = size {
                    i.size.store(*s, Relaxed);
                }
                i.set_times(Some(*time), *time);
            }
            Mutation::SetXattr { ino, name, value, time } => {
                let Ok(i) = self.find(held, *ino) else { return };
                self.xattrs_of(&i, |xattrs| set_xattr(xattrs, name, Some(value)));
                i.changed(*time);
            }
            Mutation::RemoveXattr { ino, name, time } => {
                let Ok(i) = self.find(held, *ino) else { return };
                self.xattrs_of(&i, |xattrs| xattrs.retain(|(n, _)| **n != **name));
                i.changed(*time);
            }
            Mutation::SetAcl { ino, perm, acl, time } => {
                let Ok(i) = self.find(held, *ino) else { return };
                i.set_perm(*perm);
                self.xattrs_of(&i, |xattrs| set_xattr(xattrs, acl::ACCESS, acl.as_deref()));
                i.changed(*time);
            }
            Mutation::SetFlags { ino, flags, time } => {
                let Ok(i) = self.find(held, *ino) else { return };
                i.set_flags(*flags);
                i.changed(*time);
            }
            Mutation::Inherit { made, ino, access, default } => {
                self.apply_held(made, held);
                let Ok(i) = self.find(held, *ino) else { return };
                self.xattrs_of(&i, |xattrs| {
                    set_xattr(xattrs, acl::ACCESS, access.as_deref());
                    set_xattr(xattrs, acl::DEFAULT, default.as_deref());
                });
            }
            Mutation::Forget { ino } => {
                if let Some(i) = self.inode(*ino).ok().filter(|i| i.is_dir()) {
                    self.freed_dirs.lock().add(i.attr());
                }
                self.drop_inode(*ino);
            }
        }
    }

    /// Changes `i`'s extended attributes with `change` (and notes which
    /// ACLs they then hold: see `Inode::note_acls`), and counts the
    /// bytes they gained or lost (see `usage`). O(its extended
    /// attributes).
    fn xattrs_of(&self, i: &Inode, change: impl FnOnce(&mut Vec<crate::inode::Xattr>)) {
        let mut m = i.meta.lock();
        let before = m.bytes();
        change(m.xattrs_mut());
        i.note_acls(m.xattrs());
        m.shed();
        let after = m.bytes();
        drop(m);
        self.usage.charge(0, after - before);
    }

    /// Applies a rename (see [`Renamed`]).
    fn renamed(&self, held: &[&Inode], r: &Renamed) {
        let Renamed { parent, ref name, ino, new_parent, ref new_name, victim, gone, exchange, time } = *r;
        let (Ok(p), Ok(np)) = (self.find(held, parent), self.find(held, new_parent)) else { return };
        let moved = self.find(held, ino).ok();
        let replaced = victim.and_then(|v| self.find(held, v).ok());
        if exchange {
            if let Some(v) = victim {
                self.upsert_entry(parent, name, v);
            }
            self.upsert_entry(new_parent, new_name, ino);
            if let Some(v) = &replaced {
                reparent(v, &np, &p);
                v.changed(time);
            }
        } else {
            let added = self.upsert_entry(new_parent, new_name, ino);
            self.remove_entry(&p, name, time);
            match &replaced {
                Some(v) => self.drop_link(&np, v, gone, time),
                None if added && victim.is_none() => {
                    np.dir().intent.add();
                }
                None => {}
            }
        }
        if let Some(m) = &moved {
            reparent(m, &p, &np);
            m.changed(time);
        }
        p.modified(time);
        np.modified(time);
    }

    /// A new inode, its number taken from the numbers still free.
    fn made(&self, ino: Ino, owner: Owner, meta: Meta, time: Nanos, parent: Ino) -> Arc<Inode> {
        // Read first: a live create's number is below it already, and a
        // write would pass the line between creators' cores.
        if self.next_ino.load(Relaxed) <= ino {
            self.next_ino.fetch_max(ino + 1, Relaxed);
        }
        Arc::new(Inode::new(ino, owner, meta, time, parent))
    }

    /// A new entry `name` → `ino` in `parent` (a directory if `dir`).
    fn add_entry(&self, held: &[&Inode], parent: Ino, name: &[u8], ino: Ino, dir: bool, time: Nanos) {
        let added = self.upsert_entry(parent, name, ino);
        if let Ok(p) = self.find(held, parent) {
            if added {
                p.dir().intent.add();
                if dir {
                    p.nlink.fetch_add(1, Relaxed);
                }
            }
            p.modified(time);
        }
    }

    /// Inode `ino`: from `held` if it is there, else from the table.
    pub(crate) fn find<'a>(&self, held: &[&'a Inode], ino: Ino) -> crate::errno::Result<Found<'a>> {
        match held.iter().find(|i| i.ino == ino) {
            Some(i) => Ok(Found::Held(i)),
            None => self.inode(ino).map(Found::Looked),
        }
    }

    /// Points entry `name` of `parent` at `ino`; whether it is new (then
    /// counted: see `usage`).
    fn upsert_entry(&self, parent: Ino, name: &[u8], ino: Ino) -> bool {
        let added = self.entries.upsert(self.key(parent, name), ino);
        if added {
            self.usage.charge(0, entry_bytes(name));
        }
        added
    }

    /// Entry `name` of directory `p` goes (if it is there).
    fn remove_entry(&self, p: &Inode, name: &[u8], time: Nanos) {
        if self.entries.remove(&self.key(p.ino, name)) {
            p.dir().intent.remove();
            self.usage.charge(0, -entry_bytes(name));
        }
        p.modified(time);
    }

    /// `victim` lost its name in `parent` at `time`: a directory is dead
    /// (and its `..` no longer links `parent`), anything else has one link
    /// fewer; then it is freed, or kept as an orphan, as the record says.
    fn drop_link(&self, parent: &Inode, victim: &Inode, gone: Gone, time: Nanos) {
        if let Some(d) = &victim.dir {
            d.dead.store(true, Relaxed);
            parent.nlink.fetch_sub(1, Relaxed);
            victim.nlink.store(0, Relaxed);
        } else {
            victim.nlink.fetch_sub(1, Relaxed);
        }
        victim.changed(time);
        match gone {
            Gone::Linked => {}
            Gone::Freed => {
                // Known as a freed directory before it is gone: a request
                // in between gets `ENOENT`, never `ESTALE`.
                if victim.is_dir() {
                    self.freed_dirs.lock().add(victim.attr());
                }
                self.drop_inode(victim.ino);
            }
            Gone::Orphaned => {
                victim.nlink.store(0, Relaxed);
                victim.orphan.store(true, Relaxed);
            }
        }
    }

    /// Recounts every link and entry count from the entries, points each
    /// directory at the directory that names it, frees inodes that
    /// nothing names and that are not orphans, and counts what the
    /// namespace holds again (see `usage`). Run after replay, before
    /// the namespace serves. O(n), over every core. Returns the entries whose inode does
    /// not exist (none, in a namespace that is not damaged): they are
    /// left in place for `fsck` to report.
    pub fn rebuild_counts(&self) -> Vec<(Ino, Vec<u8>, Ino)> {
        self.inodes.iter_sync(|_, i| {
            match &i.dir {
                Some(d) => {
                    i.nlink.store(2, Relaxed);
                    d.intent.clear();
                    d.dead.store(i.ino != ROOT, Relaxed);
                }
                None => i.nlink.store(0, Relaxed),
            }
            true
        });
        // The entries are counted in parallel, every core taking the
        // entries whose hash falls to it from a walk of them all (a walk
        // costs little beside the counting) and keeping its directories'
        // counts to itself until it is done: a core's share does not
        // depend on how the inodes are numbered, and no two cores take
        // turns with the line of a directory both count into.
        let parts = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8) as u64;
        let dangling = parking_lot::Mutex::new(Vec::new());
        let entry_bytes = std::sync::atomic::AtomicI64::new(0);
        std::thread::scope(|s| {
            for part in 0..parts {
                let (dangling, entry_bytes) = (&dangling, &entry_bytes);
                s.spawn(move || {
                    let guard = scc::Guard::new();
                    let mut dirs = foldhash::HashMap::<Ino, Option<Tally>>::default();
                    let mut bytes = 0;
                    for e in self.entries.iter(&guard) {
                        if e.hash % parts == part {
                            bytes += self::entry_bytes(e.name);
                            self.count_entry(&e, &mut dirs, dangling, &guard);
                            // Bounded: a tree of millions of directories
                            // would otherwise hold a count per directory
                            // on every core.
                            if dirs.len() >= TALLIES {
                                self.add_tallies(&mut dirs, &guard);
                            }
                        }
                    }
                    self.add_tallies(&mut dirs, &guard);
                    entry_bytes.fetch_add(bytes, Relaxed);
                });
            }
        });
        let dangling = dangling.into_inner();
        let (mut inodes, mut bytes) = (0, entry_bytes.into_inner());
        self.inodes.retain_sync(|_, i| {
            let named = match &i.dir {
                Some(d) => !d.dead.load(Relaxed),
                None => i.nlink.load(Relaxed) > 0,
            };
            if !named && i.is_dir() {
                i.nlink.store(0, Relaxed);
            }
            let kept = named || i.orphan.load(Relaxed);
            if kept {
                inodes += 1;
                bytes += i.bytes();
            }
            kept
        });
        self.usage.reset(inodes, bytes.max(0) as u64);
        dangling
    }

    /// Adds what a core counted into its directories, and forgets it.
    fn add_tallies(&self, dirs: &mut foldhash::HashMap<Ino, Option<Tally>>, guard: &scc::Guard) {
        for (ino, tally) in dirs.drain() {
            if let (Some(t), Ok(p)) = (tally, self.inode_in(ino, guard)) {
                if let Some(d) = &p.dir {
                    d.intent.add_n(t.entries);
                }
                p.nlink.fetch_add(t.subdirs, Relaxed);
            }
        }
    }

    /// One entry's share of [`rebuild_counts`](Namespace::rebuild_counts):
    /// its inode's counts, and its directory's in `dirs` (`None` for one
    /// that does not exist). The inodes are borrowed, not cloned: a clone
    /// writes a reference count.
    fn count_entry(
        &self,
        e: &Entry<'_>,
        dirs: &mut foldhash::HashMap<Ino, Option<Tally>>,
        dangling: &parking_lot::Mutex<Vec<(Ino, Vec<u8>, Ino)>>,
        guard: &scc::Guard,
    ) {
        let dir = dirs.entry(e.parent).or_insert_with(|| self.inode_in(e.parent, guard).ok().map(|_| Tally::default()));
        let (Some(dir), Ok(c)) = (dir, self.inode_in(e.ino, guard)) else {
            dangling.lock().push((e.parent, e.name.to_vec(), e.ino));
            return;
        };
        dir.entries += 1;
        match &c.dir {
            Some(d) => {
                dir.subdirs += 1;
                d.parent.store(e.parent, Relaxed);
                d.dead.store(false, Relaxed);
            }
            None => {
                c.nlink.fetch_add(1, Relaxed);
            }
        }
    }
}

/// The directories whose counts a core keeps to itself at most, while
/// rebuilding the counts, before it adds them in (~32 bytes each; a few
/// in unit tests, so that they add in many times).
const TALLIES: usize = if cfg!(test) { 4 } else { 1 << 16 };

/// What one core counted of a directory's entries while rebuilding the
/// counts.
#[derive(Default)]
struct Tally {
    entries: u64,
    /// Those that are directories: each one's `..` is a link to it.
    subdirs: u32,
}

/// What an entry named `name` is charged (see `usage`).
fn entry_bytes(name: &[u8]) -> i64 {
    usage::ENTRY + name.len() as i64
}

/// Moving a directory from `from` to `to` moves its `..` link.
fn reparent(i: &Inode, from: &Inode, to: &Inode) {
    if let Some(d) = &i.dir
        && from.ino != to.ino
    {
        d.parent.store(to.ino, Relaxed);
        from.nlink.fetch_sub(1, Relaxed);
        to.nlink.fetch_add(1, Relaxed);
    }
}

/// An inode [`Namespace::apply_held`] works on: one its caller holds, or
/// one looked up in the table.
pub(crate) enum Found<'a> {
    Held(&'a Inode),
    Looked(Arc<Inode>),
}

impl std::ops::Deref for Found<'_> {
    type Target = Inode;

    fn deref(&self) -> &Inode {
        match self {
            Found::Held(i) => i,
            Found::Looked(i) => i,
        }
    }
}

/// Sets extended attribute `name` to `value` (`None`: removes it).
/// O(xattrs).
fn set_xattr(xattrs: &mut Vec<crate::inode::Xattr>, name: &[u8], value: Option<&[u8]>) {
    match (xattrs.iter_mut().find(|(n, _)| **n == *name), value) {
        (Some((_, v)), Some(value)) => *v = value.into(),
        (None, Some(value)) => xattrs.push((name.into(), value.into())),
        (_, None) => xattrs.retain(|(n, _)| **n != *name),
    }
}

#[cfg(test)]
mod tests {
    use crate::mutation::Mutation;
    use crate::namespace::Namespace;
    use crate::types::{Cred, FileType, ROOT};

    fn create(perm: u32, time: i64) -> Mutation {
        Mutation::Create {
            parent: ROOT,
            name: b"f".to_vec(),
            ino: 9,
            kind: FileType::Regular,
            perm,
            uid: 0,
            gid: 0,
            rdev: 0,
            target: Vec::new(),
            time,
        }
    }

    /// Recounting from the entries gives every directory and file the
    /// links and size its live changes gave it, however many times each
    /// core adds in what it counted (every 4 directories here).
    #[test]
    fn a_recount_gives_the_counts_the_changes_gave() {
        let ns = Namespace::new(1, 0);
        let root = Cred::root();
        let new = |kind| crate::ops::NewInode { kind, perm: 0o755, rdev: 0, umask: 0 };
        let (mut dirs, mut all) = (vec![ROOT], vec![ROOT]);
        for i in 0..40u64 {
            let parent = dirs[(i * 7 % dirs.len() as u64) as usize];
            let name = format!("d{i}");
            let (d, _) = ns.create(&root, parent, name.as_bytes(), new(FileType::Directory), b"", 1).unwrap();
            dirs.push(d.ino);
            all.push(d.ino);
            for f in 0..i % 5 {
                let (a, _) =
                    ns.create(&root, d.ino, format!("f{f}").as_bytes(), new(FileType::Regular), b"", 1).unwrap();
                all.push(a.ino);
            }
        }
        let (f, _) = ns.create(&root, dirs[1], b"linked", new(FileType::Regular), b"", 1).unwrap();
        ns.link(&root, f.ino, dirs[2], b"again", 1).unwrap();
        all.push(f.ino);
        let counts = |ns: &Namespace| -> Vec<(u32, u64)> {
            all.iter().map(|&ino| ns.getattr(ino).map(|a| (a.nlink, a.size)).unwrap()).collect()
        };
        let live = counts(&ns);
        assert_eq!(ns.rebuild_counts(), vec![]);
        assert_eq!(counts(&ns), live);
    }

    /// Replay may apply a create over an image that already holds its
    /// inode: the record's inode takes the number's place, once.
    #[test]
    fn a_create_applied_over_its_inode_replaces_it() {
        let ns = Namespace::new(1, 0);
        ns.apply(&create(0o600, 1));
        ns.apply(&create(0o644, 2));
        let a = ns.lookup(&Cred::root(), ROOT, b"f").unwrap();
        assert_eq!((a.ino, a.perm, a.mtime), (9, 0o644, 2));
        assert_eq!(ns.inode_count(), 2);
    }
}
