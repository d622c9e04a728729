//! The launch unit: one identity for what `up` starts on a node. The
//! weights' root, the image id, and the versions that must match across
//! nodes (the engine, torch, NCCL, the CUDA driver and runtime, the GPU
//! architecture), with a short stable id over all of them.
//!
//! A node's unit is read from its preflight facts ([`LaunchUnit::of`]):
//! the weights and the image from the agent's own probes, the engine and
//! torch from the version probes, the driver from `nvidia-smi`, and the
//! rest from [`build_probe`]: one run of the engine's Python that says
//! which CUDA runtime torch was built for, its NCCL, the NCCL library
//! vLLM's own communicator would load (`VLLM_NCCL_SO_PATH`, else the one
//! torch loaded), and the GPUs' compute capability. It reads them from
//! files where they can be told for sure (torch's `version.py`; a pip
//! wheel that requires `nvidia-nccl-*` loads `nvidia/nccl/lib/libnccl.so.2`
//! beside it by its RPATH, asked with `ncclGetVersion`; `nvidia-smi` for
//! the visible GPUs) in a tenth of a second, and imports torch (2 s of
//! CPU) otherwise: another wheel, `LD_PRELOAD`, devices without
//! `nvidia-smi`. What a node does not have is `none` (a CPU-only
//! torch has no NCCL and no CUDA); what could not be asked is `unknown`.
//!
//! [`differences`] compares the nodes' units field by field; the
//! preflight's `nccl` and `unit` checks turn that into rows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xfer_proto::launch::{NodeFacts, Probe, VersionProbe};

use crate::config::{Engine, Setup};

/// The `what` of the build probe among the version probes.
pub const BUILD_PROBE: &str = "torch-build";

/// A value a node does not have.
pub const NONE: &str = "none";
/// A value that could not be asked.
pub const UNKNOWN: &str = "unknown";

/// What one node would start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchUnit {
    /// The first 12 hex digits of the BLAKE3 of every field below.
    pub id: String,
    /// The weights' manifest root hash (`none`: not held yet).
    pub weights: String,
    /// The id of `[launch] image` (`none`: no image).
    pub image: String,
    /// The engine and its version: "vllm 0.11.0".
    pub engine: String,
    /// torch's version.
    pub torch: String,
    /// NCCL: torch's own, and the library vLLM's communicator loads
    /// when it differs ("2.21.5, libnccl 2.26.2").
    pub nccl: String,
    /// The NVIDIA driver (`nvidia-smi`).
    pub cuda_driver: String,
    /// The CUDA runtime torch was built for.
    pub cuda_runtime: String,
    /// The GPUs' compute capabilities ("sm_121"), or their names when the
    /// ranks run in an image.
    pub gpu_arch: String,
    /// The compile caches' snapshot root (`[launch] caches`; `none`: no
    /// caches, or none held). Hashed into the id only when set, so a
    /// launch without caches keeps the id it had before caches existed.
    #[serde(default = "none")]
    pub caches: String,
}

fn none() -> String {
    NONE.to_string()
}

/// The fields that make a unit, in order, as `(name, value)`.
pub const FIELDS: [&str; 8] = [
    "weights",
    "image",
    "engine",
    "torch",
    "nccl",
    "cuda_driver",
    "cuda_runtime",
    "gpu_arch",
];

impl LaunchUnit {
    /// A unit of these values, its id computed.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        weights: String,
        image: String,
        engine: String,
        torch: String,
        nccl: String,
        cuda_driver: String,
        cuda_runtime: String,
        gpu_arch: String,
    ) -> LaunchUnit {
        let mut u = LaunchUnit {
            id: String::new(),
            weights,
            image,
            engine,
            torch,
            nccl,
            cuda_driver,
            cuda_runtime,
            gpu_arch,
            caches: NONE.into(),
        };
        u.id = u.compute_id();
        u
    }

    /// The id: BLAKE3 over every field by name (`caches` only when set).
    fn compute_id(&self) -> String {
        let mut h = blake3::Hasher::new_derive_key("xfer-launch unit v1");
        let caches = ("caches", self.caches.as_str());
        let extra = (self.caches != NONE).then_some(caches);
        for (k, v) in self.fields().into_iter().chain(extra) {
            h.update(k.as_bytes());
            h.update(b"=");
            h.update(v.as_bytes());
            h.update(b"\n");
        }
        h.finalize().to_hex()[..12].to_string()
    }

    /// This unit with the compile caches' snapshot root (`None`: the
    /// node holds none), its id computed again.
    pub fn with_caches(mut self, root: Option<xfer_proto::hash::Hash>) -> LaunchUnit {
        self.caches = root.map_or_else(none, |r| r.to_hex());
        self.id = self.compute_id();
        self
    }

    /// Every field with its name, in [`FIELDS`] order.
    pub fn fields(&self) -> [(&'static str, &str); 8] {
        [
            ("weights", &self.weights),
            ("image", &self.image),
            ("engine", &self.engine),
            ("torch", &self.torch),
            ("nccl", &self.nccl),
            ("cuda_driver", &self.cuda_driver),
            ("cuda_runtime", &self.cuda_runtime),
            ("gpu_arch", &self.gpu_arch),
        ]
    }

    /// One field's value by name.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields()
            .into_iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }

    /// "unit ID: weights 1a2b3c4d5e6f, vllm 0.11.0, torch 2.13.0, ...".
    pub fn summary(&self) -> String {
        let short = |s: &str| s.chars().take(12).collect::<String>();
        let caches = if self.caches == NONE {
            String::new()
        } else {
            format!(", caches {}", short(&self.caches))
        };
        format!(
            "unit {}: weights {}, image {}, {}, torch {}, nccl {}, cuda driver {}, cuda runtime {}, gpu {}{caches}",
            self.id,
            short(&self.weights),
            short(&self.image),
            self.engine,
            self.torch,
            self.nccl,
            self.cuda_driver,
            self.cuda_runtime,
            self.gpu_arch
        )
    }

    /// This node's unit, from its facts.
    pub fn of(setup: &Setup, f: &NodeFacts) -> LaunchUnit {
        let version = |what: &str| match f.versions.iter().find(|v| v.what == what) {
            Some(v) => match &v.version {
                Probe::Ok(v) => v.clone(),
                _ => UNKNOWN.to_string(),
            },
            None => NONE.to_string(),
        };
        let in_image = setup.container.is_some();
        let build = build_of(f);
        let from_build = |pick: fn(&Build) -> Option<String>| -> String {
            if in_image {
                return "in the image".into();
            }
            match &build {
                Some(Ok(b)) => pick(b).unwrap_or_else(|| NONE.into()),
                Some(Err(_)) => UNKNOWN.into(),
                None => NONE.into(),
            }
        };
        let engine = match setup.engine {
            Engine::Custom => "custom".to_string(),
            e if in_image => e.as_str().to_string(),
            e => {
                let what = engine_module(e);
                format!("{} {}", e.as_str(), version(what))
            }
        };
        let torch = match setup.engine {
            Engine::Custom => NONE.to_string(),
            _ if in_image => "in the image".into(),
            _ => version("torch"),
        };
        let image = match &f.containers {
            Probe::Ok(c) => match &c.image {
                Some(Probe::Ok(id)) => id.to_string(),
                Some(_) => UNKNOWN.into(),
                None => NONE.into(),
            },
            _ if setup.container.is_some() => UNKNOWN.into(),
            _ => NONE.into(),
        };
        let (driver, names) = match &f.gpus {
            Probe::Ok(g) => {
                let mut names: Vec<&str> = g.gpus.iter().map(|g| g.name.as_str()).collect();
                names.sort();
                names.dedup();
                (
                    g.driver.clone().unwrap_or_else(|| NONE.into()),
                    if names.is_empty() {
                        NONE.to_string()
                    } else {
                        names.join(",")
                    },
                )
            }
            Probe::Skipped(_) => (NONE.into(), NONE.into()),
            Probe::Failed(_) => (UNKNOWN.into(), UNKNOWN.into()),
        };
        LaunchUnit::new(
            f.weights
                .root
                .map(|r| r.to_hex())
                .unwrap_or_else(|| NONE.into()),
            image,
            engine,
            torch,
            from_build(Build::nccl),
            driver,
            from_build(|b| b.cuda.clone()),
            if in_image {
                names
            } else {
                from_build(|b| b.arch.clone())
            },
        )
    }
}

/// The Python module whose version is the engine's.
fn engine_module(e: Engine) -> &'static str {
    match e {
        Engine::Vllm | Engine::VllmRay => "vllm",
        Engine::Sglang => "sglang",
        Engine::Custom => "custom",
    }
}

/// What the build probe printed (its last line, JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Build {
    /// The interpreter it ran in.
    #[serde(default)]
    pub python: Option<String>,
    /// torch's version.
    #[serde(default)]
    pub torch: Option<String>,
    /// `torch.version.cuda`.
    #[serde(default)]
    pub cuda: Option<String>,
    /// `torch.cuda.nccl.version()`.
    #[serde(default)]
    pub nccl: Option<String>,
    /// `ncclGetVersion` of the library vLLM's communicator loads.
    #[serde(default)]
    pub nccl_lib: Option<String>,
    /// The library's path, when it was loaded.
    #[serde(default)]
    pub nccl_lib_path: Option<String>,
    /// The GPUs' compute capabilities, "sm_121,sm_90".
    #[serde(default)]
    pub arch: Option<String>,
    /// "files" when the probe read all of it without importing torch.
    #[serde(default)]
    pub read: Option<String>,
}

impl Build {
    /// The NCCL value: torch's, and the loaded library's when it differs.
    fn nccl(&self) -> Option<String> {
        match (&self.nccl, &self.nccl_lib) {
            (Some(t), Some(l)) if t != l => Some(format!("{t}, libnccl {l}")),
            (Some(t), _) => Some(t.clone()),
            (None, Some(l)) => Some(format!("libnccl {l}")),
            (None, None) => None,
        }
    }
}

/// Why a node's build probe says nothing (the `nccl` row shows it).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The probe did not run or failed: the agent's reason.
    #[error("{0}")]
    Probe(String),
    /// The probe printed something else than its JSON.
    #[error("the build probe printed `{line}`, not its JSON ({why}); report this bug")]
    NotJson {
        /// What it printed.
        line: String,
        /// Why it does not read.
        why: serde_json::Error,
    },
}

/// The build probe's answer on a node: `None` when it was not asked,
/// `Err` with the reason when it could not run or printed no JSON.
pub fn build_of(f: &NodeFacts) -> Option<Result<Build, BuildError>> {
    let v = f.versions.iter().find(|v| v.what == BUILD_PROBE)?;
    Some(match &v.version {
        Probe::Ok(line) => serde_json::from_str::<Build>(line).map_err(|why| BuildError::NotJson {
            line: line.clone(),
            why,
        }),
        Probe::Failed(why) | Probe::Skipped(why) => Err(BuildError::Probe(why.clone())),
    })
}

/// The build probe for this setup, when it has one: not for a custom
/// engine (which may not use torch) nor for ranks in an image (their
/// Python is the image's, whose id pins it).
///
/// The command is `python3 -c` with a short Python program that first
/// re-runs itself in the Python that runs the engine (the interpreter of
/// the engine's script on the agent's `PATH`, by its `#!` line, as the
/// agent's own version probe finds it), with `VLLM_NCCL_SO_PATH` from
/// `[launch.env]` added to the agent's environment (the ranks' own
/// environment: `LD_*` keys are refused in `[launch.env]`, so the loader's
/// path is the agent's). It then prints one line of JSON ([`Build`]).
/// Nothing in it can be told to report another value than the one the
/// ranks would load: a test fakes a node by giving it another Python.
pub fn build_probe(setup: &Setup) -> Option<VersionProbe> {
    if setup.engine == Engine::Custom || setup.container.is_some() {
        return None;
    }
    let program = match setup.engine {
        Engine::Sglang => "python3",
        _ => "vllm",
    };
    let env: BTreeMap<&str, &str> = setup
        .env
        .iter()
        .filter(|(k, _)| k.as_str() == "VLLM_NCCL_SO_PATH")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Some(VersionProbe {
        what: BUILD_PROBE.into(),
        argv: vec![
            "python3".into(),
            "-c".into(),
            BOOT.into(),
            BUILD_PY.into(),
            program.into(),
            serde_json::to_string(&env).expect("a map of strings serializes"),
        ],
        python_of: None,
    })
}

/// Runs the program in `sys.argv[1]` with the rest as its arguments.
const BOOT: &str = "import sys; exec(sys.argv[1])";

/// The build probe's program (see [`build_probe`]). Arguments: the
/// engine's program, the environment to add (JSON), and `inner` once it
/// runs in the engine's Python.
const BUILD_PY: &str = r##"
import ctypes, json, os, shutil, subprocess, sys
body, prog, env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if len(sys.argv) < 5:
    py = [sys.executable]
    if os.path.basename(prog).startswith("python"):
        py = [shutil.which(prog) or sys.executable]
    else:
        path, first = shutil.which(prog), ""
        if path:
            try:
                with open(path, "rb") as f:
                    first = f.readline(256).decode("utf-8", "replace")
            except OSError:
                pass
        words = first[2:].split() if first.startswith("#!") else []
        isp = lambda w: os.path.basename(w).startswith("python")
        if (words and isp(words[0])) or (len(words) > 1 and words[0].endswith("/env") and isp(words[1])):
            py = words
    e = dict(os.environ)
    e.update(env)
    os.execvpe(py[0], py + ["-c", "import sys; exec(sys.argv[1])", body, prog, json.dumps(env), "inner"], e)
def ver(n):
    if isinstance(n, (tuple, list)):
        return ".".join(str(x) for x in n)
    n = int(n)
    if n >= 10000:
        return "%d.%d.%d" % (n // 10000, n % 10000 // 100, n % 100)
    return "%d.%d.%d" % (n // 1000, n % 1000 // 100, n % 100)
def nccl_of(so):
    lib = ctypes.CDLL(so)
    v = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(v)) != 0:
        raise OSError("ncclGetVersion failed")
    return ver(v.value)
def read_build():
    # Without importing torch (2 s of CPU): its version file, the NCCL its
    # wheel's RPATH loads, and the GPUs from nvidia-smi. None when any of
    # it cannot be told for sure; the import then answers.
    if "LD_PRELOAD" in os.environ:
        return None
    import importlib.metadata, importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    where = list(spec.submodule_search_locations)[0]
    vars = {}
    try:
        with open(os.path.join(where, "version.py")) as f:
            src = f.read()
        exec(compile(src, "torch/version.py", "exec"), vars)
    except Exception:
        return None
    out = {"python": sys.executable, "torch": str(vars.get("__version__") or "") or None, "cuda": vars.get("cuda")}
    if not out["torch"]:
        return None
    if out["cuda"]:
        try:
            needs = importlib.metadata.distribution("torch").requires or []
        except Exception:
            return None
        so = os.path.join(os.path.dirname(where), "nvidia", "nccl", "lib", "libnccl.so.2")
        if not any(r.lower().startswith("nvidia-nccl") for r in needs) or not os.path.exists(so):
            return None
        try:
            out["nccl"] = nccl_of(so)
            mine = os.environ.get("VLLM_NCCL_SO_PATH")
            out["nccl_lib"] = nccl_of(mine) if mine else out["nccl"]
            out["nccl_lib_path"] = mine or "libnccl.so.2"
        except (OSError, AttributeError):
            return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        if any(os.path.exists(d) for d in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")):
            return None
        return out
    if not out["cuda"]:
        return out
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is not None and seen.strip() in ("", "-1"):
        return out
    argv = [smi, "--query-gpu=compute_cap", "--format=csv,noheader"]
    if seen is not None:
        if not all(p.strip().isdigit() for p in seen.split(",")):
            return None
        argv.append("--id=" + ",".join(p.strip() for p in seen.split(",")))
    try:
        lines = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout.split()
        caps = {"sm_" + l.replace(".", "") for l in lines if l.replace(".", "").isdigit()}
    except Exception:
        return None
    if caps:
        out["arch"] = ",".join(sorted(caps))
    return out
def import_build():
    out = {"python": sys.executable}
    try:
        import torch
    except Exception as err:
        sys.exit("torch cannot be imported by %s: %s" % (sys.executable, err))
    out["torch"] = str(getattr(torch, "__version__", "")) or None
    out["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        import torch.cuda.nccl
        out["nccl"] = ver(torch.cuda.nccl.version())
    except Exception:
        pass
    if out["cuda"]:
        so = os.environ.get("VLLM_NCCL_SO_PATH") or "libnccl.so.2"
        try:
            out["nccl_lib"] = nccl_of(so)
            out["nccl_lib_path"] = so
        except (OSError, AttributeError):
            pass
    try:
        if torch.cuda.is_available():
            caps = {"sm_%d%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
            out["arch"] = ",".join(sorted(caps))
    except Exception:
        pass
    return out
out = read_build()
if out is None:
    out = import_build()
else:
    out["read"] = "files"
print(json.dumps(out))
"##;

/// One field on which the nodes differ: each value with its nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The field's name ([`FIELDS`]).
    pub field: &'static str,
    /// Each value and the nodes that have it, values in order.
    pub values: BTreeMap<String, Vec<String>>,
}

/// The fields on which `units` (node name, unit) differ, in [`FIELDS`]
/// order; empty when every node has the same unit.
pub fn differences(units: &[(String, LaunchUnit)]) -> Vec<Difference> {
    let mut out = Vec::new();
    for field in FIELDS {
        let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (node, u) in units {
            let v = u.field(field).unwrap_or(UNKNOWN).to_string();
            values.entry(v).or_default().push(node.clone());
        }
        if values.len() > 1 {
            out.push(Difference { field, values });
        }
    }
    out
}

/// The one unit every node has, if they agree.
pub fn common(units: &[(String, LaunchUnit)]) -> Option<&LaunchUnit> {
    let (_, first) = units.first()?;
    units.iter().all(|(_, u)| u == first).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A torch wheel laid out as pip lays it out, in a temporary site
    /// directory: its version file, its metadata, the NCCL its RPATH
    /// loads (a real shared library answering `ncclGetVersion`), and an
    /// `__init__` that refuses to be imported.
    struct FakeWheel {
        dir: tempfile::TempDir,
    }

    impl FakeWheel {
        fn new(needs_nccl: bool) -> FakeWheel {
            let dir = tempfile::tempdir().unwrap();
            let site = dir.path().join("site");
            std::fs::create_dir_all(site.join("torch")).unwrap();
            std::fs::write(
                site.join("torch/__init__.py"),
                "raise ImportError('the probe imported torch')\n",
            )
            .unwrap();
            std::fs::write(
                site.join("torch/version.py"),
                "from typing import Optional\n__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\n",
            )
            .unwrap();
            let info = site.join("torch-2.13.0+cu130.dist-info");
            std::fs::create_dir_all(&info).unwrap();
            let needs = if needs_nccl {
                "Requires-Dist: nvidia-nccl-cu13==2.21.5; platform_system == \"Linux\"\n"
            } else {
                ""
            };
            std::fs::write(
                info.join("METADATA"),
                format!("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cu130\n{needs}"),
            )
            .unwrap();
            let lib = site.join("nvidia/nccl/lib");
            std::fs::create_dir_all(&lib).unwrap();
            let w = FakeWheel { dir };
            w.nccl(&lib.join("libnccl.so.2"), 22105);
            w
        }

        /// A shared library whose `ncclGetVersion` says `code`.
        fn nccl(&self, to: &std::path::Path, code: u32) {
            let c = self.dir.path().join("nccl.c");
            std::fs::write(
                &c,
                format!("int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n"),
            )
            .unwrap();
            let ok = std::process::Command::new("cc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(to)
                .arg(&c)
                .status()
                .unwrap();
            assert!(ok.success());
        }

        /// The probe's stdout and stderr, run with this site first on the
        /// module path and `bin` (when given) first on `PATH`.
        fn probe(&self, env: &[(&str, &str)], bin: Option<&std::path::Path>) -> (String, String) {
            let python = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .unwrap();
            let python = String::from_utf8(python.stdout).unwrap().trim().to_string();
            let path = match bin {
                Some(b) => format!("{}:/usr/bin:/bin", b.display()),
                None => "/usr/bin:/bin".into(),
            };
            let extra: BTreeMap<&str, &str> = env
                .iter()
                .copied()
                .filter(|(k, _)| *k == "VLLM_NCCL_SO_PATH")
                .collect();
            let mut cmd = std::process::Command::new(&python);
            cmd.args(["-c", BOOT, BUILD_PY, &python])
                .arg(serde_json::to_string(&extra).unwrap())
                .env("PYTHONPATH", self.dir.path().join("site"))
                .env("PATH", path)
                .env_remove("LD_PRELOAD")
                .env_remove("CUDA_VISIBLE_DEVICES");
            for (k, v) in env {
                cmd.env(k, v);
            }
            let out = cmd.output().unwrap();
            (
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            )
        }
    }

    fn parsed(line: &str) -> Build {
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn the_build_probe_reads_a_cuda_wheel_without_importing_torch() {
        let w = FakeWheel::new(true);
        let (out, err) = w.probe(&[], None);
        let b = parsed(&out);
        assert_eq!(b.read.as_deref(), Some("files"), "{out} {err}");
        assert_eq!(b.torch.as_deref(), Some("2.13.0+cu130"));
        assert_eq!(b.cuda.as_deref(), Some("13.0"));
        assert_eq!(b.nccl().as_deref(), Some("2.21.5"));
        assert_eq!(b.arch, None);

        // The communicator's own library, when the launch names one.
        let other = w.dir.path().join("libnccl-other.so");
        w.nccl(&other, 22602);
        let (out, _) = w.probe(&[("VLLM_NCCL_SO_PATH", other.to_str().unwrap())], None);
        assert_eq!(
            parsed(&out).nccl().as_deref(),
            Some("2.21.5, libnccl 2.26.2")
        );

        // The GPUs from nvidia-smi, limited to the visible ones.
        let bin = w.dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let asked = w.dir.path().join("asked");
        std::fs::write(
            bin.join("nvidia-smi"),
            format!(
                "#!/bin/sh\necho \"$@\" > '{}'\nprintf '12.1\\n9.0\\n'\n",
                asked.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            bin.join("nvidia-smi"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let (out, _) = w.probe(&[("CUDA_VISIBLE_DEVICES", "0, 1")], Some(&bin));
        assert_eq!(parsed(&out).arch.as_deref(), Some("sm_121,sm_90"), "{out}");
        let asked = std::fs::read_to_string(&asked).unwrap();
        assert!(
            asked.contains("--query-gpu=compute_cap") && asked.contains("--id=0,1"),
            "{asked}"
        );
    }

    #[test]
    fn the_build_probe_imports_torch_when_the_files_cannot_say() {
        // No NCCL requirement in the wheel's metadata: its NCCL may be
        // linked in, so only torch can say; here the import fails, and the
        // probe says so rather than guessing.
        let w = FakeWheel::new(false);
        let (out, err) = w.probe(&[], None);
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("torch cannot be imported") && err.contains("the probe imported torch"),
            "{err}"
        );
        // The same for a preloaded library, and for devices named in a
        // way nvidia-smi cannot be asked about.
        let w = FakeWheel::new(true);
        let (_, err) = w.probe(&[("LD_PRELOAD", "")], None);
        assert!(err.contains("the probe imported torch"), "{err}");
    }

    fn unit(torch: &str, nccl: &str) -> LaunchUnit {
        LaunchUnit::new(
            "ab".repeat(32),
            NONE.into(),
            "vllm 0.11.0".into(),
            torch.into(),
            nccl.into(),
            NONE.into(),
            NONE.into(),
            NONE.into(),
        )
    }

    #[test]
    fn the_id_is_stable_and_changes_with_any_field() {
        let a = unit("2.13.0", "2.29.7");
        assert_eq!(a.id, unit("2.13.0", "2.29.7").id);
        assert_eq!(a.id.len(), 12);
        assert_ne!(a.id, unit("2.13.0", "2.21.5").id);
        assert_ne!(a.id, unit("2.12.0", "2.29.7").id);
        // The field names are hashed too: two fields that trade values
        // make another unit.
        let f = |driver: &str, runtime: &str| {
            LaunchUnit::new(
                NONE.into(),
                NONE.into(),
                "vllm 0.11.0".into(),
                "2.13.0".into(),
                NONE.into(),
                driver.into(),
                runtime.into(),
                NONE.into(),
            )
        };
        assert_ne!(f("580.1", "13.0").id, f("13.0", "580.1").id);
        // No caches: the id of before; a snapshot root: another id of the
        // same shape, which names the root in the summary.
        let c = a.clone().with_caches(None);
        assert_eq!(c.id, a.id);
        let c = a.clone().with_caches(Some(xfer_proto::hash::Hash([9; 32])));
        assert_ne!(c.id, a.id);
        assert_eq!(c.id.len(), 12);
        assert!(
            c.summary().ends_with(", caches 090909090909"),
            "{}",
            c.summary()
        );
    }

    #[test]
    fn differences_name_each_field_its_values_and_nodes() {
        let units = vec![
            ("n1".to_string(), unit("2.13.0", "2.29.7")),
            ("n2".to_string(), unit("2.12.0", "2.21.5")),
            ("n3".to_string(), unit("2.13.0", "2.29.7")),
        ];
        let d = differences(&units);
        assert_eq!(
            d.iter().map(|d| d.field).collect::<Vec<_>>(),
            ["torch", "nccl"]
        );
        assert_eq!(d[1].values["2.21.5"], ["n2"]);
        assert_eq!(d[1].values["2.29.7"], ["n1", "n3"]);
        assert!(common(&units).is_none());
        let same = vec![
            ("n1".to_string(), unit("2.13.0", NONE)),
            ("n2".to_string(), unit("2.13.0", NONE)),
        ];
        assert!(differences(&same).is_empty());
        assert_eq!(common(&same).unwrap().nccl, NONE);
    }

    #[test]
    fn the_build_line_parses_and_nccl_shows_a_second_library() {
        let b: Build =
            serde_json::from_str(r#"{"python": "/v/bin/python3", "torch": "2.13.0+cu130", "cuda": "13.0", "nccl": "2.29.7", "nccl_lib": "2.26.2"}"#)
                .unwrap();
        assert_eq!(b.nccl().unwrap(), "2.29.7, libnccl 2.26.2");
        let cpu: Build = serde_json::from_str(r#"{"torch": "2.13.0+cpu"}"#).unwrap();
        assert_eq!(cpu.nccl(), None);
        assert_eq!(cpu.cuda, None);
    }
}
