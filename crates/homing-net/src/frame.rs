//! One frame per stream direction: a sender writes the whole postcard frame
//! and finishes the stream; a receiver reads to the end with a size bound, so
//! an oversized frame is refused as soon as its length passes the bound,
//! before it is ever buffered whole. A server reads request frames within
//! its connection's [`RequestBudget`], so that one connection's partly read
//! frames never hold more than the budget, however many streams it opens.
//! Also the QUIC error codes homing uses.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use quinn::{ReadToEndError, RecvStream, SendStream, VarInt};

use crate::stats::Counters;

/// Stream error code: the frame exceeded the receiver's limit.
pub const CODE_FRAME_TOO_LARGE: VarInt = VarInt::from_u32(1);
/// Stream error code: the request was not answered within the request timeout.
pub const CODE_REQUEST_TIMEOUT: VarInt = VarInt::from_u32(2);
/// Stream error code: the connection's partly read requests already hold
/// their budget; the request was refused unread (answered `Overloaded`).
pub const CODE_OVER_BUDGET: VarInt = VarInt::from_u32(7);
/// Connection close code: the server is shutting down.
pub const CODE_SHUTDOWN: VarInt = VarInt::from_u32(3);
/// Connection close code: the peer's certificate names no valid homing identity.
pub const CODE_BAD_IDENTITY: VarInt = VarInt::from_u32(4);
/// Connection close code: the client was dropped or closed.
pub const CODE_CLIENT_CLOSED: VarInt = VarInt::from_u32(5);
/// Connection close code: the server refused the connection after the
/// handshake because the caller's share of connections is full; the reason
/// names the share.
pub const CODE_REFUSED: VarInt = VarInt::from_u32(6);

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum ReadFrameError {
    /// More than the limit arrived; the stream was stopped with [`CODE_FRAME_TOO_LARGE`].
    TooLarge,
    /// The stream or connection ended first.
    Closed(String),
    /// The connection's partly read requests would exceed their budget
    /// (server side only); the stream was stopped with [`CODE_OVER_BUDGET`].
    OverBudget {
        /// The budget, in bytes.
        budget_bytes: usize,
    },
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

/// The request bytes one connection may make the server hold in partly
/// read frames. Readers take budget for each chunk as it arrives and never
/// wait for it: a reader that would wait could leave its stream's next bytes
/// stuck behind other streams' bytes in the connection's flow-control
/// window, and everything would stall. A frame that does not fit is refused
/// instead ([`ReadFrameError::OverBudget`], answered `Overloaded`), its bytes
/// discarded. So one connection holds at most the budget in partly read
/// frames, plus the flow-control window in QUIC's buffers.
pub(crate) struct RequestBudget {
    bytes_max: usize,
    /// Bytes read into partly read frames of this connection now.
    held: AtomicUsize,
    counters: Arc<Counters>,
}

/// A whole request frame, still counted against its connection's budget
/// until it is dropped (after decoding).
pub(crate) struct Frame<'a> {
    bytes: Vec<u8>,
    _held: Held<'a>,
}

impl Frame<'_> {
    /// The frame's bytes, for decoding.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Budget held by one reader; given back when dropped.
struct Held<'a> {
    budget: &'a RequestBudget,
    bytes: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::Relaxed);
        self.budget.counters.unbuffer(self.bytes);
    }
}

impl RequestBudget {
    /// A budget of `bytes_max` bytes.
    pub(crate) fn new(bytes_max: u32, counters: Arc<Counters>) -> RequestBudget {
        RequestBudget {
            bytes_max: bytes_max as usize,
            held: AtomicUsize::new(0),
            counters,
        }
    }

    /// Takes `bytes` more for `held`, if the budget has room.
    fn take(&self, held: &mut Held<'_>, bytes: usize) -> bool {
        let taken = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                now.checked_add(bytes)
                    .filter(|after| *after <= self.bytes_max)
            });
        match taken {
            Ok(before) => {
                held.bytes += bytes;
                self.counters.buffer(bytes, before + bytes);
                true
            }
            Err(_) => false,
        }
    }

    /// Reads a whole frame of at most `frame_bytes_max` bytes within the
    /// budget.
    pub(crate) async fn read_frame(
        &self,
        recv: &mut RecvStream,
        frame_bytes_max: usize,
    ) -> Result<Frame<'_>, ReadFrameError> {
        let mut held = Held {
            budget: self,
            bytes: 0,
        };
        let mut bytes = Vec::new();
        loop {
            // One byte past the limit tells an oversized frame apart.
            let chunk = recv
                .read_chunk(frame_bytes_max + 1 - bytes.len(), true)
                .await;
            match chunk {
                Ok(Some(chunk)) => {
                    if !self.take(&mut held, chunk.bytes.len()) {
                        let _ = recv.stop(CODE_OVER_BUDGET);
                        return Err(ReadFrameError::OverBudget {
                            budget_bytes: self.bytes_max,
                        });
                    }
                    bytes.extend_from_slice(&chunk.bytes);
                    if bytes.len() > frame_bytes_max {
                        let _ = recv.stop(CODE_FRAME_TOO_LARGE);
                        return Err(ReadFrameError::TooLarge);
                    }
                }
                Ok(None) => {
                    return Ok(Frame { bytes, _held: held });
                }
                Err(error) => return Err(ReadFrameError::Closed(error.to_string())),
            }
        }
    }
}
