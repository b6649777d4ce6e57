//! A connection's bytes, in clear or in TLS, split into the reading half
//! the connection's task owns and a writing half shared with every task
//! that pushes to the session (see `wire`).
//!
//! The writing half must take bytes without waiting, from any task
//! (`try_write`), as a TCP socket does. tokio-rustls' streams offer only
//! async writes from one owner, so after the handshake (done by
//! tokio-rustls) the rustls connection is driven here directly: plaintext
//! goes into it and records out to the socket under one mutex, so records
//! never interleave; the reading half feeds it the socket's bytes and
//! takes plaintext out under the same mutex.
//!
//! Records that the socket did not take stay in rustls (a backlog, at
//! most one batch: no plaintext is taken while there is one) and go out
//! at the next write or `writable`-then-`try_write`; [`Writer::backlog`]
//! says so, so the wire does not stop with bytes in it.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use parking_lot::Mutex;
use rustls::ServerConnection;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Plaintext taken into TLS at once: a few records.
const TLS_BATCH: usize = 64 << 10;

/// The writing half: shared, written without waiting.
pub(crate) enum Writer {
    Plain(OwnedWriteHalf),
    Tls(Box<TlsWriter>),
}

pub(crate) struct TlsWriter {
    conn: Mutex<ServerConnection>,
    raw: OwnedWriteHalf,
}

/// The reading half.
pub(crate) enum Reader {
    Plain(OwnedReadHalf),
    Tls(TlsReader),
}

pub(crate) struct TlsReader {
    raw: OwnedReadHalf,
    wr: Arc<Writer>,
    /// Socket bytes not yet given to rustls: `buf[start..end]`.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

/// Splits a connection in clear.
pub(crate) fn plain(stream: TcpStream) -> (Reader, Arc<Writer>) {
    let (rd, wr) = stream.into_split();
    (Reader::Plain(rd), Arc::new(Writer::Plain(wr)))
}

/// Runs the TLS handshake, then splits the connection.
pub(crate) async fn tls(stream: TcpStream, acceptor: &tokio_rustls::TlsAcceptor) -> io::Result<(Reader, Arc<Writer>)> {
    let (stream, conn) = acceptor.accept(stream).await?.into_inner();
    let (rd, wr) = stream.into_split();
    let wr = Arc::new(Writer::Tls(Box::new(TlsWriter { conn: Mutex::new(conn), raw: wr })));
    let reader = TlsReader { raw: rd, wr: wr.clone(), buf: vec![0; 16 << 10].into_boxed_slice(), start: 0, end: 0 };
    Ok((Reader::Tls(reader), wr))
}

impl Writer {
    /// Takes some of `bytes` without waiting, as `TcpStream::try_write`:
    /// the count taken, or `WouldBlock`. With TLS, first writes out the
    /// backlog; an empty `bytes` only does that.
    pub fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Writer::Plain(w) => w.try_write(bytes),
            Writer::Tls(t) => {
                let mut conn = t.conn.lock();
                t.drain(&mut conn)?;
                if bytes.is_empty() {
                    return Ok(0);
                }
                let n = conn.writer().write(&bytes[..bytes.len().min(TLS_BATCH)])?;
                match t.drain(&mut conn) {
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
                    _ => Ok(n),
                }
            }
        }
    }

    /// Waits until the socket may take bytes.
    pub async fn writable(&self) -> io::Result<()> {
        match self {
            Writer::Plain(w) => w.writable().await,
            Writer::Tls(t) => t.raw.writable().await,
        }
    }

    /// TLS records wait to be written (never in clear).
    pub fn backlog(&self) -> bool {
        match self {
            Writer::Plain(_) => false,
            Writer::Tls(t) => t.conn.lock().wants_write(),
        }
    }
}

impl TlsWriter {
    /// Writes rustls' records to the socket until none are left
    /// (`Ok`) or the socket is full (`WouldBlock`).
    fn drain(&self, conn: &mut ServerConnection) -> io::Result<()> {
        while conn.wants_write() {
            if conn.write_tls(&mut Socket(&self.raw))? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }
}

/// The socket as `io::Write`, without waiting.
struct Socket<'a>(&'a OwnedWriteHalf);

impl Write for Socket<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsyncRead for Reader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Reader::Plain(r) => Pin::new(r).poll_read(cx, buf),
            Reader::Tls(t) => t.poll_read(cx, buf),
        }
    }
}

impl TlsReader {
    /// Plaintext if rustls has some; else the socket's next bytes go to
    /// rustls (what it must answer, such as a key update, is written at
    /// once if the socket takes it, else with the next write).
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let Writer::Tls(tls) = &*self.wr else { unreachable!("a TLS reader has a TLS writer") };
        loop {
            {
                let mut conn = tls.conn.lock();
                // Records that came with the handshake, or were fed below.
                if let Err(e) = conn.process_new_packets() {
                    let _ = tls.drain(&mut conn); // the alert, best effort
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                }
                let _ = tls.drain(&mut conn);
                match conn.reader().read(buf.initialize_unfilled()) {
                    Ok(n) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
                if self.start < self.end {
                    let n = conn.read_tls(&mut &self.buf[self.start..self.end])?;
                    if n == 0 {
                        return Poll::Ready(Err(io::Error::other("TLS: rustls took no bytes")));
                    }
                    self.start += n;
                    continue;
                }
            }
            let mut raw = ReadBuf::new(&mut self.buf);
            ready!(Pin::new(&mut self.raw).poll_read(cx, &mut raw))?;
            let n = raw.filled().len();
            if n == 0 {
                // The peer closed without close_notify: the end of the
                // stream as far as frames go (a cut frame is an error
                // there).
                return Poll::Ready(Ok(()));
            }
            (self.start, self.end) = (0, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Wire;
    use futures::StreamExt;
    use interlock_proto::{self as proto, Reply, ServerMsg};

    /// A TLS connection whose client reads nothing until told: the
    /// server's halves, and the client's TLS stream.
    async fn tls_pair(dir: &std::path::Path) -> ((Reader, Arc<Writer>), tokio_rustls::client::TlsStream<TcpStream>) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_file, cert.cert.pem()).unwrap();
        std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(proto::tls::server_config(&cert_file, &key_file).unwrap());
        let connector = tokio_rustls::TlsConnector::from(proto::tls::client_config(&cert_file).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        // A small receive window, so that the server's socket fills soon.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let client = socket.connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let name = proto::tls::server_name("localhost:0").unwrap();
        let (client, server) =
            tokio::join!(connector.connect(name, client.unwrap()), tls(accepted.unwrap().0, &acceptor));
        (server.unwrap(), client.unwrap())
    }

    /// The backlog's contract: records stay in rustls while the socket is
    /// full (`try_write` then takes nothing and says `WouldBlock`), and an
    /// empty `try_write` after `writable` sends them.
    #[tokio::test]
    async fn a_tls_backlog_blocks_new_bytes_until_it_is_written() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let ((_rd, wr), mut client) = tls_pair(dir.path()).await;
        let chunk = vec![7u8; 16 << 10];
        let mut taken = 0;
        while !wr.backlog() {
            assert!(taken < 64 << 20, "the socket never filled");
            taken += wr.try_write(&chunk).unwrap_or(0);
        }
        assert_eq!(wr.try_write(&chunk).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; taken];
            client.read_exact(&mut got).await.unwrap();
            assert!(got.iter().all(|&b| b == 7));
        });
        while wr.backlog() {
            wr.writable().await.unwrap();
            match wr.try_write(&[]) {
                Ok(n) => assert_eq!(n, 0),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        }
        reader.await.unwrap();
    }

    /// Under TLS, records the socket did not take stay in rustls and go
    /// out later: nothing is lost or reordered, and the wire knows to come
    /// back for them.
    #[tokio::test]
    async fn tls_records_the_socket_did_not_take_go_out_later_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let ((_rd, wr), client) = tls_pair(dir.path()).await;
        let wire = Wire::default();
        assert!(wire.attach(wr.clone(), 0));
        wire.open();
        let mut sent = 0u64;
        while !wr.backlog() {
            assert!(sent < 200_000, "the socket never filled");
            wire.append(&ServerMsg::Reply { id: sent, reply: Reply::Done });
            wire.kick();
            sent += 1;
        }
        // More behind the backlog, taken by no one until the flush.
        for id in sent..sent + 100 {
            wire.append(&ServerMsg::Reply { id, reply: Reply::Done });
            wire.kick();
        }
        let total = sent + 100;
        let reader = tokio::spawn(async move {
            let mut frames = proto::reader::<ServerMsg, _>(client);
            for want in 0..total {
                match frames.next().await.unwrap().unwrap() {
                    ServerMsg::Reply { id, .. } => assert_eq!(id, want),
                    other => panic!("{other:?}"),
                }
            }
        });
        wire.flush().await.unwrap();
        assert!(!wr.backlog(), "the flush left records behind");
        let read = tokio::time::timeout(std::time::Duration::from_secs(20), reader).await;
        read.expect("every frame arrives").unwrap();
    }
}
