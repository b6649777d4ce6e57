//! Lock modes and their compatibility.
//!
//! The six modes of the VMS/Linux DLM. POSIX, OFD and flock locks use two of
//! them: a read lock is [`Mode::PR`], a write lock [`Mode::EX`]; PR is
//! compatible with PR and EX with nothing, which is exactly the POSIX rule.

use crate::error::LockError;

/// A DLM lock mode, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Null: holds a place (and the value block) but blocks nothing.
    NL = 0,
    /// Concurrent read.
    CR = 1,
    /// Concurrent write.
    CW = 2,
    /// Protected read (POSIX read lock).
    PR = 3,
    /// Protected write.
    PW = 4,
    /// Exclusive (POSIX write lock).
    EX = 5,
}

/// `COMPAT[a][b]`: may a lock of mode `a` be granted beside one of mode `b`.
const COMPAT: [[bool; 6]; 6] = [
    //  NL    CR     CW     PR     PW     EX
    [true, true, true, true, true, true],      // NL
    [true, true, true, true, true, false],     // CR
    [true, true, true, false, false, false],   // CW
    [true, true, false, true, false, false],   // PR
    [true, true, false, false, false, false],  // PW
    [true, false, false, false, false, false], // EX
];

impl Mode {
    /// Every mode, in index order.
    pub const ALL: [Mode; 6] = [Mode::NL, Mode::CR, Mode::CW, Mode::PR, Mode::PW, Mode::EX];

    /// Whether a lock of mode `self` may be held beside one of mode `other`.
    pub fn compatible(self, other: Mode) -> bool {
        COMPAT[self as usize][other as usize]
    }

    /// Whether `self` blocks at least what `other` does, so a lock held
    /// in `self` converts to `other` without waiting. Not a total order:
    /// neither of CW and PR covers the other. O(1).
    pub fn covers(self, other: Mode) -> bool {
        Mode::ALL.iter().all(|&m| self.compatible(m) <= other.compatible(m))
    }

    /// Whether a grant in this mode lets its holder write, and so moves the
    /// resource's fencing token on.
    pub fn is_write(self) -> bool {
        matches!(self, Mode::CW | Mode::PW | Mode::EX)
    }

    /// Whether `self` is a POSIX lock type (read = PR, write = EX).
    pub fn is_posix(self) -> bool {
        matches!(self, Mode::PR | Mode::EX)
    }

    /// The lowercase name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::NL => "nl",
            Mode::CR => "cr",
            Mode::CW => "cw",
            Mode::PR => "pr",
            Mode::PW => "pw",
            Mode::EX => "ex",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = LockError;

    /// DLM names (`nl cr cw pr pw ex`) and the POSIX aliases `rd`/`read`
    /// (PR) and `wr`/`write` (EX), any case.
    fn from_str(s: &str) -> Result<Mode, LockError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "nl" => Mode::NL,
            "cr" => Mode::CR,
            "cw" => Mode::CW,
            "pr" | "rd" | "read" => Mode::PR,
            "pw" => Mode::PW,
            "ex" | "wr" | "write" => Mode::EX,
            _ => return Err(LockError::InvalidMode(s.to_string())),
        })
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_is_the_dlm_lattice() {
        use Mode::*;
        for (a, b) in [(EX, PW), (PW, PR), (PW, CW), (PR, CR), (CW, CR), (CR, NL), (EX, NL), (PR, PR)] {
            assert!(a.covers(b) && (a == b || !b.covers(a)), "{a:?} over {b:?}");
        }
        assert!(!PR.covers(CW) && !CW.covers(PR));
    }

    #[test]
    fn matrix_is_symmetric_and_standard() {
        for a in Mode::ALL {
            for b in Mode::ALL {
                assert_eq!(a.compatible(b), b.compatible(a), "{a} vs {b}");
            }
            assert!(a.compatible(Mode::NL));
        }
        assert!(Mode::PR.compatible(Mode::PR));
        assert!(!Mode::PR.compatible(Mode::EX) && !Mode::EX.compatible(Mode::EX));
        assert!(Mode::CW.compatible(Mode::CW) && !Mode::CW.compatible(Mode::PR));
        assert!(Mode::PW.compatible(Mode::CR) && !Mode::PW.compatible(Mode::PW));
    }

    #[test]
    fn parse() {
        assert_eq!("wr".parse::<Mode>().unwrap(), Mode::EX);
        assert_eq!("PR".parse::<Mode>().unwrap(), Mode::PR);
        assert!("xx".parse::<Mode>().is_err());
    }
}
