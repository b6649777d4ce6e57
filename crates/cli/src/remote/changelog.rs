//! `interlock changelog`: the namespace's changelog on a running server,
//! as Lustre's `lfs changelog_register`, `lfs changelog`,
//! `lfs changelog_clear` and `lfs changelog_deregister` use it.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use interlock_client::meta::{ChangelogRecord, ConsumerInfo};
use interlock_client::{Client, ClientError};
use interlock_journal::changelog::{Mask, Record, RecordType, RenameSource, check_name};
use serde_json::json;

use super::{ServerArgs, failed, runtime};
use crate::journal_cmd::line;

#[derive(clap::Args)]
pub struct ChangelogArgs {
    #[command(subcommand)]
    command: ChangelogCommand,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Subcommand)]
enum ChangelogCommand {
    /// Register a consumer; prints its id (cl1, cl2, …). It sees the
    /// records made from now on, and holds them (the journal is not purged
    /// past what it has not cleared) until it clears or is deregistered.
    Register {
        /// Record types it sees, e.g. CREAT,UNLNK,RENME (or `all`); the
        /// default is every type but OPEN and ATIME, as Lustre's.
        #[arg(long, value_parser = Mask::parse)]
        mask: Option<Mask>,
        /// A name to use instead of the id in the other commands: 1 to 64
        /// letters, digits, '-', '_' or '.', not of an id's form (cl7).
        #[arg(long, value_parser = consumer_name)]
        name: Option<String>,
    },
    /// Remove a consumer (by id or name): the journal may be purged past it.
    Deregister { id: String },
    /// The consumers and how far each has cleared.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Print a consumer's records after its cursor, one per line in
    /// Lustre's format (`INDEX NNTYPE TIME DATE FLAGS t=TARGET p=PARENT
    /// NAME ...`). Reading does not clear.
    Read {
        id: String,
        /// Start at this index instead of after the cursor.
        #[arg(long)]
        from: Option<u64>,
        /// Keep waiting for new records (until interrupted), across
        /// restarts of the server.
        #[arg(long)]
        follow: bool,
        /// One JSON object per record: index, type, time, target, parent,
        /// name, flags, uid, gid (and a rename's source).
        #[arg(long)]
        json: bool,
    },
    /// Print a consumer's records as they come, until interrupted, across
    /// restarts of the server: the same as `read ID --follow`.
    Follow {
        /// The consumer, by id or name (or --user).
        #[arg(required_unless_present = "user", conflicts_with = "user")]
        id: Option<String>,
        /// The consumer, by id or name.
        #[arg(long, value_name = "ID")]
        user: Option<String>,
        /// Start at this index instead of after the cursor.
        #[arg(long)]
        from: Option<u64>,
        /// One JSON object per record, as `read --json`.
        #[arg(long)]
        json: bool,
    },
    /// Acknowledge a consumer's records up to INDEX (0: all so far).
    Clear { id: String, index: u64 },
}

pub fn changelog(args: ChangelogArgs) -> ExitCode {
    runtime().block_on(async move {
        let result = async {
            let options = args.server.options().map_err(ClientError::Invalid)?;
            let client = Client::connect(&args.server.server, options).await?;
            let done = run(&client, args.command).await;
            let _ = client.bye().await;
            done
        };
        match result.await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed("changelog", &e),
        }
    })
}

async fn run(client: &Client, command: ChangelogCommand) -> Result<(), ClientError> {
    match command {
        ChangelogCommand::Register { mask, name } => {
            let c = client.changelog_register(name.as_deref(), mask.unwrap_or_else(Mask::default_mask).0).await?;
            println!("{}", c.id);
        }
        ChangelogCommand::Deregister { id } => client.changelog_deregister(&id).await?,
        ChangelogCommand::List { json } => {
            for c in client.changelog_list().await? {
                println!("{}", consumer_line(&c, json));
            }
        }
        ChangelogCommand::Clear { id, index } => {
            let upto = match index {
                0 => client.status().await?.journal_last,
                i => i,
            };
            client.changelog_clear(&id, upto).await?;
        }
        ChangelogCommand::Read { id, from, follow, json } => read(client, &id, from, follow, json).await?,
        ChangelogCommand::Follow { id, user, from, json } => {
            let id = id.or(user).expect("clap asks for an id or --user");
            read(client, &id, from, true, json).await?;
        }
    }
    Ok(())
}

/// Prints consumer `id`'s records from `from` (else after its cursor), in
/// Lustre's format or as JSON; with `follow`, waits for more until
/// interrupted, across restarts of the server.
async fn read(client: &Client, id: &str, from: Option<u64>, follow: bool, json: bool) -> Result<(), ClientError> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut from = from;
    let mut waiting = false;
    loop {
        let wait = if follow { Duration::from_secs(5) } else { Duration::ZERO };
        let batch = match client.changelog_read(id, from, 256, wait).await {
            Ok(batch) => batch,
            // Following, a server that restarts or stops for a
            // while is waited for, as `tail -F` waits for its
            // file: the client reconnects by itself, and the read
            // (which changes nothing) is made again from where it
            // was.
            Err(ClientError::ConnectionLost | ClientError::Unread | ClientError::Recovering(_)) if follow => {
                if !waiting {
                    eprintln!("interlock changelog: lost the server; following on once it is back");
                    waiting = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        waiting = false;
        for r in &batch {
            let shown = if json { json_line(r) } else { line(r.index, &record(r)) };
            if writeln!(out, "{shown}").is_err() {
                // The reader went away (`| head`): done, quietly.
                return Ok(());
            }
        }
        if out.flush().is_err() {
            return Ok(());
        }
        match batch.last() {
            Some(last) => from = Some(last.index + 1),
            None if !follow => break,
            None => {}
        }
    }
    Ok(())
}

/// `id name cleared mask` (or a JSON object).
pub fn consumer_line(c: &ConsumerInfo, json: bool) -> String {
    if json {
        return json!({ "id": c.id, "name": c.name, "cleared": c.cleared, "mask": c.mask }).to_string();
    }
    format!("{} name={} cleared={} mask={:#x}", c.id, c.name.as_deref().unwrap_or("-"), c.cleared, c.mask)
}

/// `--name`, checked here as the server checks it, so that a bad name is
/// a usage error before any connection.
fn consumer_name(name: &str) -> Result<String, interlock_journal::Error> {
    check_name(name).map(|()| name.to_string())
}

fn rtype(n: u8) -> Option<RecordType> {
    RecordType::ALL.iter().copied().find(|t| *t as u8 == n)
}

fn record(r: &ChangelogRecord) -> Record {
    Record {
        rtype: rtype(r.rtype).unwrap_or(RecordType::MARK),
        flags: r.flags,
        time_ns: r.time.max(0) as u64,
        target: r.target,
        parent: r.parent,
        name: r.name.clone(),
        source: r.source.as_ref().map(|(p, n, t)| RenameSource { parent: *p, name: n.to_vec(), target: *t }),
        uid: r.uid,
        gid: r.gid,
        jobid: None,
    }
}

fn json_line(r: &ChangelogRecord) -> String {
    let name = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut v = json!({
        "index": r.index,
        "type": rtype(r.rtype).map_or("?", RecordType::name),
        "time": r.time,
        "target": r.target,
        "parent": r.parent,
        "name": name(&r.name),
        "flags": r.flags,
        "uid": r.uid,
        "gid": r.gid,
    });
    if let Some((p, n, t)) = &r.source {
        v["source"] = json!({ "parent": p, "name": name(n), "target": t });
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{ChangelogArgs, ChangelogCommand};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        changelog: ChangelogArgs,
    }

    /// The consumer `changelog follow ARGS` follows, or clap's error.
    fn follows(args: &[&str]) -> Result<String, String> {
        let cli = Cli::try_parse_from(std::iter::once("changelog").chain(args.iter().copied()))
            .map_err(|e| e.kind().to_string())?;
        match cli.changelog.command {
            ChangelogCommand::Follow { id, user, .. } => Ok(id.or(user).unwrap()),
            _ => Err("not follow".into()),
        }
    }

    /// `follow ID` or `follow --user ID` (the design brief's form); one
    /// of them, not both, not neither.
    #[test]
    fn follow_names_its_consumer_once() {
        assert_eq!(follows(&["follow", "cl1"]), Ok("cl1".into()));
        assert_eq!(follows(&["follow", "--user", "audit", "--json"]), Ok("audit".into()));
        assert!(follows(&["follow"]).is_err());
        assert!(follows(&["follow", "cl1", "--user", "cl2"]).is_err());
    }
}
