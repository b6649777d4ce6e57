//! The on-disk form of records and segment headers.
//!
//! A segment file starts with a 24-byte header, then holds records back to
//! back:
//!
//! ```text
//! header: magic "ILJSEG01" (8) | first index u64 | crc32c u32 | zero u32
//! record: len u32 | crc u32 | index u64 | durable_before u64 | seal u32 | zero u32 | payload (len bytes)
//! ```
//!
//! All integers are little-endian. `crc` is the CRC-32C of the length,
//! index and payload, computed by the appender in parallel with all the
//! others; `seal` is the CRC-32C of `crc`, `durable_before` and the zero
//! word, computed by the flusher, which alone knows `durable_before`, in
//! O(1) without reading the payload again. Together they cover every byte,
//! so a torn or flipped record never passes. `durable_before` is the highest index that was durable when the
//! record's group was written: recovery uses it to tell a torn tail (records
//! of a group whose fsync never completed) from corruption of records that
//! had been acknowledged (see `segment.rs`).

/// Bytes of a segment header.
pub const SEGMENT_HEADER: usize = 24;
/// Bytes of a record header.
pub const RECORD_HEADER: usize = 32;
/// The largest payload a record may carry.
pub const MAX_PAYLOAD: usize = 1 << 24;

const MAGIC: &[u8; 8] = b"ILJSEG01";

/// A segment header for a segment whose first record is `first`.
pub fn segment_header(first: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&first.to_le_bytes());
    let crc = crc32c::crc32c(&h[..16]);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The first index a segment header names, if the header is intact.
pub fn parse_segment_header(h: &[u8]) -> Option<u64> {
    if h.len() < SEGMENT_HEADER || &h[..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(h[16..20].try_into().ok()?);
    (crc == crc32c::crc32c(&h[..16])).then(|| u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")))
}

/// Appends the framed record to `out`.
pub fn encode(out: &mut Vec<u8>, index: u64, durable_before: u64, payload: &[u8]) {
    let start = out.len();
    out.resize(start + framed_len(payload), 0);
    prepare(&mut out[start..], index, payload);
    seal(&mut out[start..], durable_before);
}

/// The bytes of `payload`'s record, header and all.
pub fn framed_len(payload: &[u8]) -> usize {
    RECORD_HEADER + payload.len()
}

/// The appender's half of [`encode`], done in parallel with every other
/// appender: frames the record into `out` (of [`framed_len`] bytes) and
/// checksums it, leaving `durable_before` (known only to the flusher) for
/// [`seal`].
pub fn prepare(out: &mut [u8], index: u64, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("payload checked against MAX_PAYLOAD");
    out[..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].fill(0);
    out[8..16].copy_from_slice(&index.to_le_bytes());
    out[16..RECORD_HEADER].fill(0);
    out[RECORD_HEADER..].copy_from_slice(payload);
    let crc = crc_of(out);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// The flusher's half: sets `durable_before` and the seal over it. O(1).
pub fn seal(record: &mut [u8], durable_before: u64) {
    record[16..24].copy_from_slice(&durable_before.to_le_bytes());
    let seal = seal_of(record);
    record[24..28].copy_from_slice(&seal.to_le_bytes());
}

/// CRC-32C of `crc`, `durable_before` and the zero word: one call over 16
/// bytes gathered on the stack.
fn seal_of(record: &[u8]) -> u32 {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&record[4..8]);
    b[4..12].copy_from_slice(&record[16..24]);
    b[12..].copy_from_slice(&record[28..32]);
    crc32c::crc32c(&b)
}

/// CRC-32C of length, index and payload.
fn crc_of(record: &[u8]) -> u32 {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&record[..4]);
    b[4..].copy_from_slice(&record[8..16]);
    crc32c::crc32c_append(crc32c::crc32c(&b), &record[RECORD_HEADER..])
}

/// A record read back from bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub index: u64,
    pub durable_before: u64,
    pub payload: &'a [u8],
}

/// Why bytes are not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// The bytes end before the record does.
    Short,
    /// The record header is all zeros: never written.
    Zero,
    /// The checksum does not match, or the length is impossible.
    Checksum,
}

/// Decodes the record at the start of `bytes`; on success also returns its
/// total length.
pub fn decode(bytes: &[u8]) -> Result<(Frame<'_>, usize), Bad> {
    if bytes.len() < RECORD_HEADER {
        return Err(if bytes.iter().all(|&b| b == 0) { Bad::Zero } else { Bad::Short });
    }
    if bytes[..RECORD_HEADER].iter().all(|&b| b == 0) {
        return Err(Bad::Zero);
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    if len > MAX_PAYLOAD {
        return Err(Bad::Checksum);
    }
    let total = RECORD_HEADER + len;
    if bytes.len() < total {
        return Err(Bad::Short);
    }
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let seal = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    if crc != crc_of(&bytes[..total]) || seal != seal_of(bytes) || bytes[28..32] != [0; 4] {
        return Err(Bad::Checksum);
    }
    let index = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let durable_before = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    Ok((Frame { index, durable_before, payload: &bytes[RECORD_HEADER..total] }, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_flipped_bit_is_caught() {
        let mut buf = Vec::new();
        encode(&mut buf, 42, 40, b"hello");
        let (f, n) = decode(&buf).unwrap();
        assert_eq!((f.index, f.durable_before, f.payload, n), (42, 40, &b"hello"[..], buf.len()));
        for bit in 0..buf.len() * 8 {
            let mut b = buf.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&b).is_err(), "bit {bit} flipped went unnoticed");
        }
        assert_eq!(decode(&buf[..buf.len() - 1]), Err(Bad::Short));
        assert_eq!(decode(&[0; 40]), Err(Bad::Zero));
    }

    #[test]
    fn segment_headers() {
        assert_eq!(parse_segment_header(&segment_header(7)), Some(7));
        let mut h = segment_header(7);
        h[9] ^= 1;
        assert_eq!(parse_segment_header(&h), None);
    }
}
