//! Framing: every message is a 4-byte big-endian length followed by its
//! postcard encoding. Decoding is strict: an oversized length, trailing
//! bytes or an unknown variant is a [`WireError`], never a panic. A reader
//! that knows what it expects checks the length against that message's
//! limit ([`frame_len_within`]; a chunk-stream request: at most
//! [`STREAM_REQUEST_LIMIT`]), so a peer cannot make it buffer more than the
//! largest honest message.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest accepted frame of any service (a manifest of ~1.5M chunks fits).
pub const MAX_FRAME: usize = 64 << 20;
/// Largest first frame of a chunk stream: a [`crate::stream::StreamRequest`]
/// is a few dozen bytes (an RDMA hello with 16 queue pairs about 200).
pub const STREAM_REQUEST_LIMIT: usize = 4 << 10;
/// Largest [`crate::hello::Hello`]: a version and a service tag.
pub const HELLO_LIMIT: usize = 64;
/// Largest admin or launch request: a sync job names its members, a rank
/// its environment and argv; none comes near a mebibyte. (Transfer
/// messages carry manifests, up to [`MAX_FRAME`].)
pub const REQUEST_LIMIT: usize = 1 << 20;

/// Why bytes could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("frame of {len} bytes exceeds the {limit}-byte limit")]
    /// The frame is longer than the limit.
    TooLarge {
        /// The frame's length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    #[error("malformed message: {0}")]
    /// The bytes do not decode as the message expected.
    Malformed(String),
}

/// Encodes one message as a length-prefixed frame.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let body = postcard::to_stdvec(msg).expect("in-memory encoding cannot fail");
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Checks a frame's length prefix before its body is read, against the
/// largest frame of any service.
pub fn frame_len(prefix: [u8; 4]) -> Result<usize, WireError> {
    frame_len_within(prefix, MAX_FRAME)
}

/// Checks a frame's length prefix against `limit` (the service's).
pub fn frame_len_within(prefix: [u8; 4], limit: usize) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > limit {
        return Err(WireError::TooLarge { len, limit });
    }
    Ok(len)
}

thread_local! {
    /// Why the decoder running on this thread refused, in its own words.
    static REFUSED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Records why a decoder refuses its input. postcard keeps no message of a
/// decoder's own error (it says only "Serde Deserialization Error"), so a
/// decoder that refuses with a reason (a count over its limit, say) also
/// leaves it here, for [`decode`] to report.
pub(crate) fn refused_because(why: &str) {
    REFUSED.with(|r| *r.borrow_mut() = Some(why.to_string()));
}

/// Decodes a frame body; the whole body must be consumed.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    REFUSED.with(|r| r.borrow_mut().take());
    let (msg, rest) = postcard::take_from_bytes(body).map_err(|e| {
        let why = REFUSED.with(|r| r.borrow_mut().take());
        WireError::Malformed(match why {
            Some(why) if matches!(e, postcard::Error::SerdeDeCustom) => why,
            _ => e.to_string(),
        })
    })?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    Ok(msg)
}

/// Decodes a complete frame (prefix and body) from a buffer.
pub fn decode_frame<T: DeserializeOwned>(frame: &[u8]) -> Result<T, WireError> {
    let prefix: [u8; 4] = frame
        .get(..4)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| WireError::Malformed("frame shorter than its length prefix".into()))?;
    let len = frame_len(prefix)?;
    if frame.len() != 4 + len {
        return Err(WireError::Malformed(format!(
            "length prefix says {len} bytes, frame has {}",
            frame.len() - 4
        )));
    }
    decode(&frame[4..])
}
