//! The commands that talk to a server (`serve`, `lock`, `status`, `evict`,
//! `changelog`, `mount`)
//! and what they share: where the server is, the token, the runtime, and
//! how a client error becomes an exit status.

pub mod changelog;
pub mod evict;
pub mod lock;
pub mod mount;
pub mod serve;
pub mod status;

use std::path::PathBuf;
use std::time::Duration;

use interlock_client::{ClientError, ClientOptions};

use crate::{args, exit};

/// Where the server is and how to prove we may talk to it.
#[derive(clap::Args, Clone, Debug)]
pub struct ServerArgs {
    /// Server address, HOST:PORT.
    #[arg(long, global = true, env = "INTERLOCK_SERVER", default_value = "127.0.0.1:7420", value_parser = args::server)]
    pub server: String,
    /// File holding the shared-secret token (or set INTERLOCK_TOKEN).
    #[arg(long, global = true, env = "INTERLOCK_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Seconds that connecting and the handshake may take, each time.
    #[arg(long, global = true, default_value = "10", value_parser = args::positive_seconds, value_name = "SECS")]
    pub connect_timeout: f64,
    /// Speak TLS to the server, trusting the CA certificates in this PEM
    /// file; the server's certificate must name the host of --server.
    #[arg(long, global = true, env = "INTERLOCK_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

impl ServerArgs {
    pub fn options(&self) -> Result<ClientOptions, String> {
        Ok(ClientOptions {
            token: token(self.token_file.as_ref())?,
            no_local: false,
            connect_timeout: Some(Duration::from_secs_f64(self.connect_timeout)),
            tls: self
                .tls_ca
                .as_deref()
                .map(interlock_proto::tls::client_config)
                .transpose()
                .map_err(|e| e.to_string())?,
        })
    }
}

/// The token from `--token-file`, else `INTERLOCK_TOKEN`.
fn token(file: Option<&PathBuf>) -> Result<Option<String>, String> {
    match file {
        Some(f) => std::fs::read_to_string(f)
            .map(|t| Some(t.trim().to_string()))
            .map_err(|e| format!("cannot read token file {}: {e}", f.display())),
        None => Ok(std::env::var("INTERLOCK_TOKEN").ok().filter(|t| !t.is_empty())),
    }
}

/// The exit status for a failure to reach or use the server.
pub fn status_of(e: &ClientError) -> u8 {
    match e {
        ClientError::Auth(_) | ClientError::Tls { .. } | ClientError::Denied(_) => exit::AUTH,
        ClientError::Invalid(_) => exit::USAGE,
        _ => exit::UNAVAILABLE,
    }
}

/// Reports a failed operator command (`interlock CMD: ...`): 1 for what
/// the server refused (no such session, consumer, …), else as
/// [`status_of`].
pub fn failed(cmd: &str, e: &ClientError) -> std::process::ExitCode {
    eprintln!("interlock {cmd}: {e}");
    match e {
        ClientError::Server(_) => std::process::ExitCode::FAILURE,
        e => std::process::ExitCode::from(status_of(e)),
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}
