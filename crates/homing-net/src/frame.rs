//! One frame per stream direction: a sender writes the whole postcard frame
//! and finishes the stream; a receiver reads to the end with a size bound, so
//! an oversized frame is refused as soon as its length passes the bound,
//! before it is ever buffered whole. Also the QUIC error codes homing uses.

use quinn::{ReadToEndError, RecvStream, SendStream, VarInt};

/// Stream error code: the frame exceeded the receiver's limit.
pub const CODE_FRAME_TOO_LARGE: VarInt = VarInt::from_u32(1);
/// Stream error code: the request was not answered within the request timeout.
pub const CODE_REQUEST_TIMEOUT: VarInt = VarInt::from_u32(2);
/// Connection close code: the server is shutting down.
pub const CODE_SHUTDOWN: VarInt = VarInt::from_u32(3);
/// Connection close code: the peer's certificate names no valid homing identity.
pub const CODE_BAD_IDENTITY: VarInt = VarInt::from_u32(4);
/// Connection close code: the client was dropped.
pub const CODE_CLIENT_CLOSED: VarInt = VarInt::from_u32(5);

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum ReadFrameError {
    /// More than the limit arrived; the stream was stopped with [`CODE_FRAME_TOO_LARGE`].
    TooLarge,
    /// The stream or connection ended first.
    Closed(String),
}

/// Reads a whole frame of at most `frame_bytes_max` bytes.
pub(crate) async fn read_frame(
    recv: &mut RecvStream,
    frame_bytes_max: usize,
) -> Result<Vec<u8>, ReadFrameError> {
    match recv.read_to_end(frame_bytes_max).await {
        Ok(frame) => Ok(frame),
        Err(ReadToEndError::TooLong) => {
            // Tell the sender to stop; the rest of its bytes are discarded unread.
            let _ = recv.stop(CODE_FRAME_TOO_LARGE);
            Err(ReadFrameError::TooLarge)
        }
        Err(ReadToEndError::Read(error)) => Err(ReadFrameError::Closed(error.to_string())),
    }
}

/// Writes `frame` and finishes the stream.
pub(crate) async fn write_frame(send: &mut SendStream, frame: &[u8]) -> Result<(), String> {
    send.write_all(frame).await.map_err(|e| e.to_string())?;
    send.finish().map_err(|e| e.to_string())
}
