//! `interlock status`: a server's live counters, once or every interval.

use std::process::ExitCode;
use std::time::Duration;

use interlock_client::{Client, ClientError};
use interlock_proto::StatusInfo;

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
        let result = match args.watch {
            None => client.status().await.map(|s| print_status(&s, args.json)),
            Some(every) => watch(&client, every, args.json).await,
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
    println!("waiters     {}", s.waiters);
    println!("requests    {} ({rate:.0}/s over {:.1}s up)", s.requests, s.uptime_ms as f64 / 1000.0);
    if s.recovering_ms > 0 {
        println!("recovering  {} ms left (after a restart: only reclaims are served until then)", s.recovering_ms);
    }
}

/// The counters as one JSON object; `rate` in requests per second.
fn status_json(s: &StatusInfo, rate: f64) -> serde_json::Value {
    serde_json::json!({
        "sessions": s.sessions, "connections": s.connections, "max_connections": s.max_connections,
        "resources": s.resources, "locks": s.locks,
        "waiters": s.waiters, "requests": s.requests, "uptime_ms": s.uptime_ms,
        "requests_per_sec": rate, "recovering_ms": s.recovering_ms,
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
            Err(e @ ClientError::Auth(_)) => return Err(e),
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
