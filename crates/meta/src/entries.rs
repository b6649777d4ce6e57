//! Every directory entry of the namespace in one ordered, concurrent index
//! keyed by (directory, name hash): lookups and listings in hash order
//! with stable cookies, no lock for readers.
//!
//! The key is 16 bytes and the name lives in the value. With the name in
//! the key (40 bytes, names up to 16 bytes inline), a node's keys spanned
//! ten cache lines and the index's searches were 44% of a create's CPU;
//! a search compares keys only, and now reads a quarter of the lines.
//! Two names of one directory whose 62-bit hashes meet (odds of 1 in
//! 10^13 for a pair in a directory of a million, the hash seeded so that
//! names cannot be crafted to meet) share a slot: its value then lists
//! both. Every change to a slot is made under its name's stripe lock
//! (`locks`), so a slot's value is rewritten by one writer at a time, and
//! each rewrite replaces the value whole: readers see the old list or
//! the new one.
//!
//! The index (`scc::TreeIndex`) seeks a range's start by looking for a
//! key at or below it and walking back leaf by leaf; when no key is at or
//! below the start, every internal node falls back to trying each of its
//! children, and each try walks back to the first leaf. A listing of the
//! root directory (ino 1, whose entries sort first) from its start cost
//! O(n²): 54 ms at 40k entries, a worker pinned for many minutes at 2M.
//! So the index always holds one sentinel slot below every real key
//! (directory 0, which no inode has), never removed, holding no name: a
//! seek then finds a key at or below its start within one leaf, and a
//! range costs O(log n + k) as it should.
//!
//! Costs, for n entries and k returned: `get`, `upsert`, `remove`
//! O(log n), one search of the index (two more when the slot is taken:
//! an `upsert` over a name, a meeting of hashes); `range` O(log n + k);
//! `iter` O(n).

use std::num::NonZeroU64;

use scc::{Guard, TreeIndex};

use crate::types::Ino;

/// An entry's key as callers name it: a directory, the name's hash, the
/// name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub parent: Ino,
    pub hash: u64,
    pub name: Name,
}

/// An entry's name: up to 16 bytes inline (most names), longer ones on
/// the heap; 24 bytes either way, and no allocation of its own for short
/// names (at 10M entries, 32 bytes each saved).
pub(crate) type Name = smallvec::SmallVec<[u8; 16]>;

/// Where the index keeps a name: its directory and hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Slot {
    parent: Ino,
    hash: u64,
}

/// The names a slot holds: almost always one (32 bytes with its inode: a
/// list takes the niche of a zero inode number, which no entry has).
#[derive(Clone, Debug)]
enum Names {
    One(Name, NonZeroU64),
    /// Names whose hashes meet, or one entry naming inode 0 (only a
    /// damaged store has one; `fsck` reports it). Empty for the sentinel.
    Many(Box<[(Name, Ino)]>),
}

const _: () = assert!(std::mem::size_of::<Names>() == 32);

impl Names {
    fn new(name: Name, ino: Ino) -> Names {
        match NonZeroU64::new(ino) {
            Some(ino) => Names::One(name, ino),
            None => Names::Many(Box::new([(name, ino)])),
        }
    }

    /// Each (name, inode), in the order added.
    fn iter(&self) -> impl Iterator<Item = (&[u8], Ino)> {
        let (one, many) = match self {
            Names::One(name, ino) => (Some((&name[..], ino.get())), &[][..]),
            Names::Many(list) => (None, &list[..]),
        };
        one.into_iter().chain(many.iter().map(|(name, ino)| (&name[..], *ino)))
    }

    fn get(&self, name: &[u8]) -> Option<Ino> {
        match self {
            // Every look-up: no iterator to build.
            Names::One(n, ino) => (n[..] == *name).then_some(ino.get()),
            Names::Many(_) => self.iter().find(|&(n, _)| n == name).map(|(_, ino)| ino),
        }
    }

    /// The first name (the only one, but for damage or a meeting of
    /// hashes).
    fn first(&self) -> &[u8] {
        self.iter().next().map_or(&[], |(n, _)| n)
    }

    /// These names with `name` pointing at `ino` (in its place if it is
    /// there, last if not), and whether it is new.
    fn with(&self, name: &[u8], ino: Ino) -> (Names, bool) {
        let mut list = self.list();
        let new = match list.iter_mut().find(|(n, _)| n[..] == *name) {
            Some(held) => {
                held.1 = ino;
                false
            }
            None => {
                list.push((Name::from_slice(name), ino));
                true
            }
        };
        (Names::of(list).expect("a name added"), new)
    }

    /// These names but `name`; none if it was the only one.
    fn without(&self, name: &[u8]) -> Option<Names> {
        let mut list = self.list();
        list.retain(|(n, _)| n[..] != *name);
        Names::of(list)
    }

    /// `list` as a slot's value, compact when it holds one name.
    fn of(mut list: Vec<(Name, Ino)>) -> Option<Names> {
        match list.len() {
            0 => None,
            1 => list.pop().map(|(n, i)| Names::new(n, i)),
            _ => Some(Names::Many(list.into_boxed_slice())),
        }
    }

    fn list(&self) -> Vec<(Name, Ino)> {
        self.iter().map(|(n, i)| (Name::from_slice(n), i)).collect()
    }
}

/// An entry as listings show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry<'t> {
    pub parent: Ino,
    pub hash: u64,
    pub name: &'t [u8],
    pub ino: Ino,
}

/// The entries, with the sentinel.
pub(crate) struct Entries {
    index: TreeIndex<Slot, Names>,
}

fn slot(key: &Key) -> Slot {
    Slot { parent: key.parent, hash: key.hash }
}

impl Entries {
    /// No entries (only the sentinel).
    pub fn new() -> Entries {
        let index = TreeIndex::new();
        let _ = index.insert_sync(Slot { parent: 0, hash: 0 }, Names::Many(Box::new([])));
        Entries { index }
    }

    /// What `key` names.
    pub fn get(&self, key: &Key) -> Option<Ino> {
        self.index.peek_with(&slot(key), |_, names| names.get(&key.name)).flatten()
    }

    /// Points `key` at `ino`, whether or not it is there; whether it is
    /// new. One search when no name of its hash is there; three when one
    /// is (this name, or another of its hash).
    pub fn upsert(&self, key: Key, ino: Ino) -> bool {
        debug_assert!(key.parent != 0, "directory 0 holds the sentinel");
        let at = slot(&key);
        let mut names = Names::new(key.name, ino);
        loop {
            match self.index.insert_sync(at, names) {
                Ok(()) => return true,
                Err((_, back)) => names = back,
            }
            let name = names.first();
            let changed = self.index.peek_with(&at, |_, held| held.with(name, ino));
            // Emptied meanwhile: try again.
            if let Some((changed, new)) = changed {
                self.index.upsert_sync(at, changed);
                return new;
            }
        }
    }

    /// Removes `key`; whether it was there.
    pub fn remove(&self, key: &Key) -> bool {
        if key.parent == 0 {
            return false;
        }
        let at = slot(key);
        let alone = |names: &Names| matches!(names, Names::One(n, _) if n[..] == key.name[..]);
        if self.index.remove_if_sync(&at, alone) {
            return true;
        }
        // Not there, or sharing its slot: rare. What stays of the slot
        // if the name is in it.
        let rest = self.index.peek_with(&at, |_, names| names.get(&key.name).map(|_| names.without(&key.name)));
        match rest.flatten() {
            None => false,
            Some(Some(rest)) => {
                self.index.upsert_sync(at, rest);
                true
            }
            Some(None) => self.index.remove_sync(&at),
        }
    }

    /// The entries of directory `dir` whose hash is `from_hash` or more,
    /// in hash order.
    pub fn range<'t>(&'t self, dir: Ino, from_hash: u64, guard: &'t Guard) -> impl Iterator<Item = Entry<'t>> {
        let range = Slot { parent: dir, hash: from_hash }..Slot { parent: dir + 1, hash: 0 };
        self.index.range(range, guard).flat_map(flatten)
    }

    /// Every entry, in key order.
    pub fn iter<'t>(&'t self, guard: &'t Guard) -> impl Iterator<Item = Entry<'t>> {
        self.index.iter(guard).flat_map(flatten)
    }
}

/// A slot's entries.
fn flatten<'t>((slot, names): (&'t Slot, &'t Names)) -> impl Iterator<Item = Entry<'t>> {
    names.iter().map(move |(name, ino)| Entry { parent: slot.parent, hash: slot.hash, name, ino })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn key(parent: Ino, hash: u64, name: &[u8]) -> Key {
        Key { parent, hash, name: Name::from_slice(name) }
    }

    fn all(e: &Entries) -> Vec<(Ino, u64, Vec<u8>, Ino)> {
        e.iter(&Guard::new()).map(|x| (x.parent, x.hash, x.name.to_vec(), x.ino)).collect()
    }

    #[test]
    fn the_sentinel_is_neither_listed_nor_removable() {
        let e = Entries::new();
        assert_eq!(all(&e), vec![]);
        assert!(!e.remove(&key(0, 0, b"")));
        e.upsert(key(1, 5, b"x"), 7);
        assert_eq!(all(&e), vec![(1, 5, b"x".to_vec(), 7)]);
        assert_eq!(e.range(1, 0, &Guard::new()).map(|x| x.ino).collect::<Vec<_>>(), vec![7]);
    }

    /// Names whose hashes meet share a slot and behave as any others:
    /// each is added, found, repointed in its place, listed (under the one
    /// cookie) and removed alone; inode 0 is kept as given.
    #[test]
    fn names_that_share_a_hash_share_a_slot() {
        let e = Entries::new();
        assert!(e.upsert(key(2, 9, b"a"), 10));
        assert!(e.upsert(key(2, 9, b"b"), 11));
        assert!(e.upsert(key(2, 9, b"c"), 0));
        assert!(!e.upsert(key(2, 9, b"b"), 13));
        assert_eq!(
            (e.get(&key(2, 9, b"a")), e.get(&key(2, 9, b"b")), e.get(&key(2, 9, b"c"))),
            (Some(10), Some(13), Some(0))
        );
        assert_eq!(e.get(&key(2, 9, b"d")), None);
        assert_eq!(all(&e), vec![(2, 9, b"a".to_vec(), 10), (2, 9, b"b".to_vec(), 13), (2, 9, b"c".to_vec(), 0)]);
        assert!(!e.remove(&key(2, 9, b"d")));
        assert!(e.remove(&key(2, 9, b"a")));
        assert!(!e.remove(&key(2, 9, b"a")));
        assert_eq!(all(&e), vec![(2, 9, b"b".to_vec(), 13), (2, 9, b"c".to_vec(), 0)]);
        assert!(e.remove(&key(2, 9, b"c")));
        assert_eq!(all(&e), vec![(2, 9, b"b".to_vec(), 13)]);
        assert!(e.remove(&key(2, 9, b"b")));
        assert_eq!(all(&e), vec![]);
        // A lone name is not removed by another name of its hash, and is
        // pointed elsewhere in place.
        assert!(e.upsert(key(2, 9, b"a"), 10));
        assert!(!e.remove(&key(2, 9, b"b")));
        assert_eq!(e.get(&key(2, 9, b"a")), Some(10));
        assert!(!e.upsert(key(2, 9, b"a"), 14));
        assert_eq!(all(&e), vec![(2, 9, b"a".to_vec(), 14)]);
    }

    /// Slots, each its names in the order added.
    type Model = BTreeMap<(Ino, u64), Vec<(Vec<u8>, Ino)>>;

    #[derive(Clone, Debug)]
    enum Op {
        Upsert(Ino, Vec<u8>, Ino),
        Remove(Ino, Vec<u8>),
    }

    /// Names over a small alphabet hashing into three values, so that most
    /// slots are shared.
    fn op() -> impl Strategy<Value = Op> {
        let name = prop::collection::vec(b'a'..b'e', 1..3);
        prop_oneof![
            (1..3u64, name.clone(), 0..4u64).prop_map(|(p, n, i)| Op::Upsert(p, n, i)),
            (1..3u64, name).prop_map(|(p, n)| Op::Remove(p, n)),
        ]
    }

    fn hashed(parent: Ino, name: &[u8]) -> Key {
        key(parent, u64::from(name[0]) % 3, name)
    }

    proptest! {
        /// Against a model (a sorted map of slots, each a list of names in
        /// the order added): every upsert and removal says what the model
        /// says, every name looks up as in the model, and the whole index
        /// and each directory's listing from every hash list what the
        /// model lists, in its order.
        #[test]
        fn entries_behave_as_a_map_of_slots(ops in prop::collection::vec(op(), 1..60)) {
            let e = Entries::new();
            let mut model = Model::new();
            for op in ops {
                match op {
                    Op::Upsert(p, n, i) => {
                        let k = hashed(p, &n);
                        let slot = model.entry((p, k.hash)).or_default();
                        let new = match slot.iter_mut().find(|(m, _)| *m == n) {
                            Some(held) => { held.1 = i; false }
                            None => { slot.push((n, i)); true }
                        };
                        prop_assert_eq!(e.upsert(k, i), new);
                    }
                    Op::Remove(p, n) => {
                        let k = hashed(p, &n);
                        let slot = model.entry((p, k.hash)).or_default();
                        let was = slot.iter().position(|(m, _)| *m == n).map(|at| slot.remove(at)).is_some();
                        model.retain(|_, s| !s.is_empty());
                        prop_assert_eq!(e.remove(&k), was);
                    }
                }
                let listed: Vec<_> = model
                    .iter()
                    .flat_map(|(&(p, h), s)| s.iter().map(move |(n, i)| (p, h, n.clone(), *i)))
                    .collect();
                prop_assert_eq!(all(&e), listed.clone());
                for (p, h, n, i) in &listed {
                    prop_assert_eq!(e.get(&key(*p, *h, n)), Some(*i));
                }
                prop_assert_eq!(e.get(&hashed(1, b"e")), None);
                for dir in 1..3 {
                    for from in 0..4 {
                        let got: Vec<_> = e.range(dir, from, &Guard::new()).map(|x| (x.parent, x.hash, x.name.to_vec(), x.ino)).collect();
                        let want: Vec<_> = listed.iter().filter(|(p, h, ..)| *p == dir && *h >= from).cloned().collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }
}
