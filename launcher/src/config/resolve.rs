//! `[launch]` bound to the cluster's nodes: the launch nodes in rank order
//! (head first, each with its own fabric), the parallel sizes over them,
//! the head's ports, the flags `extra_args` may not carry, and the model's
//! one path on every node.

use xfer::config::cluster::{Cluster, Node};
use xfer::config::toml_reader::At;

use super::launch::Launch;
use super::{Engine, LaunchError, Parser, RankNode, Setup, VARS};

impl Parser<'_> {
    /// Binds the table to the cluster's nodes and checks what depends on them.
    pub(super) fn resolve(&self, cluster: &Cluster, l: Launch) -> Result<Setup, LaunchError> {
        let engine = l.engine.as_ref().map(|e| e.v).ok_or_else(|| {
            self.err(
                l.header,
                "[launch] has no engine; add engine = \"vllm\" (or \"vllm-ray\", \"sglang\", \"custom\")",
            )
        })?;
        let model_spec = l.model.clone().ok_or_else(|| {
            self.err(
                l.header,
                "[launch] has no model; add model = \"/abs/path\" (the same on every node) or model = \"ORG/NAME\" (in each node's root)",
            )
        })?;
        let model_spec = At {
            v: self.with_revision(model_spec.v, l.revision.clone())?,
            at: model_spec.at,
        };
        match (&l.template, engine) {
            (None, Engine::Custom) => {
                return Err(self.err(
                    l.engine.as_ref().map_or(l.header, |e| e.at),
                    "engine = \"custom\" needs a template; add template = \"COMMAND {rank} {head_ip} ...\" (placeholders: ".to_string()
                        + &VARS.iter().map(|(n, _)| format!("{{{n}}}")).collect::<Vec<_>>().join(", ")
                        + ")",
                ))
            }
            (Some(t), e) if e != Engine::Custom => {
                return Err(self.err(
                    t.at,
                    format!("template only applies to engine = \"custom\", but engine is \"{e}\"; drop template or set engine = \"custom\""),
                ))
            }
            _ => {}
        }

        let picked = self.pick_nodes(cluster, &l)?;
        let nodes = self.rank_nodes(&picked)?;
        let (tp, pp) = self.parallel_sizes(&l, engine, nodes.len() as u32)?;
        self.head_ports_differ(&l, engine)?;
        self.no_managed_flags(&l, engine)?;
        let model = self.model_path(&picked, model_spec)?;
        let container = self.container(&l)?;
        let stream_weights = match &l.stream_weights {
            Some(At { v: true, at }) if engine != Engine::Vllm => {
                return Err(self.err(
                    *at,
                    format!("stream_weights needs engine = \"vllm\" (its loader plugin, load format `xfer`), but engine is \"{engine}\"; drop stream_weights"),
                ))
            }
            Some(At { v: true, at }) if container.is_some() => {
                return Err(self.err(
                    *at,
                    "stream_weights and image do not go together yet: the loader asks the node's `xfer status`, which a container does not have; drop one",
                ))
            }
            s => s.as_ref().is_some_and(|s| s.v),
        };
        let caches = match &l.caches {
            None => Vec::new(),
            Some(c) => {
                if container.is_some() && !c.v.is_empty() {
                    return Err(self.err(
                        c.at,
                        "caches and image do not go together yet: a container sees only the model's folder; drop one",
                    ));
                }
                if let Some((kind, var)) = c.v.iter().find_map(|k| {
                    let var = xfer_proto::compile_cache::variable(k)?;
                    l.env.contains_key(var).then_some((k, var))
                }) {
                    return Err(self.err(
                        c.at,
                        format!("caches names {kind:?}, whose {var} xfer-launch sets itself (to the live cache under each agent's root), but [launch.env] sets {var} too; drop one"),
                    ));
                }
                c.v.clone()
            }
        };
        let runner = self.runner(&l, &container, stream_weights, &caches)?;
        Ok(Setup {
            engine,
            nodes,
            tp,
            pp,
            model,
            ports: l.ports,
            extra_args: l.extra_args.into_iter().map(|a| a.v).collect(),
            env: l.env,
            template: l.template.map(|t| t.v),
            container,
            key: cluster.key.clone(),
            path: cluster.path.clone(),
            stream_weights,
            caches,
            runner,
        })
    }

    /// `runner`, and what `runner = "srun"` cannot do: the ranks run on
    /// the host as Slurm starts them, so no image, no weights streamed by
    /// the agents, no caches the agents copy in.
    fn runner(
        &self,
        l: &Launch,
        container: &Option<super::ContainerConfig>,
        stream_weights: bool,
        caches: &[String],
    ) -> Result<super::Runner, LaunchError> {
        let Some(r) = &l.runner else {
            return Ok(super::Runner::Agents);
        };
        if r.v == super::Runner::Srun {
            let clash = if container.is_some() {
                Some("image (srun starts the ranks on the host)")
            } else if stream_weights {
                Some("stream_weights (the agents start streamed ranks)")
            } else if !caches.is_empty() {
                Some("caches (the agents copy them in before a rank starts)")
            } else {
                None
            };
            if let Some(what) = clash {
                return Err(self.err(
                    r.at,
                    format!("runner = \"srun\" does not go with {what}; drop it, or use runner = \"agents\""),
                ));
            }
        }
        Ok(r.v)
    }

    /// The launch nodes (`nodes`, else every node, or inside a Slurm job
    /// every host of the job), head first.
    fn pick_nodes<'c>(
        &self,
        cluster: &'c Cluster,
        l: &Launch,
    ) -> Result<Vec<&'c Node>, LaunchError> {
        let mut picked: Vec<&Node> = Vec::new();
        match &l.nodes {
            // Inside a Slurm job: the job's hosts (Cluster::select).
            None => picked.extend(cluster.select(&[]).unwrap_or_default()),
            Some(names) => {
                for name in names {
                    let Some(node) = cluster.node(&name.v) else {
                        let known: Vec<&str> =
                            cluster.nodes.iter().map(|n| n.name.as_str()).collect();
                        return Err(self.err(
                            name.at,
                            format!(
                                "nodes names {:?}, which is not a [[node]] of this file; the nodes are {}",
                                name.v,
                                known.join(", ")
                            ),
                        ));
                    };
                    if picked.iter().any(|n| n.name == node.name) {
                        return Err(self.err(
                            name.at,
                            format!("nodes lists {:?} twice; list each node once", name.v),
                        ));
                    }
                    picked.push(node);
                }
            }
        }
        if let Some(head) = &l.head {
            let Some(i) = picked.iter().position(|n| n.name.as_str() == head.v) else {
                let names: Vec<&str> = picked.iter().map(|n| n.name.as_str()).collect();
                let why = if cluster.node(&head.v).is_some() {
                    "is not in nodes"
                } else {
                    "is not a [[node]] of this file"
                };
                return Err(self.err(
                    head.at,
                    format!(
                        "head {:?} {why}; the head must be one of the launch nodes: {}",
                        head.v,
                        names.join(", ")
                    ),
                ));
            };
            let h = picked.remove(i);
            picked.insert(0, h);
        }
        Ok(picked)
    }

    /// Each launch node with its fabric; a node without one is refused.
    fn rank_nodes(&self, picked: &[&Node]) -> Result<Vec<RankNode>, LaunchError> {
        let mut nodes = Vec::with_capacity(picked.len());
        for node in picked {
            let (Some(fabric_if), Some(fabric_ip)) = (&node.fabric_if, node.fabric_ip) else {
                return Err(self
                    .r
                    .at_line(
                    node.line,
                    1,
                    format!(
                        "node {:?} has no fabric_ip; NCCL/Ray would pick an interface by themselves, which is the hang this tool prevents: add fabric_if and fabric_ip (its address on the fabric, see `ip -br addr`) to its [[node]], or leave it out of [launch] nodes",
                        node.name.as_str()
                    ),
                    )
                    .into());
            };
            nodes.push(RankNode {
                name: node.name.to_string(),
                agent: node.agent.clone(),
                line: node.line,
                fabric_if: fabric_if.clone(),
                fabric_ip,
                rdma: node.rdma.clone(),
                root: node.root.clone(),
            });
        }
        Ok(nodes)
    }

    /// `tp` (default 1) and `pp` (default: the node count), which must split
    /// evenly over the nodes.
    fn parallel_sizes(
        &self,
        l: &Launch,
        engine: Engine,
        nnodes: u32,
    ) -> Result<(u32, u32), LaunchError> {
        let tp = l.tp.as_ref().map_or(1, |t| t.v);
        let pp = l.pp.as_ref().map_or(nnodes, |p| p.v);
        if engine != Engine::Custom && (tp * pp) % nnodes != 0 {
            let at = l.tp.as_ref().or(l.pp.as_ref()).map_or(l.header, |v| v.at);
            return Err(self.err(
                at,
                format!(
                    "tp × pp = {tp} × {pp} = {} GPUs do not split evenly over {nnodes} nodes; every node runs (tp × pp) / {nnodes} of them, so make tp × pp a multiple of {nnodes} (e.g. tp = GPUs per node and pp = {nnodes})",
                    tp * pp
                ),
            ));
        }
        Ok((tp, pp))
    }

    /// The two ports the head listens on must differ.
    fn head_ports_differ(&self, l: &Launch, engine: Engine) -> Result<(), LaunchError> {
        let used: &[(&str, u16)] = match engine {
            Engine::Vllm => &[("master_port", l.ports.master), ("api_port", l.ports.api)],
            Engine::VllmRay => &[("ray_port", l.ports.ray), ("api_port", l.ports.api)],
            Engine::Sglang => &[("dist_port", l.ports.dist), ("api_port", l.ports.api)],
            Engine::Custom => &[],
        };
        if let [(a, pa), (b, pb)] = used {
            if pa == pb {
                let at = l
                    .port_at
                    .get(b)
                    .or(l.port_at.get(a))
                    .copied()
                    .unwrap_or(l.header);
                return Err(self.err(
                    at,
                    format!("{a} and {b} are both {pa}; the head listens on both, so give them different ports"),
                ));
            }
        }

        Ok(())
    }

    /// `extra_args` may not carry a flag the launcher sets itself.
    fn no_managed_flags(&self, l: &Launch, engine: Engine) -> Result<(), LaunchError> {
        for arg in &l.extra_args {
            if let Some((flag, fix)) = managed_flag(engine, &arg.v) {
                return Err(self.err(
                    arg.at,
                    format!("extra_args has {flag}, which xfer-launch sets itself; {fix}"),
                ));
            }
        }

        Ok(())
    }
}

/// A flag of `extra_args` that the launcher sets itself, and the fix.
fn managed_flag(engine: Engine, arg: &str) -> Option<(&'static str, &'static str)> {
    const TP: &str = "set tp = N in [launch] instead";
    const PP: &str = "set pp = N in [launch] instead";
    const NODES: &str = "it follows from the launch nodes and the head";
    const API: &str = "set api_port in [launch] instead";
    const MODEL: &str = "set model in [launch] instead";
    const BACKEND: &str = "choose engine = \"vllm\" (multiprocess) or \"vllm-ray\" instead";
    let vllm: &[(&str, &str)] = &[
        ("--tensor-parallel-size", TP),
        ("-tp", TP),
        ("--pipeline-parallel-size", PP),
        ("-pp", PP),
        ("--nnodes", NODES),
        ("--node-rank", NODES),
        ("--master-addr", NODES),
        ("--master-port", "set master_port in [launch] instead"),
        ("--headless", NODES),
        ("--distributed-executor-backend", BACKEND),
        ("--port", API),
        ("--model", MODEL),
    ];
    let sglang: &[(&str, &str)] = &[
        ("--tp", TP),
        ("--tp-size", TP),
        ("--tensor-parallel-size", TP),
        ("--pp-size", PP),
        ("--pipeline-parallel-size", PP),
        ("--nnodes", NODES),
        ("--node-rank", NODES),
        (
            "--dist-init-addr",
            "set dist_port in [launch]; the address is the head's fabric_ip",
        ),
        ("--port", API),
        ("--model-path", MODEL),
        ("--model", MODEL),
    ];
    let flags = match engine {
        Engine::Vllm | Engine::VllmRay => vllm,
        Engine::Sglang => sglang,
        Engine::Custom => return None,
    };
    // Both engines accept `--a_b` for `--a-b` and `--flag=value`.
    let name = arg.split_once('=').map_or(arg, |(n, _)| n);
    let name = if name.starts_with("--") {
        name.replace('_', "-")
    } else {
        name.to_string()
    };
    flags
        .iter()
        .find(|(f, _)| *f == name)
        .map(|(f, fix)| (*f, *fix))
}
