//! A namespace record as the journal holds it, and what the changelog
//! shows of it. The journal's record *is* the changelog's (seed 001:
//! Lustre writes both, and its creates fell from 155k/s to 62k/s): a
//! consumer reads the [`Mutation`] through [`project`], which names it
//! with Lustre's record type (`01CREAT`, `06UNLNK`, `08RENME`, …) and
//! fields.

use std::cell::Cell;
use std::path::Path;

use interlock_journal::Error;
use interlock_journal::changelog::{Record, RecordType, RenameSource};
use serde::{Deserialize, Serialize};

use crate::mutation::{Gone, Mutation, Renamed};
use crate::namespace::Namespace;
use crate::replies::{Tag, TagImage};
use crate::types::{Cred, FileType, Nanos};

/// Lustre's `CLF_UNLINK_LAST` (and `CLF_RENAME_LAST`): the removal took
/// the inode's last name.
pub const FLAG_LAST: u32 = 1;

/// A journal record: the change and who made it.
#[derive(Serialize)]
struct Logged<'a> {
    uid: u32,
    gid: u32,
    m: &'a Mutation,
}

/// [`Logged`], read back, with the tag it ends with if the change was
/// asked for by a client that may ask again (see `replies`).
pub(crate) struct Read {
    pub uid: u32,
    pub gid: u32,
    pub m: Mutation,
    pub tag: Option<Tag>,
}

/// [`Logged`]'s fields, as decoded.
#[derive(Deserialize)]
struct Fields {
    uid: u32,
    gid: u32,
    m: Mutation,
}

/// Hands the journal bytes of `m`, made by `cred` (followed by `tag`, if
/// any: a record without one, as every record was before session 36,
/// simply ends sooner), to `with` (the journal's append, which copies
/// them). They are encoded into a buffer
/// each thread keeps from record to record: a fresh vector grown by the
/// encoder cost an allocation and three or four reallocations per
/// record, and the holes they left scattered the inodes allocated
/// between them, so every later look-up missed the cache more (two
/// creators in the engine: 13% more creates per second with this
/// alone). A buffer grown past 128 KiB (a large extended attribute) is
/// not kept. O(record).
pub(crate) fn encoded<R>(cred: &Cred, m: &Mutation, tag: Option<Tag>, with: impl FnOnce(&[u8]) -> R) -> R {
    thread_local!(static BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) });
    let mut buf = BUF.take();
    buf.clear();
    let mut buf = postcard::to_extend(&Logged { uid: cred.uid, gid: cred.gid, m }, buf).expect("records serialize");
    if let Some(t) = tag {
        buf = postcard::to_extend(&TagImage::from(t), buf).expect("tags serialize");
    }
    let r = with(&buf);
    if buf.capacity() <= KEPT_BUFFER {
        BUF.set(buf);
    }
    r
}

/// The largest encoding buffer a thread keeps between records.
const KEPT_BUFFER: usize = 128 << 10;

pub(crate) fn decode(bytes: &[u8]) -> Result<Read, Error> {
    let bad = |e: postcard::Error| Error::Invalid(format!("not a namespace record: {e}"));
    let (Fields { uid, gid, m }, rest) = postcard::take_from_bytes(bytes).map_err(bad)?;
    let tag = if rest.is_empty() { None } else { Some(postcard::from_bytes::<TagImage>(rest).map_err(bad)?.into()) };
    Ok(Read { uid, gid, m, tag })
}

/// Applies to `ns`, in order, every record that `read` hands to the
/// function it is given (a journal's read from the replay start); the
/// number applied. A record that does not decode is corruption of the
/// store in `dir`. O(records).
pub(crate) fn replay(
    ns: &Namespace,
    dir: &Path,
    read: impl FnOnce(&mut dyn FnMut(u64, &[u8])) -> Result<usize, Error>,
) -> Result<u64, Error> {
    let mut replayed = 0;
    let mut bad = None;
    read(&mut |index, bytes| {
        if bad.is_some() {
            return;
        }
        match decode(bytes) {
            Ok(r) => {
                ns.apply(&r.m);
                if let Some(tag) = r.tag {
                    ns.replies.note(tag, r.m.ino());
                }
                replayed += 1;
            }
            Err(e) => bad = Some(format!("record {index}: {e}")),
        }
    })?;
    match bad {
        Some(what) => Err(Error::Corrupt { path: dir.to_path_buf(), offset: 0, what }),
        None => Ok(replayed),
    }
}

/// The changelog record a journal record stands for (`None` for
/// [`Mutation::Forget`], which consumers do not see: the removal that
/// orphaned the inode was their event). A
/// [`Projection`](interlock_journal::changelog::Projection).
pub fn project(bytes: &[u8]) -> Result<Option<Record>, Error> {
    let Read { uid, gid, m, .. } = decode(bytes)?;
    // The decoded names move into the record, not copied: a follower
    // decodes every record.
    let record = |rtype, time: Nanos, target, parent, name: Vec<u8>| Record {
        rtype,
        flags: 0,
        time_ns: time.max(0) as u64,
        target,
        parent,
        name,
        source: None,
        uid,
        gid,
        jobid: None,
    };
    let last = |gone: Gone| if gone == Gone::Linked { 0 } else { FLAG_LAST };
    // A new inode with inherited ACLs is its create's record.
    let m = match m {
        Mutation::Inherit { made, .. } => *made,
        m => m,
    };
    Ok(Some(match m {
        Mutation::Create { parent, name, ino, kind, time, .. } => {
            let t = match kind {
                FileType::Regular => RecordType::CREAT,
                FileType::Directory => RecordType::MKDIR,
                FileType::Symlink => RecordType::SLINK,
                _ => RecordType::MKNOD,
            };
            record(t, time, ino, parent, name)
        }
        Mutation::Link { parent, name, ino, time } => record(RecordType::HLINK, time, ino, parent, name),
        Mutation::Remove { parent, name, ino, gone, dir, time } => {
            let t = if dir { RecordType::RMDIR } else { RecordType::UNLNK };
            Record { flags: last(gone), ..record(t, time, ino, parent, name) }
        }
        // A whiteout left at the old name is not shown: it is the
        // rename's, as an overlay file system's upper layer makes it.
        Mutation::Rename(Renamed { parent, name, ino, new_parent, new_name, victim, gone, time, .. })
        | Mutation::RenameWhiteout {
            rename: Renamed { parent, name, ino, new_parent, new_name, victim, gone, time, .. },
            ..
        } => Record {
            flags: last(gone),
            source: Some(RenameSource { parent, name, target: ino }),
            ..record(RecordType::RENME, time, victim.unwrap_or(0), new_parent, new_name)
        },
        Mutation::SetAttr { ino, perm, uid: u, gid: g, size, atime, mtime, ctime } => {
            let t = if size.is_some() {
                RecordType::TRUNC
            } else if perm.is_some() || u.is_some() || g.is_some() {
                RecordType::SATTR
            } else if mtime.is_some() {
                RecordType::MTIME
            } else if atime.is_some() {
                RecordType::ATIME
            } else {
                RecordType::CTIME
            };
            record(t, ctime, ino, 0, Vec::new())
        }
        Mutation::Write { ino, time, .. } => record(RecordType::MTIME, time, ino, 0, Vec::new()),
        Mutation::SetXattr { ino, name, time, .. } | Mutation::RemoveXattr { ino, name, time } => {
            record(RecordType::XATTR, time, ino, 0, name)
        }
        Mutation::SetAcl { ino, time, .. } => record(RecordType::XATTR, time, ino, 0, crate::acl::ACCESS.to_vec()),
        // As Lustre records a `chattr`: an attribute change.
        Mutation::SetFlags { ino, time, .. } => record(RecordType::SATTR, time, ino, 0, Vec::new()),
        // Made with no name: the name a link gives it later comes as an
        // `HLINK`.
        Mutation::Tmpfile { parent, ino, time, .. } => record(RecordType::CREAT, time, ino, parent, Vec::new()),
        // Not made: an inheritance is never nested.
        Mutation::Forget { .. } | Mutation::Inherit { .. } => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xattr(len: usize) -> Mutation {
        Mutation::SetXattr { ino: 5, name: b"user.a".to_vec(), value: vec![7; len], time: 9 }
    }

    /// Each record's bytes are its own, whatever the thread's buffer held
    /// before (a long record, then a short one, then one too long to keep),
    /// and read back as what was written.
    #[test]
    fn each_record_is_encoded_afresh_in_the_reused_buffer() {
        let cred = Cred { uid: 3, gid: 4, groups: vec![] };
        for m in [xattr(1000), xattr(1), xattr(KEPT_BUFFER + 1), xattr(2)] {
            let bytes = encoded(&cred, &m, None, <[u8]>::to_vec);
            let alone = postcard::to_stdvec(&Logged { uid: 3, gid: 4, m: &m }).unwrap();
            assert_eq!(bytes, alone);
            let back = decode(&bytes).unwrap();
            assert_eq!((back.uid, back.gid, back.m, back.tag), (3, 4, m, None));
        }
    }

    /// A tagged record reads back with its tag and projects as the same
    /// changelog record as an untagged one.
    #[test]
    fn a_tag_rides_at_the_end_of_its_record() {
        let cred = Cred { uid: 3, gid: 4, groups: vec![] };
        let m = Mutation::Remove { parent: 1, name: b"a".to_vec(), ino: 9, dir: false, gone: Gone::Freed, time: 5 };
        let tag = Tag { origin: 0xfeed_beef_dead_f00d, id: 1000, settled: 998 };
        let tagged = encoded(&cred, &m, Some(tag), <[u8]>::to_vec);
        let plain = encoded(&cred, &m, None, <[u8]>::to_vec);
        assert!(tagged.starts_with(&plain) && tagged.len() > plain.len());
        let back = decode(&tagged).unwrap();
        assert_eq!((back.m, back.tag), (m, Some(tag)));
        assert_eq!(project(&tagged).unwrap(), project(&plain).unwrap());
        assert!(decode(&[&plain[..], &[0xff]].concat()).is_err(), "a tag that does not decode is damage");
    }

    /// An `O_TMPFILE` shows as a `CREAT` in its directory with no name;
    /// the link that names it later, as an `HLINK`.
    #[test]
    fn an_o_tmpfile_is_a_creat_with_no_name_and_its_naming_an_hlink() {
        let cred = Cred { uid: 3, gid: 4, groups: vec![] };
        let made = Mutation::Tmpfile { parent: 2, ino: 9, perm: 0o600, uid: 3, gid: 4, linkable: true, time: 5 };
        let named = Mutation::Link { parent: 7, name: b"kept".to_vec(), ino: 9, time: 6 };
        let seen: Vec<_> = [made, named]
            .iter()
            .map(|m| project(&encoded(&cred, m, None, <[u8]>::to_vec)).unwrap().unwrap())
            .map(|r| (r.rtype, r.target, r.parent, r.name, r.time_ns))
            .collect();
        assert_eq!(seen, [(RecordType::CREAT, 9, 2, vec![], 5), (RecordType::HLINK, 9, 7, b"kept".to_vec(), 6)]);
    }

    /// A `chattr` shows as an `SATTR` of its inode, as Lustre records
    /// one, and its record reads back whole.
    #[test]
    fn a_chattr_is_an_sattr_of_its_inode() {
        let cred = Cred { uid: 0, gid: 0, groups: vec![] };
        let m = Mutation::SetFlags { ino: 9, flags: 0x30, time: 5 };
        let bytes = encoded(&cred, &m, None, <[u8]>::to_vec);
        assert_eq!(decode(&bytes).unwrap().m, m);
        let r = project(&bytes).unwrap().unwrap();
        assert_eq!((r.rtype, r.target, r.parent, r.name, r.time_ns), (RecordType::SATTR, 9, 0, vec![], 5));
    }
}
