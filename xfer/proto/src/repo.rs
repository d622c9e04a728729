//! A Hub repository reference, `REPO[@REVISION]`, and the Hub URLs built
//! from it. Revisions and paths are percent-encoded as `huggingface_hub`
//! does: a revision with nothing kept (so `refs/pr/1` is one segment), a file
//! path with its `/` separators kept. Also the one check of a full commit
//! id ([`is_commit_sha`]), and the one test of a weight file
//! ([`is_weight_file`]).

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

/// What Python's `urllib.parse.quote` leaves alone besides alphanumerics.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// The same, keeping `/` (a file path).
const PATH: &AsciiSet = &UNRESERVED.remove(b'/');

/// Whether `s` is a full commit id: exactly 40 hex digits.
pub fn is_commit_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The file name endings of weights: what an engine loads shard by shard,
/// after it read the rest (config, tokenizer, index).
pub const WEIGHT_SUFFIXES: &[&str] = &[".safetensors", ".bin", ".pt", ".pth", ".gguf"];

/// Whether `path` names a weight file ([`WEIGHT_SUFFIXES`]); every other
/// file of a model is a small file an engine reads as it starts.
pub fn is_weight_file(path: &str) -> bool {
    WEIGHT_SUFFIXES.iter().any(|s| path.ends_with(s))
}

/// The kind of repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoType {
    /// A model repository (`models--ORG--NAME` in the cache).
    Model,
    /// A dataset repository (`datasets--ORG--NAME` in the cache).
    Dataset,
}

/// A repository type other than `model` or `dataset`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown repo type `{0}`; use --repo-type model or --repo-type dataset")]
pub struct UnknownRepoType(String);

impl RepoType {
    /// Reads `model` or `dataset`.
    pub fn from_name(s: &str) -> Result<Self, UnknownRepoType> {
        match s {
            "model" => Ok(RepoType::Model),
            "dataset" => Ok(RepoType::Dataset),
            other => Err(UnknownRepoType(other.to_string())),
        }
    }

    /// [`RepoType::from_name`] as `--repo-type`'s value parser takes it.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::from_name(s).map_err(|e| e.to_string())
    }

    /// `model` or `dataset`, as `--repo-type` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RepoType::Model => "model",
            RepoType::Dataset => "dataset",
        }
    }

    /// The plural used in API paths and cache folder names.
    fn plural(self) -> &'static str {
        match self {
            RepoType::Model => "models",
            RepoType::Dataset => "datasets",
        }
    }

    /// The prefix of `resolve` URLs (models have none).
    fn url_prefix(self) -> &'static str {
        match self {
            RepoType::Model => "",
            RepoType::Dataset => "datasets/",
        }
    }
}

/// Why `REPO[@REVISION]` is not a repository reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepoRefError {
    /// `REPO@` with nothing after the `@` (the whole text).
    #[error("`{0}` has an empty revision after `@`; write REPO or REPO@REVISION")]
    EmptyRevision(String),
    /// The part before `@` is not `ORG/NAME` or `NAME`.
    #[error("`{0}` is not a Hub repo id; write ORG/NAME, e.g. Qwen/Qwen3-8B (letters, digits, `-`, `_`, `.`)")]
    BadId(String),
    /// The revision holds control characters (shown escaped).
    #[error("revision `{0}` has control characters")]
    ControlCharacters(String),
}

/// `org/name` (or `name`) at a revision. On the wire and in a job's
/// record it is its text (`ORG/NAME@REV`) and its type, checked again by
/// [`RepoRef::parse`] when read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RepoRefText", into = "RepoRefText")]
pub struct RepoRef {
    /// Model or dataset.
    pub repo_type: RepoType,
    /// `org/name` or `name`.
    pub id: String,
    /// A branch, tag, commit or `refs/pr/N`; `main` when not given.
    pub revision: String,
}

/// How a [`RepoRef`] is written: `ORG/NAME@REV` and `model`/`dataset`.
#[derive(Serialize, Deserialize)]
struct RepoRefText {
    repo: String,
    repo_type: String,
}

impl From<RepoRef> for RepoRefText {
    fn from(r: RepoRef) -> Self {
        RepoRefText {
            repo: r.to_string(),
            repo_type: r.repo_type.as_str().to_string(),
        }
    }
}

/// Why a written repository reference does not read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepoRefTextError {
    /// Its type.
    #[error(transparent)]
    Type(#[from] UnknownRepoType),
    /// Its `ORG/NAME@REV`.
    #[error(transparent)]
    Ref(#[from] RepoRefError),
}

impl TryFrom<RepoRefText> for RepoRef {
    type Error = RepoRefTextError;

    fn try_from(t: RepoRefText) -> Result<Self, RepoRefTextError> {
        let kind = RepoType::from_name(&t.repo_type)?;
        Ok(RepoRef::parse(&t.repo, kind)?)
    }
}

/// `ORG/NAME@REV`.
impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.id, self.revision)
    }
}

impl RepoRef {
    /// Parses `REPO[@REVISION]`.
    pub fn parse(s: &str, repo_type: RepoType) -> Result<Self, RepoRefError> {
        let (id, revision) = match s.split_once('@') {
            Some((id, rev)) if !rev.is_empty() => (id, rev),
            Some(_) => return Err(RepoRefError::EmptyRevision(s.to_string())),
            None => (s, "main"),
        };
        let parts: Vec<&str> = id.split('/').collect();
        let ok_part = |p: &&str| {
            !p.is_empty()
                && p.len() <= 96
                && !p.starts_with(['-', '.'])
                && !p.ends_with(['-', '.'])
                && !p.contains("--")
                && !p.contains("..")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if parts.len() > 2 || !parts.iter().all(ok_part) {
            return Err(RepoRefError::BadId(id.to_string()));
        }
        if revision.chars().any(|c| c.is_control()) {
            return Err(RepoRefError::ControlCharacters(
                revision.escape_default().to_string(),
            ));
        }
        Ok(RepoRef {
            repo_type,
            id: id.to_string(),
            revision: revision.to_string(),
        })
    }

    /// `{endpoint}/api/models/{id}/revision/{revision}`: resolves the
    /// revision to a commit.
    pub fn revision_url(&self, endpoint: &str) -> String {
        format!(
            "{}/api/{}/{}/revision/{}",
            endpoint.trim_end_matches('/'),
            self.repo_type.plural(),
            self.id,
            utf8_percent_encode(&self.revision, UNRESERVED)
        )
    }

    /// `{endpoint}/api/models/{id}/tree/{commit}?recursive=true`: the first
    /// page of the file listing.
    pub fn tree_url(&self, endpoint: &str, commit: &str) -> String {
        format!(
            "{}/api/{}/{}/tree/{}?recursive=true&expand=false",
            endpoint.trim_end_matches('/'),
            self.repo_type.plural(),
            self.id,
            utf8_percent_encode(commit, UNRESERVED)
        )
    }

    /// `{endpoint}/{id}/resolve/{commit}/{path}`: one file's bytes.
    pub fn resolve_url(&self, endpoint: &str, commit: &str, path: &str) -> String {
        format!(
            "{}/{}{}/resolve/{}/{}",
            endpoint.trim_end_matches('/'),
            self.repo_type.url_prefix(),
            self.id,
            utf8_percent_encode(commit, UNRESERVED),
            utf8_percent_encode(path, PATH)
        )
    }

    /// The cache folder name: `models--org--name`.
    pub fn cache_folder(&self) -> String {
        format!(
            "{}--{}",
            self.repo_type.plural(),
            self.id.replace('/', "--")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(s: &str) -> RepoRef {
        RepoRef::parse(s, RepoType::Model).unwrap()
    }

    #[test]
    fn parses_repo_and_revision() {
        let r = model("Qwen/Qwen3-8B");
        assert_eq!(
            (r.id.as_str(), r.revision.as_str()),
            ("Qwen/Qwen3-8B", "main")
        );
        let r = model("gpt2@refs/pr/1");
        assert_eq!((r.id.as_str(), r.revision.as_str()), ("gpt2", "refs/pr/1"));
        for bad in [
            "",
            "a/b/c",
            "../x",
            "org/-x",
            "org/x--y",
            "org/x y",
            "org/",
            "x@",
            &format!("o/{}", "n".repeat(97)),
        ] {
            assert!(RepoRef::parse(bad, RepoType::Model).is_err(), "{bad:?}");
        }
        assert!(RepoType::parse("space").is_err());
    }

    #[test]
    fn a_commit_sha_is_40_hex_digits() {
        assert!(is_commit_sha("0123456789abcdef0123456789ABCDEF01234567"));
        assert!(!is_commit_sha("0123456789abcdef0123456789abcdef0123456"));
        assert!(!is_commit_sha("0123456789abcdef0123456789abcdef0123456g"));
        assert!(!is_commit_sha("main"));
    }

    #[test]
    fn urls_quote_like_huggingface_hub() {
        let ep = "https://hf-mirror.example/";
        let r = model("org/m@refs/pr/1");
        assert_eq!(
            r.revision_url(ep),
            "https://hf-mirror.example/api/models/org/m/revision/refs%2Fpr%2F1"
        );
        let c = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            r.tree_url(ep, c),
            format!(
                "https://hf-mirror.example/api/models/org/m/tree/{c}?recursive=true&expand=false"
            )
        );
        assert_eq!(
            r.resolve_url(ep, c, "sub dir/model-00001-of-00002.safetensors"),
            format!("https://hf-mirror.example/org/m/resolve/{c}/sub%20dir/model-00001-of-00002.safetensors")
        );
        let d = RepoRef::parse("org/data", RepoType::Dataset).unwrap();
        assert_eq!(
            d.resolve_url(ep, c, "a.parquet"),
            format!("https://hf-mirror.example/datasets/org/data/resolve/{c}/a.parquet")
        );
        assert_eq!(
            d.revision_url(ep),
            "https://hf-mirror.example/api/datasets/org/data/revision/main"
        );
        assert_eq!(r.cache_folder(), "models--org--m");
        assert_eq!(d.cache_folder(), "datasets--org--data");
    }
}
