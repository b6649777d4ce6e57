//! interlock's wire protocol, version 1.
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
//! Every decode is of untrusted bytes: a frame over [`MAX_FRAME`] or that
//! does not decode is an error, never a panic (fuzzed by property tests).

use serde::{Deserialize, Serialize};

/// The protocol version this build speaks.
pub const VERSION: u32 = 1;
/// The largest frame either side accepts, in bytes.
pub const MAX_FRAME: usize = 64 << 10;

/// Lock families, as in `interlock_core::LockKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    Posix,
    Ofd,
    Flock,
    Dlm,
}

/// A request's lock: which resource, which of the client's owners, which
/// bytes (inclusive; `end = i64::MAX` for "to end of file") and mode
/// (0 = NL … 5 = EX; POSIX read = 3, write = 5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
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
    Close { resource: Vec<u8>, kind: Kind, owner: u32 },
    /// Withdraw the queued request that had id `request`.
    Cancel { request: u64 },
    /// Release a DLM lock by handle, writing the value block from PW/EX.
    DlmUnlock { resource: Vec<u8>, owner: u32, handle: u64, lvb: Option<Vec<u8>> },
    /// Convert a DLM lock.
    DlmConvert { resource: Vec<u8>, owner: u32, handle: u64, mode: u8, wait: bool, lvb: Option<Vec<u8>> },
    /// Keep the session's lease alive (any request does too).
    Renew,
    /// Live counters.
    Status,
    /// End the session now, releasing everything it holds (instead of at
    /// lease expiry).
    Bye,
}

/// Client to server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// The first message. `session`: resume that session (after a
    /// reconnect within the lease, or to reclaim locks after a server
    /// restart).
    Hello {
        version: u32,
        token: Option<String>,
        session: Option<u64>,
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
    pub lvb: Option<Vec<u8>>,
    /// DLM lock handle.
    pub handle: Option<u64>,
}

/// A conflicting lock, as `F_GETLK` reports it. `owner` is the server's
/// id for the owner: (session << 32) | the client's owner number.
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
    pub requests: u64,
    pub uptime_ms: u64,
    /// Milliseconds left in the recovery window after a restart (0: none).
    pub recovering_ms: u64,
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
    Status(StatusInfo),
    /// Bad input or a limit: a clear message; the session goes on.
    Error(String),
}

/// Server to client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMsg {
    /// `resumed`: the session asked for in Hello was found (locks kept);
    /// `recovering`: the server restarted and accepts reclaims for this
    /// long.
    Welcome {
        version: u32,
        session: u64,
        lease_ms: u64,
        resumed: bool,
        recovering_ms: u64,
    },
    Refused {
        reason: String,
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
        resource: Vec<u8>,
        handle: u64,
        owner: u32,
        held: u8,
        wanted: u8,
    },
}

/// Why bytes are not a message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("undecodable frame: {0}")]
    Postcard(#[from] postcard::Error),
}

/// Encodes a message into a frame body.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    postcard::to_stdvec(msg).expect("messages always serialize")
}

/// Encodes a message as a frame body ready for the codec.
pub fn frame<T: Serialize>(msg: &T) -> bytes::Bytes {
    bytes::Bytes::from(encode(msg))
}

/// Decodes a frame body.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    Ok(postcard::from_bytes(bytes)?)
}

/// The frame codec: 4-byte big-endian length, at most [`MAX_FRAME`].
pub fn codec() -> tokio_util::codec::LengthDelimitedCodec {
    tokio_util::codec::LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).length_field_length(4).new_codec()
}

/// Writes the messages from `rx` to `sink` until either ends; whatever is
/// queued goes out in one write, so pipelined requests share system calls.
/// While `busy()` says other callers have requests outstanding (and so
/// are about to send more), it lets them run before writing.
pub async fn pump<T, S>(mut rx: tokio::sync::mpsc::UnboundedReceiver<T>, mut sink: S, busy: impl Fn() -> bool)
where
    T: Serialize,
    S: futures::Sink<bytes::Bytes> + Unpin,
{
    use futures::SinkExt;
    while let Some(msg) = rx.recv().await {
        if sink.feed(frame(&msg)).await.is_err() {
            return;
        }
        // Let the callers that are ready run before writing, and take what
        // they queue, while they keep queueing (a few rounds at most): many
        // then share one write. A lone caller's request goes out at once.
        for _ in 0..3 {
            if !busy() {
                break;
            }
            tokio::task::yield_now().await;
            let mut more_queued = false;
            while let Ok(more) = rx.try_recv() {
                more_queued = true;
                if sink.feed(frame(&more)).await.is_err() {
                    return;
                }
            }
            if !more_queued {
                break;
            }
        }
        if sink.flush().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let m = ClientMsg::Request {
            id: 7,
            op: Op::Lock {
                target: Target { resource: b"r".to_vec(), kind: Kind::Ofd, owner: 3, start: 0, end: 9 },
                mode: 5,
                wait: true,
                reclaim: false,
            },
        };
        assert_eq!(decode::<ClientMsg>(&encode(&m)).unwrap(), m);
        let s = ServerMsg::Granted { id: 7, grant: GrantInfo { fence: 3, lvb: Some(vec![1]), handle: None } };
        assert_eq!(decode::<ServerMsg>(&encode(&s)).unwrap(), s);
    }

    proptest! {
        /// Random bytes decode to an error or a message, never a panic.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode::<ClientMsg>(&bytes);
            let _ = decode::<ServerMsg>(&bytes);
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
