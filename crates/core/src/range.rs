//! Byte ranges: inclusive `[start, end]` over `0..=OFFSET_MAX`.
//!
//! POSIX describes a range as `(l_start, l_len)` with `l_len = 0` meaning "to
//! the end of the file, however far it grows" and a negative `l_len` meaning
//! the bytes before `l_start`. Linux stores the closed interval with
//! `OFFSET_MAX` standing for "end of file"; so do we, which makes every
//! comparison a plain integer comparison and keeps `end + 1` from ever
//! overflowing a `u64`.

use crate::error::LockError;

/// The largest offset a lock may cover: `i64::MAX`, as in Linux.
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// A closed byte range `[start, end]` with `start <= end <= OFFSET_MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Range {
    start: u64,
    end: u64,
}

impl Range {
    /// The whole file: what `flock(2)` and `l_len = 0` from 0 lock.
    pub const WHOLE: Range = Range { start: 0, end: OFFSET_MAX };

    /// `[start, end]`; an error if `start > end` or `end > OFFSET_MAX`.
    pub fn new(start: u64, end: u64) -> Result<Range, LockError> {
        if start > end {
            return Err(LockError::InvalidRange(format!("start {start} is after end {end}")));
        }
        if end > OFFSET_MAX {
            return Err(LockError::InvalidRange(format!("end {end} is beyond OFFSET_MAX ({OFFSET_MAX})")));
        }
        Ok(Range { start, end })
    }

    /// The range of a `struct flock` with `l_whence = SEEK_SET`, following
    /// Linux `flock_to_posix_lock`: `len = 0` runs to end of file, a
    /// negative `len` covers `[start + len, start - 1]`.
    pub fn from_posix(start: i64, len: i64) -> Result<Range, LockError> {
        if start < 0 {
            return Err(LockError::InvalidRange(format!("start {start} is negative")));
        }
        let (s, e) = match len {
            0 => (start, i64::MAX),
            l if l > 0 => {
                let e = start.checked_add(l - 1).ok_or_else(|| {
                    LockError::InvalidRange(format!("start {start} + length {l} is beyond OFFSET_MAX"))
                })?;
                (start, e)
            }
            l => {
                let s = start + l; // start >= 0 and l < 0: no overflow
                if s < 0 {
                    return Err(LockError::InvalidRange(format!(
                        "negative length {l} reaches before offset 0 from start {start}"
                    )));
                }
                (s, start - 1)
            }
        };
        Range::new(s as u64, e as u64)
    }

    /// First byte.
    pub fn start(self) -> u64 {
        self.start
    }

    /// Last byte (inclusive); `OFFSET_MAX` for "to end of file".
    pub fn end(self) -> u64 {
        self.end
    }

    /// Whether the range runs to end of file.
    pub fn to_eof(self) -> bool {
        self.end == OFFSET_MAX
    }

    /// `l_len` of this range as POSIX reports it: 0 for "to end of file".
    pub fn posix_len(self) -> u64 {
        if self.to_eof() { 0 } else { self.end - self.start + 1 }
    }

    /// Whether every byte of `other` is in this range.
    pub fn contains(self, other: Range) -> bool {
        self.start <= other.start && other.end <= self.end
    }

    /// Whether the two ranges share a byte.
    pub fn overlaps(self, other: Range) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// Whether the two ranges share a byte or touch end to start.
    pub fn touches(self, other: Range) -> bool {
        // end <= OFFSET_MAX < u64::MAX, so end + 1 cannot overflow.
        self.start <= other.end + 1 && other.start <= self.end + 1
    }

    /// The bytes both ranges cover, if any.
    pub fn intersection(self, other: Range) -> Option<Range> {
        self.overlaps(other).then(|| Range { start: self.start.max(other.start), end: self.end.min(other.end) })
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.to_eof() { write!(f, "[{}, EOF]", self.start) } else { write!(f, "[{}, {}]", self.start, self.end) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_lengths() {
        assert_eq!(Range::from_posix(5, 0).unwrap(), Range::new(5, OFFSET_MAX).unwrap());
        assert_eq!(Range::from_posix(5, 3).unwrap(), Range::new(5, 7).unwrap());
        assert_eq!(Range::from_posix(5, -3).unwrap(), Range::new(2, 4).unwrap());
        assert_eq!(Range::from_posix(i64::MAX, 1).unwrap(), Range::new(OFFSET_MAX, OFFSET_MAX).unwrap());
        assert!(Range::from_posix(i64::MAX, 2).is_err());
        assert!(Range::from_posix(2, -3).is_err());
        assert!(Range::from_posix(-1, 1).is_err());
        assert!(Range::new(3, 2).is_err());
        assert!(Range::new(0, OFFSET_MAX + 1).is_err());
        assert_eq!(Range::from_posix(7, 0).unwrap().posix_len(), 0);
        assert_eq!(Range::from_posix(7, 9).unwrap().posix_len(), 9);
    }

    #[test]
    fn touching_at_the_top() {
        let top = Range::new(OFFSET_MAX, OFFSET_MAX).unwrap();
        assert!(top.touches(Range::new(0, OFFSET_MAX - 1).unwrap()));
        assert!(!top.overlaps(Range::new(0, OFFSET_MAX - 1).unwrap()));
        assert!(Range::new(0, 4).unwrap().touches(Range::new(5, 9).unwrap()));
        assert!(!Range::new(0, 3).unwrap().touches(Range::new(5, 9).unwrap()));
    }
}
