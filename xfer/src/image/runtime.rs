//! The container runtime's command line (`docker`, or `podman`, which takes
//! the same verbs): the only code that runs it. (The "engine" elsewhere is
//! the scheduler, `crate::engine`, or a launch's inference server.) It asks
//! the runtime's version, its OCI runtimes (nvidia) and an image's id,
//! starts `save` and `load`, and removes a run's containers; and it turns
//! the runtime's own error text into one line naming the cause and the fix
//! ([`Runtime::explain`]).
//!
//! The runtime is whichever daemon the environment selects (`DOCKER_HOST`,
//! `CONTAINER_HOST`), so that every node's agent talks to its own. An
//! agent resolves the runtime's program once, when it starts, on its own
//! `PATH` ([`Runtime::resolved`]), and runs that path from then on: a
//! rank's environment, which its containers' client runs with, can then
//! choose neither the program nor (see [`xfer_proto::launch_rules`]) the
//! daemon. The wire and the command line still call it the container
//! engine (`--container-engine`, the reports' `engine` fields).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use xfer_proto::image::{ContainerRuntime, Digest};
use xfer_proto::launch::{ContainerFacts, Probe};

use crate::util::program::{self, ResolveError};

/// How long a quick query (`version`, `inspect`, `info`) may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(20);

/// The label every container of a launch carries: its run id.
pub const RUN_LABEL: &str = "xfer.run";

/// Why a query of the container runtime failed; each says the cause and
/// the fix in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// It did not answer within the query timeout.
    #[error("{0}")]
    Hung(String),
    /// Its program could not be started ([`Runtime::spawn_error`]).
    #[error("{0}")]
    NotStarted(String),
    /// It ran and failed: its error text explained ([`Runtime::explain`]).
    #[error("{0}")]
    Failed(String),
    /// It answered what could not be read.
    #[error("{0}")]
    Unreadable(String),
}

/// One container runtime's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// Docker or podman.
    pub kind: ContainerRuntime,
    /// The program run: its name, looked up on `PATH` at each start (the
    /// operator's own `xfer image push`), or an agent's absolute path.
    bin: PathBuf,
}

impl Runtime {
    /// The engine, its program looked up on `PATH` whenever it runs.
    pub fn new(kind: ContainerRuntime) -> Runtime {
        Runtime {
            kind,
            bin: PathBuf::from(kind.program()),
        }
    }

    /// The engine, its program resolved now on this process's own `PATH`
    /// (an agent, at start).
    pub fn resolved(kind: ContainerRuntime) -> Result<Runtime, ResolveError> {
        Ok(Runtime {
            kind,
            bin: program::resolve(kind.program())?,
        })
    }

    /// The engine run from `bin` (tests).
    #[cfg(test)]
    pub fn with_bin(self, bin: PathBuf) -> Runtime {
        Runtime { bin, ..self }
    }

    /// Its name, for messages.
    pub fn program(&self) -> &'static str {
        self.kind.program()
    }

    /// The program run, as a command line's first word.
    pub fn bin(&self) -> String {
        self.bin.to_string_lossy().into_owned()
    }

    /// A blocking command of the engine (for streams driven by a thread).
    pub fn std_command(&self) -> std::process::Command {
        let mut c = std::process::Command::new(&self.bin);
        c.stdin(Stdio::null());
        c
    }

    fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.bin);
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// Runs `args` and returns its stdout, or the explained failure.
    async fn query(&self, args: &[&str]) -> Result<String, RuntimeError> {
        let out = tokio::time::timeout(QUERY_TIMEOUT, self.command().args(args).output()).await;
        let out = match out {
            Err(_) => {
                return Err(RuntimeError::Hung(format!(
                    "`{} {}` took over {}s; check the engine (is its daemon hung?)",
                    self.program(),
                    args.join(" "),
                    QUERY_TIMEOUT.as_secs()
                )))
            }
            Ok(Err(e)) => return Err(RuntimeError::NotStarted(self.spawn_error(&e))),
            Ok(Ok(out)) => out,
        };
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(RuntimeError::Failed(
                self.explain(&String::from_utf8_lossy(&out.stderr)),
            ))
        }
    }

    /// Why the engine could not even start.
    pub fn spawn_error(&self, e: &std::io::Error) -> String {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "`{}` is not on this node's PATH; install it, or start the agent with the engine it has (`--container-engine docker|podman`)",
                self.program()
            )
        } else {
            format!("cannot run `{}`: {e}", self.program())
        }
    }

    /// The engine's error text as one line with its fix.
    pub fn explain(&self, stderr: &str) -> String {
        let text = stderr.trim();
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let lower = text.to_ascii_lowercase();
        if lower.contains("no space left on device") {
            format!(
                "the {} engine's disk is full (no space left on device); free space in its data root (`{} info` shows it), then run `xfer image push` again",
                self.program(),
                self.program()
            )
        } else if lower.contains("cannot connect to the docker daemon")
            || lower.contains("is the docker daemon running")
            || lower.contains("cannot connect to podman")
        {
            let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "the default socket".into());
            format!(
                "the {} daemon is not reachable at {host}; start it (`systemctl start {}`), or set DOCKER_HOST for the agent",
                self.program(),
                self.program()
            )
        } else if lower.contains("permission denied") && lower.contains("sock") {
            format!(
                "no permission to use the {} daemon's socket; run the agent as a user in the `docker` group, or as root",
                self.program()
            )
        } else if last.is_empty() {
            format!("`{}` failed without saying why", self.program())
        } else {
            format!("{}: {last}", self.program())
        }
    }

    /// The engine's server version.
    pub async fn version(&self) -> Result<String, RuntimeError> {
        let format = match self.kind {
            ContainerRuntime::Docker => "{{.Server.Version}}",
            // Podman has no server; its client is the engine.
            ContainerRuntime::Podman => "{{.Client.Version}}",
        };
        self.query(&["version", "--format", format]).await
    }

    /// Whether the NVIDIA container runtime is configured.
    pub async fn nvidia_runtime(&self) -> Probe<String> {
        match self.kind {
            ContainerRuntime::Podman => Probe::Skipped(
                "podman passes GPUs by CDI (`nvidia-ctk cdi generate`), not by a runtime".into(),
            ),
            ContainerRuntime::Docker => {
                match self
                    .query(&["info", "--format", "{{json .Runtimes}}"])
                    .await
                {
                    Err(e) => Probe::Failed(e.to_string()),
                    Ok(json) => {
                        let names: Vec<String> = serde_json::from_str::<
                            serde_json::Map<String, serde_json::Value>,
                        >(&json)
                        .map(|m| m.keys().cloned().collect())
                        .unwrap_or_default();
                        match names.iter().find(|n| n.contains("nvidia")) {
                            Some(n) => Probe::Ok(n.clone()),
                            None => Probe::Failed(format!(
                                "no nvidia runtime (runtimes: {}); install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker`",
                                names.join(", ")
                            )),
                        }
                    }
                }
            }
        }
    }

    /// The id of `reference` in this engine; `None` when it does not hold it.
    pub async fn image_id(&self, reference: &str) -> Result<Option<Digest>, RuntimeError> {
        let out = tokio::time::timeout(
            QUERY_TIMEOUT,
            self.command()
                .args(["image", "inspect", "--format", "{{.Id}}", "--", reference])
                .output(),
        )
        .await
        .map_err(|_| {
            RuntimeError::Hung(format!(
                "`{} image inspect` hung; check the engine",
                self.program()
            ))
        })?
        .map_err(|e| RuntimeError::NotStarted(self.spawn_error(&e)))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let lower = stderr.to_ascii_lowercase();
            if lower.contains("no such image") || lower.contains("image not known") {
                return Ok(None);
            }
            return Err(RuntimeError::Failed(self.explain(&stderr)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Digest::parse(text.trim()).map(Some).map_err(|e| {
            RuntimeError::Unreadable(format!(
                "`{} image inspect {reference}`: {e}",
                self.program()
            ))
        })
    }

    /// The chain ids of every layer stack this engine holds (see
    /// [`super::chain_ids`]), read off every image's `RootFS.Layers`.
    /// Podman's `load` wants every layer in the stream, so for podman this
    /// is always empty.
    pub async fn held_chains(&self) -> Result<BTreeSet<Digest>, RuntimeError> {
        let mut held = BTreeSet::new();
        if self.kind != ContainerRuntime::Docker {
            return Ok(held);
        }
        let ids = self.query(&["image", "ls", "-aq", "--no-trunc"]).await?;
        let ids: BTreeSet<&str> = ids.split_whitespace().collect();
        if ids.is_empty() {
            return Ok(held);
        }
        let mut args = vec!["image", "inspect", "--format", "{{json .RootFS.Layers}}"];
        args.extend(ids);
        for line in self.query(&args).await?.lines() {
            let layers: Vec<Digest> = serde_json::from_str(line).map_err(|e| {
                RuntimeError::Unreadable(format!(
                    "`{} image inspect` printed `{line}`: {e}",
                    self.program()
                ))
            })?;
            held.extend(super::chain_ids(&layers));
        }
        Ok(held)
    }

    /// The layers (diff ids, bottom first) of `reference` in this engine.
    pub async fn layers(&self, reference: &str) -> Result<Vec<Digest>, RuntimeError> {
        let out = self
            .query(&[
                "image",
                "inspect",
                "--format",
                "{{json .RootFS.Layers}}",
                "--",
                reference,
            ])
            .await?;
        serde_json::from_str(&out).map_err(|e| {
            RuntimeError::Unreadable(format!(
                "`{} image inspect {reference}` printed `{out}`: {e}",
                self.program()
            ))
        })
    }

    /// The preflight's view of this engine.
    pub async fn facts(&self, image: Option<&str>) -> Probe<ContainerFacts> {
        let version = match self.version().await {
            Ok(v) => v,
            Err(e) => return Probe::Failed(e.to_string()),
        };
        let nvidia_runtime = self.nvidia_runtime().await;
        let image = match image {
            None => None,
            Some(r) => Some(match self.image_id(r).await {
                Ok(Some(id)) => Probe::Ok(id),
                Ok(None) => Probe::Failed(format!("image {r} is not loaded in {}", self.program())),
                Err(e) => Probe::Failed(e.to_string()),
            }),
        };
        Probe::Ok(ContainerFacts {
            engine: self.kind,
            version,
            nvidia_runtime,
            image,
        })
    }

    /// Removes every container of run `run` (running or not); returns how
    /// many there were.
    pub async fn remove_run(&self, run: &str) -> Result<usize, RuntimeError> {
        let filter = format!("label={RUN_LABEL}={run}");
        let ids = self.query(&["ps", "-aq", "--filter", &filter]).await?;
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let mut args = vec!["rm", "-f"];
        args.extend(&ids);
        self.query(&args).await?;
        Ok(ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_name_the_cause_and_the_fix() {
        let e = Runtime::new(ContainerRuntime::Docker);
        let full = e
            .explain("Error processing tar file(exit status 1): write /x: no space left on device");
        assert!(
            full.contains("disk is full") && full.contains("xfer image push"),
            "{full}"
        );
        let down = e.explain(
            "Cannot connect to the Docker daemon at unix:///x.sock. Is the docker daemon running?",
        );
        assert!(
            down.contains("not reachable") && down.contains("start it"),
            "{down}"
        );
        let other = e.explain("Error response from daemon: something odd\n");
        assert_eq!(other, "docker: Error response from daemon: something odd");
        let missing = e.spawn_error(&std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(missing.contains("not on this node's PATH"), "{missing}");
    }
}
