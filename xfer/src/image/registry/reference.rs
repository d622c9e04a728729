//! Image references as `docker pull` reads them: `[HOST[:PORT]/]PATH[:TAG]
//! [@sha256:HEX]`, with Docker Hub's defaults (`ubuntu` is
//! `docker.io/library/ubuntu:latest`, served by `registry-1.docker.io`).

use std::fmt;

use xfer_proto::image::Digest;

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";
/// The host Docker Hub's registry API answers on.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A parsed image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// The registry as named (`docker.io`, `ghcr.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// The repository path (`library/ubuntu`, `org/name`).
    pub repository: String,
    /// The tag, unless only a digest was given.
    pub tag: Option<String>,
    /// The manifest's digest, when pinned.
    pub digest: Option<Digest>,
}

/// Why a reference was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    /// Not a reference at all.
    #[error("`{0}` is not an image reference; write it as [REGISTRY/]NAME[:TAG][@sha256:DIGEST], e.g. ghcr.io/org/image:1.0")]
    Malformed(String),
    /// A name component Docker refuses.
    #[error("`{0}` is not an image reference: repository names are lowercase letters, digits and . _ - separated by /")]
    Repository(String),
    /// A tag Docker refuses.
    #[error("`{0}` is not an image reference: a tag is up to 128 of A-Z a-z 0-9 _ . - and does not start with . or -")]
    Tag(String),
    /// A digest that is not sha256.
    #[error("`{0}` is not an image reference: a digest is @sha256: and 64 hex digits")]
    Digest(String),
}

impl ImageRef {
    /// Parses `s` as `docker pull` would.
    pub fn parse(s: &str) -> Result<ImageRef, RefError> {
        let malformed = || RefError::Malformed(s.escape_default().to_string());
        if s.is_empty() || s.len() > 512 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(malformed());
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| RefError::Digest(s.to_string()))?;
                let digest = Digest::parse(&format!("sha256:{hex}"))
                    .map_err(|_| RefError::Digest(s.to_string()))?;
                (r, Some(digest))
            }
            None => (s, None),
        };
        // The first component is a registry if it looks like a host.
        let (registry, path) = match rest.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path)
            }
            _ => (DOCKER_HUB.to_string(), rest),
        };
        if registry.starts_with(['-', '.', ':']) || registry.ends_with([':', '.']) {
            return Err(malformed());
        }
        // A tag follows the last component's colon.
        let (path, tag) = match path.rsplit_once(':') {
            Some((p, t)) if !t.contains('/') => (p, Some(t.to_string())),
            _ => (path, None),
        };
        if let Some(t) = &tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && !t.starts_with(['.', '-'])
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !ok {
                return Err(RefError::Tag(s.to_string()));
            }
        }
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        };
        if path.is_empty() || !path.split('/').all(component_ok) {
            return Err(RefError::Repository(s.to_string()));
        }
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_string()
        };
        let tag = match (tag, digest) {
            (None, None) => Some("latest".to_string()),
            (t, _) => t,
        };
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The host (and port) the registry's API answers on.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// What the manifest is asked by: the digest if pinned, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    /// The name an engine gives the image after a pull: Docker Hub's
    /// `library/` and `docker.io/` left out, as `docker images` shows it.
    pub fn local_name(&self) -> String {
        let path = match self.registry.as_str() {
            DOCKER_HUB => self
                .repository
                .strip_prefix("library/")
                .unwrap_or(&self.repository)
                .to_string(),
            host => format!("{host}/{}", self.repository),
        };
        format!("{path}:{}", self.tag.as_deref().unwrap_or("latest"))
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_defaults_and_other_registries() {
        let r = ImageRef::parse("ubuntu").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("docker.io", "library/ubuntu", Some("latest"))
        );
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.local_name(), "ubuntu:latest");
        let r = ImageRef::parse("scitrera/dgx-spark-sglang:0.5").unwrap();
        assert_eq!(r.repository, "scitrera/dgx-spark-sglang");
        assert_eq!(r.local_name(), "scitrera/dgx-spark-sglang:0.5");
        let r = ImageRef::parse("127.0.0.1:5000/org/img:v1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.api_host()),
            ("127.0.0.1:5000", "org/img", "127.0.0.1:5000")
        );
        assert_eq!(r.local_name(), "127.0.0.1:5000/org/img:v1");
        let hex = "ab".repeat(32);
        let r = ImageRef::parse(&format!("nvcr.io/nvidia/vllm@sha256:{hex}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_reference(), format!("sha256:{hex}"));
        let r = ImageRef::parse("localhost/x:1").unwrap();
        assert_eq!(r.registry, "localhost");
    }

    #[test]
    fn bad_references_are_refused_with_the_form() {
        for bad in [
            "",
            "UPPER/case",
            "a b",
            "x:",
            "x:.bad",
            "x@sha256:12",
            "-x",
            "a//b",
            "x@md5:00",
        ] {
            let e = ImageRef::parse(bad).unwrap_err().to_string();
            assert!(e.contains("is not an image reference"), "{bad}: {e}");
        }
    }
}
