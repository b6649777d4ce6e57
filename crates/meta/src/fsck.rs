//! The offline check of a store (`interlock fsck`): loads the checkpoint
//! and replays the journal without changing either, then checks what the
//! namespace is derived from. Link and entry counts are not stored (they
//! are recounted from the entries at every start), so they cannot
//! disagree with the entries; what can be damaged is the entries and the
//! inodes themselves:
//!
//! - an entry naming an inode that does not exist, or in a parent that
//!   is not a directory;
//! - a directory with more than one name (two parents);
//! - a directory that has a name but cannot be reached from the root (a
//!   cycle: it is, or is under, its own ancestor);
//! - an inode with no name that is not an orphan (leaked).
//!
//! Orphans (unlinked while open) are counted, not damage.
//!
//! Costs: O(inodes + entries + records since the checkpoint) time, and
//! the namespace's memory.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use interlock_journal::Error;

use crate::checkpoint;
use crate::mutation::{Gone, Mutation, Renamed};
use crate::namespace::Namespace;
use crate::record;
use crate::types::{Ino, ROOT};

/// One thing found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// The entry names an inode that does not exist.
    Dangling { parent: Ino, name: Vec<u8>, ino: Ino },
    /// The entry's parent does not exist or is not a directory.
    Homeless { parent: Ino, name: Vec<u8>, ino: Ino },
    /// A directory named more than once; `extra` are the names after the
    /// first.
    ManyParents { dir: Ino, extra: Vec<(Ino, Vec<u8>)> },
    /// A named directory the root does not reach; `at` is its name.
    Unreachable { dir: Ino, at: (Ino, Vec<u8>) },
    /// An inode nothing names that is not an orphan.
    Leaked { ino: Ino },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match self {
            Damage::Dangling { parent, name, ino } => {
                write!(f, "entry {:?} in directory {parent} names inode {ino}, which does not exist", n(name))
            }
            Damage::Homeless { parent, name, ino } => {
                write!(f, "entry {:?} (inode {ino}) is in {parent}, which is not a directory", n(name))
            }
            Damage::ManyParents { dir, extra } => {
                write!(f, "directory {dir} has {} names too many:", extra.len())?;
                for (p, name) in extra {
                    write!(f, " {:?} in {p}", n(name))?;
                }
                Ok(())
            }
            Damage::Unreachable { dir, at } => {
                write!(f, "directory {dir} ({:?} in {}) is not reachable from the root (a cycle)", n(&at.1), at.0)
            }
            Damage::Leaked { ino } => write!(f, "inode {ino} has no name and is not open (leaked)"),
        }
    }
}

/// What the check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub inodes: u64,
    pub directories: u64,
    pub entries: u64,
    pub orphans: u64,
    /// Replay started here, and this many records were replayed.
    pub start: u64,
    pub replayed: u64,
    pub damage: Vec<Damage>,
}

/// Checks the store in `dir`, changing nothing.
pub fn check_dir(dir: &Path) -> Result<Report, Error> {
    let Some(loaded) = checkpoint::load(dir)? else {
        return Err(Error::Invalid(format!("{}: no namespace checkpoint (meta.ckpt) here", dir.display())));
    };
    let ns = loaded.ns;
    let replayed = record::replay(&ns, dir, |apply| interlock_journal::read_dir(dir, loaded.start, apply))?;
    let mut report = ns.check();
    report.start = loaded.start;
    report.replayed = replayed;
    Ok(report)
}

impl Namespace {
    /// Checks the entries and inodes (see the module docs). O(n).
    pub fn check(&self) -> Report {
        let mut report = Report::default();
        let mut named: HashSet<Ino> = HashSet::new();
        let mut dir_names: HashMap<Ino, Vec<(Ino, Vec<u8>)>> = HashMap::new();
        let mut children: HashMap<Ino, Vec<Ino>> = HashMap::new();
        let guard = scc::Guard::new();
        for e in self.entries.iter(&guard) {
            let ino = e.ino;
            report.entries += 1;
            let at = (e.parent, e.name.to_vec());
            let Ok(child) = self.inode(ino) else {
                report.damage.push(Damage::Dangling { parent: at.0, name: at.1, ino });
                continue;
            };
            if !self.inode(e.parent).is_ok_and(|p| p.is_dir()) {
                report.damage.push(Damage::Homeless { parent: at.0, name: at.1, ino });
                continue;
            }
            named.insert(ino);
            if child.is_dir() {
                dir_names.entry(ino).or_default().push(at);
                children.entry(e.parent).or_default().push(ino);
            }
        }
        for (&dir, names) in &dir_names {
            if names.len() > 1 {
                report.damage.push(Damage::ManyParents { dir, extra: names[1..].to_vec() });
            }
        }
        let mut reached = HashSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(d) = todo.pop() {
            for &c in children.get(&d).into_iter().flatten() {
                if reached.insert(c) {
                    todo.push(c);
                }
            }
        }
        for (&dir, names) in &dir_names {
            if !reached.contains(&dir) {
                report.damage.push(Damage::Unreachable { dir, at: names[0].clone() });
            }
        }
        self.inodes.iter_sync(|&ino, i| {
            report.inodes += 1;
            if i.is_dir() {
                report.directories += 1;
            }
            if ino != ROOT && !named.contains(&ino) {
                if i.orphan.load(Relaxed) {
                    report.orphans += 1;
                } else {
                    report.damage.push(Damage::Leaked { ino });
                }
            }
            true
        });
        report
    }

    /// The records that repair `damage`: dangling and homeless entries and
    /// extra names removed, leaked inodes freed, each unreachable
    /// directory moved under `lost` (the caller's `lost+found`) as `#INO`.
    pub(crate) fn repairs(damage: &[Damage], lost: Ino, time: i64) -> Vec<Mutation> {
        let remove = |parent: Ino, name: &[u8], ino: Ino| Mutation::Remove {
            parent,
            name: name.to_vec(),
            ino,
            dir: false,
            gone: Gone::Linked,
            time,
        };
        let mut out = Vec::new();
        for d in damage {
            match d {
                Damage::Dangling { parent, name, ino } | Damage::Homeless { parent, name, ino } => {
                    out.push(remove(*parent, name, *ino))
                }
                Damage::ManyParents { dir, extra } => out.extend(extra.iter().map(|(p, n)| remove(*p, n, *dir))),
                Damage::Unreachable { dir, at } => out.push(Mutation::Rename(Renamed {
                    parent: at.0,
                    name: at.1.clone(),
                    ino: *dir,
                    new_parent: lost,
                    new_name: format!("#{dir}").into_bytes(),
                    victim: None,
                    gone: Gone::Linked,
                    exchange: false,
                    time,
                })),
                Damage::Leaked { ino } => out.push(Mutation::Forget { ino: *ino }),
            }
        }
        out
    }
}
