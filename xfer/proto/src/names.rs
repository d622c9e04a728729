//! The names every node shares: the protocol version, the TLS ALPN, the
//! default port, and the validated names of nodes and models.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Protocol version spoken by this build, checked once per connection
/// through the ALPN ([`alpn_offers`]). Version 2 tags every
/// chunk-stream request ([`crate::stream::StreamRequest`]); version 3
/// opens every control stream with a [`crate::hello::Hello`] naming its
/// service, followed by that service's own messages.
pub const PROTOCOL_VERSION: u32 = 3;
/// TLS ALPN identifier of this build's protocol version.
pub const ALPN: &[u8] = b"xfer/3";
/// ALPNs of the older protocol versions, newest first: still offered and
/// accepted, only so that a node of such a version is refused with a
/// sentence naming both versions (a handshake without a common ALPN would
/// fail with no such sentence).
pub const ALPN_OLDER: &[&[u8]] = &[b"xfer/2", ALPN_V1];
/// ALPN of protocol version 1.
pub const ALPN_V1: &[u8] = b"xfer/1";

/// The ALPN identifiers a node offers, newest first: TLS settles on the
/// newest both ends know, and a node that then finds another version than
/// its own refuses the connection with [`version_refusal`].
pub fn alpn_offers() -> Vec<Vec<u8>> {
    std::iter::once(ALPN)
        .chain(ALPN_OLDER.iter().copied())
        .map(<[u8]>::to_vec)
        .collect()
}

/// The protocol version an ALPN identifier names (`xfer/N`).
pub fn alpn_version(alpn: &[u8]) -> Option<u32> {
    std::str::from_utf8(alpn.strip_prefix(b"xfer/")?)
        .ok()?
        .parse()
        .ok()
}

/// The one line a node prints when `peer` speaks protocol `theirs`:
/// both versions, and which node to upgrade.
pub fn version_refusal(peer: &str, theirs: u32) -> String {
    let fix = if theirs < PROTOCOL_VERSION {
        format!("upgrade xfer on {peer}")
    } else {
        "upgrade xfer on this node".to_string()
    };
    format!("{peer} speaks xfer protocol {theirs}, this node speaks {PROTOCOL_VERSION}: {fix}")
}

/// The port an agent listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7470;

/// Longest node name, in characters.
pub const MAX_NAME_LEN: usize = 64;

/// A node's name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(String);

/// Why a node name was refused ([`NodeName::new`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeNameError {
    /// The name is empty.
    #[error("node name is empty; name it, e.g. name = \"spark-a\"")]
    Empty,
    /// The name holds a character outside `A-Z a-z 0-9 . _ -`.
    #[error("node name {name:?} contains {c:?}; use only letters, digits, '.', '_' and '-'")]
    BadChar {
        /// The name as given.
        name: String,
        /// The first character not allowed.
        c: char,
    },
    /// The name is longer than [`MAX_NAME_LEN`].
    #[error("node name {name:?} is {len} characters long; use at most {MAX_NAME_LEN}")]
    TooLong {
        /// The name as given.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
}

impl NodeName {
    /// Checks a name; the error says what is wrong with it.
    pub fn new(s: &str) -> Result<Self, NodeNameError> {
        if s.is_empty() {
            return Err(NodeNameError::Empty);
        }
        if let Some(c) = s
            .chars()
            .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(NodeNameError::BadChar {
                name: s.to_string(),
                c,
            });
        }
        if s.len() > MAX_NAME_LEN {
            return Err(NodeNameError::TooLong {
                name: s.to_string(),
                len: s.len(),
            });
        }
        Ok(Self(s.to_string()))
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// On the wire as the plain string; a name that fails [`NodeName::new`]
/// is refused when read.
impl Serialize for NodeName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NodeName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        NodeName::new(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for NodeName {
    type Err = NodeNameError;
    fn from_str(s: &str) -> Result<Self, NodeNameError> {
        Self::new(s)
    }
}

/// A model's name on the receiving node: one path component.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ModelName(String);

/// A model name that is not one safe path component ([`ModelName::new`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model name `{0}` must be 1-200 characters of letters, digits and ._-+=@, not starting with `.` (or a Hub repo id ORG/NAME, stored as models--ORG--NAME); give one of those")]
pub struct ModelNameError(
    /// The name as given, escaped for printing.
    pub String,
);

impl ModelName {
    /// Checks a name: 1-200 of `A-Z a-z 0-9 . _ - + = @`, not starting
    /// with `.`.
    pub fn new(s: &str) -> Result<Self, ModelNameError> {
        let ok = !s.is_empty()
            && s.len() <= 200
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-+=@".contains(c));
        if ok {
            Ok(ModelName(s.to_string()))
        } else {
            Err(ModelNameError(s.escape_default().to_string()))
        }
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A model as the operator names it: the stored name
    /// (`models--Qwen--Qwen3-8B`, `my-model`) or, when it holds a `/`, a
    /// Hub repo id (`Qwen/Qwen3-8B`, an `@REVISION` ignored), which is
    /// stored under its cache folder name for `repo_type`.
    pub fn from_user(text: &str, repo_type: crate::repo::RepoType) -> Result<Self, ModelNameError> {
        if text.contains('/') {
            let repo = crate::repo::RepoRef::parse(text, repo_type)
                .map_err(|_| ModelNameError(text.escape_default().to_string()))?;
            return ModelName::new(&repo.cache_folder());
        }
        ModelName::new(text)
    }
}

/// A stored model name as a person reads and types it: a Hub cache folder
/// (`models--Qwen--Qwen3-8B`) as its repo id (`Qwen/Qwen3-8B`; a dataset's
/// with ` (dataset)`), any other name as it is. For tables and messages;
/// paths and `--json` keep the stored name.
pub fn for_people(stored: &str) -> String {
    for (prefix, kind) in [("models--", ""), ("datasets--", " (dataset)")] {
        if let Some((org, name)) = stored
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once("--"))
        {
            if !org.is_empty() && !name.is_empty() && !name.contains("--") {
                return format!("{org}/{name}{kind}");
            }
        }
    }
    stored.to_string()
}

impl TryFrom<String> for ModelName {
    type Error = ModelNameError;
    fn try_from(s: String) -> Result<Self, ModelNameError> {
        ModelName::new(&s)
    }
}

impl From<ModelName> for String {
    fn from(n: ModelName) -> String {
        n.0
    }
}

impl std::fmt::Display for ModelName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_folder_reads_as_its_repo_id_and_other_names_as_they_are() {
        assert_eq!(for_people("models--acme--big-model"), "acme/big-model");
        assert_eq!(for_people("datasets--o--d"), "o/d (dataset)");
        assert_eq!(for_people("my-model"), "my-model");
        assert_eq!(for_people("models--odd"), "models--odd");
        assert_eq!(for_people("models--a--b--c"), "models--a--b--c");
        let typed = ModelName::from_user(
            &for_people("models--Org--Name"),
            crate::repo::RepoType::Model,
        );
        assert_eq!(
            typed.unwrap().as_str(),
            "models--Org--Name",
            "it round-trips"
        );
    }

    #[test]
    fn alpn_names_its_version_and_the_refusal_names_both_and_the_fix() {
        assert_eq!(alpn_version(ALPN), Some(PROTOCOL_VERSION));
        assert_eq!(alpn_version(ALPN_V1), Some(1));
        assert_eq!(alpn_version(b"h3"), None);
        assert_eq!(alpn_offers()[0], ALPN);
        let line = version_refusal("n2 (10.0.0.2:7470)", 1);
        assert_eq!(
            line,
            format!("n2 (10.0.0.2:7470) speaks xfer protocol 1, this node speaks {PROTOCOL_VERSION}: upgrade xfer on n2 (10.0.0.2:7470)")
        );
        assert!(version_refusal("n3", PROTOCOL_VERSION + 1).ends_with("upgrade xfer on this node"));
    }

    #[test]
    fn a_repo_id_names_the_model_stored_under_its_cache_folder() {
        use crate::repo::RepoType;
        let m = |s: &str| ModelName::from_user(s, RepoType::Model).map(|n| n.to_string());
        assert_eq!(m("Qwen/Qwen3-8B").unwrap(), "models--Qwen--Qwen3-8B");
        assert_eq!(m("Qwen/Qwen3-8B@main").unwrap(), "models--Qwen--Qwen3-8B");
        assert_eq!(
            m("models--Qwen--Qwen3-8B").unwrap(),
            "models--Qwen--Qwen3-8B"
        );
        assert_eq!(m("my-model").unwrap(), "my-model");
        assert_eq!(
            ModelName::from_user("org/data", RepoType::Dataset)
                .unwrap()
                .as_str(),
            "datasets--org--data"
        );
        for bad in ["a/b/c", "../x", ".hidden", "", "org/x y"] {
            let e = m(bad).unwrap_err().to_string();
            assert!(
                e.contains("ORG/NAME") && !e.contains("--name"),
                "{bad}: {e}"
            );
        }
    }
}
