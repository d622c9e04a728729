//! What an agent lets an authenticated caller do beyond moving models,
//! each off unless its operator switched it on (`xfer serve`):
//! - start processes (a rank's engine, its stop hooks, the preflight's
//!   version probes) only with `--allow-launch`, and with `--allow-exec
//!   PROGRAM` only those programs: the name is checked, then resolved to
//!   an absolute path on the agent's own `PATH` (never the rank's, which
//!   [`xfer_proto::launch_rules`] keeps from setting one), and that path
//!   is what starts;
//! - read a sync job's source folder only under the agent's root or under
//!   a folder named with `--export DIR`;
//! - load images and run ranks in containers only with
//!   `--container-engine docker|podman` (the engine's daemon is root on
//!   the node: the agent builds every engine command itself, with the
//!   engine's program resolved once, when the agent starts).
//!
//! And what a caller's certificate lets it ask ([`operator_only`]): with
//! issued credentials, a node may move models, report and stop the runs
//! it belongs to, and tell the members of a sync job it is the source of
//! that the job ended (`runner::note_ended` checks that); only an operator
//! may sync, remove, prune jobs, launch or read logs.
//!
//! Every refusal is one line naming the node and the switch or the
//! credential that would allow it.

use std::path::{Path, PathBuf};

use crate::config::auth::identity::Peer;
use crate::util::program;

/// Why this agent's permits refuse a caller or a command line: one line
/// naming the node and the switch or credential that would allow it (the
/// text of the refusal sent back).
#[derive(Debug, thiserror::Error)]
pub enum PermitError {
    /// Only an operator may.
    #[error("{node}: only an operator may {what}, and the caller is {peer}; ask with an operator credential (`xfer ca issue {name}-op --role operator`)")]
    NotOperator {
        /// This node.
        node: String,
        /// What the caller asked to do.
        what: String,
        /// The caller, as it shows.
        peer: String,
        /// The caller's name, or `NAME`.
        name: String,
    },
    /// `--allow-launch` is off.
    #[error("{node}: launching is off on this agent (it starts no engine, stop hook or version probe); start it with `xfer serve --allow-launch` (docs/launcher.md#allowing-launches)")]
    LaunchOff {
        /// This node.
        node: String,
    },
    /// No program at all.
    #[error("{node}: an empty command line; fix the launch template")]
    EmptyCommand {
        /// This node.
        node: String,
    },
    /// Not in `--allow-exec`.
    #[error("{node}: `{program}` is not in this agent's --allow-exec list ({listed}); add `--allow-exec {program}` to its `xfer serve`")]
    NotListed {
        /// This node.
        node: String,
        /// The program asked for.
        program: String,
        /// The list, comma-separated.
        listed: String,
    },
    /// Not on the agent's `PATH`.
    #[error("{node}: {source}")]
    NotFound {
        /// This node.
        node: String,
        /// The lookup's error.
        source: program::ResolveError,
    },
    /// Found, but under a path that is not UTF-8.
    #[error("{node}: `{program}` resolves to {}, which is not UTF-8; install it under a UTF-8 path", path.display())]
    NotUtf8 {
        /// This node.
        node: String,
        /// The program asked for.
        program: String,
        /// Where it resolved.
        path: PathBuf,
    },
}

/// `Ok` if `peer` may do `what` on `node`, which only an operator may.
pub fn operator_only(node: &str, peer: &Peer, what: &str) -> Result<(), PermitError> {
    if peer.is_operator() {
        return Ok(());
    }
    Err(PermitError::NotOperator {
        node: node.to_string(),
        what: what.to_string(),
        peer: peer.to_string(),
        name: peer.name().map_or("NAME", |n| n.as_str()).to_string(),
    })
}

/// The operator's switches.
#[derive(Clone, Debug, Default)]
pub struct Permits {
    /// `--allow-launch`.
    pub launch: bool,
    /// `--allow-exec`: the programs (argv[0], as the launcher sends it)
    /// that may be started; empty: any, once launching is on.
    pub exec: Vec<String>,
    /// `--export`: folders (canonical) a sync job may read from, besides
    /// the root.
    pub exports: Vec<PathBuf>,
    /// `--container-engine`, its program resolved when the agent started:
    /// the engine images are loaded into and ranks run in; `None`: no
    /// image is loaded and no rank runs in one.
    pub containers: Option<crate::image::runtime::Runtime>,
}

impl Permits {
    /// The container engine, if the operator named one.
    pub fn engine(&self) -> Option<crate::image::runtime::Runtime> {
        self.containers.clone()
    }
}

impl Permits {
    /// `argv` as it may be started on `node`: its program checked against
    /// `--allow-exec` by the name given, then replaced by its absolute
    /// path on this agent's own `PATH`; or why not.
    pub fn may_run(&self, node: &str, argv: &[String]) -> Result<Vec<String>, PermitError> {
        self.may_name(node, argv)?;
        let path = program::resolve(&argv[0]).map_err(|source| PermitError::NotFound {
            node: node.to_string(),
            source,
        })?;
        let Some(path) = path.to_str() else {
            return Err(PermitError::NotUtf8 {
                node: node.to_string(),
                program: argv[0].clone(),
                path,
            });
        };
        let mut resolved = argv.to_vec();
        resolved[0] = path.to_string();
        Ok(resolved)
    }

    /// Whether a command line naming `argv[0]` may be started on `node`,
    /// by its name alone: for a process inside a container, whose program
    /// is the image's, not this host's. [`Permits::may_run`] for a host's.
    pub fn may_name(&self, node: &str, argv: &[String]) -> Result<(), PermitError> {
        let node = node.to_string();
        if !self.launch {
            return Err(PermitError::LaunchOff { node });
        }
        let Some(program) = argv.first() else {
            return Err(PermitError::EmptyCommand { node });
        };
        if !self.exec.is_empty() && !self.exec.iter().any(|e| e == program) {
            return Err(PermitError::NotListed {
                node,
                program: program.clone(),
                listed: self.exec.join(", "),
            });
        }
        Ok(())
    }

    /// The canonical form of `path`, if a sync job on `node` may read it:
    /// it must lie under `root` or under an export. Text: the sync runner
    /// sends it as a refusal or records it as the job's error.
    pub fn may_read(&self, node: &str, root: &Path, path: &Path) -> Result<PathBuf, String> {
        let real = path.canonicalize().map_err(|e| {
            format!(
                "{}: {e} on {node}; fix the path and run xfer sync again",
                path.display()
            )
        })?;
        let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        if real.starts_with(&root) || self.exports.iter().any(|e| real.starts_with(e)) {
            return Ok(real);
        }
        let exports = if self.exports.is_empty() {
            "none".to_string()
        } else {
            self.exports
                .iter()
                .map(|e| e.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(format!(
            "{} is outside {node}'s root ({}) and its exports ({exports}); start the agent on {node} with `--export {}` to allow syncing from there",
            path.display(),
            root.display(),
            path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn launching_is_off_unless_switched_on_and_then_limited_to_the_list() {
        let off = Permits::default();
        let why = off
            .may_run("n1", &argv(&["sh", "-c", "id"]))
            .unwrap_err()
            .to_string();
        assert!(why.starts_with("n1: launching is off"), "{why}");
        assert!(why.contains("--allow-launch"), "{why}");
        let any = Permits {
            launch: true,
            ..Permits::default()
        };
        assert!(any.may_run("n1", &argv(&["sh"])).is_ok());
        assert!(any.may_run("n1", &[]).is_err());
        let listed = Permits {
            launch: true,
            exec: argv(&["vllm", "sh"]),
            ..Permits::default()
        };
        assert!(listed.may_name("n1", &argv(&["vllm", "serve"])).is_ok());
        let why = listed
            .may_run("n1", &argv(&["id", "-u"]))
            .unwrap_err()
            .to_string();
        assert!(why.contains("--allow-exec id"), "{why}");
        // A path is not the name the operator allowed.
        let why = listed
            .may_name("n1", &argv(&["/tmp/sh"]))
            .unwrap_err()
            .to_string();
        assert!(why.contains("--allow-exec /tmp/sh"), "{why}");
    }

    #[test]
    fn an_allowed_name_starts_as_its_absolute_path_on_the_agents_path() {
        let listed = Permits {
            launch: true,
            exec: argv(&["sh", "no-such-engine-xyz"]),
            ..Permits::default()
        };
        let run = listed.may_run("n1", &argv(&["sh", "-c", "true"])).unwrap();
        assert_eq!(run[0], program::resolve("sh").unwrap().to_str().unwrap());
        assert!(run[0].starts_with('/'), "{run:?}");
        assert_eq!(run[1..], argv(&["-c", "true"]));
        let why = listed
            .may_run("n1", &argv(&["no-such-engine-xyz"]))
            .unwrap_err()
            .to_string();
        assert!(
            why.starts_with("n1: `no-such-engine-xyz` is not on the PATH of the xfer agent"),
            "{why}"
        );
    }

    #[test]
    fn a_sync_source_must_lie_under_the_root_or_an_export() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let shared = t.path().join("shared");
        for d in [&root, &shared, &root.join("m"), &shared.join("m")] {
            std::fs::create_dir_all(d).unwrap();
        }
        let p = Permits::default();
        assert!(p.may_read("n1", &root, &root.join("m")).is_ok());
        let why = p.may_read("n1", &root, Path::new("/etc")).unwrap_err();
        assert!(why.contains("outside n1's root"), "{why}");
        assert!(why.contains("--export /etc"), "{why}");
        // A link inside the root to a folder outside is judged by its target.
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        assert!(p.may_read("n1", &root, &root.join("etc")).is_err());
        let exported = Permits {
            exports: vec![shared.canonicalize().unwrap()],
            ..Permits::default()
        };
        assert!(exported.may_read("n1", &root, &shared.join("m")).is_ok());
        assert!(exported.may_read("n1", &root, Path::new("/etc")).is_err());
    }
}
