//! The namespace and the changelog, through the client: each call is one
//! request on the session's connection (pipelined with everything else),
//! carrying the caller's credentials; a change is answered once it is
//! durable at the server. A namespace call that fails at the server
//! fails with [`ClientError::Errno`] (the errno a local file system would
//! give); anything else is a transport or server error.
//!
//! ```no_run
//! # async fn f(client: &interlock_client::Client) -> Result<(), interlock_client::ClientError> {
//! use interlock_client::meta::{Cred, FileType, ROOT};
//! let me = Cred { uid: 1000, gid: 1000, groups: vec![] };
//! let dir = client.create(&me, ROOT, b"home", FileType::Directory, 0o755, b"").await?;
//! let file = client.create(&me, dir.ino, b"notes", FileType::Regular, 0o644, b"").await?;
//! assert_eq!(client.lookup(&me, dir.ino, b"notes").await?.ino, file.ino);
//! # Ok(()) }
//! ```

use std::time::Duration;

pub use interlock_meta::{
    Attr, Caller, Cred, FLAG_APPEND, FLAG_IMMUTABLE, FLAG_NOATIME, FLAG_NODUMP, Fallocate, FileType, Ino, KEPT_FLAGS,
    ROOT, RenameFlags, SeekTo, SetAttr, StatFs, TimeSet, WANT_APPEND, XattrMode,
};
use interlock_proto::meta::{Asking, ChangelogOp, ChangelogReply, MetaOp, MetaReply, Once};
pub use interlock_proto::meta::{ChangelogRecord, ConsumerInfo, Entry};
use interlock_proto::{Op, Reply};

use crate::{Client, ClientError};

fn unexpected(r: impl std::fmt::Debug) -> ClientError {
    ClientError::Server(format!("unexpected reply {r:?}"))
}

impl Client {
    /// Any namespace operation: its reply, or [`ClientError::Errno`].
    /// (Opens made here are not opened again after a server restart:
    /// [`open`](Client::open) and [`create_open`](Client::create_open)
    /// are.)
    pub async fn meta(&self, cred: &Cred, op: MetaOp) -> Result<MetaReply, ClientError> {
        self.meta_in(cred, op).await.map(|(r, _)| r)
    }

    /// A namespace operation's reply, and the session it came in. A
    /// change that may not be made twice ([`MetaOp::once`]) goes with
    /// [`Once`], which the client fills in as it sends it: after a server
    /// restart it gets the answer the first attempt got (or would have),
    /// never the errno of the change made twice.
    async fn meta_in(&self, cred: &Cred, op: MetaOp) -> Result<(MetaReply, u64), ClientError> {
        let once = op.once().then_some(Once { settled: 0, asking: Asking::First });
        match self.request_in(Op::Meta { cred: cred.clone(), op, once }).await? {
            (Reply::Meta(r), generation) => Ok((r, generation)),
            (Reply::Errno(e), _) => Err(ClientError::Errno(e)),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// An open (or create and open): counted, to be opened again in a new
    /// session (see [`opens`](crate::opens)).
    async fn opening(&self, cred: &Cred, op: MetaOp) -> Result<Attr, ClientError> {
        match self.meta_in(cred, op).await? {
            (MetaReply::Attr(a), generation) => {
                crate::opens::opened(&self.inner, a.ino, generation);
                Ok(a)
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    async fn attr(&self, cred: &Cred, op: MetaOp) -> Result<Attr, ClientError> {
        match self.meta(cred, op).await? {
            MetaReply::Attr(a) => Ok(a),
            other => Err(unexpected(other)),
        }
    }

    async fn done(&self, cred: &Cred, op: MetaOp) -> Result<(), ClientError> {
        match self.meta(cred, op).await? {
            MetaReply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn bytes(&self, cred: &Cred, op: MetaOp) -> Result<Vec<u8>, ClientError> {
        match self.meta(cred, op).await? {
            MetaReply::Bytes(b) => Ok(b),
            other => Err(unexpected(other)),
        }
    }

    pub async fn lookup(&self, cred: &Cred, parent: Ino, name: &[u8]) -> Result<Attr, ClientError> {
        self.attr(cred, MetaOp::Lookup { parent, name: name.to_vec() }).await
    }

    pub async fn getattr(&self, cred: &Cred, ino: Ino) -> Result<Attr, ClientError> {
        self.attr(cred, MetaOp::Getattr { ino }).await
    }

    pub async fn setattr(&self, cred: &Cred, ino: Ino, set: SetAttr) -> Result<Attr, ClientError> {
        self.attr(cred, MetaOp::Setattr { ino, set }).await
    }

    /// Creates a file, directory, symlink (`target`), fifo or socket;
    /// `perm` with the caller's umask applied (a directory's default ACL
    /// then cuts what is left). Device nodes, or a umask the server is
    /// to apply: [`meta`](Client::meta) with `MetaOp::Create`.
    pub async fn create(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &[u8],
        kind: FileType,
        perm: u32,
        target: &[u8],
    ) -> Result<Attr, ClientError> {
        let op = MetaOp::Create { parent, name: name.to_vec(), kind, perm, rdev: 0, target: target.to_vec(), umask: 0 };
        self.attr(cred, op).await
    }

    /// Creates regular file `name` and opens it in one round trip
    /// (`open(O_CREAT)`); close it with [`release`](Client::release).
    /// `EEXIST` if the name is taken. `umask` as `MetaOp::Create`'s.
    pub async fn create_open(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &[u8],
        (perm, umask): (u32, u32),
    ) -> Result<Attr, ClientError> {
        self.opening(cred, MetaOp::CreateOpen { parent, name: name.to_vec(), perm, umask }).await
    }

    /// `open(O_TMPFILE)` in `parent`: a regular file with no name, open
    /// as [`create_open`](Client::create_open) opens it, freed at its last
    /// release unless [`link`](Client::link) names it first, which it may
    /// only if `linkable` (made without `O_EXCL`). `umask` as
    /// `MetaOp::Create`'s.
    pub async fn tmpfile(
        &self,
        cred: &Cred,
        parent: Ino,
        (perm, umask): (u32, u32),
        linkable: bool,
    ) -> Result<Attr, ClientError> {
        self.opening(cred, MetaOp::Tmpfile { parent, perm, linkable, umask }).await
    }

    pub async fn link(&self, cred: &Cred, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr, ClientError> {
        self.attr(cred, MetaOp::Link { ino, parent, name: name.to_vec() }).await
    }

    pub async fn unlink(&self, cred: &Cred, parent: Ino, name: &[u8]) -> Result<(), ClientError> {
        self.done(cred, MetaOp::Unlink { parent, name: name.to_vec() }).await
    }

    pub async fn rmdir(&self, cred: &Cred, parent: Ino, name: &[u8]) -> Result<(), ClientError> {
        self.done(cred, MetaOp::Rmdir { parent, name: name.to_vec() }).await
    }

    pub async fn rename(
        &self,
        cred: &Cred,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
        flags: RenameFlags,
    ) -> Result<(), ClientError> {
        let op = MetaOp::Rename { parent, name: name.to_vec(), new_parent, new_name: new_name.to_vec(), flags };
        self.done(cred, op).await
    }

    pub async fn readlink(&self, cred: &Cred, ino: Ino) -> Result<Vec<u8>, ClientError> {
        self.bytes(cred, MetaOp::Readlink { ino }).await
    }

    /// One page of a listing after `cookie` (0: from the start): entries
    /// (with attributes if `plus`), and whether the listing is over. Each
    /// entry's cookie resumes after it; an entry present throughout a
    /// listing is listed exactly once.
    pub async fn readdir(
        &self,
        who: impl Into<Caller<'_>>,
        ino: Ino,
        cookie: u64,
        max: u32,
        plus: bool,
    ) -> Result<(Vec<Entry>, bool), ClientError> {
        let Caller { cred, opened } = who.into();
        match self.meta(cred, MetaOp::Readdir { ino, cookie, max, plus, opened }).await? {
            MetaReply::Entries { entries, end } => Ok((entries, end)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn getxattr(&self, cred: &Cred, ino: Ino, name: &[u8]) -> Result<Vec<u8>, ClientError> {
        self.bytes(cred, MetaOp::Getxattr { ino, name: name.to_vec() }).await
    }

    pub async fn setxattr(
        &self,
        cred: &Cred,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<(), ClientError> {
        self.done(cred, MetaOp::Setxattr { ino, name: name.to_vec(), value: value.to_vec(), mode }).await
    }

    pub async fn listxattr(&self, cred: &Cred, ino: Ino) -> Result<Vec<Vec<u8>>, ClientError> {
        match self.meta(cred, MetaOp::Listxattr { ino }).await? {
            MetaReply::Names(n) => Ok(n.into_iter().map(|b| b.into_vec()).collect()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn removexattr(&self, cred: &Cred, ino: Ino, name: &[u8]) -> Result<(), ClientError> {
        self.done(cred, MetaOp::Removexattr { ino, name: name.to_vec() }).await
    }

    /// The inodes in use, the longest name, and the server's space.
    pub async fn statfs(&self, cred: &Cred) -> Result<StatFs, ClientError> {
        match self.meta(cred, MetaOp::Statfs).await? {
            MetaReply::StatFs(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Holds `ino` open for `want` (`access(2)`'s bits, checked as an
    /// open is; the data calls made through it with
    /// [`Caller`]`{ opened: true }` are not checked again): unlinked, it
    /// lives until released, or until the client is gone (its session
    /// ended). Across a server restart the client opens it again in the
    /// recovery window, so it lives on.
    pub async fn open(&self, cred: &Cred, ino: Ino, want: u32) -> Result<Attr, ClientError> {
        self.opening(cred, MetaOp::Open { ino, want }).await
    }

    pub async fn release(&self, cred: &Cred, ino: Ino) -> Result<(), ClientError> {
        self.done(cred, MetaOp::Release { ino }).await
    }

    /// Up to `size` bytes of regular file `ino` from `offset` (fewer at
    /// its end; at most 128 KiB a call).
    pub async fn read(
        &self,
        who: impl Into<Caller<'_>>,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, ClientError> {
        let Caller { cred, opened } = who.into();
        self.bytes(cred, MetaOp::Read { ino, offset, size, opened }).await
    }

    /// Writes `data` (at most 1 MiB a call, made whole: no other write
    /// lands inside it) at `offset`; the file's attributes after it.
    /// Answered before it is durable, as `write(2)` returns: see
    /// [`Client::fsync`].
    pub async fn write(
        &self,
        who: impl Into<Caller<'_>>,
        ino: Ino,
        offset: u64,
        data: &[u8],
    ) -> Result<Attr, ClientError> {
        let Caller { cred, opened } = who.into();
        self.attr(cred, MetaOp::Write { ino, offset, append: false, data: data.to_vec(), opened }).await
    }

    /// Writes `data` (at most 1 MiB, made whole) at the end of the file,
    /// wherever that is when it arrives (`O_APPEND`); the file's
    /// attributes after.
    pub async fn append(&self, who: impl Into<Caller<'_>>, ino: Ino, data: &[u8]) -> Result<Attr, ClientError> {
        let Caller { cred, opened } = who.into();
        self.attr(cred, MetaOp::Write { ino, offset: 0, append: true, data: data.to_vec(), opened }).await
    }

    /// `fallocate(2)` of `len` bytes at `offset`, as `how` says; the
    /// file's attributes after it.
    pub async fn fallocate(
        &self,
        who: impl Into<Caller<'_>>,
        ino: Ino,
        how: Fallocate,
        offset: u64,
        len: u64,
    ) -> Result<Attr, ClientError> {
        let Caller { cred, opened } = who.into();
        self.attr(cred, MetaOp::Fallocate { ino, how, offset, len, opened }).await
    }

    /// `copy_file_range(2)`: up to `len` bytes of `src` from `src_off`
    /// into `dst` at `dst_off`, copied by the server (no data crosses the
    /// network); how many bytes (fewer at the source's end), and the
    /// destination's attributes after.
    pub async fn copy_range(
        &self,
        who: impl Into<Caller<'_>>,
        (src, src_off): (Ino, u64),
        (dst, dst_off): (Ino, u64),
        len: u64,
    ) -> Result<(u64, Attr), ClientError> {
        let Caller { cred, opened } = who.into();
        match self.meta(cred, MetaOp::CopyRange { src, src_off, dst, dst_off, len, opened }).await? {
            MetaReply::Copied { bytes, attr } => Ok((bytes, attr)),
            other => Err(unexpected(other)),
        }
    }

    /// Where the next data (or hole) starts at or after `offset`, as
    /// `lseek(2)`'s `SEEK_DATA` (`SEEK_HOLE`) says; `ENXIO` past the end.
    pub async fn seek(
        &self,
        who: impl Into<Caller<'_>>,
        ino: Ino,
        offset: u64,
        to: SeekTo,
    ) -> Result<u64, ClientError> {
        let Caller { cred, opened } = who.into();
        match self.meta(cred, MetaOp::Seek { ino, offset, to, opened }).await? {
            MetaReply::Offset(at) => Ok(at),
            other => Err(unexpected(other)),
        }
    }

    /// Regular file or directory `ino`'s attribute flags (`lsattr`),
    /// after setting them to `set` if given (`chattr`): see
    /// [`KEPT_FLAGS`] for those kept and what
    /// they refuse. A set is acknowledged once durable, as any change.
    pub async fn flags(&self, cred: &Cred, ino: Ino, set: Option<u32>) -> Result<u32, ClientError> {
        match self.meta(cred, MetaOp::Flags { ino, set }).await? {
            MetaReply::Flags(flags) => Ok(flags),
            other => Err(unexpected(other)),
        }
    }

    /// Makes the file's data, and every change made so far, durable.
    /// Writes made before the server's machine crashed may be lost all
    /// the same, and this cannot tell: compare [`Client::verifier`]
    /// read before those writes were sent with its value after this
    /// returns (the mount fails its `fsync` with `EIO` when they differ).
    pub async fn fsync(&self, cred: &Cred, ino: Ino) -> Result<(), ClientError> {
        self.done(cred, MetaOp::Fsync { ino }).await
    }

    async fn changelog(&self, op: ChangelogOp) -> Result<ChangelogReply, ClientError> {
        match self.request(Op::Changelog(op)).await? {
            Reply::Changelog(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Registers a changelog consumer that sees the record types in
    /// `mask` (bit n for Lustre's type n) from now on.
    pub async fn changelog_register(&self, name: Option<&str>, mask: u32) -> Result<ConsumerInfo, ClientError> {
        match self.changelog(ChangelogOp::Register { name: name.map(str::to_string), mask }).await? {
            ChangelogReply::Consumer(c) => Ok(c),
            other => Err(unexpected(other)),
        }
    }

    pub async fn changelog_deregister(&self, id: &str) -> Result<(), ClientError> {
        match self.changelog(ChangelogOp::Deregister { id: id.to_string() }).await? {
            ChangelogReply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn changelog_list(&self) -> Result<Vec<ConsumerInfo>, ClientError> {
        match self.changelog(ChangelogOp::List).await? {
            ChangelogReply::Consumers(c) => Ok(c),
            other => Err(unexpected(other)),
        }
    }

    /// Up to `max` records for consumer `id` after its cursor (or from
    /// `from`), waiting up to `wait` for the first if none is there.
    pub async fn changelog_read(
        &self,
        id: &str,
        from: Option<u64>,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ChangelogRecord>, ClientError> {
        let wait_ms = wait.as_millis().min(u128::from(u32::MAX)) as u32;
        match self.changelog(ChangelogOp::Read { id: id.to_string(), from, max, wait_ms }).await? {
            ChangelogReply::Records(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }

    /// Acknowledges consumer `id`'s records up to `upto`, durably when it
    /// returns; a read from the cursor sent before then may begin before
    /// `upto` (requests in flight at once are served in either order).
    pub async fn changelog_clear(&self, id: &str, upto: u64) -> Result<(), ClientError> {
        match self.changelog(ChangelogOp::Clear { id: id.to_string(), upto }).await? {
            ChangelogReply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}
