//! What one side of a session stream wrote and the other has not yet
//! acknowledged: kept so that a new connection can send it again.
//!
//! Both directions of a session keep one (the server its replies and
//! pushes, the client its requests). The stream is counted in bytes from
//! the session's start; this holds the bytes from [`Unacked::start`] to
//! [`Unacked::end`], in the chunks they were written in (shared with the
//! write, not copied).

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

#[derive(Debug, Default)]
pub struct Unacked {
    chunks: VecDeque<Bytes>,
    len: usize,
    start: u64,
}

impl Unacked {
    /// The stream offset of the first byte kept.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The stream offset after the last byte written.
    pub fn end(&self) -> u64 {
        self.start + self.len as u64
    }

    /// Keeps a chunk just taken for writing. O(1).
    pub fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        self.chunks.push_back(chunk);
    }

    /// The other side took in the stream up to `offset` (at most
    /// [`Unacked::end`]): what is before it is dropped. O(chunks dropped).
    pub fn ack(&mut self, offset: u64) {
        let mut n = (offset.saturating_sub(self.start) as usize).min(self.len);
        self.start += n as u64;
        self.len -= n;
        while n > 0 {
            let front = self.chunks.front_mut().expect("len counts the chunks' bytes");
            if front.len() <= n {
                n -= front.len();
                self.chunks.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }

    /// A new connection, whose other side took in the stream up to
    /// `offset`: returns what follows it, then `pending` (not yet taken for
    /// writing), to write from the start; what is kept starts afresh at
    /// `offset`. `None` if `offset` is outside [`Unacked::start`] to
    /// [`Unacked::end`]: those bytes were dropped, or never written.
    /// O(bytes returned).
    pub fn replay(&mut self, offset: u64, pending: &[u8]) -> Option<BytesMut> {
        if offset < self.start || offset > self.end() {
            return None;
        }
        let mut skip = (offset - self.start) as usize;
        let mut again = BytesMut::with_capacity(self.len - skip + pending.len());
        for chunk in std::mem::take(&mut self.chunks) {
            let n = skip.min(chunk.len());
            skip -= n;
            again.extend_from_slice(&chunk[n..]);
        }
        again.extend_from_slice(pending);
        (self.start, self.len) = (offset, 0);
        Some(again)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against the whole stream as one byte string: after any chunks
        /// and acknowledgements, a replay from any offset kept gives
        /// exactly the stream's bytes from there, then the pending ones.
        #[test]
        fn a_replay_is_the_stream_from_there(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..20), 0..8),
            acks in proptest::collection::vec(0u64..200, 0..4),
            at in 0u64..200,
            pending in proptest::collection::vec(any::<u8>(), 0..10),
        ) {
            let mut kept = Unacked::default();
            let whole: Vec<u8> = chunks.concat();
            let mut acked = 0u64;
            for c in &chunks {
                kept.push(Bytes::from(c.clone()));
            }
            for a in acks {
                kept.ack(a);
                acked = acked.max(a.min(whole.len() as u64));
            }
            prop_assert_eq!((kept.start(), kept.end()), (acked, whole.len() as u64));
            match kept.replay(at, &pending) {
                None => prop_assert!(at < acked || at > whole.len() as u64),
                Some(again) => {
                    let mut want = whole[at as usize..].to_vec();
                    want.extend_from_slice(&pending);
                    prop_assert_eq!(&again[..], &want[..]);
                    prop_assert_eq!((kept.start(), kept.end()), (at, at));
                }
            }
        }
    }
}
