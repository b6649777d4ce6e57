//! `interlock debug posix-replay`: run a script of POSIX lock operations on
//! one file through the engine, so a user can reproduce a lock problem
//! without a cluster. The format is in `interlock debug posix-replay --help`.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use interlock_core::{HeldLock, LockKind, LockRequest, LockSpace, Mode, Namespace, Outcome, Range};

const FILE: &[u8] = b"posix-replay";

/// One parsed line.
enum Line<'a> {
    Set { owner: &'a str, mode: Option<Mode>, range: Range },
    Get { owner: &'a str, mode: Mode, range: Range },
    Unlock { owner: &'a str, range: Range },
    Close { owner: &'a str },
    Dump,
    Skip,
}

fn parse_type(word: &str) -> Result<Option<Mode>, String> {
    match word {
        "rd" => Ok(Some(Mode::PR)),
        "wr" => Ok(Some(Mode::EX)),
        "un" => Ok(None),
        other => Err(format!("unknown lock type {other:?} (expected rd, wr or un)")),
    }
}

fn parse_range(start: &str, len: &str) -> Result<Range, String> {
    let start: i64 = start.parse().map_err(|_| format!("START {start:?} is not a byte offset"))?;
    let len: i64 = len.parse().map_err(|_| format!("LEN {len:?} is not a length"))?;
    Range::from_posix(start, len).map_err(|e| e.to_string())
}

fn parse(line: &str) -> Result<Line<'_>, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        [] => Ok(Line::Skip),
        [w, ..] if w.starts_with('#') => Ok(Line::Skip),
        ["dump"] => Ok(Line::Dump),
        [owner, "close", ..] => Ok(Line::Close { owner }),
        [owner, op @ ("setlk" | "getlk" | "unlk"), ty, start, len] => {
            let mode = parse_type(ty)?;
            let range = parse_range(start, len)?;
            match (*op, mode) {
                ("setlk", mode) => Ok(Line::Set { owner, mode, range }),
                ("getlk", Some(mode)) => Ok(Line::Get { owner, mode, range }),
                ("getlk", None) => Err("getlk needs a lock type to test: rd or wr".into()),
                _ => Ok(Line::Unlock { owner, range }),
            }
        }
        [_, "setlk" | "getlk" | "unlk", ..] => {
            Err(format!("expected 5 fields `OWNER OP TYPE START LEN`, got {}", words.len()))
        }
        [_, op, ..] => Err(format!("unknown operation {op:?} (expected setlk, getlk, unlk, close, or a line `dump`)")),
        [word] => Err(format!("{word:?} is not an operation (expected `OWNER OP TYPE START LEN` or `dump`)")),
    }
}

/// Owner names and the engine ids they map to.
#[derive(Default)]
struct Owners {
    ids: HashMap<String, u64>,
    names: Vec<String>,
}

impl Owners {
    fn id(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u64;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    fn name(&self, id: u64) -> &str {
        &self.names[id as usize]
    }

    /// Sort key: numeric names in numeric order, then the others by name.
    fn sort_key(&self, id: u64) -> (u8, u64, &str) {
        let name = self.name(id);
        match name.parse::<u64>() {
            Ok(n) => (0, n, name),
            Err(_) => (1, 0, name),
        }
    }
}

fn type_name(mode: Mode) -> &'static str {
    if mode == Mode::EX { "wr" } else { "rd" }
}

fn describe(owners: &Owners, owner: u64, mode: Mode, range: Range) -> String {
    format!("{} {} {} {}", owners.name(owner), type_name(mode), range.start(), range.posix_len())
}

/// Runs the script from `input`; returns how many lines were bad.
pub fn run(input: impl BufRead, mut out: impl Write, err: &mut impl Write) -> std::io::Result<usize> {
    let space = LockSpace::default();
    let mut owners = Owners::default();
    let mut bad = 0;
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        let parsed = match parse(&line) {
            Ok(p) => p,
            Err(e) => {
                writeln!(err, "interlock: line {}: {e}", n + 1)?;
                bad += 1;
                continue;
            }
        };
        let kind = LockKind::Ofd;
        let result = match parsed {
            Line::Skip => continue,
            Line::Dump => {
                let mut locks: Vec<HeldLock> = space.locks(FILE, Namespace::Record).expect("valid name");
                locks.sort_by(|a, b| {
                    (owners.sort_key(a.owner), a.range.start()).cmp(&(owners.sort_key(b.owner), b.range.start()))
                });
                for l in locks {
                    writeln!(out, "lock {}", describe(&owners, l.owner, l.mode, l.range))?;
                }
                writeln!(out, "end")?;
                continue;
            }
            Line::Set { owner, mode: Some(mode), range } => {
                let req = LockRequest { resource: FILE, owner: owners.id(owner), kind, mode, range, wait: false };
                space.lock(&req).map(|r| if r.outcome == Outcome::WouldBlock { "eagain".into() } else { "ok".into() })
            }
            Line::Set { owner, mode: None, range } | Line::Unlock { owner, range } => {
                space.unlock(FILE, owners.id(owner), kind, range).map(|_| "ok".into())
            }
            Line::Get { owner, mode, range } => {
                space.test(FILE, owners.id(owner), kind, mode, range).map(|c| match c {
                    None => "unlocked".into(),
                    Some(c) => format!("conflict {}", describe(&owners, c.owner, c.mode, c.range)),
                })
            }
            Line::Close { owner } => space.release_owner(FILE, owners.id(owner), kind).map(|_| "ok".into()),
        };
        match result {
            Ok(s) => writeln!(out, "{s}")?,
            Err(e) => {
                writeln!(err, "interlock: line {}: {e}", n + 1)?;
                bad += 1;
            }
        }
    }
    out.flush()?;
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(script: &str) -> (String, String, usize) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let bad = run(script.as_bytes(), &mut out, &mut err).unwrap();
        (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap(), bad)
    }

    #[test]
    fn merge_split_conflict_and_dump() {
        let (out, err, bad) = replay(
            "a setlk rd 0 10\n\
             a setlk wr 4 2\n\
             b setlk rd 5 1\n\
             b getlk wr 0 0\n\
             b setlk rd 20 0\n\
             a getlk wr 30 5\n\
             c getlk rd 100 1\n\
             dump\n\
             a close\n\
             dump\n",
        );
        assert_eq!(err, "");
        assert_eq!(bad, 0);
        assert_eq!(
            out,
            "ok\nok\neagain\nconflict a rd 0 4\nok\nconflict b rd 20 0\nunlocked\n\
             lock a rd 0 4\nlock a wr 4 2\nlock a rd 6 4\nlock b rd 20 0\nend\n\
             ok\nlock b rd 20 0\nend\n"
        );
    }

    #[test]
    fn bad_lines_are_reported_and_the_run_goes_on() {
        let (out, err, bad) = replay(
            "# a comment\n\
             a setlk xx 0 1\n\
             a frob rd 0 1\n\
             a setlk wr -1 1\n\
             a setlk wr 0\n\
             a getlk un 0 1\n\
             a setlk wr 0 1\n\
             \n\
             a setlk wr 9223372036854775807 2\n\
             dump\n",
        );
        assert_eq!(bad, 6);
        for n in [2, 3, 4, 5, 6, 9] {
            assert!(err.contains(&format!("line {n}:")), "line {n} not reported in {err}");
        }
        assert_eq!(out, "ok\nlock a wr 0 1\nend\n");
    }

    #[test]
    fn owners_sort_numerically() {
        let (out, _, _) = replay("10 setlk rd 0 1\n2 setlk rd 0 1\ndump\n");
        assert_eq!(out, "ok\nok\nlock 2 rd 0 1\nlock 10 rd 0 1\nend\n");
    }
}
