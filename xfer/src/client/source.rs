//! What `xfer sync SOURCE` means, without guessing: `/abs` and `./x`,
//! `../x` are folders on the `--from` node; `hf://ORG/NAME[@REV]` is a Hub
//! repo; a bare `ORG/NAME[@REV]` is a folder when the `--from` node has it
//! as one (under the operator's working directory or the node's root),
//! refused when only the operator's machine has it (two readings), and a
//! Hub repo otherwise. [`read_source`] reads SOURCE (no I/O), the source
//! agent answers whether `ORG/NAME` is a folder there (its
//! `sync::source`), [`decide`] gives the verdict, [`reading`] the words
//! for the reading taken.

use std::path::{Component, Path, PathBuf};

use xfer_proto::admin::{JobSource, JobSpec};
use xfer_proto::repo::{RepoRef, RepoRefError, RepoType};

/// The prefix that makes a SOURCE a Hub repo whatever folders exist.
pub const HUB_PREFIX: &str = "hf://";

/// A SOURCE as read on the operator's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// A folder on the `--from` node: absolute, `.` and `..` folded away.
    Folder(PathBuf),
    /// A Hub repo, written `hf://...`.
    Hub(RepoRef),
    /// `ORG/NAME[@REV]` (or a bare `NAME`): ask the `--from` node whether
    /// it is a folder there.
    Ask {
        /// The SOURCE as written.
        text: String,
        /// The operator's working directory.
        cwd: PathBuf,
    },
}

/// Why a SOURCE cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// `hf://` followed by something that is not a repo id.
    #[error("{0}; after hf:// write ORG/NAME[@REVISION]")]
    BadRepo(RepoRefError),
    /// The SOURCE is empty.
    #[error("SOURCE is empty; give a folder (/abs/path or ./path) or a Hub repo (hf://ORG/NAME)")]
    Empty,
    /// A relative SOURCE that is neither `./x` nor a repo id.
    #[error("`{0}` is neither a folder (/abs/path, ./path) nor a Hub repo id (ORG/NAME[@REV]); write ./{0} for a folder or hf://ORG/NAME for a repo")]
    Unreadable(String),
    /// The working directory is not absolute (cannot happen with
    /// `std::env::current_dir`).
    #[error("the working directory {0} is not absolute")]
    RelativeCwd(PathBuf),
}

/// Reads SOURCE as written, against the operator's working directory
/// `cwd`. No file system access: whether `ORG/NAME` is a folder is the
/// `--from` node's to say (`AdminRequest::FindFolder`).
pub fn read_source(text: &str, cwd: &Path, repo_type: RepoType) -> Result<Reading, SourceError> {
    if text.is_empty() {
        return Err(SourceError::Empty);
    }
    if !cwd.is_absolute() {
        return Err(SourceError::RelativeCwd(cwd.to_path_buf()));
    }
    if let Some(repo) = text.strip_prefix(HUB_PREFIX) {
        return RepoRef::parse(repo, repo_type)
            .map(Reading::Hub)
            .map_err(SourceError::BadRepo);
    }
    let path = Path::new(text);
    if path.is_absolute() {
        return Ok(Reading::Folder(fold(path)));
    }
    if matches!(
        path.components().next(),
        Some(Component::CurDir | Component::ParentDir)
    ) {
        return Ok(Reading::Folder(fold(&cwd.join(path))));
    }
    if RepoRef::parse(text, repo_type).is_ok() {
        return Ok(Reading::Ask {
            text: text.to_string(),
            cwd: cwd.to_path_buf(),
        });
    }
    Err(SourceError::Unreadable(text.to_string()))
}

/// `path` with `.` dropped and `..` taking its parent off (lexically).
fn fold(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The verdict on [`Reading::Ask`]: `found` is the `--from` node's answer,
/// `here` whether `cwd/text` is a folder where the operator runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The folder on the source node.
    Folder(PathBuf),
    /// The Hub repo of that id.
    Hub(RepoRef),
}

/// Why [`decide`] refuses: one line with both readings and how to pick.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguous {
    /// A folder where the operator runs, but not on the source node.
    #[error("`{text}` is a folder here ({here}) but not on node {node}, and also names the Hub repo {text}: for the folder, copy it to {node} and give its absolute path there, or run `xfer sync ./{text} --from {node}` on {node}; for the repo, write hf://{text}")]
    OnlyHere {
        /// The SOURCE as written.
        text: String,
        /// The folder where the operator runs.
        here: String,
        /// The source node.
        node: String,
    },
    /// Two different folders on the source node.
    #[error("`{text}` is two folders on node {node}: {a} and {b}; give the absolute path of the one you mean (or hf://{text} for the Hub repo)")]
    TwoFolders {
        /// The SOURCE as written.
        text: String,
        /// The node.
        node: String,
        /// Under the operator's working directory.
        a: String,
        /// Under the node's root.
        b: String,
    },
}

/// Decides what `ORG/NAME` is, from what the source node `node` found
/// and whether the operator's machine has the folder (`here`).
pub fn decide(
    text: &str,
    repo_type: RepoType,
    node: &str,
    found: &[PathBuf],
    here: Option<&Path>,
) -> Result<Verdict, Ambiguous> {
    match found {
        [one] => Ok(Verdict::Folder(one.clone())),
        [a, b, ..] => Err(Ambiguous::TwoFolders {
            text: text.to_string(),
            node: node.to_string(),
            a: a.display().to_string(),
            b: b.display().to_string(),
        }),
        [] => match here {
            Some(h) => Err(Ambiguous::OnlyHere {
                text: text.to_string(),
                here: h.display().to_string(),
                node: node.to_string(),
            }),
            None => Ok(Verdict::Hub(
                RepoRef::parse(text, repo_type).expect("read_source checked the repo id"),
            )),
        },
    }
}

/// What a job reads, in words, for the line `xfer sync` prints: `folder
/// /x/m on node a` or `Hub repo org/m@main pulled by node a`.
pub fn reading(spec: &JobSpec) -> String {
    match &spec.source {
        JobSource::Path(p) => format!("folder {} on node {}", p.display(), spec.source_node),
        JobSource::Hub { repo, .. } => {
            format!("Hub repo {repo} pulled by node {}", spec.source_node)
        }
        JobSource::Oci { reference, .. } => {
            format!(
                "model artifact {reference} pulled by node {}",
                spec.source_node
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str) -> Reading {
        read_source(s, Path::new("/home/op"), RepoType::Model).unwrap()
    }

    #[test]
    fn paths_are_folders_hf_is_a_repo_and_org_name_is_asked() {
        assert_eq!(read("/models/m"), Reading::Folder("/models/m".into()));
        assert_eq!(
            read("./local/m"),
            Reading::Folder("/home/op/local/m".into())
        );
        assert_eq!(read("../x/./m"), Reading::Folder("/home/x/m".into()));
        match read("hf://local/m@v1") {
            Reading::Hub(r) => assert_eq!((r.id.as_str(), r.revision.as_str()), ("local/m", "v1")),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            read("local/m"),
            Reading::Ask {
                text: "local/m".into(),
                cwd: "/home/op".into()
            }
        );
        let e = read_source("a/b/c", Path::new("/"), RepoType::Model).unwrap_err();
        assert!(e.to_string().contains("./a/b/c"), "{e}");
        let e = read_source("hf://a/b/c", Path::new("/"), RepoType::Model).unwrap_err();
        assert!(e.to_string().contains("hf://"), "{e}");
    }

    #[test]
    fn the_reading_taken_is_said_in_words() {
        let mut spec = JobSpec {
            id: "j1".into(),
            name: xfer_proto::names::ModelName::new("m").unwrap(),
            source: JobSource::Path("/home/op/local/m".into()),
            source_node: "a".into(),
            members: Vec::new(),
            chunk_size: xfer_proto::manifest::ChunkSize::Auto,
            limit_rate: None,
            transport: Default::default(),
            peers: None,
            hub_endpoint: None,
            intake: Vec::new(),
            give_up: Default::default(),
        };
        assert_eq!(reading(&spec), "folder /home/op/local/m on node a");
        spec.source = JobSource::Hub {
            repo: xfer_proto::repo::RepoRef::parse("local/m", xfer_proto::repo::RepoType::Model)
                .unwrap(),
            pin: None,
        };
        assert_eq!(reading(&spec), "Hub repo local/m@main pulled by node a");
    }

    #[test]
    fn a_folder_only_where_the_operator_runs_is_refused_with_both_readings() {
        let t = RepoType::Model;
        assert_eq!(
            decide("o/m", t, "a", &["/r/o/m".into()], None),
            Ok(Verdict::Folder("/r/o/m".into()))
        );
        assert!(matches!(decide("o/m", t, "a", &[], None), Ok(Verdict::Hub(r)) if r.id == "o/m"));
        let e = decide("o/m", t, "a", &[], Some(Path::new("/home/op/o/m")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/home/op/o/m") && e.contains("./o/m --from a") && e.contains("hf://o/m"),
            "{e}"
        );
        let e = decide("o/m", t, "a", &["/x/o/m".into(), "/r/o/m".into()], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/x/o/m") && e.contains("/r/o/m"), "{e}");
    }
}
