//! Container images as content, for `xfer image push` and the agents that
//! load them: reading the tar `docker save` writes into content-addressed
//! blobs, each checked against its sha256 digest ([`archive`]); writing
//! the tar `docker load` reads back from those blobs, checking each digest
//! again as it streams ([`loadtar`]); and the one place that runs the
//! container engine's command line ([`engine`]: version, runtimes, image
//! ids, save, load, removing containers).
//!
//! The blob layout on both sides is the one [`xfer_proto::image`] names: a
//! folder `sha256-<hex>` per blob holding one file, `blob`, so that a blob
//! is a model the swarm delivers like any other.

pub mod archive;
pub mod engine;
pub mod loadtar;

use std::io::Read;

use sha2::{Digest as _, Sha256};
use xfer_proto::image::Digest;

/// The sha256 of everything `r` yields, and how many bytes that was.
pub fn sha256_of(mut r: impl Read) -> std::io::Result<(Digest, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = r.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((Digest(h.finalize().into()), n))
}
