//! interlock's wire protocol (version [`VERSION`]).
//!
//! A connection carries frames both ways: a 4-byte big-endian length, then
//! that many bytes of a [postcard](https://docs.rs/postcard)-encoded
//! message. The client speaks first with [`ClientMsg::Hello`]; the server
//! answers [`ServerMsg::Welcome`] or [`ServerMsg::Refused`] (an unknown
//! version, a wrong token) and closes. After that the client sends requests,
//! each with its own id, as many as it likes without waiting (pipelining);
//! the server answers each with a [`ServerMsg::Reply`] carrying the id, and
//! pushes, on the same connection, grants of requests that had to wait
//! ([`ServerMsg::Granted`]) and blocking callbacks to holders of DLM locks
//! ([`ServerMsg::Blocking`]). `docs/protocol.md` describes the exchange.
//!
//! Everything after the handshake is a session's stream, one each way,
//! counted in bytes across the session's connections: after a lost
//! connection, [`ClientMsg::Hello`] and [`ServerMsg::Welcome`] tell each
//! other how much of the other's stream they took in, and each sends the
//! rest again. So no request, reply or push is lost or doubled when a
//! connection drops (version 2; version 1 lost them).
//!
//! Resuming a session takes the 128-bit secret its [`ServerMsg::Welcome`]
//! gave: nothing else the server ever says (a conflict names the holder's
//! session) lets another client act on a session (version 3).
//!
//! Every decode is of untrusted bytes: a frame over [`MAX_FRAME`] or that
//! does not decode is an error, never a panic (fuzzed by property tests).

#![forbid(unsafe_code)]

mod frame;
pub mod meta;
pub mod tls;
mod unacked;

use serde::{Deserialize, Serialize};

pub use frame::{DecodeError, FrameTooLarge, ReadError, Reader, decode, encode, reader, send, write_frame};
pub use unacked::Unacked;

/// The protocol version this build speaks.
pub const VERSION: u32 = 25;
/// The oldest client version this build's server serves. Every version
/// from it to [`VERSION`] sends and reads the same messages, but for
/// requests added since, which an older client never sends (and so
/// never reads their answers); what changed since is otherwise only
/// what the server does, and a client of such a version still gets what
/// it counts on (version 24: the server stops a client's other
/// connections before the welcome, which a client of version 23 does
/// not rely on; version 25: `MetaOp::Flags` and `MetaReply::Flags`, and
/// an open's `WANT_APPEND`, which an older client leaves out: its
/// opens of an append-only file for writing are refused). So a cluster upgrades its server first,
/// then its clients one by one. A client asks for its own version only:
/// it relies on what its server does. Raised to [`VERSION`] by a version
/// that changes a message.
pub const OLDEST_CLIENT: u32 = 23;

/// How a server names the versions it serves, in a refusal.
pub fn versions_served() -> String {
    if OLDEST_CLIENT == VERSION { VERSION.to_string() } else { format!("{OLDEST_CLIENT} to {VERSION}") }
}
/// The largest frame either side accepts, in bytes: room for the largest
/// write ([`meta::MAX_WRITE`], version 18; 256 KiB before), an extended
/// attribute's largest value (64 KiB), and a page of directory entries.
pub const MAX_FRAME: usize = meta::MAX_WRITE + (64 << 10);
/// The largest frame a server reads before the hello (see
/// [`Reader::limit`]): a peer that has not yet shown its token holds no
/// more of the server's memory than this a connection.
pub const MAX_HELLO: usize = 64 << 10;

/// Lock families, as in `interlock_core::LockKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    Posix,
    Ofd,
    Flock,
    Dlm,
}

impl From<Kind> for interlock_core::LockKind {
    fn from(k: Kind) -> Self {
        match k {
            Kind::Posix => interlock_core::LockKind::Posix,
            Kind::Ofd => interlock_core::LockKind::Ofd,
            Kind::Flock => interlock_core::LockKind::Flock,
            Kind::Dlm => interlock_core::LockKind::Dlm,
        }
    }
}

/// The layout of an engine owner id, the one home for it: the kind in the
/// top two bits (a process and an open file with the same number are
/// different owners, and the engine tells owners apart by id alone), the
/// session in the next 30 (0 in a client's own table), the client's
/// number for the owner in the low 32.
pub mod owner {
    use super::Kind;

    /// Session ids fit in this many bits.
    pub const SESSION_BITS: u32 = 30;
    const SESSION_MASK: u64 = (1 << SESSION_BITS) - 1;

    /// The engine's id for the client's owner `number` of `kind` in
    /// session `session` (which must fit in [`SESSION_BITS`]).
    pub fn id(kind: Kind, session: u64, number: u32) -> u64 {
        debug_assert!(session <= SESSION_MASK);
        ((kind as u64) << 62) | (session << 32) | u64::from(number)
    }

    /// The session of an owner id.
    pub fn session(id: u64) -> u64 {
        (id >> 32) & SESSION_MASK
    }

    /// The kind of an owner id.
    pub fn kind(id: u64) -> Kind {
        [Kind::Posix, Kind::Ofd, Kind::Flock, Kind::Dlm][(id >> 62) as usize]
    }

    /// The client's number for the owner.
    pub fn number(id: u64) -> u32 {
        id as u32
    }
}

/// A session's secret: 128 random bits, issued in the welcome, needed to
/// resume the session.
pub type Secret = [u8; 16];

/// A request's lock: which resource, which of the client's owners, which
/// bytes (inclusive; `end = i64::MAX` for "to end of file") and mode
/// (0 = NL … 5 = EX; POSIX read = 3, write = 5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    #[serde(with = "serde_bytes")]
    pub resource: Vec<u8>,
    pub kind: Kind,
    /// The client's own name for the owner (a process, an open file):
    /// owners of different clients never collide.
    pub owner: u32,
    pub start: u64,
    pub end: u64,
}

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Take a lock. With `wait`, a conflict queues the request at the
    /// server and the grant comes later as [`ServerMsg::Granted`] with this
    /// request's id. `reclaim` marks a lock replayed after a server
    /// restart (accepted during the recovery window).
    Lock { target: Target, mode: u8, wait: bool, reclaim: bool },
    /// Release bytes (POSIX, OFD, flock).
    Unlock { target: Target },
    /// `F_GETLK`.
    Test { target: Target, mode: u8 },
    /// Release everything the owner holds on the resource (close).
    Close {
        #[serde(with = "serde_bytes")]
        resource: Vec<u8>,
        kind: Kind,
        owner: u32,
    },
    /// Withdraw the queued request that had id `request`.
    Cancel { request: u64 },
    /// Release a DLM lock by handle, writing the value block from PW/EX.
    DlmUnlock {
        #[serde(with = "serde_bytes")]
        resource: Vec<u8>,
        owner: u32,
        handle: u64,
        #[serde(with = "serde_bytes")]
        lvb: Option<Vec<u8>>,
    },
    /// Convert a DLM lock.
    DlmConvert {
        #[serde(with = "serde_bytes")]
        resource: Vec<u8>,
        owner: u32,
        handle: u64,
        mode: u8,
        wait: bool,
        #[serde(with = "serde_bytes")]
        lvb: Option<Vec<u8>>,
    },
    /// Keep the session's lease alive (any request does too), and
    /// acknowledge the first `received` bytes of the session's stream from
    /// the server: it keeps what is not acknowledged, to send again after
    /// a reconnect.
    Renew { received: u64 },
    /// Live counters.
    Status,
    /// End the session now, releasing everything it holds (instead of at
    /// lease expiry).
    Bye,
    /// Who holds and who waits for `resource`, in every lock map (record,
    /// flock, DLM): [`Reply::Resource`].
    Inspect {
        #[serde(with = "serde_bytes")]
        resource: Vec<u8>,
    },
    /// End session `session` now, as if its lease had run out: its locks
    /// are released and its waits withdrawn (an operator forcing a dead
    /// client out). Any client with the token may.
    Evict { session: u64 },
    /// A namespace operation by `cred` (version 5): [`Reply::Meta`] or
    /// [`Reply::Errno`], once any change it made is durable. `once`
    /// (version 15) for a change that may not be made twice: see
    /// [`meta::Once`].
    Meta { cred: interlock_meta::Cred, op: meta::MetaOp, once: Option<meta::Once> },
    /// A changelog request (version 5): [`Reply::Changelog`].
    Changelog(meta::ChangelogOp),
}

/// Client to server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// The first message. `session`: resume that session (after a
    /// reconnect within the lease, or to reclaim locks after a server
    /// restart); `received`: the bytes of its stream from the server taken
    /// in so far (the server sends the rest again); `secret`: the
    /// session's secret from its welcome (zeros for a new session);
    /// `origin` (version 15): the client, for its life, across sessions
    /// and server restarts (a random number; see [`meta::Once`]; 0 for
    /// none: the server keeps no changes for it). Later
    /// versions only add fields at the end, so any version's hello decodes
    /// far enough to be refused by its version.
    Hello {
        version: u32,
        token: Option<String>,
        session: Option<u64>,
        received: u64,
        secret: Secret,
        origin: u64,
    },
    Request {
        id: u64,
        op: Op,
    },
}

/// A grant's details.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantInfo {
    /// Fencing token: grows with every write grant on the resource, also
    /// across server restarts.
    pub fence: u64,
    #[serde(with = "serde_bytes")]
    pub lvb: Option<Vec<u8>>,
    /// DLM lock handle.
    pub handle: Option<u64>,
}

/// A conflicting lock, as `F_GETLK` reports it. `owner` is the server's
/// id for the owner (see [`owner`]): its kind in the top two bits,
/// then the session (30 bits), then the client's owner number (32 bits).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictInfo {
    pub owner: u64,
    pub mode: u8,
    pub start: u64,
    pub end: u64,
}

/// Live counters of a server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusInfo {
    pub sessions: u64,
    pub resources: u64,
    pub locks: u64,
    pub waiters: u64,
    /// Requests served, renewals (keep-alives) not counted.
    pub requests: u64,
    pub uptime_ms: u64,
    /// Milliseconds left in the recovery window after a restart (0: none;
    /// at least 1 until the orphans nobody reopened in it are freed).
    pub recovering_ms: u64,
    /// Open connections, and the most the server takes.
    pub connections: u64,
    pub max_connections: u64,
    /// The most locks held and requests queued in all sessions together
    /// (version 20: `max-total-locks`).
    pub max_total_locks: u64,
    /// Inodes in the namespace (orphans included) (version 5).
    pub inodes: u64,
    /// The last durable journal record, and the records since the last
    /// checkpoint (what a restart replays).
    pub journal_last: u64,
    pub since_checkpoint: u64,
    /// Changelog consumers.
    pub consumers: Vec<meta::ConsumerInfo>,
    /// Whether changes are answered only once durable (`fdatasync`);
    /// false in the unsafe mode, `--unsafe-no-fsync` (version 8).
    pub durable: bool,
    /// The size of the file system that holds the data directory, and
    /// what of it is free to the server, in bytes (version 9; 0 if it
    /// could not be read).
    pub disk_bytes: u64,
    pub disk_available_bytes: u64,
    /// The journal's disk is full (version 12): changes that need room
    /// are refused with `ENOSPC` until a removal or the operator makes
    /// some (see `docs/namespace.md`, "When the disk is full").
    pub disk_full: bool,
    /// The server's root squash, if on (version 13): root's namespace
    /// requests are served as these ids but from the addresses listed
    /// (prefixes, `ADDR/LEN`).
    pub root_squash: Option<RootSquashInfo>,
    /// Clients with changes in the replay cache (version 15): changes
    /// they may ask about again after a crash of the server (see
    /// [`meta::Once`]).
    pub replay_clients: u64,
    /// The bytes of memory the namespace is charged (an estimate), and
    /// its budget, past which new files, names and extended attributes
    /// are refused with `ENOSPC` (`u64::MAX`: none) (version 20).
    pub namespace_bytes: u64,
    pub namespace_budget: u64,
    /// The bytes all sessions' streams keep (answers not yet acknowledged
    /// or on their way, requests held back; to 64 KiB), and the limit
    /// past which each is held to a share (`u64::MAX`: none) (version
    /// 22).
    pub output_bytes: u64,
    pub max_output_memory: u64,
}

/// A server's root squash, as [`StatusInfo`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootSquashInfo {
    pub uid: u32,
    pub gid: u32,
    /// The clients spared, as `ADDR/LEN`.
    pub except: Vec<String>,
}

/// "uid U, gid G", and the clients spared if any: what root is served as,
/// as `interlock status` and `interlock mount` say it.
impl std::fmt::Display for RootSquashInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid {}, gid {}", self.uid, self.gid)?;
        if !self.except.is_empty() {
            write!(f, " but from {}", self.except.join(", "))?;
        }
        Ok(())
    }
}

/// One lock held or wanted, for [`Op::Inspect`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub session: u64,
    pub kind: Kind,
    /// The client's number for the owner.
    pub owner: u32,
    pub mode: u8,
    pub start: u64,
    pub end: u64,
    /// Milliseconds since the owner first held a lock on the resource (for
    /// a holder) or since the request was queued (for a waiter).
    pub for_ms: u64,
}

/// Who holds and who waits for one resource. Each list holds at most
/// [`ResourceInfo::MAX_LISTED`] entries (holders by owner then start,
/// waiters in queue order); the totals count every one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceInfo {
    pub holders: Vec<LockInfo>,
    pub waiters: Vec<LockInfo>,
    pub holders_total: u64,
    pub waiters_total: u64,
}

impl ResourceInfo {
    /// Entries listed per list: keeps the reply far below [`MAX_FRAME`].
    pub const MAX_LISTED: usize = 256;
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Granted(GrantInfo),
    /// Waiting at the server; the grant will be pushed.
    Queued,
    /// EAGAIN.
    WouldBlock,
    /// EDEADLK.
    Deadlock,
    Done,
    Conflict(Option<ConflictInfo>),
    /// Boxed: the largest reply by far and the rarest, it would make every
    /// other reply as large (the encoding is the same).
    Status(Box<StatusInfo>),
    /// Bad input or a limit: a clear message; the session goes on.
    Error(String),
    /// A request that does not wait, made during the recovery window after
    /// a server restart (only reclaims are served then): this long is
    /// left of it.
    Recovering {
        left_ms: u64,
    },
    /// The answer to [`Op::Inspect`].
    Resource(ResourceInfo),
    /// A namespace operation's result.
    Meta(meta::MetaReply),
    /// A namespace operation failed with this errno.
    Errno(i32),
    /// A changelog request's result.
    Changelog(meta::ChangelogReply),
    /// A change asked about with [`meta::Asking::IfMade`] was not made
    /// (version 15): it had no effect, and the caller may make it anew.
    NotMade,
    /// The caller may not make this request (version 16): a user of the
    /// server's machine other than root or the server's own asked to
    /// evict a session or for the changelog. Before, an [`Reply::Error`].
    Denied(String),
    /// A limit refused the request (version 20): the session's
    /// (`max-locks`, `max-waiters`) or the server's (`max-total-locks`),
    /// named in the message; the session goes on. A mount answers
    /// `ENOLCK`, as POSIX has for a lock past a limit. Before, an
    /// [`Reply::Error`], which a mount answered `EIO`.
    Limit(String),
}

/// Server to client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMsg {
    /// `resumed`: the session asked for in Hello was found (locks kept);
    /// then `received` is the bytes of the client's stream the server
    /// took in, and the client sends the rest again. `recovering`: the
    /// server restarted and accepts reclaims for this long. `secret`:
    /// what resuming this session takes. `boot`: the server's start
    /// number, which grows at every start: a client that finds its session
    /// gone tells a restart (it may reclaim in the window) from the end of
    /// its lease (its locks are lost) by it. `verifier` (version 17), as
    /// NFS's write verifier: it changes only at a start after which data
    /// written and not yet synced may have been lost (the machine
    /// restarted since a run that did not end with everything on disk);
    /// an `fsync` after it changed cannot vouch for writes made before.
    /// `namespace` (version 19): the identity of the namespace served,
    /// for its life; a client that finds another one after a reconnect is
    /// talking to another data directory, where its inode numbers name
    /// other files (or none), and must not go on. `kept` (version 23):
    /// the server holds changes of the hello's `origin` in its replay
    /// cache (see [`meta::Once`]); since version 24, the server has also
    /// stopped that client's other connections, and none of their
    /// requests will be served after this welcome.
    Welcome {
        version: u32,
        session: u64,
        lease_ms: u64,
        resumed: bool,
        recovering_ms: u64,
        received: u64,
        secret: Secret,
        boot: u64,
        verifier: u64,
        namespace: u64,
        kept: bool,
    },
    /// The connection is refused and closes. `auth`: for a wrong or
    /// missing token (a client reports that apart from other refusals).
    /// `busy` (version 19): the server is at its connection limit, a
    /// refusal of the moment that a client reconnecting tries again after;
    /// every other refusal is for good. (A client of an older version
    /// decodes the fields before it: postcard leaves trailing bytes.)
    Refused {
        reason: String,
        auth: bool,
        busy: bool,
    },
    Reply {
        id: u64,
        reply: Reply,
    },
    /// Request `id`, queued earlier, is granted.
    Granted {
        id: u64,
        grant: GrantInfo,
    },
    /// A DLM lock of this client blocks another request: release or
    /// convert it down.
    Blocking {
        #[serde(with = "serde_bytes")]
        resource: Vec<u8>,
        handle: u64,
        owner: u32,
        held: u8,
        wanted: u8,
    },
    /// The server is stopping cleanly (SIGTERM, Ctrl-C), and this is the
    /// last it sends on the connection. It read the client's stream up to
    /// byte `served`, and what it read it has answered, or still owes an
    /// answer no session will get (a lock wait, a changelog read that
    /// waits, a disk task that outlasted the stop). Nothing past `served`
    /// was read: those requests had no effect, and the client may make
    /// them again on the next server, even those that may not be repeated
    /// (a create, a rename) after a plain loss of the connection.
    Goodbye {
        served: u64,
    },
}

/// [`ClientMsg::Request`] with the request borrowed: it encodes to the
/// same bytes, so a client can send a request it keeps (to send again
/// after a reconnect) without copying it.
#[derive(Serialize)]
pub enum ClientMsgRef<'a> {
    Hello { version: u32, token: Option<&'a str>, session: Option<u64>, received: u64, secret: Secret, origin: u64 },
    Request { id: u64, op: &'a Op },
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use proptest::prelude::*;

    use super::*;

    /// A blocking OFD write lock on bytes 0..=9 of "ab", request 7.
    fn lock_request() -> ClientMsg {
        ClientMsg::Request {
            id: 7,
            op: Op::Lock {
                target: Target { resource: b"ab".to_vec(), kind: Kind::Ofd, owner: 3, start: 0, end: 9 },
                mode: 5,
                wait: true,
                reclaim: false,
            },
        }
    }

    #[test]
    fn round_trip() {
        let m = lock_request();
        assert_eq!(decode::<ClientMsg>(&encode(&m)).unwrap(), m);
        let s = ServerMsg::Granted { id: 7, grant: GrantInfo { fence: 3, lvb: Some(vec![1]), handle: None } };
        assert_eq!(decode::<ServerMsg>(&encode(&s)).unwrap(), s);
    }

    /// The bytes of version 3, spelled out: postcard varints, enum
    /// variants by index, byte strings as length then bytes. A change
    /// here is a new protocol version.
    #[test]
    fn version_4_bytes() {
        assert_eq!(encode(&lock_request()), [1, 7, 0, 2, b'a', b'b', 1, 3, 0, 9, 5, 1, 0]);
        let unlock = Op::DlmUnlock { resource: b"r".to_vec(), owner: 1, handle: 300, lvb: Some(vec![9]) };
        assert_eq!(encode(&unlock), [5, 1, b'r', 1, 0xac, 0x02, 1, 1, 9]);
        let grant = ServerMsg::Granted { id: 2, grant: GrantInfo { fence: 1, lvb: None, handle: Some(4) } };
        assert_eq!(encode(&grant), [3, 2, 1, 0, 1, 4]);
        let hello =
            ClientMsg::Hello { version: 3, token: None, session: Some(5), received: 130, secret: [7; 16], origin: 9 };
        assert_eq!(encode(&hello)[..], [&[0u8, 3, 0, 1, 5, 0x82, 0x01][..], &[7; 16], &[9]].concat());
        let welcome = ServerMsg::Welcome {
            version: 3,
            session: 5,
            lease_ms: 1,
            resumed: true,
            recovering_ms: 0,
            received: 3,
            secret: [1; 16],
            boot: 2,
            verifier: 4,
            namespace: 5,
            kept: true,
        };
        assert_eq!(encode(&welcome)[..], [&[0u8, 3, 5, 1, 1, 0, 3][..], &[1; 16], &[2, 4, 5, 1]].concat());
        assert_eq!(encode(&Reply::Recovering { left_ms: 5 }), [8, 5]);
        assert_eq!(encode(&Op::Renew { received: 1 }), [7, 1]);
        assert_eq!(encode(&Op::Inspect { resource: b"r".to_vec() }), [10, 1, b'r']);
        assert_eq!(encode(&Op::Evict { session: 5 }), [11, 5]);
        assert_eq!(encode(&Reply::Resource(ResourceInfo::default())), [9, 0, 0, 0, 0]);
    }

    /// The fullest answer to an inspection fits in a frame.
    #[test]
    fn a_full_resource_answer_fits_a_frame() {
        let most = LockInfo {
            session: (1 << 30) - 1,
            kind: Kind::Dlm,
            owner: u32::MAX,
            mode: 5,
            start: u64::MAX,
            end: u64::MAX,
            for_ms: u64::MAX,
        };
        let list = vec![most; ResourceInfo::MAX_LISTED];
        let info =
            ResourceInfo { holders: list.clone(), waiters: list, holders_total: u64::MAX, waiters_total: u64::MAX };
        let msg = ServerMsg::Reply { id: u64::MAX, reply: Reply::Resource(info) };
        assert!(encode(&msg).len() < MAX_FRAME, "{}", encode(&msg).len());
    }

    /// A hello of any later version (fields added at its end) decodes
    /// far enough to read its version.
    #[test]
    fn a_later_hello_decodes_to_its_version() {
        let mut bytes = encode(&ClientMsg::Hello {
            version: 4,
            token: None,
            session: None,
            received: 0,
            secret: [0; 16],
            origin: 0,
        });
        bytes.extend_from_slice(&[9, 9, 9]);
        assert!(matches!(decode::<ClientMsg>(&bytes).unwrap(), ClientMsg::Hello { version: 4, .. }));
    }

    /// Frames written in place decode with the reading codec, in order,
    /// and the borrowed request form encodes as the owned one.
    #[test]
    fn frames_written_in_place_read_back() {
        use tokio_util::codec::Decoder;
        let op =
            Op::Unlock { target: Target { resource: b"abc".to_vec(), kind: Kind::Posix, owner: 1, start: 0, end: 5 } };
        let mut out = BytesMut::new();
        write_frame(&ClientMsgRef::Request { id: 9, op: &op }, &mut out).unwrap();
        let hello = ClientMsg::Hello {
            version: VERSION,
            token: Some("t".into()),
            session: None,
            received: 4,
            secret: [3; 16],
            origin: 5,
        };
        write_frame(&hello, &mut out).unwrap();
        // Larger than the stack buffer of the fast path.
        let big = ClientMsg::Request { id: 10, op: Op::Close { resource: vec![3; 2000], kind: Kind::Ofd, owner: 2 } };
        write_frame(&big, &mut out).unwrap();
        let hello_ref = ClientMsgRef::Hello {
            version: VERSION,
            token: Some("t"),
            session: None,
            received: 4,
            secret: [3; 16],
            origin: 5,
        };
        let total = out.len() as u64;
        let mut reader = Reader::<ClientMsg>::default();
        assert_eq!(reader.decode(&mut out).unwrap().unwrap(), ClientMsg::Request { id: 9, op });
        let hello = reader.decode(&mut out).unwrap().unwrap();
        assert_eq!(encode(&hello), encode(&hello_ref));
        assert_eq!(reader.decode(&mut out).unwrap().unwrap(), big);
        assert!(reader.decode(&mut out).unwrap().is_none());
        assert_eq!(reader.consumed(), total, "every byte of the three frames counted");
    }

    #[test]
    fn the_reader_refuses_oversized_and_undecodable_frames() {
        use tokio_util::codec::Decoder;
        let mut reader = Reader::<ClientMsg>::default();
        let mut big = BytesMut::from(&((MAX_FRAME + 1) as u32).to_be_bytes()[..]);
        assert!(matches!(reader.decode(&mut big), Err(ReadError::TooLarge(n, MAX_FRAME)) if n == MAX_FRAME + 1));
        reader.limit(MAX_HELLO);
        let mut hello = BytesMut::from(&((MAX_HELLO + 1) as u32).to_be_bytes()[..]);
        assert!(matches!(reader.decode(&mut hello), Err(ReadError::TooLarge(n, MAX_HELLO)) if n == MAX_HELLO + 1));
        let mut garbage = BytesMut::from(&[0, 0, 0, 2, 0xff, 0xff][..]);
        assert!(matches!(reader.decode(&mut garbage), Err(ReadError::Undecodable(_))));
    }

    #[test]
    fn an_oversized_frame_is_refused_and_leaves_the_buffer_as_it_was() {
        let big = Op::Close { resource: vec![7; MAX_FRAME], kind: Kind::Flock, owner: 0 };
        let mut out = BytesMut::from(&b"xy"[..]);
        let err = write_frame(&ClientMsgRef::Request { id: 1, op: &big }, &mut out).unwrap_err();
        assert!(err.0 > MAX_FRAME);
        assert_eq!(&out[..], b"xy");
    }

    proptest! {
        /// Random bytes decode to an error or a message, never a panic.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode::<ClientMsg>(&bytes);
            let _ = decode::<ServerMsg>(&bytes);
        }

        /// Frames arriving in pieces of any sizes read back whole, in order.
        #[test]
        fn frames_read_back_however_they_arrive(names in proptest::collection::vec(0usize..300, 1..6), cuts in proptest::collection::vec(1usize..64, 1..40)) {
            use tokio_util::codec::Decoder;
            let msgs: Vec<ClientMsg> = names
                .iter()
                .enumerate()
                .map(|(i, &n)| ClientMsg::Request { id: i as u64, op: Op::Close { resource: vec![i as u8; n], kind: Kind::Flock, owner: 1 } })
                .collect();
            let mut wire = BytesMut::new();
            for m in &msgs {
                write_frame(m, &mut wire).unwrap();
            }
            let (mut reader, mut buf, mut got) = (Reader::<ClientMsg>::default(), BytesMut::new(), Vec::new());
            let mut at = 0;
            for cut in cuts.iter().cycle() {
                if at == wire.len() {
                    break;
                }
                let end = (at + cut).min(wire.len());
                buf.extend_from_slice(&wire[at..end]);
                at = end;
                while let Some(m) = reader.decode(&mut buf).unwrap() {
                    got.push(m);
                }
            }
            prop_assert_eq!(got, msgs);
            prop_assert!(buf.is_empty());
        }

        /// Every truncation of a valid message is an error or a message.
        #[test]
        fn truncation_never_panics(owner in any::<u32>(), cut in 0usize..40) {
            let m = ClientMsg::Request { id: 1, op: Op::Close { resource: vec![1; 10], kind: Kind::Posix, owner } };
            let bytes = encode(&m);
            let _ = decode::<ClientMsg>(&bytes[..cut.min(bytes.len())]);
        }
    }
}
