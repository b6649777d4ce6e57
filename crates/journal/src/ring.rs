//! The append path: a bounded ring of record slots with no mutex.
//!
//! Seed 001: every metadata thread queued on one semaphore to append a
//! changelog record. Here an appender takes its record's position with one
//! atomic add on `tail` (the reservation), writes its bytes into its own
//! slot in parallel with every other appender, and publishes the slot with
//! one release store of its sequence number. A single consumer (the
//! flusher) takes slots strictly in position order, so it, and every reader
//! behind it, sees only the contiguous published prefix: no hole is ever
//! visible, and published order is position order.
//!
//! Each slot's `seq` tells whose turn it is (after Vyukov's bounded queue):
//!
//! - `seq == p`: free for the appender of position `p`;
//! - `seq == p + 1`: holds the record of position `p`, published;
//! - the consumer frees it for the next lap with `seq = p + capacity`.
//!
//! An appender that finds its slot still full (the ring is `capacity`
//! records ahead of the flusher) waits: back-pressure, not loss.
//!
//! The protocol is model-checked with `loom` (`RUSTFLAGS="--cfg loom"`).

use crate::sync::{AtomicU64, Ordering, UnsafeCell};
use crossbeam_utils::CachePadded;

struct Slot {
    seq: AtomicU64,
    data: UnsafeCell<Bytes>,
}

/// What a slot's bytes may take inline: with the sequence number, the
/// length and the spill's header, the slot's 128-byte line pair. A
/// namespace record (a create's is ~70 bytes framed) then costs its
/// appender and the flusher that one pair of lines, not that and the
/// heap lines of a buffer of its own.
const INLINE: usize = 88;

// The slot, bytes inline and all, within its line pair.
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Slot>() <= 128);

/// A slot's bytes: inline while they fit, else in `spill` (kept for the
/// next lap, so a large record allocates once per slot).
struct Bytes {
    len: u32,
    inline: [u8; INLINE],
    spill: Vec<u8>,
}

impl Bytes {
    /// Room for `len` bytes, to be filled.
    fn put(&mut self, len: usize) -> &mut [u8] {
        self.len = u32::try_from(len).expect("a record under 4 GiB");
        if len <= INLINE {
            return &mut self.inline[..len];
        }
        self.spill.resize(len, 0);
        &mut self.spill[..]
    }

    fn get(&self) -> &[u8] {
        let len = self.len as usize;
        if len <= INLINE { &self.inline[..len] } else { &self.spill[..len] }
    }
}

/// A bounded multi-producer, single-consumer ring of byte records.
pub(crate) struct Ring {
    /// Each on a line of its own: neighbouring positions go to different
    /// appenders, which would otherwise pass a shared line back and forth
    /// on every append (two creators on two cores: ~130 ns a pass).
    slots: Box<[CachePadded<Slot>]>,
    mask: u64,
    /// The next position to hand out.
    tail: CachePadded<AtomicU64>,
}

// SAFETY: a slot's `data` is touched only by the one appender whose
// position owns it (between its reservation and its publishing store) and
// then only by the consumer (between its acquire load and its releasing
// store); `seq` orders the hand-overs.
unsafe impl Sync for Ring {}
// SAFETY: as above; the ring owns its slots.
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of `capacity` slots (rounded up to a power of two).
    pub fn new(capacity: usize) -> Ring {
        let capacity = capacity.max(2).next_power_of_two();
        let slots = (0..capacity as u64).map(|p| {
            let data = Bytes { len: 0, inline: [0; INLINE], spill: Vec::new() };
            CachePadded::new(Slot { seq: AtomicU64::new(p), data: UnsafeCell::new(data) })
        });
        Ring { slots: slots.collect(), mask: capacity as u64 - 1, tail: CachePadded::new(AtomicU64::new(0)) }
    }

    /// How many slots it has.
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Reserves the next position. One atomic add: the only shared write
    /// on the append path besides the appender's own slot.
    pub fn reserve(&self) -> u64 {
        self.tail.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the slot of position `pos` is free for its appender.
    pub fn writable(&self, pos: u64) -> bool {
        self.slots[(pos & self.mask) as usize].seq.load(Ordering::Acquire) == pos
    }

    /// Writes and publishes the record of position `pos`, which the caller
    /// reserved and found [`writable`](Ring::writable): `fill` writes its
    /// `len` bytes in place, in the slot itself if they fit.
    pub fn publish(&self, pos: u64, len: usize, fill: impl FnOnce(&mut [u8])) {
        let slot = &self.slots[(pos & self.mask) as usize];
        debug_assert_eq!(slot.seq.load(Ordering::Acquire), pos);
        slot.data.with_mut(|data| {
            // SAFETY: `seq == pos` hands this slot to the appender of `pos`
            // alone until the release store below.
            fill(unsafe { &mut *data }.put(len));
        });
        slot.seq.store(pos + 1, Ordering::Release);
    }

    /// The consumer's side: if the record at position `pos` (the next one
    /// it expects) is published, lets `take` read it and frees the slot.
    /// Returns whether it was there. Must be called by one thread only,
    /// with `pos` advancing by one after every success.
    pub fn consume(&self, pos: u64, take: impl FnOnce(&[u8])) -> bool {
        let slot = &self.slots[(pos & self.mask) as usize];
        if slot.seq.load(Ordering::Acquire) != pos + 1 {
            return false;
        }
        slot.data.with(|data| {
            // SAFETY: `seq == pos + 1` hands the slot to the consumer until
            // the release store below.
            take(unsafe { &*data }.get());
        });
        slot.seq.store(pos + self.capacity(), Ordering::Release);
        true
    }

    /// Whether the record at position `pos` is published (the consumer's
    /// peek, without taking it).
    pub fn ready(&self, pos: u64) -> bool {
        self.slots[(pos & self.mask) as usize].seq.load(Ordering::Acquire) == pos + 1
    }

    /// Positions handed out so far.
    pub fn reserved(&self) -> u64 {
        self.tail.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Many appenders through a small ring: every record arrives once, in
    /// position order, with the bytes its appender wrote.
    #[test]
    fn stress_every_record_once_in_order() {
        let ring = Arc::new(Ring::new(64));
        let threads = 8;
        let per = 20_000u64;
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for _ in 0..per {
                        let pos = ring.reserve();
                        while !ring.writable(pos) {
                            std::thread::yield_now();
                        }
                        // 8, 58 or 108 bytes: some spill out of the slot.
                        let extra = [t as u8; 100][..(pos % 3) as usize * 50].to_vec();
                        ring.publish(pos, 8 + extra.len(), |buf| {
                            buf[..8].copy_from_slice(&pos.to_le_bytes());
                            buf[8..].copy_from_slice(&extra);
                        });
                    }
                })
            })
            .collect();
        let total = threads * per;
        let mut pos = 0;
        while pos < total {
            if !ring.consume(pos, |bytes| {
                assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), pos, "record at its position");
                assert_eq!(bytes.len(), 8 + (pos % 3) as usize * 50, "its length");
                assert!(bytes[8..].iter().all(|&b| b == bytes[8]), "one appender's bytes");
            }) {
                std::thread::yield_now();
                continue;
            }
            pos += 1;
        }
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(ring.reserved(), total);
        assert!(!ring.consume(total, |_| {}));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two appenders, a ring of two slots, and a consumer that reads as the
    /// records are published: under every interleaving it sees each record
    /// exactly once, in position order, never a hole and never a torn
    /// write.
    #[test]
    fn publish_consume_is_ordered_and_complete() {
        loom::model(|| {
            let ring = Arc::new(Ring::new(2));
            let appenders: Vec<_> = (0..2u8)
                .map(|t| {
                    let ring = ring.clone();
                    thread::spawn(move || {
                        let pos = ring.reserve();
                        while !ring.writable(pos) {
                            thread::yield_now();
                        }
                        ring.publish(pos, 2, |buf| buf.copy_from_slice(&[t, pos as u8]));
                    })
                })
                .collect();
            let mut seen = Vec::new();
            let mut pos = 0;
            while pos < 2 {
                if ring.consume(pos, |b| seen.push((b[0], b[1]))) {
                    pos += 1;
                } else {
                    thread::yield_now();
                }
            }
            for a in appenders {
                a.join().unwrap();
            }
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0].1, 0);
            assert_eq!(seen[1].1, 1);
            assert_ne!(seen[0].0, seen[1].0);
        });
    }

    /// A ring of two slots lapped by three records: the third appender
    /// waits for the consumer to free slot 0, and its record is not
    /// overwritten or lost.
    #[test]
    fn lapping_waits_for_the_consumer() {
        loom::model(|| {
            let ring = Arc::new(Ring::new(2));
            let producer = {
                let ring = ring.clone();
                thread::spawn(move || {
                    for v in 0..3u8 {
                        let pos = ring.reserve();
                        while !ring.writable(pos) {
                            thread::yield_now();
                        }
                        ring.publish(pos, 1, |buf| buf[0] = v);
                    }
                })
            };
            let mut pos = 0;
            while pos < 3 {
                if ring.consume(pos, |b| assert_eq!(b, &[pos as u8])) {
                    pos += 1;
                } else {
                    thread::yield_now();
                }
            }
            producer.join().unwrap();
        });
    }
}
