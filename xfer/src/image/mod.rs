//! Container images as content, for `xfer image push` and the agents that
//! load them: reading the tar `docker save` writes into content-addressed
//! blobs, each checked against its sha256 digest ([`archive`]); writing
//! the tar `docker load` reads back from those blobs, checking each digest
//! again as it streams ([`loadtar`]); and the one place that runs the
//! container engine's command line ([`runtime`]: version, runtimes, image
//! ids, save, load, removing containers). [`chain_ids`] and [`omittable`]
//! say which layers a node's engine holds already, so that a load leaves
//! them out of the stream. [`files`] is how a registry pull reaches what
//! it writes: plain paths with `O_NOFOLLOW` for the operator's folders,
//! or beneath an agent's root where no symlink is followed.
//!
//! The blob layout on both sides is the one [`xfer_proto::image`] names: a
//! folder `sha256-<hex>` per blob holding one file, `blob`, so that a blob
//! is a model the swarm delivers like any other.

pub mod archive;
pub mod files;
pub mod loadtar;
pub mod registry;
pub mod runtime;

use std::collections::BTreeSet;
use std::io::{Read, Write};

use sha2::{Digest as _, Sha256};
use xfer_proto::image::{Digest, ImageDesc};

/// Copies everything `r` yields into `w`, hashing it as it passes: its
/// sha256 and how many bytes that was.
pub fn sha256_copy(mut r: impl Read, mut w: impl Write) -> std::io::Result<(Digest, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = r.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        w.write_all(&buf[..k])?;
        n += k as u64;
    }
    Ok((Digest(h.finalize().into()), n))
}

/// The chain id of every prefix of a layer stack, bottom first: what an
/// engine keys a stack of layers by (OCI: `ChainID(L0) = DiffID(L0)`,
/// `ChainID(L0..Ln) = sha256(ChainID(L0..Ln-1) + " " + DiffID(Ln))`).
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => *d,
            Some(below) => Digest(Sha256::digest(format!("{below} {d}").as_bytes()).into()),
        };
        out.push(next);
    }
    out
}

/// The layers of `desc` that an engine holding the stacks `held` (chain
/// ids) need not be sent: every place the layer stands in the image has
/// its stack there already. Docker's `load` then takes the layer from its
/// store and never opens the file.
pub fn omittable(desc: &ImageDesc, held: &BTreeSet<Digest>) -> BTreeSet<Digest> {
    let chains = chain_ids(&desc.diff_ids());
    let mut needed = BTreeSet::new();
    let mut maybe = BTreeSet::new();
    for (l, c) in desc.layers.iter().zip(&chains) {
        if held.contains(c) {
            maybe.insert(l.digest);
        } else {
            needed.insert(l.digest);
        }
    }
    maybe.difference(&needed).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::image::BlobRef;

    fn d(b: u8) -> Digest {
        Digest([b; 32])
    }

    #[test]
    fn chain_ids_follow_the_oci_rule() {
        // Read off a Docker 20.10 layer store (image/overlay2/layerdb):
        // the layer d7480dc7… on top of 874574fc… is kept as 98ae0090….
        let a = Digest::parse(
            "sha256:874574fcfeabb1bdb0fd2f6591c1ad112413c62648fa3a142ce19c6a6f8a6a3d",
        )
        .unwrap();
        let b = Digest::parse(
            "sha256:d7480dc7acbb085c0e5d4702d5788aa527daeb160e355942ae6ed75ee0955fe0",
        )
        .unwrap();
        let docker = Digest::parse(
            "sha256:98ae0090eb07d05916f83dbc051d2dfb1dc23faf9333d90cf41380662650858c",
        )
        .unwrap();
        assert_eq!(chain_ids(&[a, b]), vec![a, docker]);
        assert_eq!(chain_ids(&[]), Vec::<Digest>::new());
    }

    #[test]
    fn only_layers_whose_every_stack_is_held_are_left_out() {
        let blob = |digest| BlobRef { digest, size: 1 };
        let desc = ImageDesc {
            reference: "xt/app:2".into(),
            config: blob(d(9)),
            layers: vec![blob(d(1)), blob(d(2)), blob(d(1))],
            diff_ids: Vec::new(),
        };
        let chains = chain_ids(&[d(1), d(2), d(1)]);
        let none = omittable(&desc, &BTreeSet::new());
        assert!(none.is_empty());
        let base: BTreeSet<Digest> = [chains[0]].into();
        // d(1) also stands on top, where its stack is not held.
        assert!(omittable(&desc, &base).is_empty());
        let two: BTreeSet<Digest> = [chains[0], chains[1]].into();
        assert_eq!(omittable(&desc, &two), [d(2)].into());
        let all: BTreeSet<Digest> = chains.iter().copied().collect();
        assert_eq!(omittable(&desc, &all), [d(1), d(2)].into());
    }
}
