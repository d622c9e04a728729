//! The model of `[launch]`: an absolute path, or a Hub repo at a revision
//! (a string, or a `model = { ... }` table, with an optional separate
//! `revision`), and the one path every launch node loads it from.

use toml::de::{DeTable, DeValue};
use xfer::config::cluster::Node;
use xfer::config::toml_reader::{entries, At, Val};
use xfer_proto::repo::{is_commit_sha, RepoRef, RepoType};

use super::{LaunchError, ModelPath, Parser, COMMIT_PLACEHOLDER};

/// The model as written.
#[derive(Clone, Debug)]
pub(super) enum ModelSpec {
    /// An absolute path, the same on every node.
    Path(String),
    /// `explicit` when the repo string carried `@REVISION` itself.
    Repo { repo: RepoRef, explicit: bool },
}

/// Keys of a `model = { ... }` table.
const MODEL_KEYS: &[&str] = &["path", "repo", "revision"];

impl Parser<'_> {
    /// `model = "/abs/path"`, `"ORG/NAME[@REVISION]"` or a table of
    /// `path`, or `repo` and `revision`.
    pub(super) fn model(&self, v: &Val) -> Result<ModelSpec, LaunchError> {
        let at = v.span().start;
        match v.get_ref() {
            DeValue::String(s) => self.model_string(s, at),
            DeValue::Table(t) => self.model_table(t, at),
            _ => {
                let fix = "write an absolute path or ORG/NAME, like model = \"Qwen/Qwen3-8B\"";
                Err(self.r.wrong_kind("model", v, fix).into())
            }
        }
    }

    /// `model = { path = ... }` or `model = { repo = ..., revision = ... }`.
    fn model_table(&self, t: &DeTable, at: usize) -> Result<ModelSpec, LaunchError> {
        let mut path = None;
        let mut repo = None;
        let mut revision = None;
        for e in entries(t) {
            let (v, at) = (e.value, e.at);
            match e.key {
                "path" => {
                    let s = self.r.string("model.path", v, "\"/models/Qwen3-8B\"")?;
                    path = Some(At {
                        v: self.abs_path(s, at)?,
                        at,
                    });
                }
                "repo" => {
                    let s = self.r.string("model.repo", v, "\"Qwen/Qwen3-8B\"")?;
                    let parsed = RepoRef::parse(s, RepoType::Model)
                        .map_err(|e| self.err(at, e.to_string()))?;
                    repo = Some(self.repo(parsed, s, at)?);
                }
                "revision" => {
                    let s = self.r.string("model.revision", v, "\"main\"")?;
                    revision = Some(At {
                        v: self.revision(s, at)?,
                        at,
                    });
                }
                _ => {
                    let otherwise = || "model takes path, or repo and an optional revision".into();
                    let aliases = &[("commit", "revision")];
                    return Err(self
                        .r
                        .unknown_key(&e, "model", MODEL_KEYS, aliases, otherwise)
                        .into());
                }
            }
        }
        match (path, repo, revision) {
            (Some(p), Some(_), _) => Err(self.err(
                p.at,
                "model has both path and repo; keep one: path for a folder at the same absolute path on every node, repo for ORG/NAME in each node's root",
            )),
            (Some(_), None, Some(r)) => Err(self.err(
                r.at,
                "model has a revision but no repo; a revision only applies to repo = \"ORG/NAME\"",
            )),
            (Some(p), None, None) => Ok(ModelSpec::Path(p.v)),
            (None, Some(r), rev) => self.with_revision(r, rev),
            (None, None, _) => Err(self.err(
                at,
                "model names no model; write model = { path = \"/abs/path\" } or model = { repo = \"ORG/NAME\" }",
            )),
        }
    }

    fn model_string(&self, s: &str, at: usize) -> Result<ModelSpec, LaunchError> {
        if s.starts_with('/') {
            return Ok(ModelSpec::Path(self.abs_path(s, at)?));
        }
        match RepoRef::parse(s, RepoType::Model) {
            Ok(parsed) => self.repo(parsed, s, at),
            Err(_) => Err(self.err(
                at,
                format!(
                    "model {s:?} is neither an absolute path nor a Hub repo; write the folder's absolute path (the same on every node), e.g. \"/models/Qwen3-8B\", or ORG/NAME[@REVISION], e.g. \"Qwen/Qwen3-8B\""
                ),
            )),
        }
    }

    /// Applies a separate `revision` to a repo model.
    pub(super) fn with_revision(
        &self,
        model: ModelSpec,
        revision: Option<At<String>>,
    ) -> Result<ModelSpec, LaunchError> {
        match (model, revision) {
            (m, None) => Ok(m),
            (ModelSpec::Path(_), Some(r)) => Err(self.err(
                r.at,
                "revision applies to a Hub repo, but model is a path; drop revision or write model = \"ORG/NAME\"",
            )),
            (ModelSpec::Repo { repo, explicit: true }, Some(r)) => Err(self.err(
                r.at,
                format!(
                    "the revision is given twice (@{} in the repo, {:?} here); keep one",
                    repo.revision, r.v
                ),
            )),
            (ModelSpec::Repo { repo, .. }, Some(r)) => Ok(ModelSpec::Repo {
                repo: RepoRef {
                    revision: r.v,
                    ..repo
                },
                explicit: true,
            }),
        }
    }

    /// `ORG/NAME[@REVISION]` (`s`, parsed as `r`), its revision checked.
    fn repo(&self, r: RepoRef, s: &str, at: usize) -> Result<ModelSpec, LaunchError> {
        let rev = r.revision.clone();
        Ok(ModelSpec::Repo {
            repo: RepoRef {
                revision: self.revision(&rev, at)?,
                ..r
            },
            explicit: s.contains('@'),
        })
    }

    pub(super) fn revision(&self, s: &str, at: usize) -> Result<String, LaunchError> {
        if s.is_empty() || s.contains(['\0', '\n']) || s.contains("..") {
            return Err(self.err(
                at,
                format!("revision {s:?} is not a branch, tag or commit; write e.g. \"main\" or the 40-hex commit"),
            ));
        }
        Ok(s.to_string())
    }

    fn abs_path(&self, s: &str, at: usize) -> Result<String, LaunchError> {
        if !s.starts_with('/') {
            return Err(self.err(
                at,
                format!(
                    "model path {s:?} is relative; write the absolute path, the same on every node"
                ),
            ));
        }
        if s.contains('\0') || s.split('/').any(|c| c == "..") {
            return Err(self.err(
                at,
                format!("model path {s:?} has a NUL or a \"..\" component; write the plain absolute path"),
            ));
        }
        Ok(s.to_string())
    }

    /// The one absolute path every launch node loads the model from.
    pub(super) fn model_path(
        &self,
        nodes: &[&Node],
        model: At<ModelSpec>,
    ) -> Result<ModelPath, LaunchError> {
        let repo = match model.v {
            ModelSpec::Path(p) => {
                return Ok(ModelPath {
                    path: p,
                    unresolved: None,
                    revision: None,
                    repo: None,
                })
            }
            ModelSpec::Repo { repo, .. } => repo,
        };
        let commit = is_commit_sha(&repo.revision).then(|| repo.revision.clone());
        let leaf = commit.clone().unwrap_or_else(|| COMMIT_PLACEHOLDER.into());
        let path_on = |n: &Node| {
            n.root
                .join(repo.cache_folder())
                .join("snapshots")
                .join(&leaf)
                .display()
                .to_string()
        };
        let first = nodes[0];
        let path = path_on(first);
        if let Some(other) = nodes.iter().find(|n| path_on(n) != path) {
            return Err(self.err(
                model.at,
                format!(
                    "model {} resolves to {} on {} (line {}) but to {} on {} (line {}); the engine loads one absolute path on every node: give these nodes the same root, or make the snapshot reachable at one path everywhere and set model = \"/that/path\"",
                    repo.id,
                    path,
                    first.name,
                    first.line,
                    path_on(other),
                    other.name,
                    other.line
                ),
            ));
        }
        let unresolved = commit.is_none().then(|| {
            format!(
                "{} is at a revision ({}), not a commit: the path holds {COMMIT_PLACEHOLDER}; `xfer-launch check` resolves it from {}/{}/refs/{} on each node (or set revision = \"<40-hex commit>\")",
                repo.id,
                repo.revision,
                first.root.display(),
                repo.cache_folder(),
                repo.revision
            )
        });
        let revision = commit.is_none().then(|| repo.revision.clone());
        Ok(ModelPath {
            path,
            unresolved,
            revision,
            repo: Some(repo),
        })
    }
}
