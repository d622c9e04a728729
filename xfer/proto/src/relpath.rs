//! Paths inside a model tree, checked so that no manifest can name anything
//! outside it.
//!
//! A [`RelPath`] is a `/`-separated relative path with no empty, `.` or `..`
//! components, no NUL, backslash or other control character (C0, DEL, C1:
//! a newline or an escape sequence in a name would forge log lines and
//! drive terminals), and bounded length. Every path a peer or the Hub
//! sends is parsed into one before it touches the filesystem, and every
//! refusal shows the path escaped ([`shown`]), never raw.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest accepted path, in bytes.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest accepted path component, in bytes.
pub const MAX_COMPONENT_LEN: usize = 255;

/// A validated relative path inside a tree.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(String);

/// Why a path was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("empty path")]
    /// The path is empty.
    Empty,
    #[error("absolute path `{0}` (paths must be relative to the model root)")]
    /// The path is absolute.
    Absolute(String),
    #[error("path `{0}` climbs out of the tree with `..`")]
    /// The path has a `..` component.
    Parent(String),
    #[error("path `{0}` has an empty or `.` component")]
    /// The path has an empty or `.` component.
    EmptyComponent(String),
    #[error("path `{0}` contains a NUL byte or backslash")]
    /// The path holds a NUL byte or backslash.
    BadChar(String),
    #[error("path `{0}` contains the control character {1:?}; rename it at its source without control characters")]
    /// The path holds a control character.
    Control(String, char),
    #[error("path of {0} bytes is longer than {MAX_PATH_LEN}")]
    /// The path, or one component, is too long.
    TooLong(usize),
    #[error("path `{0}` is not valid UTF-8")]
    /// The path is not UTF-8.
    NotUtf8(String),
}

impl RelPath {
    /// Parses and checks a `/`-separated relative path.
    pub fn new(s: &str) -> Result<Self, PathError> {
        if s.is_empty() {
            return Err(PathError::Empty);
        }
        if s.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong(s.len()));
        }
        if s.starts_with('/') {
            return Err(PathError::Absolute(shown(s)));
        }
        if s.contains('\0') || s.contains('\\') {
            return Err(PathError::BadChar(shown(s)));
        }
        if let Some(c) = control_char(s) {
            return Err(PathError::Control(shown(s), c));
        }
        for part in s.split('/') {
            match part {
                "" | "." => return Err(PathError::EmptyComponent(shown(s))),
                ".." => return Err(PathError::Parent(shown(s))),
                p if p.len() > MAX_COMPONENT_LEN => return Err(PathError::TooLong(p.len())),
                _ => {}
            }
        }
        Ok(RelPath(s.to_string()))
    }

    /// Builds a relative path from a filesystem path below some root.
    pub fn from_fs(path: &Path) -> Result<Self, PathError> {
        let mut parts = Vec::new();
        for c in path.components() {
            match c {
                Component::Normal(p) => parts.push(
                    p.to_str()
                        .ok_or_else(|| PathError::NotUtf8(shown(&path.to_string_lossy())))?,
                ),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(PathError::Absolute(shown(&path.to_string_lossy())))
                }
                Component::ParentDir => {
                    return Err(PathError::Parent(shown(&path.to_string_lossy())))
                }
                Component::CurDir => {}
            }
        }
        RelPath::new(&parts.join("/"))
    }

    /// The path as written, `/`-separated.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path's components.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The parent directory, or `None` at the top of the tree.
    pub fn parent(&self) -> Option<RelPath> {
        self.0.rsplit_once('/').map(|(p, _)| RelPath(p.to_string()))
    }

    /// Every proper ancestor, nearest the root first.
    pub fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.0.match_indices('/').map(move |(i, _)| &self.0[..i])
    }

    /// This path below `root` on the local filesystem.
    pub fn under(&self, root: &Path) -> PathBuf {
        let mut p = root.to_path_buf();
        p.extend(self.components());
        p
    }

    /// Resolves a symlink target written relative to this path's directory.
    /// Returns the path it names inside the tree, or `None` if it escapes the
    /// tree or is absolute.
    pub fn resolve_link(&self, target: &str) -> Option<RelPath> {
        if target.is_empty()
            || target.starts_with('/')
            || target.contains('\0')
            || control_char(target).is_some()
        {
            return None;
        }
        let mut stack: Vec<&str> = match self.0.rsplit_once('/') {
            Some((dir, _)) => dir.split('/').collect(),
            None => Vec::new(),
        };
        for part in target.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    stack.pop()?;
                }
                p => stack.push(p),
            }
        }
        RelPath::new(&stack.join("/")).ok()
    }
}

/// The first control character of `s` (C0 including newline, tab and
/// ESC, DEL, or C1 U+0080 to U+009F), if any.
pub fn control_char(s: &str) -> Option<char> {
    s.chars().find(|c| c.is_control())
}

/// `s` as it may appear in a message: control characters, quotes and
/// backslashes escaped as in Rust source (`a\nb\u{1b}[31m`), so that a
/// hostile name can neither break a log line nor reach a terminal.
pub fn shown(s: &str) -> String {
    s.escape_debug().to_string()
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Serialize for RelPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        RelPath::new(&s).map_err(|e| {
            // postcard drops a custom error's text: keep it for the refusal.
            crate::frame::refused_because(&e.to_string());
            serde::de::Error::custom(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_paths() {
        let p = RelPath::new("snapshots/abc/model.safetensors").unwrap();
        assert_eq!(p.parent().unwrap().as_str(), "snapshots/abc");
        assert_eq!(
            p.ancestors().collect::<Vec<_>>(),
            ["snapshots", "snapshots/abc"]
        );
        assert_eq!(
            p.under(Path::new("/r")),
            PathBuf::from("/r/snapshots/abc/model.safetensors")
        );
    }

    #[test]
    fn rejects_escapes_and_junk() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../../b",
            "..",
            "a//b",
            "./a",
            "a/.",
            "a\\b",
            "a\0b",
        ] {
            assert!(RelPath::new(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(RelPath::new(&"a".repeat(300)).is_err());
        assert!(RelPath::new(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn control_characters_are_refused_and_shown_escaped() {
        for bad in [
            "a\nb\u{1b}[31mRED",
            "tab\there",
            "del\u{7f}",
            "c1\u{85}x",
            "c1\u{9b}31m",
            "dir/\rcarriage",
        ] {
            let e = RelPath::new(bad).unwrap_err().to_string();
            assert!(
                !e.chars().any(|c| c.is_control()),
                "{bad:?}: the message itself carries a control character: {e:?}"
            );
            assert!(e.contains(&bad.escape_debug().to_string()), "{e}");
        }
        let e = RelPath::new("a\nb\u{1b}[31mRED").unwrap_err().to_string();
        assert_eq!(
            e,
            "path `a\\nb\\u{1b}[31mRED` contains the control character '\\n'; rename it at its source without control characters"
        );
        // Non-ASCII that is not a control character stays allowed.
        RelPath::new("modèle/权重.safetensors").unwrap();
        // Other refusals show the path escaped too.
        let e = RelPath::new("/etc/\u{1b}]0;x").unwrap_err().to_string();
        assert!(e.contains("/etc/\\u{1b}]0;x"), "{e}");
        // A link target with one cannot resolve.
        let l = RelPath::new("d/l").unwrap();
        assert!(l.resolve_link("x\ny").is_none());
        assert!(l.resolve_link("../\u{9b}").is_none());
    }

    #[test]
    fn deserialising_checks_too() {
        let r: Result<RelPath, _> = serde_json::from_str("\"../x\"");
        assert!(r.is_err());
    }

    #[test]
    fn link_resolution_stays_inside() {
        let link = RelPath::new("snapshots/abc/model.safetensors").unwrap();
        assert_eq!(
            link.resolve_link("../../blobs/123").unwrap().as_str(),
            "blobs/123"
        );
        assert!(link.resolve_link("../../../etc/passwd").is_none());
        assert!(link.resolve_link("/etc/passwd").is_none());
        let top = RelPath::new("a").unwrap();
        assert_eq!(top.resolve_link("b").unwrap().as_str(), "b");
        assert!(top.resolve_link("..").is_none());
        assert!(top.resolve_link(".").is_none());
    }
}
