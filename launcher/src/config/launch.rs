//! The `[launch]` table walked key by key in file order: each group of
//! keys (engine, parallel sizes, node selection, ports, extra arguments)
//! is read by its own function, the model, env, container and template
//! keys by the files beside this one. Each value is checked alone here;
//! what depends on the nodes is checked in `resolve.rs`.

use std::collections::BTreeMap;

use toml::de::{DeTable, DeValue};
use xfer::config::toml_reader::{and_list, did_you_mean, entries, int_value, At, Val};
use xfer_proto::launch::GpuAccess;

use super::model::ModelSpec;
use super::{
    quoted_list, Engine, LaunchError, Parser, Ports, Template, DEFAULT_API_PORT, DEFAULT_DIST_PORT,
    DEFAULT_MASTER_PORT, DEFAULT_RAY_PORT, MAX_PARALLEL,
};

/// `[launch]` as written, each value checked alone.
#[derive(Debug)]
pub(super) struct Launch {
    /// Where `[launch]` is written.
    pub(super) header: usize,
    pub(super) engine: Option<At<Engine>>,
    pub(super) model: Option<At<ModelSpec>>,
    /// `revision` next to a string `model`.
    pub(super) revision: Option<At<String>>,
    pub(super) tp: Option<At<u32>>,
    pub(super) pp: Option<At<u32>>,
    pub(super) head: Option<At<String>>,
    pub(super) nodes: Option<Vec<At<String>>>,
    pub(super) ports: Ports,
    pub(super) port_at: BTreeMap<&'static str, usize>,
    pub(super) extra_args: Vec<At<String>>,
    pub(super) env: BTreeMap<String, String>,
    pub(super) template: Option<At<Template>>,
    pub(super) image: Option<At<String>>,
    pub(super) gpus: Option<At<GpuAccess>>,
    pub(super) shm_size: Option<At<u64>>,
    /// `stream_weights = true`: start the ranks while the weights land.
    pub(super) stream_weights: Option<At<bool>>,
    /// `caches = ["vllm", ...]`: the compile caches delivered with the launch.
    pub(super) caches: Option<At<Vec<String>>>,
    /// `runner = "agents" | "srun"`: who starts the ranks.
    pub(super) runner: Option<At<super::Runner>>,
}

/// Keys of `[launch]`.
const LAUNCH_KEYS: &[&str] = &[
    "engine",
    "model",
    "revision",
    "tp",
    "pp",
    "head",
    "nodes",
    "master_port",
    "api_port",
    "ray_port",
    "dist_port",
    "extra_args",
    "env",
    "template",
    "image",
    "gpus",
    "shm_size",
    "stream_weights",
    "runner",
    "caches",
];
/// Other words for `[launch]` keys, tried before edit distance.
const ALIASES: &[(&str, &str)] = &[
    ("tensor_parallel_size", "tp"),
    ("tensor_parallel", "tp"),
    ("tp_size", "tp"),
    ("pipeline_parallel_size", "pp"),
    ("pipeline_parallel", "pp"),
    ("pp_size", "pp"),
    ("backend", "engine"),
    ("model_path", "model"),
    ("path", "model"),
    ("repo", "model"),
    ("args", "extra_args"),
    ("extra", "extra_args"),
    ("engine_args", "extra_args"),
    ("environment", "env"),
    ("command", "template"),
    ("cmd", "template"),
    ("port", "api_port"),
    ("head_node", "head"),
    ("master", "head"),
    ("container", "image"),
    ("container_image", "image"),
    ("docker_image", "image"),
    ("gpu", "gpus"),
    ("devices", "gpus"),
    ("shm", "shm_size"),
    ("shm_bytes", "shm_size"),
    ("shared_memory", "shm_size"),
    ("stream", "stream_weights"),
    ("streaming", "stream_weights"),
    ("load_while_syncing", "stream_weights"),
    ("cache", "caches"),
    ("compile_cache", "caches"),
    ("compile_caches", "caches"),
    ("cache_dirs", "caches"),
];
/// `v`, written at `at`.
fn placed<T>(v: T, at: usize) -> Option<At<T>> {
    Some(At { v, at })
}

impl Launch {
    fn new(header: usize) -> Launch {
        Launch {
            header,
            engine: None,
            model: None,
            revision: None,
            tp: None,
            pp: None,
            head: None,
            nodes: None,
            ports: Ports {
                master: DEFAULT_MASTER_PORT,
                api: DEFAULT_API_PORT,
                ray: DEFAULT_RAY_PORT,
                dist: DEFAULT_DIST_PORT,
            },
            port_at: BTreeMap::new(),
            extra_args: Vec::new(),
            env: BTreeMap::new(),
            template: None,
            image: None,
            gpus: None,
            shm_size: None,
            stream_weights: None,
            caches: None,
            runner: None,
        }
    }
}

impl Parser<'_> {
    /// Reads every key of `[launch]` (written at `header`).
    pub(super) fn launch(&self, table: &DeTable, header: usize) -> Result<Launch, LaunchError> {
        let mut l = Launch::new(header);
        for e in entries(table) {
            let (key, v, at) = (e.key, e.value, e.at);
            match key {
                "engine" => l.engine = placed(self.engine(v)?, at),
                "model" => l.model = placed(self.model(v)?, at),
                "revision" => {
                    let s = self.r.string(key, v, "\"main\"")?;
                    l.revision = placed(self.revision(s, at)?, at);
                }
                "tp" => l.tp = Some(self.parallel(key, v)?),
                "pp" => l.pp = Some(self.parallel(key, v)?),
                "head" => l.head = placed(self.r.string(key, v, "\"spark-a\"")?.to_string(), at),
                "nodes" => l.nodes = Some(self.node_names(v)?),
                "master_port" | "api_port" | "ray_port" | "dist_port" => {
                    self.port(&mut l, key, v)?
                }
                "extra_args" => l.extra_args = self.extra_args(v)?,
                "env" => l.env = self.env(v)?,
                "image" => l.image = placed(self.image(v)?, at),
                "gpus" => l.gpus = placed(self.gpus(v)?, at),
                "shm_size" => l.shm_size = placed(self.shm_size(v)?, at),
                "template" => l.template = placed(self.template(v)?, at),
                "caches" => l.caches = placed(self.caches(v)?, at),
                "runner" => {
                    let s = self.r.string(key, v, "\"srun\"")?;
                    let r = super::Runner::parse(s).ok_or_else(|| {
                        self.err(
                            at,
                            format!("unknown runner {s:?}; runner is \"agents\" (each node's xfer agent starts its rank: the default) or \"srun\" (one Slurm job step inside the allocation)"),
                        )
                    })?;
                    l.runner = placed(r, at);
                }
                "stream_weights" => match v.get_ref() {
                    DeValue::Boolean(b) => l.stream_weights = placed(*b, at),
                    _ => {
                        let fix = "write stream_weights = true or false";
                        return Err(self.r.wrong_kind(key, v, fix).into());
                    }
                },
                _ => {
                    let otherwise = || format!("[launch] takes {}", and_list(LAUNCH_KEYS));
                    return Err(self
                        .r
                        .unknown_key(&e, "[launch]", LAUNCH_KEYS, ALIASES, otherwise)
                        .into());
                }
            }
        }
        Ok(l)
    }

    /// `engine = "vllm"`, with the engine probably meant.
    fn engine(&self, v: &Val) -> Result<Engine, LaunchError> {
        let s = self.r.string("engine", v, "\"vllm\"")?;
        Engine::parse(s).ok_or_else(|| {
            let names: Vec<&str> = Engine::ALL.iter().map(|(n, _)| *n).collect();
            let hint = did_you_mean(s, &names, &[("ray", "vllm-ray"), ("sgl", "sglang")])
                .map(|h| format!("{h} "))
                .unwrap_or_default();
            self.err(
                v.span().start,
                format!(
                    "unknown engine {s:?}; {hint}engine is one of {}",
                    quoted_list(&names)
                ),
            )
        })
    }

    /// `caches = ["vllm", ...]`: kinds of compile cache, never paths (each
    /// lives under its agent's root, [`xfer_proto::compile_cache`]).
    fn caches(&self, v: &Val) -> Result<Vec<String>, LaunchError> {
        use xfer_proto::compile_cache::KINDS;
        let names: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
        let items = self.r.array(
            "caches",
            v,
            "write a list of cache kinds, like caches = [\"vllm\"]",
        )?;
        let mut kinds: Vec<String> = Vec::new();
        for item in items {
            let at = item.span().start;
            let s = self.r.string("an item of caches", item, "\"vllm\"")?;
            if kinds.iter().any(|k| k == s) {
                return Err(self.err(at, format!("caches lists {s:?} twice; list each kind once")));
            }
            if xfer_proto::compile_cache::variable(s).is_some() {
                kinds.push(s.to_string());
                continue;
            }
            let pathlike = s.contains('/') || s.contains("..") || s.starts_with('~');
            let why = if pathlike {
                format!("caches takes kinds of compile cache, not paths, so that a cluster file cannot make an agent write outside its root; {s:?} is a path: each kind lives under every agent's root (<root>/.xfer-caches/...), so write one of {}", quoted_list(&names))
            } else {
                let hint = did_you_mean(
                    s,
                    &names,
                    &[
                        ("torch", "inductor"),
                        ("torch_compile", "vllm"),
                        ("torchinductor", "inductor"),
                    ],
                )
                .map(|h| format!("{h} "))
                .unwrap_or_default();
                format!(
                    "unknown cache kind {s:?}; {hint}caches takes {}",
                    quoted_list(&names)
                )
            };
            return Err(self.err(at, why));
        }
        Ok(kinds)
    }

    /// `tp` or `pp`: a GPU count.
    fn parallel(&self, key: &str, v: &Val) -> Result<At<u32>, LaunchError> {
        let at = v.span().start;
        let n = self.r.integer(key, v, "2")?;
        if !(1..=MAX_PARALLEL).contains(&n) {
            return Err(self.err(
                at,
                format!("{key} = {n} is out of range; it counts GPUs, from 1 to {MAX_PARALLEL}"),
            ));
        }
        Ok(At { v: n as u32, at })
    }

    /// `nodes = ["spark-a", ...]`: names only; `resolve.rs` looks them up.
    fn node_names(&self, v: &Val) -> Result<Vec<At<String>>, LaunchError> {
        let items = self.r.array(
            "nodes",
            v,
            "write a list of node names, like nodes = [\"spark-a\", \"spark-b\"]",
        )?;
        if items.is_empty() {
            return Err(self.err(
                v.span().start,
                "nodes is empty; list the nodes to launch on, or drop nodes to use every node",
            ));
        }
        let mut names = Vec::new();
        for item in items {
            let s = self.r.string("a node name in nodes", item, "\"spark-a\"")?;
            names.push(At {
                v: s.to_string(),
                at: item.span().start,
            });
        }
        Ok(names)
    }

    /// One of the `*_port` keys, into `l.ports`.
    fn port(&self, l: &mut Launch, key: &str, v: &Val) -> Result<(), LaunchError> {
        let at = v.span().start;
        let n = self.r.integer(key, v, "8000")?;
        let port = match u16::try_from(n) {
            Ok(p) if p > 0 => p,
            _ => return Err(self.err(at, format!("{key} = {n} is not a port; ports run 1-65535"))),
        };
        let (name, slot) = match key {
            "master_port" => ("master_port", &mut l.ports.master),
            "api_port" => ("api_port", &mut l.ports.api),
            "ray_port" => ("ray_port", &mut l.ports.ray),
            _ => ("dist_port", &mut l.ports.dist),
        };
        *slot = port;
        l.port_at.insert(name, at);
        Ok(())
    }

    /// `extra_args = ["--flag", "value", ...]`; numbers are taken as
    /// written.
    fn extra_args(&self, v: &Val) -> Result<Vec<At<String>>, LaunchError> {
        let items = self.r.array(
            "extra_args",
            v,
            "write a list with one argument per item, like extra_args = [\"--max-model-len\", \"32768\"]",
        )?;
        let mut args = Vec::with_capacity(items.len());
        for item in items {
            let s = match item.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(i) => int_value(i).to_string(),
                DeValue::Float(f) => f.as_str().to_string(),
                _ => {
                    let fix = "write each argument as a string, like \"--enforce-eager\"";
                    return Err(self.r.wrong_kind("an item of extra_args", item, fix).into());
                }
            };
            if s.contains('\0') {
                return Err(self.err(
                    item.span().start,
                    "an item of extra_args holds a NUL character, which no command line can carry",
                ));
            }
            args.push(At {
                v: s,
                at: item.span().start,
            });
        }
        Ok(args)
    }
}
