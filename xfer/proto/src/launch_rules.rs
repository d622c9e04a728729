//! What a rank's spec may carry onto a node besides its command line: the
//! `[launch.env]` keys and the container devices (`[launch] gpus`). The
//! launcher checks them where it reads the cluster file (so the operator
//! gets the line), and every agent checks them again when a rank arrives:
//! the agent's check is the boundary, since an agent trusts no launcher.
//!
//! `xfer serve --allow-exec` names the programs a rank may start; these
//! rules keep the environment and the devices from going around it.
//!
//! Refused environment keys ([`check_env`]), each because it changes which
//! code a process loads rather than how the engine behaves, so a file a
//! node credential pushed into a model folder would run under an allowed
//! program's name:
//! - `PATH`: which program a name runs (the engine's own children, its
//!   compilers, the container client's plugins);
//! - `LD_*` (`LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT`, ...) and
//!   `GCONV_PATH`: which libraries the dynamic loader maps in;
//! - `PYTHONPATH`, `PYTHONHOME`, `PYTHONUSERBASE`, and `HOME` (the user
//!   site-packages and the dotfiles shells and clients read): which Python
//!   modules load at start (a `sitecustomize.py` runs before the engine);
//!   engines load plugins as installed packages, so none needs them; an
//!   operator who does sets them for `xfer serve` itself, which every rank
//!   inherits;
//! - `BASH_ENV`, `ENV`, `NODE_OPTIONS`, `PERL5LIB`, `PERL5OPT`, `RUBYLIB`,
//!   `RUBYOPT`: start-up code of shells and other interpreters a wrapper
//!   script may be;
//! - `DOCKER_*`, `CONTAINER_HOST`, `CONTAINERS_*`, `XDG_CONFIG_HOME`,
//!   `XDG_RUNTIME_DIR`, `XDG_DATA_HOME`: which daemon and configuration
//!   the container client uses (it runs with the rank's keys, which it
//!   passes into the container by name).
//!
//! Everything else (`NCCL_*`, `VLLM_*`, `CUDA_*`, `HF_*`, ...) passes, but
//! an `NCCL_*_PLUGIN` may name a plugin only by name, never by a path.
//!
//! Devices ([`check_device`]) are GPU and RDMA device nodes by their host
//! path alone (`/dev/nvidia*`, `/dev/nvidia-caps/*`, `/dev/dri/*`,
//! `/dev/kfd`, `/dev/infiniband/*`), or CDI names (`vendor/class=name`,
//! like `nvidia.com/gpu=0`); never another host path (`/dev/mem`), nor
//! docker's `HOST:CONTAINER:PERMISSIONS` form.

use crate::launch::{GpuAccess, RankSpec};

/// Environment keys refused by their exact name.
const REFUSED_KEYS: &[&str] = &[
    "PATH",
    "HOME",
    "GCONV_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "BASH_ENV",
    "ENV",
    "NODE_OPTIONS",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYLIB",
    "RUBYOPT",
    "CONTAINER_HOST",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
    "XDG_DATA_HOME",
];

/// Environment keys refused by their prefix.
const REFUSED_PREFIXES: &[&str] = &["LD_", "DOCKER_", "CONTAINERS_"];

/// Device-node folders whose entries (one level, by name) may be passed.
const DEVICE_FOLDERS: &[&str] = &["/dev/nvidia-caps/", "/dev/dri/", "/dev/infiniband/"];

/// Why a rank's environment or devices were refused; each is one line
/// with its fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A key the agent sets itself.
    #[error("[launch.env] sets {0}, which the agent sets itself (the file that releases a held rank); drop it")]
    AgentKey(String),
    /// A held rank in a container, which could not see its release file.
    #[error("a held rank cannot run in a container (its release file is on the host); start it without `held`")]
    HeldContainer,
    /// A key that changes which code a process loads.
    #[error("[launch.env] sets {name}, which {why}, around the agent's --allow-exec; drop it, or set it in the environment of `xfer serve` on each node (every rank inherits that)")]
    EnvKey {
        /// The key.
        name: String,
        /// What it changes.
        why: &'static str,
    },
    /// A key whose value may not be a path.
    #[error("[launch.env] sets {name} to the path {value:?}, which would load a plugin from a file of the caller's choosing; name the plugin (NCCL finds it on the agent's library path), or drop it")]
    PluginPath {
        /// The key.
        name: String,
        /// The path it was set to.
        value: String,
    },
    /// A device outside the GPU and RDMA device nodes and CDI names.
    #[error("gpus lists {device:?}, {why}; list GPU or RDMA device nodes (/dev/nvidia*, /dev/nvidia-caps/*, /dev/dri/*, /dev/kfd, /dev/infiniband/*) by path alone, or CDI names (vendor/class=name), like \"/dev/nvidia0\" or \"nvidia.com/gpu=0\"")]
    Device {
        /// The device as listed.
        device: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Why `name` changes what a process loads, if it does.
fn loader_key(name: &str) -> Option<&'static str> {
    let why = match name {
        "PATH" => "chooses the program a name runs",
        "HOME" => "moves the user site-packages and the dotfiles shells and the container client read",
        "GCONV_PATH" => "makes the C library load modules from a folder of the caller's choosing",
        "PYTHONPATH" | "PYTHONHOME" | "PYTHONUSERBASE" => {
            "makes Python import modules (a sitecustomize.py runs first) from a folder of the caller's choosing"
        }
        "BASH_ENV" | "ENV" | "NODE_OPTIONS" | "PERL5LIB" | "PERL5OPT" | "RUBYLIB" | "RUBYOPT" => {
            "makes an interpreter run start-up code of the caller's choosing"
        }
        "CONTAINER_HOST" | "XDG_CONFIG_HOME" | "XDG_RUNTIME_DIR" | "XDG_DATA_HOME" => {
            "chooses the container client's daemon or configuration"
        }
        _ if name.starts_with("LD_") => "makes the dynamic loader map libraries of the caller's choosing",
        _ if name.starts_with("DOCKER_") || name.starts_with("CONTAINERS_") => {
            "chooses the container client's daemon or configuration"
        }
        _ => return None,
    };
    debug_assert!(
        REFUSED_KEYS.contains(&name) || REFUSED_PREFIXES.iter().any(|p| name.starts_with(p))
    );
    Some(why)
}

/// The variable naming a held rank's release file
/// ([`RankSpec::held`]): the agent's own.
pub const HOLD_FILE_KEY: &str = "XFER_HOLD_FILE";

/// The variables of a held rank's rendezvous ([`RankSpec::rendezvous`]):
/// what to meet, and the file the outcome goes to. The agent's own.
pub const RENDEZVOUS_KEY: &str = "XFER_RENDEZVOUS";
/// See [`RENDEZVOUS_KEY`].
pub const RENDEZVOUS_FILE_KEY: &str = "XFER_RENDEZVOUS_FILE";

/// `Ok` if a rank may set `name` to `value`.
pub fn check_env(name: &str, value: &str) -> Result<(), Refused> {
    if [
        HOLD_FILE_KEY,
        RENDEZVOUS_KEY,
        RENDEZVOUS_FILE_KEY,
        crate::local::SOCKET_KEY,
    ]
    .contains(&name)
    {
        return Err(Refused::AgentKey(name.to_string()));
    }
    if let Some(why) = loader_key(name) {
        return Err(Refused::EnvKey {
            name: name.to_string(),
            why,
        });
    }
    if name.starts_with("NCCL_") && name.ends_with("_PLUGIN") && value.contains('/') {
        return Err(Refused::PluginPath {
            name: name.to_string(),
            value: value.to_string(),
        });
    }
    Ok(())
}

/// Whether `s` is a non-empty run of `[A-Za-z0-9_-]` (no dot: no `..`).
fn device_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `d` is a CDI device name: `vendor/class=name`, the vendor a
/// domain (`nvidia.com`), the name an index, a UUID, `all` or a MIG
/// `0:1`.
fn cdi_name(d: &str) -> bool {
    let Some((kind, name)) = d.split_once('=') else {
        return false;
    };
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    let word = |s: &str, extra: &[u8]| {
        s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
    };
    word(vendor, b".-") && word(class, b"_.-") && word(name, b"_.-:")
}

/// `Ok` if a container of a rank may be given device `d`.
pub fn check_device(d: &str) -> Result<(), Refused> {
    let refuse = |why| {
        Err(Refused::Device {
            device: d.to_string(),
            why,
        })
    };
    if !d.starts_with('/') {
        return if cdi_name(d) {
            Ok(())
        } else {
            refuse("which is neither a device path nor a CDI name")
        };
    }
    if d.contains(':') {
        return refuse("which adds a container path or permissions to the host path");
    }
    let gpu = d == "/dev/kfd"
        || d == "/dev/nvidiactl"
        || d.strip_prefix("/dev/nvidia").is_some_and(device_name)
        || DEVICE_FOLDERS
            .iter()
            .any(|f| d.strip_prefix(f).is_some_and(device_name));
    if gpu {
        Ok(())
    } else {
        refuse("which is not a GPU or RDMA device node")
    }
}

/// `Ok` if every key of `spec`'s environment and every device of its
/// container passes ([`check_env`], [`check_device`]).
pub fn check_spec(spec: &RankSpec) -> Result<(), Refused> {
    if spec.held && spec.container.is_some() {
        return Err(Refused::HeldContainer);
    }
    for (k, v) in &spec.env {
        check_env(k, v)?;
    }
    if let Some(GpuAccess::Devices(ds)) = spec.container.as_ref().map(|c| &c.gpus) {
        for d in ds {
            check_device(d)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_change_the_code_a_process_loads_are_refused() {
        for k in [
            "PATH",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "DOCKER_HOST",
            "DOCKER_CONFIG",
            "CONTAINER_HOST",
            "CONTAINERS_CONF",
            "PYTHONPATH",
            "PYTHONHOME",
            "HOME",
            "BASH_ENV",
            "GCONV_PATH",
            "XDG_CONFIG_HOME",
        ] {
            let e = check_env(k, "/root/m/tools").unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("[launch.env] sets {k}, which ")),
                "{msg}"
            );
            assert!(
                msg.contains("--allow-exec") && msg.contains("xfer serve"),
                "{msg}"
            );
            assert_eq!(msg.lines().count(), 1);
        }
        for k in [
            "NCCL_DEBUG",
            "VLLM_USE_V1",
            "CUDA_VISIBLE_DEVICES",
            "HF_TOKEN",
            "XDG_CACHE_HOME",
            "OMP_NUM_THREADS",
            "PYTHONUNBUFFERED",
            "LDX",
            "MY_PATH",
        ] {
            assert_eq!(check_env(k, "1"), Ok(()), "{k}");
        }
        assert_eq!(check_env("NCCL_NET_PLUGIN", "aws-ofi"), Ok(()));
        let e = check_env("NCCL_NET_PLUGIN", "/root/m/libnccl-net.so").unwrap_err();
        assert!(e.to_string().contains("name the plugin"), "{e}");
    }

    #[test]
    fn devices_are_gpu_and_rdma_nodes_or_cdi_names_only() {
        for ok in [
            "/dev/nvidia0",
            "/dev/nvidia12",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia-caps/nvidia-cap1",
            "/dev/dri/renderD128",
            "/dev/dri/card0",
            "/dev/kfd",
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/rdma_cm",
            "nvidia.com/gpu=0",
            "nvidia.com/gpu=all",
            "nvidia.com/gpu=0:1",
            "nvidia.com/gpu=GPU-8f6e1c2a-1b2c-3d4e-5f60-718293a4b5c6",
            "amd.com/gpu=0",
        ] {
            assert_eq!(check_device(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("/dev/mem", "not a GPU or RDMA device node"),
            ("/dev/kmsg", "not a GPU or RDMA device node"),
            ("/dev/sda", "not a GPU or RDMA device node"),
            (
                "/dev/sda:/dev/sda:rwm",
                "adds a container path or permissions",
            ),
            (
                "/dev/nvidia0:/dev/nvidia0:rwm",
                "adds a container path or permissions",
            ),
            (
                "/dev/nvidia0:/dev/mem",
                "adds a container path or permissions",
            ),
            ("/dev/nvidia/../mem", "not a GPU or RDMA device node"),
            ("/dev/dri/../mem", "not a GPU or RDMA device node"),
            ("/dev/dri/by-path/x", "not a GPU or RDMA device node"),
            ("/dev/nvidia", "not a GPU or RDMA device node"),
            ("/dev/dri/", "not a GPU or RDMA device node"),
            ("/etc/shadow", "not a GPU or RDMA device node"),
            ("--privileged", "neither a device path nor a CDI name"),
            ("dev/mem", "neither a device path nor a CDI name"),
            ("nvidia.com/gpu", "neither a device path nor a CDI name"),
            (
                "nvidia.com/gpu=/dev/mem",
                "neither a device path nor a CDI name",
            ),
            ("", "neither a device path nor a CDI name"),
        ] {
            let msg = check_device(bad).unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("gpus lists {bad:?}, which ")),
                "{msg}"
            );
            assert!(msg.contains(why), "{bad}: {msg}");
            assert!(msg.contains("nvidia.com/gpu=0"), "{msg}");
        }
    }
}
