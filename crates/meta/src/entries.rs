//! Every directory entry of the namespace, keyed by (directory, name
//! hash) in two concurrent structures: a hash table of slots and their
//! names, for look-ups, and an ordered index of the slots alone, for
//! listings in hash order with stable cookies. No lock for readers.
//!
//! Why two: a look-up is what a stat costs, and through the ordered
//! index alone it was a search of ~6 levels of nodes, most of them
//! cache misses at scale (18.5% of a server's CPU on stats at 300k
//! files); the table finds a slot in one bucket. Over loopback, 50
//! connections stat 11% faster (server CPU 5.4-6.1 µs a stat against
//! 6.0-6.2 at 100k files; 6.4-6.7 against 7.3-7.9 at 300k), the
//! engine's stats 2.4× as many. The cost is memory (the key twice:
//! 290 B of resident memory per file at 10M against 262) and a
//! restart's load, which fills the table and then the order sorted
//! (see [`Entries::loading`]). Both keys are 16 bytes, and the name
//! lives with the table's slot: with the name in the ordered key (40
//! bytes), a node's keys spanned ten cache lines and its searches were
//! 44% of a create's CPU.
//!
//! Two names of one directory whose 62-bit hashes meet (odds of 1 in
//! 10^13 for a pair in a directory of a million, the hash seeded so that
//! names cannot be crafted to meet) share a slot: its value then lists
//! both. Every change to a slot is made under its name's stripe lock
//! (`locks`), so a slot is changed by one writer at a time, and each
//! change replaces the value whole: readers see the old list or the new
//! one. A new slot enters the table before the order, and an emptied one
//! leaves the table first: a listing that meets a slot the table no
//! longer has lists nothing there (an entry that was not there
//! throughout).
//!
//! The order (`scc::TreeIndex`) seeks a range's start by looking for a
//! key at or below it and walking back leaf by leaf; when no key is at or
//! below the start, every internal node falls back to trying each of its
//! children, and each try walks back to the first leaf. A listing of the
//! root directory (ino 1, whose entries sort first) from its start cost
//! O(n²): 54 ms at 40k entries, a worker pinned for many minutes at 2M.
//! So the order always holds one sentinel slot below every real key
//! (directory 0, which no inode has), never removed, in no table: a
//! seek then finds a key at or below its start within one leaf, and a
//! range costs O(log n + k) as it should.
//!
//! Costs, for n entries and k returned: `get` O(1) expected, one probe
//! of the table; `upsert`, `remove` O(1) expected when the slot was and
//! stays taken (a name repointed, a meeting of hashes), O(log n) when it
//! is new or emptied (the order changes too); `range` O(log n + k), a
//! probe per slot listed; `iter` O(n), in no order.

use std::num::NonZeroU64;

use scc::{Guard, HashIndex, TreeIndex, hash_index};

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

/// A name's place in both structures: its directory and hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// The entries: their slots in key order for listings (with the
/// sentinel), their names by slot for look-ups.
pub(crate) struct Entries {
    order: TreeIndex<Slot, ()>,
    names: HashIndex<Slot, Names, foldhash::fast::RandomState>,
}

fn slot(key: &Key) -> Slot {
    Slot { parent: key.parent, hash: key.hash }
}

impl Entries {
    /// No entries (only the sentinel).
    pub fn new() -> Entries {
        let order = TreeIndex::new();
        let _ = order.insert_sync(Slot { parent: 0, hash: 0 }, ());
        Entries { order, names: HashIndex::default() }
    }

    /// What `key` names.
    pub fn get(&self, key: &Key) -> Option<Ino> {
        self.names.peek_with(&slot(key), |_, names| names.get(&key.name)).flatten()
    }

    /// Points `key` at `ino`, whether or not it is there; whether it is
    /// new. Called under the name's stripe lock: a new slot goes into the
    /// names first and the order after, so that a listing that meets it
    /// finds its names.
    pub fn upsert(&self, key: Key, ino: Ino) -> bool {
        let at = slot(&key);
        let added = self.name(key, ino);
        if added == Some(true) {
            let _ = self.order.insert_sync(at, ());
        }
        added.is_some()
    }

    /// Points `key` at `ino` among the names alone: `None` if the name
    /// was there, else whether its slot is new.
    fn name(&self, key: Key, ino: Ino) -> Option<bool> {
        debug_assert!(key.parent != 0, "directory 0 holds the sentinel");
        match self.names.entry_sync(slot(&key)) {
            hash_index::Entry::Vacant(v) => {
                v.insert_entry(Names::new(key.name, ino));
                Some(true)
            }
            hash_index::Entry::Occupied(mut o) => {
                let (changed, new) = o.get().with(&key.name, ino);
                o.update(changed);
                new.then_some(false)
            }
        }
    }

    /// A loader of entries given in no order (a checkpoint's): each goes
    /// into the names at once, and into the order, sorted, at
    /// [`Loading::finish`]. At 10M entries, a restart that inserted them
    /// into the order as they came took 43 s; sorted, 30 (same build).
    pub fn loading(&self) -> Loading<'_> {
        Loading { entries: self, slots: Vec::new(), reserved: None }
    }

    /// Removes `key`; whether it was there. Called under the name's
    /// stripe lock; an emptied slot leaves the table, then the order.
    pub fn remove(&self, key: &Key) -> bool {
        let hash_index::Entry::Occupied(mut o) = self.names.entry_sync(slot(key)) else {
            return false;
        };
        if o.get().get(&key.name).is_none() {
            return false;
        }
        match o.get().without(&key.name) {
            Some(rest) => o.update(rest),
            None => {
                o.remove_entry();
                self.order.remove_sync(&slot(key));
            }
        }
        true
    }

    /// The entries of directory `dir` whose hash is `from_hash` or more,
    /// in hash order.
    pub fn range<'t>(&'t self, dir: Ino, from_hash: u64, guard: &'t Guard) -> impl Iterator<Item = Entry<'t>> {
        let range = Slot { parent: dir, hash: from_hash }..Slot { parent: dir + 1, hash: 0 };
        // A slot emptied since the order gave it lists none.
        let named = |(at, ()): (&'t Slot, &())| self.names.peek(at, guard).map(|names| (at, names));
        self.order.range(range, guard).filter_map(named).flat_map(flatten)
    }

    /// Every entry, in no order: the names' table walked from its start
    /// (no look-up per slot). A walk while the table grows may meet a
    /// slot twice; a checkpoint's loading keeps the last it meets, and
    /// replay redoes every change after the checkpoint's start over it.
    pub fn iter<'t>(&'t self, guard: &'t Guard) -> impl Iterator<Item = Entry<'t>> {
        self.names.iter(guard).flat_map(flatten)
    }
}

/// Entries being loaded; see [`Entries::loading`].
pub(crate) struct Loading<'e> {
    entries: &'e Entries,
    /// The new slots, not yet in the order.
    slots: Vec<Slot>,
    reserved: Option<hash_index::Reserve<'e, Slot, Names, foldhash::fast::RandomState>>,
}

impl Loading<'_> {
    /// Makes room for `n` more entries at once, rather than doubling the
    /// names' table (and copying it) as they come.
    pub fn reserve(&mut self, n: usize) {
        self.slots.reserve(n);
        self.reserved = self.entries.names.reserve(n);
    }

    /// Points `key` at `ino`. O(1) expected.
    pub fn add(&mut self, key: Key, ino: Ino) {
        let at = slot(&key);
        if self.entries.name(key, ino) == Some(true) {
            self.slots.push(at);
        }
    }

    /// Puts the new slots in the order. O(s log s) for s slots.
    pub fn finish(mut self) {
        self.slots.sort_unstable();
        for at in self.slots {
            let _ = self.entries.order.insert_sync(at, ());
        }
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

    /// Every entry, in key order (a slot's names in the order added).
    fn all(e: &Entries) -> Vec<(Ino, u64, Vec<u8>, Ino)> {
        let mut all: Vec<_> = e.iter(&Guard::new()).map(|x| (x.parent, x.hash, x.name.to_vec(), x.ino)).collect();
        all.sort_by_key(|&(parent, hash, ..)| (parent, hash));
        all
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

    /// Every entry and every directory's listing from each hash are
    /// `listed`, in its order; a name not there is not found.
    fn listed_as(e: &Entries, listed: &[(Ino, u64, Vec<u8>, Ino)]) -> Result<(), TestCaseError> {
        prop_assert_eq!(all(e), listed.to_vec());
        for (p, h, n, i) in listed {
            prop_assert_eq!(e.get(&key(*p, *h, n)), Some(*i));
        }
        prop_assert_eq!(e.get(&hashed(1, b"e")), None);
        for dir in 1..3 {
            for from in 0..4 {
                let got: Vec<_> =
                    e.range(dir, from, &Guard::new()).map(|x| (x.parent, x.hash, x.name.to_vec(), x.ino)).collect();
                let want: Vec<_> = listed.iter().filter(|(p, h, ..)| *p == dir && *h >= from).cloned().collect();
                prop_assert_eq!(got, want);
            }
        }
        Ok(())
    }

    proptest! {
        /// Against a model (a sorted map of slots, each a list of names in
        /// the order added): every upsert and removal says what the model
        /// says, every name looks up as in the model, and the whole index
        /// and each directory's listing from every hash list what the
        /// model lists, in its order; and so does a loading of them in
        /// another order.
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
                listed_as(&e, &listed)?;
            }
            // The same entries loaded slots last first (a slot's names in
            // their order), as a checkpoint gives them in no order.
            let mut listed = all(&e);
            let loaded = Entries::new();
            let mut loading = loaded.loading();
            loading.reserve(listed.len());
            listed.sort_by_key(|&(p, h, ..)| std::cmp::Reverse((h, p)));
            for (p, h, n, i) in &listed {
                loading.add(key(*p, *h, n), *i);
            }
            loading.finish();
            listed_as(&loaded, &all(&e))?;
        }
    }
}
