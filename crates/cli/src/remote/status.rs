//! `interlock status`: a server's live counters, once or every interval.

use std::process::ExitCode;
use std::time::Duration;

use interlock_client::{Client, ClientError};
use interlock_core::{Mode, OFFSET_MAX};
use interlock_proto::{Kind, LockInfo, ResourceInfo, StatusInfo};

use super::{ServerArgs, runtime, status_of};
use crate::args;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// One JSON object instead of text (with --watch: one per line).
    #[arg(long)]
    json: bool,
    /// Print a line every SECS seconds (default 1) with the counters and
    /// the request rate over that interval (the watcher's own requests
    /// left out), until interrupted; a restart of the server is said and
    /// watched through.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1", value_parser = args::interval)]
    watch: Option<Duration>,
    /// Instead of the counters, who holds and who waits for the resource
    /// NAME (every lock kind): session, kind, owner, mode, bytes, and for
    /// how long. A holder's session is what `interlock evict` takes.
    #[arg(long, value_name = "NAME", conflicts_with = "watch")]
    resource: Option<String>,
    #[command(flatten)]
    server: ServerArgs,
}

pub fn status(args: StatusArgs) -> ExitCode {
    runtime().block_on(async move {
        let connected = match args.server.options() {
            Ok(options) => Client::connect(&args.server.server, options).await,
            Err(e) => Err(ClientError::Invalid(e)),
        };
        let client = match connected {
            Ok(c) => c,
            Err(e) => {
                eprintln!("interlock status: {e}");
                return ExitCode::from(status_of(&e));
            }
        };
        let result = match (&args.resource, args.watch) {
            (Some(name), _) => client.inspect(name.as_bytes()).await.map(|r| print_resource(&r, args.json)),
            (None, None) => client.status().await.map(|s| print_status(&s, args.json)),
            (None, Some(every)) => watch(&client, every, args.json).await,
        };
        let _ = client.bye().await;
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("interlock status: {e}");
                ExitCode::from(status_of(&e))
            }
        }
    })
}

fn print_status(s: &StatusInfo, json: bool) {
    let rate = s.requests as f64 * 1000.0 / s.uptime_ms.max(1) as f64;
    if json {
        println!("{}", status_json(s, rate));
        return;
    }
    println!("sessions    {}", s.sessions);
    println!("connections {} (max {})", s.connections, s.max_connections);
    println!("resources   {}", s.resources);
    println!("locks       {}", s.locks);
    println!("waiters     {} (with the locks, at most {} in all: max-total-locks)", s.waiters, s.max_total_locks);
    println!("requests    {} ({rate:.0}/s over {:.1}s up)", s.requests, s.uptime_ms as f64 / 1000.0);
    if s.recovering_ms > 0 {
        println!("recovering  {} ms left (after a restart: only reclaims are served until then)", s.recovering_ms);
    }
    if !s.durable {
        println!(
            "durability  UNSAFE: changes are answered before fdatasync (--unsafe-no-fsync); a machine crash may lose them"
        );
    }
    if let Some(q) = &s.root_squash {
        println!("root squash root's requests are served as {q}");
    }
    println!("inodes      {}", s.inodes);
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    println!(
        "disk        {:.1} GiB available of {:.1} GiB (the data directory's file system)",
        gib(s.disk_available_bytes),
        gib(s.disk_bytes)
    );
    if s.disk_full {
        println!(
            "disk full   FULL: new files, writes and other changes that need room get ENOSPC; removals still work"
        );
    }
    // MiB below a GiB: a small namespace's memory would read 0.00 GiB.
    let size = |b: u64| {
        if b < 1 << 30 { format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)) } else { format!("{:.2} GiB", gib(b)) }
    };
    match s.namespace_budget {
        u64::MAX => println!("memory      {} (the namespace's, estimated; no budget)", size(s.namespace_bytes)),
        budget => println!(
            "memory      {} of the namespace's budget of {} (files, names, extended attributes)",
            size(s.namespace_bytes),
            size(budget)
        ),
    }
    match s.max_output_memory {
        u64::MAX => println!("output      {} kept for clients (no limit)", size(s.output_bytes)),
        limit => println!(
            "output      {} kept for clients (past {}, each session is held to a share: max-output-memory)",
            size(s.output_bytes),
            size(limit)
        ),
    }
    if s.namespace_bytes >= s.namespace_budget {
        println!(
            "memory full FULL: new files, names and extended attributes get ENOSPC; removals and writes still work \
             (max-namespace-memory)"
        );
    }
    println!(
        "journal     last record {}, {} since the checkpoint (a restart replays them)",
        s.journal_last, s.since_checkpoint
    );
    println!("replay      {} (clients with changes they may ask about again after a crash)", s.replay_clients);
    if s.consumers.is_empty() {
        println!("changelog   no consumers");
    }
    for c in &s.consumers {
        let lag = s.journal_last.saturating_sub(c.cleared);
        println!("changelog   {} ({lag} records behind)", super::changelog::consumer_line(c, false));
    }
}

/// A resource's holders, then its waiters in queue order.
fn print_resource(r: &ResourceInfo, json: bool) {
    if json {
        let list = |l: &[LockInfo]| l.iter().map(lock_json).collect::<Vec<_>>();
        let v = serde_json::json!({
            "holders": list(&r.holders), "waiters": list(&r.waiters),
            "holders_total": r.holders_total, "waiters_total": r.waiters_total,
        });
        println!("{v}");
        return;
    }
    if r.holders_total + r.waiters_total == 0 {
        println!("no one holds or waits for it");
        return;
    }
    println!("{:<8} {:>10} {:<6} {:>10} {:<5} {:<24} {:>10}", "", "session", "kind", "owner", "mode", "bytes", "for");
    for (what, list, total) in [("holds", &r.holders, r.holders_total), ("waits", &r.waiters, r.waiters_total)] {
        for l in list.iter() {
            let secs = format!("{:.1}s", l.for_ms as f64 / 1000.0);
            let (kind, mode) = (kind_name(l.kind), mode_name(l.kind, l.mode));
            println!("{what:<8} {:>10} {kind:<6} {:>10} {mode:<5} {:<24} {secs:>10}", l.session, l.owner, bytes(l));
        }
        if total > list.len() as u64 {
            println!("{what:<8} … and {} more", total - list.len() as u64);
        }
    }
}

fn lock_json(l: &LockInfo) -> serde_json::Value {
    serde_json::json!({
        "session": l.session, "kind": kind_name(l.kind), "owner": l.owner,
        "mode": mode_name(l.kind, l.mode), "start": l.start, "end": bytes_end(l.end), "for_ms": l.for_ms,
    })
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Posix => "posix",
        Kind::Ofd => "ofd",
        Kind::Flock => "flock",
        Kind::Dlm => "dlm",
    }
}

/// POSIX, OFD and flock locks by their own names (read/write,
/// shared/exclusive); DLM locks by mode.
fn mode_name(k: Kind, m: u8) -> &'static str {
    let mode = Mode::ALL.get(m as usize).copied();
    match (k, mode) {
        (Kind::Posix | Kind::Ofd, Some(Mode::PR)) => "read",
        (Kind::Posix | Kind::Ofd, Some(Mode::EX)) => "write",
        (Kind::Flock, Some(Mode::PR)) => "sh",
        (Kind::Flock, Some(Mode::EX)) => "ex",
        (_, Some(m)) => m.name(),
        (_, None) => "?",
    }
}

/// The last byte, `None` for "to the end of the file".
fn bytes_end(end: u64) -> Option<u64> {
    (end < OFFSET_MAX).then_some(end)
}

fn bytes(l: &LockInfo) -> String {
    match (l.kind, bytes_end(l.end)) {
        (Kind::Flock | Kind::Dlm, None) if l.start == 0 => "whole".into(),
        (_, None) => format!("{}-EOF", l.start),
        (_, Some(e)) => format!("{}-{e}", l.start),
    }
}

/// The counters as one JSON object; `rate` in requests per second.
fn status_json(s: &StatusInfo, rate: f64) -> serde_json::Value {
    serde_json::json!({
        "sessions": s.sessions, "connections": s.connections, "max_connections": s.max_connections,
        "max_total_locks": s.max_total_locks,
        "resources": s.resources, "locks": s.locks,
        "waiters": s.waiters, "requests": s.requests, "uptime_ms": s.uptime_ms,
        "requests_per_sec": rate, "recovering_ms": s.recovering_ms,
        "inodes": s.inodes, "journal_last": s.journal_last, "since_checkpoint": s.since_checkpoint,
        "durable": s.durable, "disk_bytes": s.disk_bytes, "disk_available_bytes": s.disk_available_bytes,
        "disk_full": s.disk_full, "replay_clients": s.replay_clients,
        "namespace_bytes": s.namespace_bytes,
        "namespace_budget": (s.namespace_budget != u64::MAX).then_some(s.namespace_budget),
        "output_bytes": s.output_bytes,
        "max_output_memory": (s.max_output_memory != u64::MAX).then_some(s.max_output_memory),
        "root_squash": s.root_squash.as_ref().map(|q| serde_json::json!({"uid": q.uid, "gid": q.gid, "except": q.except})),
        "consumers": s.consumers.iter().map(|c| serde_json::json!({
            "id": c.id, "name": c.name, "cleared": c.cleared, "mask": c.mask,
            "behind": s.journal_last.saturating_sub(c.cleared),
        })).collect::<Vec<_>>(),
    })
}

/// A line per interval: the counters, and requests per second over the
/// interval (from the server's own uptime clock; the watcher's own
/// status requests not counted, and the server counts no renewals). When the server restarts
/// (its uptime goes back) or cannot be reached, it says so and goes on.
async fn watch(client: &Client, every: Duration, json: bool) -> Result<(), ClientError> {
    let mut last = client.status().await?;
    if !json {
        println!("{:>10} {:>10} {:>10} {:>10} {:>12}", "sessions", "resources", "locks", "waiters", "requests/s");
    }
    loop {
        tokio::time::sleep(every).await;
        let now = match client.status().await {
            Ok(s) => s,
            Err(e) if e.is_refusal() => return Err(e),
            Err(e) => {
                eprintln!("interlock status: {e}; still watching");
                continue;
            }
        };
        if now.uptime_ms < last.uptime_ms {
            eprintln!("interlock status: the server restarted; still watching");
        } else {
            let secs = now.uptime_ms.saturating_sub(last.uptime_ms).max(1) as f64 / 1000.0;
            // Our own: this status request (renewals are not counted).
            let rate = now.requests.saturating_sub(last.requests + 1) as f64 / secs;
            if json {
                println!("{}", status_json(&now, rate));
            } else {
                println!(
                    "{:>10} {:>10} {:>10} {:>10} {:>12.0}",
                    now.sessions, now.resources, now.locks, now.waiters, rate
                );
            }
        }
        last = now;
    }
}
