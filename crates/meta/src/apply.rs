//! Applying a [`Mutation`]: the one place the namespace changes. A live
//! operation checks, locks and applies; replay applies the journal's
//! records in order. Applying never fails: the record was checked when it
//! was made.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::inode::{Inode, Meta};
use crate::mutation::Mutation;
use crate::namespace::Namespace;
use crate::types::{FileType, Ino, Nanos};

impl Namespace {
    /// Applies `m`. Replay calls this on each journal record in order;
    /// live operations call it under their locks.
    pub fn apply(&self, m: &Mutation) {
        match m {
            Mutation::Create { parent, name, ino, kind, perm, uid, gid, rdev, target, time } => {
                self.next_ino.fetch_max(ino + 1, Relaxed);
                let meta = Meta {
                    perm: *perm,
                    uid: *uid,
                    gid: *gid,
                    atime: *time,
                    xattrs: Vec::new(),
                    target: target.as_slice().into(),
                };
                let inode = Arc::new(Inode::new(*ino, *kind, meta, *rdev, *time, *parent));
                let _ = self.inodes.insert_sync(*ino, inode);
                self.add_entry(*parent, name, *ino, *kind == FileType::Directory, *time);
            }
            Mutation::Link { parent, name, ino, time } => {
                if let Ok(i) = self.inode(*ino) {
                    i.nlink.fetch_add(1, Relaxed);
                    i.changed(*time);
                }
                self.add_entry(*parent, name, *ino, false, *time);
            }
            Mutation::Remove { parent, name, ino, time } => {
                let _ = self.entries.remove_sync(&self.key(*parent, name));
                let Ok(p) = self.inode(*parent) else { return };
                p.dir().entries.fetch_sub(1, Relaxed);
                p.modified(*time);
                let Ok(i) = self.inode(*ino) else { return };
                drop_link(&p, &i, *time);
                self.forget_if_unused(&i);
            }
            Mutation::Rename { parent, name, new_parent, new_name, exchange, time } => {
                self.rename_entries(*parent, name, *new_parent, new_name, *exchange, *time);
            }
            Mutation::SetAttr { ino, perm, uid, gid, size, atime, mtime, ctime } => {
                let Ok(i) = self.inode(*ino) else { return };
                {
                    let mut m = i.meta.lock();
                    if let Some(p) = perm {
                        m.perm = *p;
                    }
                    if let Some(u) = uid {
                        m.uid = *u;
                    }
                    if let Some(g) = gid {
                        m.gid = *g;
                    }
                    if let Some(a) = atime {
                        m.atime = *a;
                    }
                }
                if let Some(s) = size {
                    i.size.store(*s, Relaxed);
                }
                if let Some(t) = mtime {
                    i.mtime.store(*t, Relaxed);
                }
                i.ctime.store(*ctime, Relaxed);
            }
            Mutation::SetXattr { ino, name, value, time } => {
                let Ok(i) = self.inode(*ino) else { return };
                {
                    let mut m = i.meta.lock();
                    match m.xattrs.iter_mut().find(|(n, _)| **n == **name) {
                        Some((_, v)) => *v = value.as_slice().into(),
                        None => m.xattrs.push((name.as_slice().into(), value.as_slice().into())),
                    }
                }
                i.changed(*time);
            }
            Mutation::RemoveXattr { ino, name, time } => {
                let Ok(i) = self.inode(*ino) else { return };
                i.meta.lock().xattrs.retain(|(n, _)| **n != **name);
                i.changed(*time);
            }
            Mutation::Forget { ino } => {
                let _ = self.inodes.remove_sync(ino);
            }
        }
    }

    /// A new entry `name` → `ino` in `parent` (a directory if `dir`).
    fn add_entry(&self, parent: Ino, name: &[u8], ino: Ino, dir: bool, time: Nanos) {
        let _ = self.entries.insert_sync(self.key(parent, name), ino);
        if let Ok(p) = self.inode(parent) {
            p.dir().entries.fetch_add(1, Relaxed);
            if dir {
                p.nlink.fetch_add(1, Relaxed);
            }
            p.modified(time);
        }
    }

    /// An inode with no names and no open handles goes.
    pub(crate) fn forget_if_unused(&self, i: &Inode) {
        if i.nlink.load(Relaxed) == 0 && i.opens.load(Relaxed) == 0 {
            let _ = self.inodes.remove_sync(&i.ino);
        }
    }

    fn rename_entries(&self, parent: Ino, name: &[u8], new_parent: Ino, new_name: &[u8], exchange: bool, time: Nanos) {
        let (Some(moved), Ok(p), Ok(np)) = (self.child(parent, name), self.inode(parent), self.inode(new_parent))
        else {
            return;
        };
        let Ok(m) = self.inode(moved) else { return };
        let victim = self.child(new_parent, new_name).and_then(|v| self.inode(v).ok());
        // Moving a directory to another parent moves its `..` link.
        let reparent = |i: &Inode, from: &Inode, to: &Inode| {
            if let Some(d) = &i.dir
                && from.ino != to.ino
            {
                d.parent.store(to.ino, Relaxed);
                from.nlink.fetch_sub(1, Relaxed);
                to.nlink.fetch_add(1, Relaxed);
            }
        };
        if exchange {
            let Some(v) = victim else { return };
            self.entries.upsert_sync(self.key(parent, name), v.ino);
            self.entries.upsert_sync(self.key(new_parent, new_name), m.ino);
            reparent(&m, &p, &np);
            reparent(&v, &np, &p);
            v.changed(time);
        } else {
            self.entries.upsert_sync(self.key(new_parent, new_name), m.ino);
            let _ = self.entries.remove_sync(&self.key(parent, name));
            p.dir().entries.fetch_sub(1, Relaxed);
            match &victim {
                Some(v) => drop_link(&np, v, time),
                None => {
                    np.dir().entries.fetch_add(1, Relaxed);
                }
            }
            reparent(&m, &p, &np);
            if let Some(v) = &victim {
                self.forget_if_unused(v);
            }
        }
        m.changed(time);
        p.modified(time);
        np.modified(time);
    }
}

/// `victim` lost its name in `parent` at `time`: a directory is dead (and
/// its `..` no longer links `parent`), anything else has one link fewer.
fn drop_link(parent: &Inode, victim: &Inode, time: Nanos) {
    if let Some(d) = &victim.dir {
        d.dead.store(true, Relaxed);
        parent.nlink.fetch_sub(1, Relaxed);
        victim.nlink.store(0, Relaxed);
    } else {
        victim.nlink.fetch_sub(1, Relaxed);
    }
    victim.changed(time);
}
