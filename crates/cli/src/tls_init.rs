//! `interlock tls-init DIR`: a private CA and a server certificate signed
//! by it, so that a server can speak TLS without an outside PKI (as
//! `etcd`'s and CockroachDB's quick starts do). Clients are given the CA.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

#[derive(clap::Args)]
pub struct TlsInitArgs {
    /// Directory to write ca.pem, server.pem and server.key to (made if
    /// missing). Existing files are never overwritten.
    dir: PathBuf,
    /// Names and addresses the server's certificate is good for: each name
    /// clients give in --server (repeat the flag) [default: localhost,
    /// 127.0.0.1, ::1 and this machine's host name].
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
}

/// The files written.
pub struct Files {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes a fresh CA certificate (its key is not kept: this CA signs one
/// certificate) and a server certificate and key for `names`.
pub fn generate(dir: &Path, names: Vec<String>) -> Result<Files, String> {
    let failed = |e: rcgen::Error| format!("cannot make the certificates: {e}");
    let mut ca = CertificateParams::new(Vec::new()).map_err(failed)?;
    ca.distinguished_name.push(DnType::CommonName, "interlock CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().map_err(failed)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(failed)?;
    let mut server = CertificateParams::new(names).map_err(failed)?;
    server.distinguished_name.push(DnType::CommonName, "interlock server");
    let key = KeyPair::generate().map_err(failed)?;
    let cert = server.signed_by(&key, &Issuer::new(ca, ca_key)).map_err(failed)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let files = Files { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") };
    for f in [&files.ca, &files.cert, &files.key] {
        if f.exists() {
            return Err(format!("{} exists; not overwriting it", f.display()));
        }
    }
    write_new(&files.ca, &ca_cert.pem(), 0o644)?;
    write_new(&files.cert, &cert.pem(), 0o644)?;
    write_new(&files.key, &key.serialize_pem(), 0o600)?;
    Ok(files)
}

/// Creates `path` (never over an existing file) with `mode`.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn run(args: TlsInitArgs) -> Result<(), String> {
    let names = if args.names.is_empty() { default_names() } else { args.names };
    let files = generate(&args.dir, names.clone())?;
    println!(
        "wrote {} (give it to clients), {} and {} (the server's; keep the key private)",
        files.ca.display(),
        files.cert.display(),
        files.key.display()
    );
    println!("good for: {}", names.join(", "));
    println!("server:  interlock serve --tls-cert {} --tls-key {}", files.cert.display(), files.key.display());
    println!("clients: --tls-ca {} (or INTERLOCK_TLS_CA)", files.ca.display());
    Ok(())
}

fn default_names() -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() && host != "localhost" {
            names.push(host.to_string());
        }
    }
    names
}
