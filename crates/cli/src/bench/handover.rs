//! `bench handover`: seed 002's queue, in the engine alone. K owners want
//! one byte exclusively; one holds it, the others wait. Each step the
//! holder unlocks (the engine grants the head of the queue) and asks again
//! (it queues at the tail), so the queue stays K long. The cost of a step
//! must not grow with K: a hand-over that re-examines every waiter, or
//! rebuilds every waiter's waits-for edges, shows here as ns/step growing
//! with K long before it shows over the network.

use interlock_core::{Effect, LockKind, LockRequest, LockSpace, Mode, Outcome, Owner, Range};

use super::{Report, base_row, median, parse_size, timed};

#[derive(clap::Args)]
pub struct Args {
    /// Queue lengths to run (suffixes k and M allowed).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "10,100,1000,10000")]
    k: Vec<u64>,
    /// Hand-overs per run.
    #[arg(long, value_parser = parse_size, default_value = "20000")]
    steps: u64,
    /// Lock kinds to run: posix, ofd, flock, dlm.
    #[arg(long, value_delimiter = ',', default_value = "posix,ofd,flock,dlm")]
    kinds: Vec<String>,
    /// Runs per figure; the median is shown.
    #[arg(long, default_value_t = 3, value_parser = crate::args::count)]
    repeat: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

const COLUMNS: &[(&str, &str)] =
    &[("variant", "variant"), ("k", "n"), ("steps", "ops"), ("seconds", "seconds"), ("ns/step", "ns_per_op")];

pub fn run(args: Args) -> Result<(), String> {
    let kinds = args
        .kinds
        .iter()
        .map(|k| match k.as_str() {
            "posix" => Ok((k.as_str(), LockKind::Posix)),
            "ofd" => Ok((k.as_str(), LockKind::Ofd)),
            "flock" => Ok((k.as_str(), LockKind::Flock)),
            "dlm" => Ok((k.as_str(), LockKind::Dlm)),
            other => Err(format!("unknown lock kind {other:?} (posix, ofd, flock, dlm)")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut report = Report::new(args.json, COLUMNS);
    for &(name, kind) in &kinds {
        for &k in &args.k {
            let (seconds, ()) = median(args.repeat, || (once(kind, k, args.steps), ()));
            report.row(base_row("handover", name, k, seconds, args.steps));
        }
    }
    Ok(())
}

/// Seconds for `steps` hand-overs with a queue `k` long.
fn once(kind: LockKind, k: u64, steps: u64) -> f64 {
    let space = LockSpace::default();
    let range =
        if kind == LockKind::Flock || kind == LockKind::Dlm { Range::WHOLE } else { Range::new(0, 0).expect("valid") };
    let req = |owner: Owner| LockRequest { resource: b"queue", owner, kind, mode: Mode::EX, range, wait: true };
    // DLM handles of the locks held, by owner (the others hold nothing).
    let mut handle = vec![0u64; k as usize];
    let note = |outcome: &Outcome, effects: &[Effect], owner: Owner, handle: &mut [u64]| {
        if let Outcome::Granted(g) = outcome {
            handle[owner as usize] = g.lock.unwrap_or(0);
        }
        for e in effects {
            if let Effect::Granted { owner, grant, .. } = e {
                handle[*owner as usize] = grant.lock.unwrap_or(0);
            }
        }
    };
    for owner in 0..k {
        let r = space.lock(&req(owner)).expect("valid request");
        note(&r.outcome, &r.effects, owner, &mut handle);
    }
    timed(|| {
        for step in 0..steps {
            // Owners are granted in queue order, so the holder is known.
            let holder = step % k;
            let r = if kind == LockKind::Dlm {
                space.dlm_unlock(b"queue", holder, handle[holder as usize], None).expect("held")
            } else {
                space.unlock(b"queue", holder, kind, range).expect("valid request")
            };
            note(&r.outcome, &r.effects, holder, &mut handle);
            assert!(
                k == 1 || matches!(r.effects.first(), Some(&Effect::Granted { owner, .. }) if owner == (step + 1) % k),
                "FIFO hand-over"
            );
            let r = space.lock(&req(holder)).expect("valid request");
            note(&r.outcome, &r.effects, holder, &mut handle);
        }
    })
}
