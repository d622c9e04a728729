//! Container images as content: an image is its config blob and its
//! layer blobs ([`ImageDesc`]), each named by its sha256 [`Digest`], the
//! name Docker and OCI give it. On a node every blob is a model of its
//! own, named [`Digest::model`] (`sha256-<hex>`) and holding one file,
//! [`BLOB_FILE`]: it travels, resumes and is verified chunk by chunk like
//! any model, and a blob a node already holds, from any image, is not sent
//! again. What an agent reports of the images it loaded is an
//! [`ImageStatus`]; the engine that loads them is a [`ContainerRuntime`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::names::ModelName;

/// The one file in a blob's model folder.
pub const BLOB_FILE: &str = "blob";
/// What every blob model's name starts with.
pub const BLOB_MODEL_PREFIX: &str = "sha256-";
/// The most layers an image may have (Docker allows 127 on overlay2).
pub const MAX_LAYERS: usize = 256;

/// A sha256 digest, written `sha256:<64 hex>` as Docker and OCI write it
/// (in JSON too; 32 bytes in postcard frames).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(pub [u8; 32]);

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(self)
        } else {
            self.0.serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        if d.is_human_readable() {
            let s = String::deserialize(d)?;
            Digest::parse(&s).map_err(serde::de::Error::custom)
        } else {
            <[u8; 32]>::deserialize(d).map(Digest)
        }
    }
}

/// Text that is no sha256 digest.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{}` is not a sha256 digest (sha256: and 64 hex digits)", .0.escape_default())]
pub struct BadDigest(pub String);

/// Text that is no image reference Docker takes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{}` is not an image reference (NAME[:TAG] of a-z, 0-9, . _ - / : @)", .0.escape_default())]
pub struct BadReference(pub String);

/// Why an image a peer sent is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadImage {
    /// Its reference.
    #[error(transparent)]
    Reference(#[from] BadReference),
    /// Its number of layers.
    #[error("image {reference} has {layers} layers; an image has 1 to {MAX_LAYERS}")]
    Layers {
        /// The image's reference.
        reference: String,
        /// How many layers it has.
        layers: usize,
    },
}

impl Digest {
    /// Parses `sha256:<64 lowercase hex>` (or the bare hex).
    pub fn parse(s: &str) -> Result<Digest, BadDigest> {
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        let bad = || BadDigest(s.to_string());
        if hex_part.len() != 64 || hex_part.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| bad())?;
        Ok(Digest(out))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 12 hex digits, as `docker images` shows an id.
    pub fn short(&self) -> String {
        self.hex()[..12].to_string()
    }

    /// The name of the model that holds this blob on a node.
    pub fn model(&self) -> ModelName {
        ModelName::new(&format!("{BLOB_MODEL_PREFIX}{}", self.hex()))
            .expect("sha256-<hex> is a valid model name")
    }

    /// The digest a blob model's name stands for; `None` for any other model.
    pub fn of_model(name: &str) -> Option<Digest> {
        let hex_part = name.strip_prefix(BLOB_MODEL_PREFIX)?;
        Digest::parse(hex_part).ok()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.short())
    }
}

/// One blob of an image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    /// The blob's sha256.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
}

/// An image as the operator's engine saved it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDesc {
    /// What the operator named it: `vllm-gb10:latest`.
    pub reference: String,
    /// The image id: its config blob's digest.
    pub config: BlobRef,
    /// The layers, bottom first: each a tar whose digest is the config's
    /// `rootfs.diff_ids` entry (from `docker save`), or, from a registry,
    /// a compressed tar whose uncompressed digest is that entry.
    pub layers: Vec<BlobRef>,
    /// The config's `rootfs.diff_ids`, when they differ from the layers'
    /// digests (compressed layers from a registry); empty when equal.
    #[serde(default)]
    pub diff_ids: Vec<Digest>,
}

impl ImageDesc {
    /// The image id: the config blob's digest.
    pub fn id(&self) -> Digest {
        self.config.digest
    }

    /// The config, then the layers.
    pub fn blobs(&self) -> impl Iterator<Item = &BlobRef> {
        std::iter::once(&self.config).chain(&self.layers)
    }

    /// The uncompressed digest of each layer (what the engine's layer
    /// store and chain ids are keyed by).
    pub fn diff_ids(&self) -> Vec<Digest> {
        if self.diff_ids.is_empty() {
            self.layers.iter().map(|l| l.digest).collect()
        } else {
            self.diff_ids.clone()
        }
    }

    /// The bytes of all its blobs.
    pub fn bytes(&self) -> u64 {
        self.blobs().map(|b| b.size).sum()
    }

    /// Checks what a peer sent before anything acts on it.
    pub fn check(&self) -> Result<(), BadImage> {
        check_reference(&self.reference)?;
        if self.layers.is_empty()
            || self.layers.len() > MAX_LAYERS
            || (!self.diff_ids.is_empty() && self.diff_ids.len() != self.layers.len())
        {
            return Err(BadImage::Layers {
                reference: self.reference.clone(),
                layers: self.layers.len(),
            });
        }
        Ok(())
    }
}

/// Checks an image reference (`NAME[:TAG]`, `HOST/NAME:TAG`): what Docker
/// accepts, and nothing a command line could mistake for an option.
pub fn check_reference(r: &str) -> Result<(), BadReference> {
    let ok = !r.is_empty()
        && r.len() <= 255
        && !r.starts_with(['-', '.', ':', '/'])
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BadReference(r.to_string()))
    }
}

/// The container runtime an agent loads images into and runs ranks with
/// (`xfer serve --container-engine`; the type's name is not on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ContainerRuntime {
    /// `docker`.
    Docker,
    /// `podman`.
    Podman,
}

impl ContainerRuntime {
    /// Its command.
    pub fn program(self) -> &'static str {
        match self {
            ContainerRuntime::Docker => "docker",
            ContainerRuntime::Podman => "podman",
        }
    }
}

impl fmt::Display for ContainerRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.program())
    }
}

/// What an agent reports after loading an image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageLoadReport {
    /// The image reference loaded.
    pub reference: String,
    /// The id the engine reports for the reference after the load.
    pub id: Digest,
    /// "docker 20.10.24".
    pub engine: String,
    /// Bytes streamed into the engine (0: it held the image already).
    pub loaded_bytes: u64,
    /// Seconds the sha256 checks and the load took.
    pub check_s: f64,
    /// Seconds the load into the engine took.
    pub load_s: f64,
}

/// An image an agent loaded, in its status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageStatus {
    /// The image reference.
    pub reference: String,
    /// The image id.
    pub id: Digest,
    /// The bytes of all its blobs.
    pub bytes: u64,
    /// How many layers it has.
    pub layers: u32,
    /// When it was loaded (Unix seconds).
    pub loaded_unix: u64,
    /// What the engine says of the reference now: its id, or why none
    /// (`removed from docker since`); `None`: no engine configured.
    pub engine_id: Option<Result<Digest, String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_print_and_name_their_models() {
        let hex = "6ebeff1d5b25f822a7c441aa143064f154b7559a6c34960fe82da58181a42b8c";
        let d = Digest::parse(&format!("sha256:{hex}")).unwrap();
        assert_eq!(d, Digest::parse(hex).unwrap());
        assert_eq!(d.to_string(), format!("sha256:{hex}"));
        assert_eq!(d.short(), "6ebeff1d5b25");
        assert_eq!(d.model().as_str(), format!("sha256-{hex}"));
        assert_eq!(Digest::of_model(d.model().as_str()), Some(d));
        assert_eq!(Digest::of_model("models--org--name"), None);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"sha256:{hex}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        let frame = crate::frame::encode(&d);
        assert_eq!(crate::frame::decode_frame::<Digest>(&frame).unwrap(), d);
        for bad in ["sha256:12", "sha512:00", &hex.to_uppercase(), ""] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn references_refuse_what_a_command_line_would_misread() {
        for ok in [
            "xt/base:1",
            "nvcr.io/nvidia/vllm:25.09-py3",
            "app@sha256:00",
        ] {
            check_reference(ok).unwrap();
        }
        for bad in ["", "-rm", "a b", "x;y", ":tag", "/abs"] {
            assert!(check_reference(bad).is_err(), "{bad}");
        }
    }
}
