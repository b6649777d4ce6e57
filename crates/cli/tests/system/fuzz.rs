//! The server under requests that decode but make no sense: every request
//! of the protocol, with fields drawn at random (inodes that do not
//! exist, offsets at `u64::MAX`, names with `/`, NUL or 300 bytes, modes
//! past EX, ranges backwards, acknowledgements of bytes never sent,
//! evictions of other sessions, ids used twice), from clients that said
//! hello. The server must answer each with a reply or an error, or close
//! that one connection, and nothing else: no panic in any task, every
//! frame it sends decodes, a normal client is served throughout, and the
//! namespace it leaves is sound (`fsck`). After a `kill -9`, the server
//! that replays its journal must come back with the very tree it left
//! (every path, attribute, symlink target, extended attribute, attribute
//! flag, and each file's data at both ends and in its first 64 runs of
//! data): each kind of change the run made, however odd, is replayed as it was made; and with the changelog it had, in
//! order, each record once. And no two owners ever hold one byte of a
//! lock resource in conflicting modes (looked at every 5,000 requests).
//!
//! The requests come from a serde `Deserializer` that makes up whatever
//! value it is asked for (`Made`), so every variant of every message,
//! including those added later, is drawn without a list to keep. Its
//! numbers lean to the ones that find edges (0, 1, the first inodes,
//! powers of two, the top of each width). The run's seed is printed and
//! `FUZZ_SEED` repeats it; `FUZZ_REQUESTS` sets the length (100,000).

use crate::common;

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use common::{
    BIN, Draw, ServerProc, Tmpfs, client, lock_cmd, raw_frame, raw_hello_resuming, rt, try_read_raw_frame, wait_for,
};
use interlock_core::Mode;
use interlock_proto::meta::{Asking, ChangelogRecord, MetaReply, Once};
use interlock_proto::{ClientMsg, GrantInfo, Kind, Op, Reply, Secret, ServerMsg, Target};
use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, SeqAccess, VariantAccess, Visitor};

/// What the sessions' readers learn from the answers, shared by all.
#[derive(Default)]
struct Answers {
    /// The inodes, DLM handles and queued requests the answers named,
    /// most recent last (at most 256): made-up requests name them often,
    /// so that they act on files, locks and waits that exist rather than
    /// fail at the first look-up.
    seen: Mutex<VecDeque<u64>>,
    /// Answers to requests: all, to namespace requests, and those of
    /// them that succeeded (how deep the run went).
    any: AtomicU64,
    meta: AtomicU64,
    meta_ok: AtomicU64,
    /// Locks granted, at once or later.
    granted: AtomicU64,
}

impl Answers {
    /// Counts `m` and notes the inodes, DLM handles and queued requests
    /// it names.
    fn note(&self, m: &ServerMsg) {
        let reply = match m {
            ServerMsg::Granted { grant, .. } => return self.granted(grant),
            ServerMsg::Reply { id, reply: Reply::Queued } => return self.saw([*id]),
            ServerMsg::Reply { reply, .. } => reply,
            _ => return,
        };
        self.any.fetch_add(1, Ordering::Relaxed);
        let reply = match reply {
            Reply::Meta(reply) => reply,
            Reply::Errno(_) | Reply::NotMade => {
                self.meta.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Reply::Granted(grant) => return self.granted(grant),
            _ => return,
        };
        self.meta.fetch_add(1, Ordering::Relaxed);
        self.meta_ok.fetch_add(1, Ordering::Relaxed);
        match reply {
            MetaReply::Attr(a) => self.saw([a.ino]),
            MetaReply::Entries { entries, .. } => self.saw(entries.iter().map(|e| e.ino)),
            _ => {}
        }
    }

    fn granted(&self, grant: &GrantInfo) {
        self.granted.fetch_add(1, Ordering::Relaxed);
        self.saw(grant.handle);
    }

    /// Adds `numbers` to those seen, forgetting the oldest past 256.
    fn saw(&self, numbers: impl IntoIterator<Item = u64>) {
        let mut seen = self.seen.lock().unwrap();
        for n in numbers {
            if seen.len() == 256 {
                seen.pop_front();
            }
            seen.push_back(n);
        }
    }
}

/// The seeded draw, and the answers, whose inodes a number is drawn from
/// `pool` times in ten.
struct Rng {
    draw: Draw,
    answers: Arc<Answers>,
    pool: u64,
}

impl Rng {
    fn next(&mut self) -> u64 {
        self.draw.next()
    }

    fn below(&mut self, n: u64) -> u64 {
        self.draw.below(n)
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.draw.chance(one_in)
    }

    /// A number that finds edges more often than a uniform one would.
    fn number(&mut self) -> u64 {
        let seen = self.answers.seen.lock().unwrap().len() as u64;
        if seen > 0 && self.below(10) < self.pool {
            let at = self.below(seen) as usize;
            return self.answers.seen.lock().unwrap()[at];
        }
        match self.below(8) {
            0 | 1 => self.below(4),
            2 => self.below(40),
            3 => 1 << self.below(64),
            4 => u64::MAX - self.below(3),
            5 => (i64::MAX as u64) - self.below(3),
            6 => u64::from(u32::MAX) - self.below(3),
            _ => self.next(),
        }
    }

    /// Bytes for a name, a value or a resource: one of [`NAMES`], or
    /// random bytes.
    fn bytes(&mut self) -> Vec<u8> {
        let [odd, xattrs, plain] = &*NAMES;
        let drawn = match self.below(12) {
            0 => return (0..self.below(64)).map(|_| self.next() as u8).collect(),
            1..=6 => odd,
            7 | 8 => xattrs,
            _ => plain,
        };
        drawn[self.below(drawn.len() as u64) as usize].clone()
    }
}

/// The names, values and lock resources drawn, besides random bytes:
/// odd ones (empty, `.`, `..`, with `/` or NUL, 255 and 256 bytes long),
/// extended attributes' names in each namespace (`user.`, `trusted.`,
/// `security.`, the ACLs'), and plain ones (changelog consumers' among
/// them, but never [`OWN`]). Drawn from a few, names meet again: a file made is
/// found, a lock taken is met by another, a consumer registered is read
/// and cleared.
static NAMES: LazyLock<[Vec<Vec<u8>>; 3]> = LazyLock::new(|| {
    let odd = [&b""[..], b".", b"..", b"a/b", b"a\0b", &[b'n'; 255], &[b'n'; 256]];
    let xattrs =
        ["user.", "trusted.", "security."].iter().flat_map(|space| (0..3).map(move |i| format!("{space}x{i}")));
    let acls = ["system.posix_acl_access", "system.posix_acl_default"].map(String::from);
    [
        odd.map(<[u8]>::to_vec).to_vec(),
        xattrs.chain(acls).map(String::into_bytes).collect(),
        (0..6).map(|i| format!("f{i}")).chain((2..5).map(|i| format!("cl{i}"))).map(String::into_bytes).collect(),
    ]
});

/// A value of any type serde asks for, made up from `rng`: a
/// `Deserializer` with no input.
struct Made<'r> {
    rng: &'r mut Rng,
    depth: u32,
}

type Error = de::value::Error;

macro_rules! number {
    ($($method:ident => $visit:ident as $t:ty),*) => {
        $(fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
            v.$visit(self.rng.number() as $t)
        })*
    };
}

impl<'de> Deserializer<'de> for &mut Made<'_> {
    type Error = Error;

    number!(deserialize_u8 => visit_u8 as u8, deserialize_u16 => visit_u16 as u16,
        deserialize_u32 => visit_u32 as u32, deserialize_u64 => visit_u64 as u64,
        deserialize_i8 => visit_i8 as i8, deserialize_i16 => visit_i16 as i16,
        deserialize_i32 => visit_i32 as i32, deserialize_i64 => visit_i64 as i64,
        deserialize_u128 => visit_u128 as u128, deserialize_i128 => visit_i128 as i128,
        deserialize_f32 => visit_f32 as f32, deserialize_f64 => visit_f64 as f64);

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("the messages are not self-describing"))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_bool(self.rng.chance(2))
    }

    fn deserialize_char<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_char('a')
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_string(v)
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_string(String::from_utf8_lossy(&self.rng.bytes()).into_owned())
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_byte_buf(v)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_byte_buf(self.rng.bytes())
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        if self.rng.chance(3) { v.visit_none() } else { v.visit_some(self) }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> Result<V::Value, Error> {
        v.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        // Deep in a value, sequences stay short: the value stays finite.
        let n = if self.depth > 4 { 0 } else { self.rng.below(4) as usize };
        self.deserialize_tuple(n, v)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, n: usize, v: V) -> Result<V::Value, Error> {
        self.depth += 1;
        let r = v.visit_seq(Fields { made: self, left: n });
        self.depth -= 1;
        r
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(self, _: &'static str, n: usize, v: V) -> Result<V::Value, Error> {
        self.deserialize_tuple(n, v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("no maps in the messages"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_tuple(fields.len(), v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let index = self.rng.below(variants.len() as u64) as u32;
        v.visit_enum(Variant { made: self, index })
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("identifiers come from deserialize_enum"))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_unit()
    }
}

/// The fields of a struct, tuple or sequence, each made up.
struct Fields<'a, 'r> {
    made: &'a mut Made<'r>,
    left: usize,
}

impl<'de> SeqAccess<'de> for Fields<'_, '_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.made).map(Some)
    }
}

/// An enum's variant, chosen at random, and its fields.
struct Variant<'a, 'r> {
    made: &'a mut Made<'r>,
    index: u32,
}

impl<'de, 'a, 'r> EnumAccess<'de> for Variant<'a, 'r> {
    type Error = Error;
    type Variant = &'a mut Made<'r>;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self::Variant), Error> {
        let index: de::value::U32Deserializer<Error> = self.index.into_deserializer();
        Ok((seed.deserialize(index)?, self.made))
    }
}

impl<'de> VariantAccess<'de> for &mut Made<'_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, n: usize, v: V) -> Result<V::Value, Error> {
        self.deserialize_tuple(n, v)
    }

    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], v: V) -> Result<V::Value, Error> {
        self.deserialize_tuple(fields.len(), v)
    }
}

/// A request: half of them namespace operations, most of those by root
/// (whom permissions stop least, so they go deepest) and with most of
/// their numbers inodes the server named, a tenth changelog requests,
/// the rest any request, most lock requests made [`lockable`].
fn request(rng: &mut Rng, id: u64) -> Op {
    match rng.below(10) {
        0..=4 => {
            let cred = if rng.chance(4) { made(rng) } else { interlock_meta::Cred::root() };
            rng.pool = 7;
            let op = made(rng);
            rng.pool = 2;
            // A change asked for again after a restart (`Again`,
            // `IfMade`) is answered from the replay cache, mostly without
            // making it: an eighth of them, so that most are made. The
            // rest are asked for the first time, as a client asks, every
            // earlier one settled.
            let once = if rng.chance(8) { made(rng) } else { Some(Once { settled: id, asking: Asking::First }) };
            Op::Meta { cred, op, once }
        }
        5 => Op::Changelog(made(rng)),
        _ => loop {
            // Requests that end a session (its own, or another's) come a
            // tenth as often, so that sessions live long enough to hold
            // locks and files.
            match made(rng) {
                Op::Bye | Op::Evict { .. } if !rng.chance(10) => {}
                op if rng.chance(4) => break op,
                op => break lockable(op),
            }
        },
    }
}

/// `op`, if a lock request, made one that is granted or meets a
/// conflict rather than refused at once: a mode its kind has (read or
/// write but for DLM), a range that runs forward within a file's bytes,
/// an owner among a few (so that owners meet), a reclaim rarely (it is
/// refused but in the recovery window after a restart). Any other
/// request as it is.
fn lockable(op: Op) -> Op {
    const LAST: u64 = i64::MAX as u64;
    let target = |t: Target| {
        let (start, end) = (t.start.min(t.end).min(LAST), t.start.max(t.end).min(LAST));
        Target { start, end, owner: t.owner % 4, ..t }
    };
    let mode = |kind: Kind, m: u8| match kind {
        Kind::Dlm => m % 6,
        _ if m.is_multiple_of(2) => Mode::PR as u8,
        _ => Mode::EX as u8,
    };
    match op {
        Op::Lock { target: t, mode: m, wait, reclaim } => {
            let reclaim = reclaim && t.owner.is_multiple_of(8);
            Op::Lock { mode: mode(t.kind, m), target: target(t), wait, reclaim }
        }
        Op::Unlock { target: t } => Op::Unlock { target: target(t) },
        Op::Test { target: t, mode: m } => Op::Test { mode: mode(t.kind, m), target: target(t) },
        Op::Close { resource, kind, owner } => Op::Close { resource, kind, owner: owner % 4 },
        Op::DlmConvert { resource, owner, handle, mode: m, wait, lvb } => {
            Op::DlmConvert { resource, owner: owner % 4, handle, mode: m % 6, wait, lvb }
        }
        Op::DlmUnlock { resource, owner, handle, lvb } => Op::DlmUnlock { resource, owner: owner % 4, handle, lvb },
        op => op,
    }
}

/// A value made up from `rng` (drawn again where a type refuses what
/// was drawn, as one that checks its value may).
fn made<T: serde::de::DeserializeOwned>(rng: &mut Rng) -> T {
    loop {
        if let Ok(v) = T::deserialize(&mut Made { rng: &mut *rng, depth: 0 }) {
            return v;
        }
    }
}

/// A raw session: requests go out on `stream`; a thread reads every
/// frame the server sends, checks that it decodes, and counts its bytes.
struct Session {
    stream: TcpStream,
    /// The session's id and secret, and its client's.
    id: u64,
    secret: Secret,
    origin: u64,
    received: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
    reader: std::thread::JoinHandle<Result<(), String>>,
}

impl Session {
    /// A new session of client `origin`, or with `resume` (a session,
    /// its secret, the bytes of its stream taken in) that one; `None` if
    /// the server refuses it, or closes the connection without a word (a
    /// newer connection took the session over).
    fn open(addr: &str, origin: u64, answers: &Arc<Answers>, resume: Option<(u64, Secret, u64)>) -> Option<Session> {
        let mut stream = TcpStream::connect(addr).unwrap();
        let mut r = stream.try_clone().unwrap();
        let Some(ServerMsg::Welcome { session, secret, resumed, .. }) =
            raw_hello_resuming(&mut stream, &mut r, origin, resume)
        else {
            return None;
        };
        stream.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        // The server's stream goes on from where the resume said.
        let from = resume.filter(|_| resumed).map_or(0, |(_, _, received)| received);
        let (received, closed) = (Arc::new(AtomicU64::new(from)), Arc::new(AtomicBool::new(false)));
        let reader = {
            let (received, closed, answers) = (received.clone(), closed.clone(), answers.clone());
            std::thread::spawn(move || {
                let r = (|| {
                    while let Some(body) = try_read_raw_frame(&mut r) {
                        let m = interlock_proto::decode::<ServerMsg>(&body)
                            .map_err(|e| format!("a frame of {} bytes does not decode: {e}", body.len()))?;
                        received.fetch_add(4 + body.len() as u64, Ordering::Relaxed);
                        answers.note(&m);
                        if matches!(m, ServerMsg::Goodbye { .. }) {
                            // Evicted: the server closes the connection.
                            closed.store(true, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })();
                closed.store(true, Ordering::Relaxed);
                r
            })
        };
        Some(Session { stream, received, closed, reader, id: session, secret, origin })
    }

    /// Sends `op` as request `id`; false once the connection is gone, or
    /// when `op` ends the session (a `Bye`: nothing sent after it would
    /// be read).
    fn send(&mut self, id: u64, op: Op) -> bool {
        let bye = matches!(op, Op::Bye);
        !self.closed.load(Ordering::Relaxed)
            && self.stream.write_all(&raw_frame(&ClientMsg::Request { id, op })).is_ok()
            && !bye
    }

    /// Acknowledges what was taken in, as a client does, so that the
    /// server's stream for the session stays small.
    fn acknowledge(&mut self, id: u64) -> bool {
        let received = self.received.load(Ordering::Relaxed);
        self.send(id, Op::Renew { received })
    }

    fn close(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Err(e) = self.reader.join().unwrap() {
            panic!("{e}");
        }
    }
}

/// The server survives made-up requests from several sessions, with no
/// panic, every answer decoding and a normal client served throughout;
/// then `fsck` finds its namespace sound, and a `kill -9`, a clean stop
/// and a restart after each change nothing in it. Half the requests come
/// after the first `kill -9`, to a server that replayed its journal.
#[test]
fn requests_with_any_fields_are_answered_or_close_only_their_connection() {
    let draw = Draw::seeded("FUZZ_SEED", "fuzz");
    let seed = draw.seed;
    let total: u64 = std::env::var("FUZZ_REQUESTS").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    eprintln!("fuzz: {total} requests");
    // A small tmpfs: a made-up `fallocate` of a terabyte takes no more
    // than it from the machine.
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("!! SKIPPED requests_with_any_fields_are_answered_or_close_only_their_connection: needs root");
        return;
    }
    let data = Tmpfs::of("256m");
    let log = tempfile::NamedTempFile::new().unwrap();
    let data_dir = data.path().to_str().unwrap();
    // A short recovery window: the run goes on through the one after
    // its first restart, reclaims and all. Checkpoints while it runs, so
    // that each restart loads an image and replays the journal after it.
    let serve = |log: &std::fs::File| {
        let args =
            ["--listen", "127.0.0.1:0", "--data", data_dir, "--recovery-ms", "2000", "--checkpoint-every", "500"];
        ServerProc::spawn_logged(&args, log)
    };
    let said = || std::fs::read_to_string(log.path()).unwrap();
    let fsck = |what: &str| {
        let out = Command::new(BIN).arg("fsck").arg(data.path()).output().unwrap();
        assert!(out.status.success(), "fsck {what} (seed {seed}): {}", String::from_utf8_lossy(&out.stdout));
    };
    let answers = Arc::new(Answers::default());
    let mut rng = Rng { draw, answers: answers.clone(), pool: 2 };
    let mut server = serve(log.as_file());
    let own = rt().block_on(async { client(&server.addr).await.changelog_register(None, u32::MAX).await.unwrap() });
    assert_eq!(own.id, OWN);
    let (mut made, mut counts, mut changelog_records) = (Tree::new(), Counts::default(), 0);
    // Two halves, each ended by a `kill -9`: the second runs on what
    // the first one's journal replays to.
    for half in [1..=total / 2, total / 2 + 1..=total] {
        let half = fuzz(&server.addr, &mut rng, half, seed);
        counts.reopened += half.reopened;
        counts.resumed += half.resumed;
        counts.held += half.held;
        let status = Command::new(BIN).args(["status", "--server", &server.addr]).output().unwrap();
        assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
        // What the run made, once the server has finished with its last
        // requests; then a `kill -9`: the server that replays its
        // journal must come back with exactly that, every change having
        // been answered (a process's writes outlive it).
        made = settled_tree(&server.addr);
        let records = changelog_of(&server.addr, seed);
        server.kill9();
        assert!(!said().contains("panicked"), "the server panicked (seed {seed}):\n{}", said());
        fsck("after a kill -9");
        server = serve(log.as_file());
        // The next half starts in the recovery window.
        assert_same_tree(&made, &tree_of(&server.addr), "after a kill -9 and a restart", seed);
        let replayed = changelog_of(&server.addr, seed);
        assert!(replayed.starts_with(&records), "the changelog lost records in a kill -9 (seed {seed})");
        changelog_records = records.len();
    }
    assert_eq!(lock_cmd(&server.addr, &["fuzz-alive", "--", "true"]).status().unwrap().code(), Some(0));
    let [any, meta, meta_ok, granted] =
        [&answers.any, &answers.meta, &answers.meta_ok, &answers.granted].map(|n| n.load(Ordering::Relaxed));
    let kinds: std::collections::BTreeSet<_> = made.values().map(|v| v.split(',').nth(1).unwrap_or_default()).collect();
    eprintln!(
        "{any} requests answered, {meta} of them namespace requests, of which {meta_ok} succeeded; \
         {granted} locks granted, {} found held by the checks for two holders; \
         {} sessions ended by their requests and were opened again, {} of them resumed; \
         the run left {} paths ({kinds:?}), {} with extended attributes, and {changelog_records} changelog records",
        counts.held,
        counts.reopened,
        counts.resumed,
        made.len(),
        made.values().filter(|v| v.contains('=')).count()
    );
    // A run whose requests all fail at the first look-up tests little:
    // about a fifth succeed (one in twelve before the inodes seen were
    // drawn this often and sessions known to be over were replaced).
    assert!(meta_ok * 10 >= meta, "too few namespace requests succeeded to test much (seed {seed})");
    // And after a clean stop: sound, and the same again once opened.
    server.terminate();
    fsck("after a clean stop");
    let mut again = serve(log.as_file());
    assert_same_tree(&made, &tree_of(&again.addr), "after a clean stop and a restart", seed);
    again.terminate();
    fsck("after the last stop");
    assert!(!said().contains("panicked"), "the server panicked (seed {seed}):\n{}", said());
}

/// What a run did, besides its answers.
#[derive(Default)]
struct Counts {
    /// Sessions its requests ended (or whose connection closed), and of
    /// them those resumed.
    reopened: u64,
    resumed: u64,
    /// Holders the checks for two looked at.
    held: usize,
}

/// Sends requests `ids` to the server at `addr`, made up from `rng`,
/// from three sessions, each opened again when its requests end it;
/// checks that a normal client is served, and that no lock has two
/// holders, every 5,000 requests and at the end.
fn fuzz(addr: &str, rng: &mut Rng, ids: std::ops::RangeInclusive<u64>, seed: u64) -> Counts {
    let answers = rng.answers.clone();
    let mut origin = ids.start() * 10;
    let new = |origin| Session::open(addr, origin, &answers, None).expect("a new session is welcome");
    let mut sessions: Vec<Session> = (1..=3).map(|o| new(origin + o)).collect();
    let mut counts = Counts::default();
    origin += 3;
    for id in ids {
        let which = rng.below(sessions.len() as u64) as usize;
        let s = &mut sessions[which];
        let sent = if id % 64 == 0 {
            s.acknowledge(id)
        } else if rng.chance(200) {
            // Any message: a second hello, a request with any id.
            let msg: ClientMsg = made(rng);
            s.stream.write_all(&raw_frame(&msg)).is_ok()
        } else {
            s.send(id, request(rng, id))
        };
        if !sent {
            // Ended by its own request (a `Bye`, an acknowledgement of
            // bytes never sent, an eviction by another), or its
            // connection closed: a third of the time resumed, as a
            // client whose connection dropped does (now and then with a
            // made-up secret or position), else a new one. A client's
            // own requests after a resume are new ones: none is sent
            // again.
            let old = sessions.swap_remove(which);
            let (session, secret, received) = (old.id, old.secret, old.received.load(Ordering::Relaxed));
            let old_origin = old.origin;
            old.close();
            counts.reopened += 1;
            let resume = rng.chance(3).then(|| {
                let secret = if rng.chance(10) { made(rng) } else { secret };
                // A made-up position is the start (gone if acknowledged
                // since) or past what was ever sent: one inside a frame
                // would have the server resend from there, as the client
                // asked, and what it read would not decode.
                let received = match rng.below(20) {
                    0 => 0,
                    1 => received.saturating_add(1 << 32).saturating_add(rng.number() >> 1),
                    _ => received,
                };
                (session, secret, received)
            });
            let resumed = resume.and_then(|resume| Session::open(addr, old_origin, &answers, Some(resume)));
            counts.resumed += u64::from(resumed.as_ref().is_some_and(|s| s.id == session));
            sessions.push(resumed.unwrap_or_else(|| {
                origin += 1;
                new(origin)
            }));
        }
        if id % 5_000 == 0 {
            assert_eq!(lock_cmd(addr, &["fuzz-alive", "--", "true"]).status().unwrap().code(), Some(0));
            counts.held += assert_one_holder(addr, seed);
        }
    }
    for s in sessions {
        s.close();
    }
    counts.held += assert_one_holder(addr, seed);
    counts
}

/// Fails unless, on each lock resource the run draws often ([`NAMES`]),
/// the holders of each lock map (record, flock, DLM) are compatible
/// wherever their ranges overlap: no two owners hold one byte in
/// conflicting modes, whatever cancels, conversions, closes, evictions
/// and session ends the run made. A DLM lock conflicts even with its
/// owner's others. The holders looked at.
fn assert_one_holder(addr: &str, seed: u64) -> usize {
    use interlock_core::LockKind;
    rt().block_on(async {
        let c = client(addr).await;
        let mut looked = 0;
        for resource in NAMES.iter().flatten() {
            let held = c.inspect(resource).await.unwrap().holders;
            looked += held.len();
            for (i, a) in held.iter().enumerate() {
                for b in &held[i + 1..] {
                    let (ka, kb) = (LockKind::from(a.kind), LockKind::from(b.kind));
                    let one_owner = ka != LockKind::Dlm && (a.session, ka, a.owner) == (b.session, kb, b.owner);
                    let meet = ka.namespace() == kb.namespace() && a.start <= b.end && b.start <= a.end;
                    let compatible = Mode::ALL[usize::from(a.mode)].compatible(Mode::ALL[usize::from(b.mode)]);
                    let name = String::from_utf8_lossy(resource);
                    assert!(!meet || one_owner || compatible, "two holders of {name:?} (seed {seed}): {a:?} and {b:?}");
                }
            }
        }
        looked
    })
}

/// The test's own changelog consumer: registered before the run, it
/// sees every type, and the run never names it (nor clears it).
const OWN: &str = "cl1";

/// Every record of [`OWN`], checked to be in order, each once. (Not
/// without gaps: an orphan's end is a journal record no consumer sees.)
fn changelog_of(addr: &str, seed: u64) -> Vec<ChangelogRecord> {
    rt().block_on(async {
        let c = client(addr).await;
        let mut all: Vec<ChangelogRecord> = Vec::new();
        loop {
            let from = all.last().map(|r| r.index + 1);
            let page = c.changelog_read(OWN, from, 4096, Duration::ZERO).await.unwrap();
            if page.is_empty() {
                break;
            }
            all.extend(page);
        }
        for pair in all.windows(2) {
            assert!(pair[0].index < pair[1].index, "a repeat or a step back in the changelog (seed {seed})");
        }
        all
    })
}

/// Every path of the namespace as root sees it, with what it names: its
/// attributes (times included: a read changes no `atime`, as a mount is
/// `noatime`), a symlink's target or a regular file's data (a hash of
/// its ends), the extended attributes, the attribute flags (`chattr`'s).
type Tree = std::collections::BTreeMap<Vec<u8>, String>;

/// The tree of the server at `addr`, walked through a client.
fn tree_of(addr: &str) -> Tree {
    use interlock_client::meta::{Cred, FileType, ROOT};
    let root = Cred::root();
    rt().block_on(async {
        let c = client(addr).await;
        let mut tree = Tree::new();
        let mut dirs = vec![(b"".to_vec(), ROOT)];
        while let Some((path, dir)) = dirs.pop() {
            let mut cookie = 0;
            loop {
                let (page, end) = c.readdir(&root, dir, cookie, 1024, true).await.unwrap();
                for e in &page {
                    cookie = e.cookie;
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let at = [&path[..], b"/", &e.name].concat();
                    let a = e.attr.clone().expect("nothing changes the tree while it is walked");
                    let target = match a.kind {
                        FileType::Symlink => c.readlink(&root, a.ino).await.unwrap(),
                        FileType::Regular => format!("{:016x}", fnv(&sampled(&c, a.ino, a.size).await)).into_bytes(),
                        _ => Vec::new(),
                    };
                    let mut xattrs = String::new();
                    for name in c.listxattr(&root, a.ino).await.unwrap() {
                        let value = c.getxattr(&root, a.ino, &name).await.unwrap();
                        let shown = String::from_utf8_lossy(&value[..value.len().min(16)]).into_owned();
                        xattrs += &format!(" {}={shown:?}({})", String::from_utf8_lossy(&name), value.len());
                    }
                    if a.kind == FileType::Directory {
                        dirs.push((at.clone(), a.ino));
                    }
                    // `ENOTTY` for the inodes that have none.
                    let flags = c.flags(&root, a.ino, None).await.unwrap_or(0);
                    tree.insert(at, format!("{a:?} {:?}{xattrs} {flags:#x}", String::from_utf8_lossy(&target)));
                }
                if end {
                    break;
                }
            }
        }
        tree
    })
}

/// A regular file's data, sampled: its first and last 64 KiB, and the
/// first and last 64 KiB of each of its first 64 runs of data
/// (`SEEK_DATA` to `SEEK_HOLE`), each with where it was read. The files
/// of a run are sparse, up to 2^62 bytes, with writes anywhere in them:
/// until session 53 only the ends were read, and a write in the middle
/// lost by a restart went unseen.
async fn sampled(c: &interlock_client::Client, ino: u64, size: u64) -> Vec<u8> {
    use interlock_client::meta::Cred;
    use interlock_client::meta::SeekTo;
    let root = Cred::root();
    const SPAN: u64 = 64 << 10;
    let mut at = vec![0, size.saturating_sub(SPAN)];
    let mut from = 0;
    for _ in 0..64 {
        // ENXIO: no data past `from`.
        let Ok(start) = c.seek(&root, ino, from, SeekTo::Data).await else { break };
        let end = c.seek(&root, ino, start, SeekTo::Hole).await.unwrap();
        at.extend([start, end.saturating_sub(SPAN).max(start)]);
        from = end;
    }
    let mut data = Vec::new();
    for offset in at {
        data.extend(offset.to_le_bytes());
        data.extend(c.read(&root, ino, offset, SPAN as u32).await.unwrap());
    }
    data
}

/// FNV-1a of `data`: enough to tell data that changed.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The tree at `addr` once two walks in a row find the same: the
/// server may still be making the last requests it read when their
/// connections closed.
fn settled_tree(addr: &str) -> Tree {
    let mut last = tree_of(addr);
    wait_for("two walks of the tree in a row to find the same", || {
        let now = tree_of(addr);
        let same = now == last;
        last = now;
        same
    });
    last
}

/// Fails, naming the first paths that differ, unless `was` and `is` are
/// the same tree.
fn assert_same_tree(was: &Tree, is: &Tree, when: &str, seed: u64) {
    let differ: Vec<_> = was
        .keys()
        .chain(is.keys())
        .filter(|p| was.get(*p) != is.get(*p))
        .take(5)
        .map(|p| format!("{}: {:?} -> {:?}", String::from_utf8_lossy(p), was.get(p), is.get(p)))
        .collect();
    assert!(differ.is_empty(), "the tree differs {when} (seed {seed}, {} paths):\n{}", was.len(), differ.join("\n"));
}
