//! What the store tests share: a namespace's whole state as comparable
//! data, read through the public API.

#![allow(dead_code)]

use interlock_meta::{Attr, Cred, FileType, Ino, Namespace, ROOT};

/// How many cases a property test runs: `default`, or what
/// `PROPTEST_CASES` says (for a long run, or a short one).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One inode as seen through a path: its attributes, attribute flags
/// (`chattr`'s; 0 for an inode that has none), sorted xattrs and, for a
/// symlink, its target.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    pub path: Vec<u8>,
    pub attr: Attr,
    pub flags: u32,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub target: Vec<u8>,
}

fn seen(ns: &Namespace, path: Vec<u8>, attr: Attr) -> Seen {
    let root = Cred::root();
    let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = ns
        .listxattr(&root, attr.ino)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = ns.getxattr(&root, attr.ino, &n).unwrap();
            (n, v)
        })
        .collect();
    xattrs.sort();
    let target = if attr.kind == FileType::Symlink { ns.readlink(attr.ino).unwrap() } else { Vec::new() };
    let flags = ns.flags(attr.ino).unwrap_or(0);
    Seen { path, attr, flags, xattrs, target }
}

/// Every inode reachable from the root, by path, in path order; then the
/// inodes in `extra` (orphans a test holds open) under `#INO`.
pub fn dump(ns: &Namespace, extra: &[Ino]) -> Vec<Seen> {
    let root = Cred::root();
    let mut out = vec![seen(ns, b"/".to_vec(), ns.getattr(ROOT).unwrap())];
    let mut todo = vec![(ROOT, b"/".to_vec())];
    while let Some((dir, path)) = todo.pop() {
        let mut cookie = 0;
        loop {
            let batch = ns.readdirplus(&root, dir, cookie, 100).unwrap();
            let Some(last) = batch.last() else { break };
            cookie = last.0.cookie;
            for (e, a) in batch {
                let a = a.expect("nothing is removed while a test dumps");
                let mut p = path.clone();
                p.extend_from_slice(&e.name);
                if a.kind == FileType::Directory {
                    let mut d = p.clone();
                    d.push(b'/');
                    todo.push((a.ino, d));
                }
                out.push(seen(ns, p, a));
            }
        }
    }
    for &ino in extra {
        if let Ok(a) = ns.getattr(ino) {
            out.push(seen(ns, format!("#{ino}").into_bytes(), a));
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// A POSIX ACL in the extended-attribute form `setfacl` sends, from its
/// short text form: `u::rw,u:1000:rwx,g::r,g:20:w,m::rwx,o::`, entries in
/// the order given (an id, or none for the owner's, the owning group's,
/// the mask and the others').
pub fn acl(text: &str) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for entry in text.split(',').filter(|e| !e.is_empty()) {
        let mut parts = entry.split(':');
        let (kind, id, perm) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let tag: u16 = match (kind, id.is_empty()) {
            ("u", true) => 0x01,
            ("u", false) => 0x02,
            ("g", true) => 0x04,
            ("g", false) => 0x08,
            ("m", _) => 0x10,
            ("o", _) => 0x20,
            _ => panic!("ACL entry {entry:?}"),
        };
        let bits: u16 = perm
            .chars()
            .map(|c| match c {
                'r' => 4,
                'w' => 2,
                'x' => 1,
                _ => panic!("ACL permission {perm:?}"),
            })
            .sum();
        let id = if id.is_empty() { u32::MAX } else { id.parse().unwrap() };
        out.extend([tag.to_le_bytes().as_slice(), &bits.to_le_bytes(), &id.to_le_bytes()].concat());
    }
    out
}
