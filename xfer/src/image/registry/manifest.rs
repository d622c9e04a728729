//! The manifests a registry serves, told apart by their media type (the
//! `Content-Type` the registry sent, or the document's own `mediaType`),
//! never by trying one decoder after another: an image index (OCI) or
//! manifest list (Docker) names one manifest per platform; an image
//! manifest names a config and layers.

use std::collections::BTreeMap;

use serde::Deserialize;
use xfer_proto::image::Digest;

/// OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker manifest list.
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker image manifest, schema 2.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// What a manifest request accepts, in order.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// An image config: OCI's and Docker's.
pub const CONFIGS: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
/// Image layers an engine loads: tars, plain or compressed.
pub const LAYERS: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// The most bytes a manifest may have (the distribution spec's servers
/// refuse above 4 MiB).
pub const MAX_MANIFEST: usize = 4 << 20;

/// A blob or manifest as another document names it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What it is.
    pub media_type: String,
    /// Its sha256.
    pub digest: Digest,
    /// Its bytes.
    pub size: u64,
    /// For an index's entry: the platform it is for.
    #[serde(default)]
    pub platform: Option<Platform>,
    /// Its annotations (a model artifact's file path).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// An operating system and architecture (`linux/arm64`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Platform {
    /// `amd64`, `arm64`...
    pub architecture: String,
    /// `linux`.
    pub os: String,
    /// `v8` for arm64, when given.
    #[serde(default)]
    pub variant: Option<String>,
}

impl Platform {
    /// `OS/ARCH[/VARIANT]`, as `--platform` takes it.
    pub fn parse(s: &str) -> Option<Platform> {
        let mut it = s.split('/');
        let (os, arch) = (it.next()?, it.next()?);
        let variant = it.next().map(str::to_string);
        if os.is_empty() || arch.is_empty() || it.next().is_some() {
            return None;
        }
        Some(Platform {
            os: os.into(),
            architecture: arch.into(),
            variant,
        })
    }

    /// This machine's platform, in Go's names as registries write them.
    pub fn host() -> Platform {
        Platform::of_arch(std::env::consts::ARCH)
    }

    /// The platform an agent pulls images for: `XFER_PLATFORM`
    /// (`OS/ARCH[/VARIANT]`; a node whose engine runs another architecture
    /// under emulation) if set and valid, else this machine's.
    pub fn of_node() -> Platform {
        std::env::var("XFER_PLATFORM")
            .ok()
            .and_then(|p| Platform::parse(&p))
            .unwrap_or_else(Platform::host)
    }

    /// Linux on a machine whose Rust `ARCH` is `arch`.
    pub fn of_arch(arch: &str) -> Platform {
        let architecture = match arch {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: None,
        }
    }

    /// Whether an index entry for `other` serves this platform (a variant
    /// asked for must match; none asked for takes any).
    pub fn serves(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && (self.variant.is_none() || self.variant == other.variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// An index or manifest list.
#[derive(Clone, Debug, Deserialize)]
pub struct Index {
    /// One entry per platform (and attestations, which have none).
    pub manifests: Vec<Descriptor>,
}

/// An image manifest (or an artifact's).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// An artifact's type, when it is one (ModelPack's).
    #[serde(default)]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layers, bottom first.
    pub layers: Vec<Descriptor>,
}

/// A manifest, by its media type.
#[derive(Clone, Debug)]
pub enum Manifest {
    /// Many platforms.
    Index(Index),
    /// One image (or artifact).
    Image(ImageManifest),
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A media type this client does not read.
    #[error("the registry sent a manifest of type `{0}`, which xfer does not read (it reads OCI image indexes and manifests and Docker schema 2 manifests and lists); push the image with a current docker, podman or skopeo")]
    MediaType(String),
    /// Bytes that are not the manifest their type says.
    #[error("the registry's {kind} does not parse: {why}")]
    Parse {
        /// The media type.
        kind: String,
        /// The parser's words.
        why: String,
    },
}

/// Reads `bytes` as the manifest `content_type` says it is (the
/// document's own `mediaType` when the registry sent a generic type).
pub fn parse(content_type: &str, bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let mut kind = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    if ![OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST].contains(&kind.as_str()) {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Typed {
            media_type: Option<String>,
        }
        if let Ok(Typed {
            media_type: Some(t),
        }) = serde_json::from_slice::<Typed>(bytes)
        {
            kind = t;
        }
    }
    let parse_err = |e: serde_json::Error| ManifestError::Parse {
        kind: kind.clone(),
        why: e.to_string(),
    };
    match kind.as_str() {
        OCI_INDEX | DOCKER_LIST => serde_json::from_slice(bytes)
            .map(Manifest::Index)
            .map_err(parse_err),
        OCI_MANIFEST | DOCKER_MANIFEST => serde_json::from_slice(bytes)
            .map(Manifest::Image)
            .map_err(parse_err),
        _ => Err(ManifestError::MediaType(kind.clone())),
    }
}

/// The index's entry for `want`, or the platforms it has.
pub fn pick<'a>(index: &'a Index, want: &Platform) -> Result<&'a Descriptor, Vec<String>> {
    let platforms = || {
        index
            .manifests
            .iter()
            .filter_map(|m| m.platform.as_ref())
            .filter(|p| p.os != "unknown")
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
    };
    index
        .manifests
        .iter()
        .find(|m| m.platform.as_ref().is_some_and(|p| want.serves(p)))
        .ok_or_else(platforms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(b: char) -> String {
        format!("sha256:{}", b.to_string().repeat(64))
    }

    #[test]
    fn an_index_picks_each_platform_and_names_the_others() {
        let doc = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":10,"platform":{{"architecture":"amd64","os":"linux"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":11,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":12,"platform":{{"architecture":"unknown","os":"unknown"}}}}]}}"#,
            d('a'),
            d('b'),
            d('c')
        );
        // The registry said only application/json: the document's type decides.
        let Manifest::Index(ix) = parse("application/json", doc.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(pick(&ix, &Platform::of_arch("aarch64")).unwrap().size, 11);
        assert_eq!(
            pick(&ix, &Platform::parse("linux/amd64").unwrap())
                .unwrap()
                .size,
            10
        );
        let missing = pick(&ix, &Platform::parse("linux/s390x").unwrap()).unwrap_err();
        assert_eq!(missing, ["linux/amd64", "linux/arm64/v8"]);
    }

    #[test]
    fn an_unknown_media_type_is_refused_by_name() {
        let e = parse(
            "application/vnd.docker.distribution.manifest.v1+prettyjws",
            b"{}",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("manifest.v1+prettyjws") && e.contains("does not read"),
            "{e}"
        );
    }
}
