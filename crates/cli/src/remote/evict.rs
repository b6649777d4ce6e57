//! `interlock evict SESSION`: an operator forces a dead client out at
//! once instead of waiting for its lease (`interlock status --resource`
//! names the holder's session).

use std::process::ExitCode;

use interlock_client::{Client, ClientError};

use super::{ServerArgs, failed, runtime};

#[derive(clap::Args)]
pub struct EvictArgs {
    /// The session to end, as `interlock status --resource NAME` shows it.
    session: u64,
    #[command(flatten)]
    server: ServerArgs,
}

pub fn evict(args: EvictArgs) -> ExitCode {
    runtime().block_on(async move {
        let result = async {
            let options = args.server.options().map_err(ClientError::Invalid)?;
            let client = Client::connect(&args.server.server, options).await?;
            let done = client.evict(args.session).await;
            let _ = client.bye().await;
            done
        };
        match result.await {
            Ok(()) => {
                println!("session {} ended: its locks are released, its waits withdrawn", args.session);
                ExitCode::SUCCESS
            }
            Err(e) => failed("evict", &e),
        }
    })
}
