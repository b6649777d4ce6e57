//! Frames: a 4-byte big-endian length, then that many bytes of a
//! postcard-encoded message; written in place into a send buffer, and
//! decoded straight from the read buffer.

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};

use crate::MAX_FRAME;
#[cfg(doc)]
use crate::MAX_HELLO;

/// Why bytes are not a message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("undecodable frame: {0}")]
    Postcard(#[from] postcard::Error),
}

/// Encodes a message into a frame body.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    postcard::to_stdvec(msg).expect("messages always serialize")
}

/// Decodes a frame body.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    Ok(postcard::from_bytes(bytes)?)
}

/// A message whose frame would exceed [`MAX_FRAME`]; nothing was written.
#[derive(Debug, thiserror::Error)]
#[error("a message of {0} bytes exceeds the {MAX_FRAME}-byte frame limit")]
pub struct FrameTooLarge(pub usize);

/// Appends `msg` as one frame (length, then body) to `out`, encoding it in
/// place: no buffer of its own, no copy. Many frames gathered in one
/// buffer go out in one write. O(size of the message).
pub fn write_frame<T: Serialize + ?Sized>(msg: &T, out: &mut BytesMut) -> Result<(), FrameTooLarge> {
    // Room for many frames at once: a sender that splits off what it
    // wrote (to keep it until acknowledged) then shares one allocation
    // among many writes, instead of allocating for each.
    if out.capacity() - out.len() < 512 {
        out.reserve(4 << 10);
    }
    let at = out.len();
    out.put_u32(0);
    // Most messages are small: encoded on the stack and copied once, they
    // cost a fraction of growing the buffer a field at a time.
    let mut small = [0u8; 512];
    match postcard::to_slice(msg, &mut small) {
        Ok(body) => out.extend_from_slice(body),
        Err(_) => postcard::serialize_with_flavor::<T, _, _>(msg, Appender(out)).expect("messages always serialize"),
    }
    let len = out.len() - at - 4;
    if len > MAX_FRAME {
        out.truncate(at);
        return Err(FrameTooLarge(len));
    }
    out[at..at + 4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// postcard output straight into a `BytesMut`.
struct Appender<'a>(&'a mut BytesMut);

impl postcard::ser_flavors::Flavor for Appender<'_> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.put_u8(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Writes one message as a frame, for the exchanges before a connection
/// settles into its loop (hello, welcome, refusal).
pub async fn send<W, T>(w: &mut W, msg: &T) -> std::io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
    T: Serialize,
{
    use tokio::io::AsyncWriteExt;
    let mut out = BytesMut::new();
    write_frame(msg, &mut out).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    w.write_all(&out).await?;
    // TLS keeps records back until flushed.
    w.flush().await
}

/// Why a connection's bytes could not be read as messages. Every one
/// closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of {0} bytes exceeds the {1}-byte limit")]
    TooLarge(usize, usize),
    #[error(transparent)]
    Undecodable(#[from] DecodeError),
}

/// The reading side: frames (4-byte big-endian length, at most
/// [`MAX_FRAME`]) decoded into messages straight from the read buffer,
/// with no buffer split off per frame. Frames are written with
/// [`write_frame`].
pub struct Reader<T> {
    consumed: u64,
    /// The largest frame taken.
    max: usize,
    _msg: std::marker::PhantomData<fn() -> T>,
}

impl<T> Default for Reader<T> {
    fn default() -> Self {
        Reader { consumed: 0, max: MAX_FRAME, _msg: std::marker::PhantomData }
    }
}

impl<T> Reader<T> {
    /// Takes frames of at most `max` bytes from now on (never more than
    /// [`MAX_FRAME`]): a server reads the hello with [`MAX_HELLO`].
    pub fn limit(&mut self, max: usize) {
        self.max = max.min(MAX_FRAME);
    }

    /// Bytes of the frames decoded so far: where a stream stands.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }
}

impl<T: serde::de::DeserializeOwned> tokio_util::codec::Decoder for Reader<T> {
    type Item = T;
    type Error = ReadError;

    /// O(size of the frame).
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<T>, ReadError> {
        let Some(head) = src.first_chunk::<4>() else { return Ok(None) };
        let len = u32::from_be_bytes(*head) as usize;
        if len > self.max {
            return Err(ReadError::TooLarge(len, self.max));
        }
        let Some(body) = src.get(4..4 + len) else {
            src.reserve(4 + len - src.len());
            return Ok(None);
        };
        let msg = decode(body)?;
        bytes::Buf::advance(src, 4 + len);
        self.consumed += 4 + len as u64;
        Ok(Some(msg))
    }
}

/// Reads messages of type `T` from `io`.
pub fn reader<T, R: tokio::io::AsyncRead>(io: R) -> tokio_util::codec::FramedRead<R, Reader<T>> {
    tokio_util::codec::FramedRead::new(io, Reader::default())
}
