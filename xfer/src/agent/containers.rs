//! Ranks in containers (`[launch] image`): the `docker run` form of a
//! rank's processes, which this agent builds itself from the typed
//! [`ContainerSpec`] so that a launcher names no flag, mount or program of
//! the engine's.
//!
//! Each process becomes, in the form NVIDIA's guides use:
//!
//! ```text
//! docker run --rm --init --name xfer-<run>-r<rank>-<i> --label xfer.run=<run>
//!     --network host --ipc host [--gpus all | --device D ...] [--shm-size N]
//!     -v MODEL:MODEL:ro --env KEY ... --entrypoint ARGV0 IMAGE ARGV1...
//! ```
//!
//! `MODEL` is the top folder of the weights under this agent's root (all
//! of an HF cache repo, whose snapshots link into its `blobs/`), the only
//! host path a container sees. Every key of the rank's environment is
//! passed by name, its value taken from the `docker` client's environment
//! (which the supervisor sets), so no value shows in `ps`; the keys that
//! would steer the client itself (`DOCKER_*`, `LD_*`, `PATH`, ...) never
//! get that far ([`xfer_proto::launch_rules`]). `docker` is the absolute
//! path the agent resolved when it started, for the processes and for the
//! stop hook, which removes every container of the rank, on `down` and on
//! any failure, and outlives an agent restart in the rank's record.
//! Devices are GPU and RDMA device nodes or CDI names only.
//!
//! Under podman, each container also gets `--ulimit nofile=S:H --ulimit
//! nproc=S:H` at the agent's own limits: podman's defaults (nofile
//! 1048576, nproc 4194304) exceed the hard limits of many hosts (a
//! container, a tightened `limits.conf`), and its OCI runtime then fails
//! with "error setting rlimit type 7: operation not permitted" unless
//! `containers.conf` lowers them (the processes' limit is also capped at
//! the kernel's `pid_max`, above which one kernel refused it).

use std::path::{Component, Path, PathBuf};

use crate::image::runtime::{Runtime, RUN_LABEL};
use xfer_proto::image::ContainerRuntime;
use xfer_proto::launch::{ContainerSpec, GpuAccess, ProcSpec, RankSpec};
use xfer_proto::launch_rules;

/// The container name of process `i` of a rank.
pub fn container_name(run: &str, rank: u32, i: usize) -> String {
    format!("xfer-{run}-r{rank}-{i}")
}

/// Why a rank cannot run in its container: one line naming the node and
/// the fix (the launch service sends it back as the refusal).
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// The image reference is malformed.
    #[error("{node}: {source}")]
    Reference {
        /// This node.
        node: String,
        /// Why.
        source: xfer_proto::image::BadReference,
    },
    /// An environment key a container cannot carry.
    #[error("{node}: `{}` is not an environment variable name; fix [launch.env]", key.escape_default())]
    EnvName {
        /// This node.
        node: String,
        /// The key.
        key: String,
    },
    /// The weights cannot be mounted.
    #[error("{node}: {source}")]
    Mount {
        /// This node.
        node: String,
        /// Why.
        source: MountError,
    },
    /// A process with no program.
    #[error("{node}: an empty command line; fix the launch template")]
    EmptyCommand {
        /// This node.
        node: String,
    },
    /// A device outside the launch rules.
    #[error("{node}: {source}")]
    Device {
        /// This node.
        node: String,
        /// Why.
        source: launch_rules::Refused,
    },
}

/// Why the weights' folder is not mounted into a container.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The weights lie outside the root.
    #[error("the weights {} are outside the agent's root {}; only a model under the root is mounted into a container", path.display(), root.display())]
    OutsideRoot {
        /// The weights.
        path: PathBuf,
        /// The agent's root.
        root: PathBuf,
    },
    /// The folder's path is not UTF-8.
    #[error("{} is not UTF-8", .0.display())]
    NotUtf8(PathBuf),
    /// The folder's path holds a separator of `-v`.
    #[error("{0} holds ':' or ',', which a container mount cannot name; rename the model")]
    Separator(String),
    /// The path names no model folder under the root.
    #[error("the weights {} do not name a model under the agent's root {}", path.display(), root.display())]
    NotAModel {
        /// The weights.
        path: PathBuf,
        /// The agent's root.
        root: PathBuf,
    },
}

/// The spec with every process run inside `c.image`, and the stop hooks
/// replaced by the removal of those containers (`ray stop` and the like
/// act inside a container that removal ends anyway).
pub fn wrap(
    mut spec: RankSpec,
    c: &ContainerSpec,
    engine: Runtime,
    root: &Path,
) -> Result<RankSpec, ContainerError> {
    let node = spec.node.to_string();
    xfer_proto::image::check_reference(&c.image).map_err(|source| ContainerError::Reference {
        node: node.clone(),
        source,
    })?;
    for key in spec.env.keys() {
        let ok = key
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
        if !ok || key.is_empty() {
            return Err(ContainerError::EnvName {
                node,
                key: key.clone(),
            });
        }
    }
    let mount = match &spec.weights {
        None => None,
        Some(gate) => Some(model_folder(root, Path::new(&gate.path)).map_err(|source| {
            ContainerError::Mount {
                node: node.clone(),
                source,
            }
        })?),
    };
    let program = engine.bin();
    let mut names = Vec::new();
    let procs = std::mem::take(&mut spec.procs);
    for (i, p) in procs.into_iter().enumerate() {
        let Some((argv0, rest)) = p.argv.split_first() else {
            return Err(ContainerError::EmptyCommand { node });
        };
        let name = container_name(&spec.run, spec.rank, i);
        let mut argv: Vec<String> = vec![
            program.clone(),
            "run".into(),
            "--rm".into(),
            "--init".into(),
            "--name".into(),
            name.clone(),
            "--label".into(),
            format!("{RUN_LABEL}={}", spec.run),
            "--network".into(),
            "host".into(),
            "--ipc".into(),
            "host".into(),
        ];
        if engine.kind == ContainerRuntime::Podman {
            argv.extend(podman_ulimits());
        }
        match &c.gpus {
            GpuAccess::None => {}
            GpuAccess::All => argv.extend(["--gpus".into(), "all".into()]),
            GpuAccess::Devices(ds) => {
                for d in ds {
                    launch_rules::check_device(d).map_err(|source| ContainerError::Device {
                        node: node.clone(),
                        source,
                    })?;
                    argv.extend(["--device".into(), d.clone()]);
                }
            }
        }
        if let Some(shm) = c.shm_bytes {
            argv.extend(["--shm-size".into(), format!("{shm}b")]);
        }
        if let Some(dir) = &mount {
            argv.extend(["-v".into(), format!("{dir}:{dir}:ro")]);
        }
        for key in spec.env.keys() {
            argv.extend(["--env".into(), key.clone()]);
        }
        argv.extend(["--entrypoint".into(), argv0.clone(), c.image.clone()]);
        argv.extend(rest.iter().cloned());
        names.push(name);
        spec.procs.push(ProcSpec {
            argv,
            wait_tcp: p.wait_tcp,
        });
    }
    let mut rm = vec![program, "rm".into(), "-f".into()];
    rm.extend(names);
    spec.on_stop = vec![rm];
    Ok(spec)
}

/// `--ulimit` for the open files and processes at this agent's own soft
/// and hard limits, which a process it starts may have (`-1`: unlimited).
/// The processes' limit is capped at the kernel's `pid_max`: a kernel here
/// refused a higher one for the container's first process ("error setting
/// rlimit type 6"), although the agent itself held it.
pub fn podman_ulimits() -> Vec<String> {
    let pid_max: Option<u64> = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let limit = |name: &str, resource, cap: Option<u64>| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(resource, &mut r) } != 0 {
            return None;
        }
        let v = |x: libc::rlim_t| match (x, cap) {
            (libc::RLIM_INFINITY, None) => "-1".to_string(),
            (x, Some(c)) if x == libc::RLIM_INFINITY || x > c => c.to_string(),
            (x, _) => x.to_string(),
        };
        Some(format!("{name}={}:{}", v(r.rlim_cur), v(r.rlim_max)))
    };
    [
        limit("nofile", libc::RLIMIT_NOFILE, None),
        limit("nproc", libc::RLIMIT_NPROC, pid_max),
    ]
    .into_iter()
    .flatten()
    .flat_map(|l| ["--ulimit".to_string(), l])
    .collect()
}

/// The folder to mount for weights at `path`: its first component under
/// `root`, refused when the path leaves the root.
fn model_folder(root: &Path, path: &Path) -> Result<String, MountError> {
    let rel = path
        .strip_prefix(root)
        .map_err(|_| MountError::OutsideRoot {
            path: path.to_path_buf(),
            root: root.to_path_buf(),
        })?;
    match rel.components().next() {
        Some(Component::Normal(top)) if !rel.components().any(|c| c == Component::ParentDir) => {
            let dir = root.join(top);
            let s = dir
                .to_str()
                .ok_or_else(|| MountError::NotUtf8(dir.clone()))?;
            if s.contains(':') || s.contains(',') {
                return Err(MountError::Separator(s.to_string()));
            }
            Ok(s.to_string())
        }
        _ => Err(MountError::NotAModel {
            path: path.to_path_buf(),
            root: root.to_path_buf(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::image::{ContainerRuntime, Digest};
    use xfer_proto::launch::WeightGate;
    use xfer_proto::names::NodeName;

    fn spec() -> RankSpec {
        RankSpec {
            run: "r1".into(),
            node: NodeName::new("n1").unwrap(),
            rank: 1,
            env: [("VLLM_HOST_IP".to_string(), "10.0.0.2".to_string())].into(),
            procs: vec![ProcSpec {
                argv: vec!["vllm".into(), "serve".into(), "/root/m/snapshots/c".into()],
                wait_tcp: None,
            }],
            on_stop: vec![vec!["ray".into(), "stop".into()]],
            group: vec![],
            wait_timeout_ms: 1,
            grace_ms: 1,
            weights: Some(WeightGate {
                path: "/root/m/snapshots/c".into(),
                root: xfer_proto::hash::Hash([1; 32]),
            }),
            evict_page_cache: false,
            container: None,
            caches: None,
            held: false,
            rendezvous: None,
        }
    }

    fn container() -> ContainerSpec {
        ContainerSpec {
            image: "xt/app:1".into(),
            image_id: Some(Digest([2; 32])),
            gpus: GpuAccess::All,
            shm_bytes: Some(1 << 30),
        }
    }

    /// The engine as an agent has it: resolved to an absolute path.
    fn engine() -> Runtime {
        Runtime::new(ContainerRuntime::Docker).with_bin("/opt/bin/docker".into())
    }

    #[test]
    fn a_rank_runs_in_the_image_as_nvidia_guides_run_it() {
        let engine = engine();
        let docker = engine.bin();
        assert_eq!(docker, "/opt/bin/docker");
        let s = wrap(spec(), &container(), engine, Path::new("/root")).unwrap();
        let argv = s.procs[0].argv.join(" ");
        assert_eq!(
            argv,
            format!("{docker} run --rm --init --name xfer-r1-r1-0 --label xfer.run=r1 --network host --ipc host \
             --gpus all --shm-size 1073741824b -v /root/m:/root/m:ro --env VLLM_HOST_IP \
             --entrypoint vllm xt/app:1 serve /root/m/snapshots/c")
        );
        assert_eq!(s.on_stop, vec![vec![&*docker, "rm", "-f", "xfer-r1-r1-0"]]);
        assert_eq!(
            s.env,
            spec().env,
            "values reach docker through its environment"
        );
    }

    #[test]
    fn under_podman_a_container_gets_the_agents_own_limits() {
        let podman = Runtime::new(ContainerRuntime::Podman).with_bin("/usr/bin/podman".into());
        let s = wrap(spec(), &container(), podman, Path::new("/root")).unwrap();
        let argv = &s.procs[0].argv;
        let ulimits: Vec<&str> = argv
            .windows(2)
            .filter(|w| w[0] == "--ulimit")
            .map(|w| w[1].as_str())
            .collect();
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        let nofile = format!(
            "nofile={}:{}",
            r.rlim_cur,
            if r.rlim_max == libc::RLIM_INFINITY {
                "-1".to_string()
            } else {
                r.rlim_max.to_string()
            }
        );
        assert_eq!(ulimits.len(), 2, "{argv:?}");
        assert_eq!(ulimits[0], nofile, "{argv:?}");
        assert!(ulimits[1].starts_with("nproc="), "{argv:?}");
        // Docker's defaults are the daemon's: nothing added.
        let s = wrap(spec(), &container(), engine(), Path::new("/root")).unwrap();
        assert!(!s.procs[0].argv.iter().any(|a| a == "--ulimit"));
    }

    #[test]
    fn nothing_outside_the_root_is_mounted_and_no_flag_is_smuggled() {
        let engine = &Runtime::new(ContainerRuntime::Docker);
        let mut outside = spec();
        outside.weights.as_mut().unwrap().path = "/etc".into();
        let e = wrap(outside, &container(), engine.clone(), Path::new("/root"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the agent's root"), "{e}");
        let mut up = spec();
        up.weights.as_mut().unwrap().path = "/root/../etc".into();
        assert!(wrap(up, &container(), engine.clone(), Path::new("/root")).is_err());
        let flag = ContainerSpec {
            image: "--privileged".into(),
            ..container()
        };
        assert!(wrap(spec(), &flag, engine.clone(), Path::new("/root")).is_err());
        let dev = ContainerSpec {
            gpus: GpuAccess::Devices(vec!["--privileged".into()]),
            ..container()
        };
        assert!(wrap(spec(), &dev, engine.clone(), Path::new("/root")).is_err());
        for raw in [
            "/dev/mem",
            "/dev/sda:/dev/sda:rwm",
            "/dev/kmsg",
            "/dev/nvidia0:/dev/mem",
        ] {
            let dev = ContainerSpec {
                gpus: GpuAccess::Devices(vec!["/dev/nvidia0".into(), raw.into()]),
                ..container()
            };
            let e = wrap(spec(), &dev, engine.clone(), Path::new("/root"))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("n1: gpus lists {raw:?}, which ")),
                "{e}"
            );
        }
        let mut env = spec();
        env.env.insert("A=B".into(), "x".into());
        assert!(wrap(env, &container(), engine.clone(), Path::new("/root")).is_err());
    }
}
