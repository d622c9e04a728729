//! The launch plan: the exact commands and environment of every rank,
//! rendered from a [`Setup`] by pure functions, so `xfer-launch plan` (the
//! dry run) and the launcher show and run the same thing.
//!
//! Every rank's environment pins it to its own fabric, from its own
//! `[[node]]` (cross-wired boxes have different interface names):
//!
//! - `VLLM_HOST_IP` (vLLM) or `SGLANG_HOST_IP` (SGLang; the custom engine
//!   gets both): the node's `fabric_ip`, the address the engine advertises
//!   to the other ranks.
//! - `NCCL_SOCKET_IFNAME==IF`: NCCL reads the value as a list of name
//!   prefixes; the leading `=` makes it the exact interface.
//! - `GLOO_SOCKET_IFNAME=IF`: Gloo (torch's CPU process groups) compares
//!   the value with each interface name as is (`strcmp` in
//!   `gloo/transport/tcp/device.cc`), so it is already exact, and a leading
//!   `=` would name an interface that does not exist ("Unable to find
//!   address for: =IF").
//! - `NCCL_IB_HCA==DEV` and `NCCL_IB_GID_INDEX=N` only on nodes with an
//!   `rdma_device` (the GID index only when one is set).
//! - `HF_HUB_OFFLINE=1`: the weights are on the node already.
//! - `RAY_memory_monitor_refresh_ms=0` with vllm-ray (Ray's memory killer
//!   off). Ray workers inherit the environment of `ray start`, not of the
//!   head's shell, so the whole environment goes on every node's `ray start`.
//! - with `[launch] caches`, each kind's variable (`VLLM_CACHE_ROOT`,
//!   `TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`,
//!   `FLASHINFER_WORKSPACE_BASE`) at the live cache under the node's root
//!   ([`crate::caches`]).
//! - then `[launch.env]`.
//!
//! With `[launch] image` the commands are the same: each agent runs every
//! one inside the image ([`PlanContainer`]), which `xfer-launch plan`
//! says in one line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use serde::Serialize;

use xfer_proto::launch::GpuAccess;
use xfer_proto::units::Bytes;

use crate::config::{Engine, Piece, RankNode, Setup, Var};

/// Arguments of any displayable types, as strings.
macro_rules! argv {
    ($($x:expr),* $(,)?) => { vec![$($x.to_string()),*] };
}

/// What a rank does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Rank 0: the rendezvous address and the API server.
    Head,
    /// Every other rank.
    Worker,
}

/// One node's part of the launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RankPlan {
    /// The node's name.
    pub node: String,
    /// Its rank, 0 on the head.
    pub rank: usize,
    /// Head or worker.
    pub role: Role,
    /// Its fabric interface.
    pub fabric_if: String,
    /// Its address on the fabric.
    pub fabric_ip: String,
    /// The environment of every command below (added to the inherited one).
    pub env: BTreeMap<String, String>,
    /// Commands run to completion before `argv`, in order (e.g. `ray start`,
    /// which starts Ray's daemons and returns).
    pub pre: Vec<Vec<String>>,
    /// The long-running engine process; empty when the node runs none of
    /// its own (vllm-ray workers: Ray starts vLLM's workers there).
    pub argv: Vec<String>,
}

/// The image every rank runs in (`[launch] image`): each agent runs the
/// rank's commands in it, with host network and IPC, the GPUs passed
/// through, and the model's folder mounted read-only at the same path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanContainer {
    /// The image reference.
    pub image: String,
    /// `"all"`, `"none"`, or the devices passed with `--device`.
    #[serde(serialize_with = "gpus_json")]
    pub gpus: GpuAccess,
    /// `--shm-size`, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_bytes: Option<u64>,
}

fn gpus_json<S: serde::Serializer>(g: &GpuAccess, s: S) -> Result<S::Ok, S::Error> {
    match g {
        GpuAccess::None => s.serialize_str("none"),
        GpuAccess::All => s.serialize_str("all"),
        GpuAccess::Devices(d) => d.serialize(s),
    }
}

impl PlanContainer {
    /// The one line `xfer-launch plan` prints of it.
    pub fn describe(&self) -> String {
        let gpus = match &self.gpus {
            GpuAccess::None => "no gpus".to_string(),
            GpuAccess::All => "gpus all".to_string(),
            GpuAccess::Devices(d) => format!("devices {}", d.join(" ")),
        };
        let shm = self
            .shm_bytes
            .map(|b| format!(", shm {}", Bytes(b)))
            .unwrap_or_default();
        format!(
            "in image {} (each agent's docker or podman: host network and IPC, {gpus}{shm}, model mounted read-only); the commands below run inside it",
            self.image
        )
    }
}

/// What the launch runs, everywhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanBody {
    /// Which engine runs.
    pub engine: Engine,
    /// The model path every node loads; may hold `<COMMIT>`.
    pub model: String,
    /// Tensor-parallel size.
    pub tp: u32,
    /// Pipeline-parallel size.
    pub pp: u32,
    /// How many nodes launch.
    pub nnodes: usize,
    /// The head's name.
    pub head: String,
    /// The head's fabric address.
    pub head_ip: String,
    /// Where the head serves the OpenAI-compatible API.
    pub api_port: u16,
    /// What to know before running it (an unresolved model commit...).
    pub notes: Vec<String>,
    /// The image every rank runs in; absent: on the host (and absent
    /// from the JSON, so a plan without an image keeps its digest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<PlanContainer>,
    /// In rank order; `ranks[0]` is the head.
    pub ranks: Vec<RankPlan>,
}

/// The plan and its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// What runs.
    #[serde(flatten)]
    pub body: PlanBody,
    /// BLAKE3 (hex) of the body's JSON: serde_json's compact form of
    /// [`PlanBody`], fields in declaration order, maps sorted by key. Equal
    /// plans have equal digests, whatever order the file lists things in.
    pub digest: String,
}

impl std::ops::Deref for Plan {
    type Target = PlanBody;
    fn deref(&self) -> &PlanBody {
        &self.body
    }
}

/// Renders the plan of `setup`.
pub fn plan(setup: &Setup) -> Plan {
    let head = &setup.nodes[0];
    let ranks: Vec<RankPlan> = setup
        .nodes
        .iter()
        .enumerate()
        .map(|(rank, node)| rank_plan(setup, rank, node))
        .collect();
    let mut notes = Vec::new();
    if let Some(n) = &setup.model.unresolved {
        notes.push(n.clone());
    }
    let body = PlanBody {
        engine: setup.engine,
        model: setup.model.path.clone(),
        tp: setup.tp,
        pp: setup.pp,
        nnodes: setup.nodes.len(),
        head: head.name.clone(),
        head_ip: head.fabric_ip.to_string(),
        api_port: setup.ports.api,
        notes,
        container: setup.container.as_ref().map(|c| PlanContainer {
            image: c.image.clone(),
            gpus: c.gpus.clone(),
            shm_bytes: c.shm_bytes,
        }),
        ranks,
    };
    let digest = digest(&body);
    Plan { body, digest }
}

/// BLAKE3 of the canonical JSON of `body`.
pub fn digest(body: &PlanBody) -> String {
    let json = serde_json::to_vec(body).expect("a plan always serializes");
    blake3::hash(&json).to_hex().to_string()
}

/// `--served-model-name` for a model named by a Hub repo, unless the
/// operator's `extra_args` give one: clients ask for `org/name`, as they
/// typed it, not for the snapshot's path. vLLM answers to every name it is
/// given, so the path (what it served before) goes second; SGLang takes one.
fn served_names(setup: &Setup, and_path: bool) -> Vec<String> {
    let Some(repo) = &setup.model.repo else {
        return Vec::new();
    };
    if setup
        .extra_args
        .iter()
        .any(|a| a == "--served-model-name" || a.starts_with("--served-model-name="))
    {
        return Vec::new();
    }
    let mut a = vec!["--served-model-name".to_string(), repo.id.clone()];
    if and_path {
        a.push(setup.model.path.clone());
    }
    a
}

fn rank_plan(setup: &Setup, rank: usize, node: &RankNode) -> RankPlan {
    let head = &setup.nodes[0];
    let role = if rank == 0 { Role::Head } else { Role::Worker };
    let nnodes = setup.nodes.len();
    let model = setup.model.path.clone();
    let (pre, argv): (Vec<Vec<String>>, Vec<String>) = match setup.engine {
        Engine::Vllm => {
            let mut a = argv!["vllm", "serve"];
            a.push(model);
            a.extend(argv![
                "--tensor-parallel-size",
                setup.tp,
                "--pipeline-parallel-size",
                setup.pp,
                "--nnodes",
                nnodes,
                "--node-rank",
                rank,
                "--master-addr",
                head.fabric_ip,
                "--master-port",
                setup.ports.master,
            ]);
            match role {
                Role::Head => {
                    a.extend(argv!["--port", setup.ports.api]);
                    a.extend(served_names(setup, true));
                }
                Role::Worker => a.push("--headless".into()),
            }
            if setup.stream_weights {
                // The loader plugin's format (launcher/python/xfer_vllm_loader).
                a.extend(argv!["--load-format", "xfer"]);
            }
            a.extend(setup.extra_args.iter().cloned());
            (Vec::new(), a)
        }
        Engine::VllmRay => {
            let ray = match role {
                Role::Head => argv![
                    "ray",
                    "start",
                    "--block",
                    "--head",
                    "--node-ip-address",
                    node.fabric_ip,
                    "--port",
                    setup.ports.ray,
                ],
                Role::Worker => argv![
                    "ray",
                    "start",
                    "--block",
                    "--address",
                    host_port(head.fabric_ip, setup.ports.ray),
                    "--node-ip-address",
                    node.fabric_ip,
                ],
            };
            let argv = match role {
                Role::Head => {
                    let mut a = argv!["vllm", "serve"];
                    a.push(model);
                    a.extend(argv![
                        "--tensor-parallel-size",
                        setup.tp,
                        "--pipeline-parallel-size",
                        setup.pp,
                        "--distributed-executor-backend",
                        "ray",
                        "--port",
                        setup.ports.api,
                    ]);
                    a.extend(served_names(setup, true));
                    a.extend(setup.extra_args.iter().cloned());
                    a
                }
                Role::Worker => Vec::new(),
            };
            (vec![ray], argv)
        }
        Engine::Sglang => {
            let mut a = argv!["python", "-m", "sglang.launch_server", "--model-path"];
            a.push(model);
            a.extend(argv!["--tp-size", setup.tp]);
            // Left out at 1 so the common TP-only launch is exactly the
            // documented command (and older SGLang without --pp-size runs it).
            if setup.pp > 1 {
                a.extend(argv!["--pp-size", setup.pp]);
            }
            a.extend(argv![
                "--nnodes",
                nnodes,
                "--node-rank",
                rank,
                "--dist-init-addr",
                host_port(head.fabric_ip, setup.ports.dist),
                // SGLang's API listens on 127.0.0.1 unless told otherwise
                // (vLLM's on every address): open it to the network, like vLLM's.
                "--host",
                "0.0.0.0",
                "--port",
                setup.ports.api,
            ]);
            if rank == 0 {
                a.extend(served_names(setup, false));
            }
            a.extend(setup.extra_args.iter().cloned());
            (Vec::new(), a)
        }
        Engine::Custom => {
            let template = setup
                .template
                .as_ref()
                .expect("config gives a custom engine its template");
            let mut a: Vec<String> = template
                .words
                .iter()
                .map(|word| {
                    word.iter()
                        .map(|p| match p {
                            Piece::Lit(l) => l.clone(),
                            Piece::Var(v) => var_value(setup, rank, node, *v),
                        })
                        .collect()
                })
                .collect();
            a.extend(setup.extra_args.iter().cloned());
            (Vec::new(), a)
        }
    };
    RankPlan {
        node: node.name.clone(),
        rank,
        role,
        fabric_if: node.fabric_if.clone(),
        fabric_ip: node.fabric_ip.to_string(),
        env: rank_env(setup, node),
        pre,
        argv,
    }
}

/// `IP:PORT`, with brackets around an IPv6 address.
fn host_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

fn var_value(setup: &Setup, rank: usize, node: &RankNode, v: Var) -> String {
    let head = &setup.nodes[0];
    match v {
        Var::Rank => rank.to_string(),
        Var::Nnodes => setup.nodes.len().to_string(),
        Var::HeadIp => head.fabric_ip.to_string(),
        Var::FabricIp => node.fabric_ip.to_string(),
        Var::FabricIf => node.fabric_if.clone(),
        Var::Model => setup.model.path.clone(),
        Var::MasterPort => setup.ports.master.to_string(),
        Var::ApiPort => setup.ports.api.to_string(),
        Var::RayPort => setup.ports.ray.to_string(),
        Var::DistPort => setup.ports.dist.to_string(),
        Var::Tp => setup.tp.to_string(),
        Var::Pp => setup.pp.to_string(),
        Var::Node => node.name.clone(),
        Var::Head => head.name.clone(),
    }
}

/// The environment of one rank (see the module docs for why each).
pub fn rank_env(setup: &Setup, node: &RankNode) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    let ip = node.fabric_ip.to_string();
    match setup.engine {
        Engine::Vllm | Engine::VllmRay => set("VLLM_HOST_IP", ip),
        Engine::Sglang => set("SGLANG_HOST_IP", ip),
        Engine::Custom => {
            set("VLLM_HOST_IP", ip.clone());
            set("SGLANG_HOST_IP", ip);
        }
    }
    set("NCCL_SOCKET_IFNAME", format!("={}", node.fabric_if));
    set("GLOO_SOCKET_IFNAME", node.fabric_if.clone());
    if let Some(rdma) = &node.rdma {
        set("NCCL_IB_HCA", format!("={}", rdma.device));
        if let Some(g) = rdma.gid_index {
            set("NCCL_IB_GID_INDEX", g.to_string());
        }
    }
    set("HF_HUB_OFFLINE", "1".into());
    if setup.engine == Engine::VllmRay {
        set("RAY_memory_monitor_refresh_ms", "0".into());
    }
    for (kind, var, dir) in crate::caches::live_dirs(setup, node) {
        let _ = kind;
        set(var, dir.display().to_string());
    }
    for (k, v) in &setup.env {
        set(k, v.clone());
    }
    env
}

/// `s` as one POSIX shell word: as is when it holds only characters no
/// shell treats specially, else in single quotes.
pub fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// One command as a shell line: `env K=V ... ARGV`, continued over lines
/// with `\` (each variable, then each `--flag [value...]`, on its own).
pub fn command_line(env: &BTreeMap<String, String>, argv: &[String]) -> String {
    let mut out = String::from("env");
    for (k, v) in env {
        let _ = write!(out, " \\\n  {k}={}", quote(v));
    }
    let mut first = true;
    for (i, a) in argv.iter().enumerate() {
        if first {
            out.push_str(" \\\n  ");
            first = false;
        } else if a.starts_with('-') && i > 0 {
            out.push_str(" \\\n    ");
        } else {
            out.push(' ');
        }
        out.push_str(&quote(a));
    }
    out
}

/// The plan as `xfer-launch plan` prints it: a header saying what runs
/// where and in which order, then one block per node with its commands
/// ready to paste into a shell on that node.
pub fn render_text(plan: &Plan) -> String {
    let mut o = String::new();
    let nodes: Vec<&str> = plan.ranks.iter().map(|r| r.node.as_str()).collect();
    let _ = writeln!(
        o,
        "# xfer-launch plan: {} on {} node(s) ({}), tp {} x pp {}, head {} ({})",
        plan.engine,
        plan.nnodes,
        nodes.join(", "),
        plan.tp,
        plan.pp,
        plan.head,
        plan.head_ip
    );
    let _ = writeln!(o, "# model: {}", plan.model);
    let _ = writeln!(o, "# digest: {}", plan.digest);
    let order = match plan.engine {
        Engine::Vllm => format!(
            "run every block, one per node; rank 0 ({}) serves the API on port {}, the others run --headless",
            plan.head, plan.api_port
        ),
        Engine::VllmRay => format!(
            "run `ray start` on {} first, then on the other nodes; once `ray status` on {} lists {} node(s), run `vllm serve` on {} (API on port {})",
            plan.head, plan.head, plan.nnodes, plan.head, plan.api_port
        ),
        Engine::Sglang => format!(
            "run every block, one per node; rank 0 ({}) serves the API on port {} (probe /health there only)",
            plan.head, plan.api_port
        ),
        Engine::Custom => "run every block, one per node".to_string(),
    };
    let _ = writeln!(o, "# order: {order}");
    if let Some(c) = &plan.container {
        let _ = writeln!(o, "# {}", c.describe());
    }
    for n in &plan.notes {
        let _ = writeln!(o, "# NOTE: {n}");
    }
    for r in &plan.ranks {
        let role = match r.role {
            Role::Head => "head",
            Role::Worker => "worker",
        };
        let _ = writeln!(
            o,
            "\n# --- {}: rank {} of {}, {role}, fabric {} {} ---",
            r.node, r.rank, plan.nnodes, r.fabric_if, r.fabric_ip
        );
        for p in &r.pre {
            // `ray start --block` stays in the foreground: background it.
            let _ = writeln!(o, "{} &", command_line(&r.env, p));
        }
        if r.argv.is_empty() {
            let _ = writeln!(
                o,
                "# no engine process of its own: vLLM's workers run here under Ray"
            );
        } else {
            let _ = writeln!(o, "{}", command_line(&r.env, &r.argv));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{file, setup, COMMIT, TWO_NODES};
    use crate::config::{self};

    fn plan_of(launch: &str) -> Plan {
        plan(&setup(launch))
    }

    fn v(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// spark-a's fabric, RDMA included, plus `more`.
    fn env_a(more: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut e = env(&[
            ("NCCL_SOCKET_IFNAME", "=enp1s0f1np1"),
            ("GLOO_SOCKET_IFNAME", "enp1s0f1np1"),
            ("NCCL_IB_HCA", "=rocep1s0f1"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("HF_HUB_OFFLINE", "1"),
        ]);
        e.extend(env(more));
        e
    }

    /// spark-b's: another interface, device and GID index.
    fn env_b(more: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut e = env(&[
            ("NCCL_SOCKET_IFNAME", "=enp1s0f0np0"),
            ("GLOO_SOCKET_IFNAME", "enp1s0f0np0"),
            ("NCCL_IB_HCA", "=rocep1s0f0"),
            ("NCCL_IB_GID_INDEX", "1"),
            ("HF_HUB_OFFLINE", "1"),
        ]);
        e.extend(env(more));
        e
    }

    #[test]
    fn vllm_multiprocess_runs_every_rank_headless_off_the_head() {
        let p = plan_of("engine = \"vllm\"\nmodel = \"/models/qwen3-8b\"\ntp = 2\npp = 1");
        assert_eq!(
            (p.nnodes, p.head.as_str(), p.head_ip.as_str()),
            (2, "spark-a", "192.168.100.1")
        );
        let (a, b) = (&p.ranks[0], &p.ranks[1]);
        assert_eq!(
            (a.node.as_str(), a.rank, a.role),
            ("spark-a", 0, Role::Head)
        );
        assert_eq!(
            (b.node.as_str(), b.rank, b.role),
            ("spark-b", 1, Role::Worker)
        );
        assert_eq!(
            a.argv,
            v(&[
                "vllm",
                "serve",
                "/models/qwen3-8b",
                "--tensor-parallel-size",
                "2",
                "--pipeline-parallel-size",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--master-addr",
                "192.168.100.1",
                "--master-port",
                "29500",
                "--port",
                "8000",
            ])
        );
        assert_eq!(
            b.argv,
            v(&[
                "vllm",
                "serve",
                "/models/qwen3-8b",
                "--tensor-parallel-size",
                "2",
                "--pipeline-parallel-size",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--master-addr",
                "192.168.100.1",
                "--master-port",
                "29500",
                "--headless",
            ])
        );
        assert_eq!(a.env, env_a(&[("VLLM_HOST_IP", "192.168.100.1")]));
        assert_eq!(b.env, env_b(&[("VLLM_HOST_IP", "192.168.100.2")]));
        assert!(a.pre.is_empty() && b.pre.is_empty());
        assert!(!a.argv.contains(&"--headless".to_string()));
        assert!(p.notes.is_empty());
    }

    #[test]
    fn the_head_can_be_any_node_and_is_rank_0() {
        let p = plan_of("engine = \"vllm\"\nmodel = \"/m\"\nhead = \"spark-b\"");
        let (b, a) = (&p.ranks[0], &p.ranks[1]);
        assert_eq!(
            (b.node.as_str(), b.rank, b.role),
            ("spark-b", 0, Role::Head)
        );
        assert_eq!(
            (a.node.as_str(), a.rank, a.role),
            ("spark-a", 1, Role::Worker)
        );
        for r in &p.ranks {
            let i = r.argv.iter().position(|x| x == "--master-addr").unwrap();
            assert_eq!(r.argv[i + 1], "192.168.100.2");
        }
        assert!(a.argv.ends_with(&v(&["--headless"])));
        assert!(b.argv.ends_with(&v(&["--port", "8000"])));
        assert_eq!(b.env["VLLM_HOST_IP"], "192.168.100.2");
        assert_eq!(a.env["VLLM_HOST_IP"], "192.168.100.1");
    }

    #[test]
    fn a_model_named_by_its_repo_is_served_under_that_name_unless_extra_args_say() {
        let p = plan_of("engine = \"vllm\"\nmodel = \"acme/big-model\"\ntp = 1\npp = 2");
        let (head, worker) = (&p.ranks[0], &p.ranks[1]);
        let i = head
            .argv
            .iter()
            .position(|x| x == "--served-model-name")
            .expect("the head names the model");
        assert_eq!(head.argv[i + 1], "acme/big-model");
        assert!(head.argv[i + 2].contains("models--acme--big-model/snapshots/"));
        assert!(!worker.argv.iter().any(|x| x == "--served-model-name"));
        let own = plan_of(
            "engine = \"vllm\"\nmodel = \"acme/big-model\"\ntp = 1\npp = 2\nextra_args = [\"--served-model-name\", \"mine\"]",
        );
        let n = own.ranks[0]
            .argv
            .iter()
            .filter(|x| *x == "--served-model-name")
            .count();
        assert_eq!(n, 1, "the operator's name wins: {:?}", own.ranks[0].argv);
        let path = plan_of("engine = \"vllm\"\nmodel = \"/m\"\ntp = 1\npp = 2");
        assert!(!path.ranks[0]
            .argv
            .iter()
            .any(|x| x == "--served-model-name"));
        let sglang = plan_of("engine = \"sglang\"\nmodel = \"acme/big-model\"\ntp = 1\npp = 2");
        let a = &sglang.ranks[0].argv;
        let i = a.iter().position(|x| x == "--served-model-name").unwrap();
        assert_eq!(&a[i + 1..i + 2], ["acme/big-model"]);
    }

    #[test]
    fn vllm_ray_starts_ray_everywhere_and_serves_on_the_head_only() {
        let p = plan_of(&format!(
            "engine = \"vllm-ray\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\ntp = 1\npp = 2"
        ));
        let model = format!("/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/{COMMIT}");
        let (a, b) = (&p.ranks[0], &p.ranks[1]);
        assert_eq!(
            a.pre,
            [v(&[
                "ray",
                "start",
                "--block",
                "--head",
                "--node-ip-address",
                "192.168.100.1",
                "--port",
                "6379"
            ])]
        );
        assert_eq!(
            b.pre,
            [v(&[
                "ray",
                "start",
                "--block",
                "--address",
                "192.168.100.1:6379",
                "--node-ip-address",
                "192.168.100.2"
            ])]
        );
        assert_eq!(
            a.argv,
            v(&[
                "vllm",
                "serve",
                &model,
                "--tensor-parallel-size",
                "1",
                "--pipeline-parallel-size",
                "2",
                "--distributed-executor-backend",
                "ray",
                "--port",
                "8000",
                "--served-model-name",
                "Qwen/Qwen3-8B",
                &model,
            ])
        );
        assert!(
            b.argv.is_empty(),
            "no vllm serve off the head: {:?}",
            b.argv
        );
        // Ray workers inherit `ray start`'s environment: all of it, everywhere.
        assert_eq!(
            a.env,
            env_a(&[
                ("VLLM_HOST_IP", "192.168.100.1"),
                ("RAY_memory_monitor_refresh_ms", "0")
            ])
        );
        assert_eq!(
            b.env,
            env_b(&[
                ("VLLM_HOST_IP", "192.168.100.2"),
                ("RAY_memory_monitor_refresh_ms", "0")
            ])
        );
        let text = render_text(&p);
        assert!(text.contains("run `ray start` on spark-a first"), "{text}");
        assert!(text.contains("# no engine process of its own"), "{text}");
    }

    #[test]
    fn sglang_pins_its_host_ip_on_every_rank() {
        let p = plan_of("engine = \"sglang\"\nmodel = \"/models/qwen3-8b\"\ntp = 2\npp = 1");
        for (r, ip) in p.ranks.iter().zip(["192.168.100.1", "192.168.100.2"]) {
            assert_eq!(
                r.argv,
                v(&[
                    "python",
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    "/models/qwen3-8b",
                    "--tp-size",
                    "2",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    &r.rank.to_string(),
                    "--dist-init-addr",
                    "192.168.100.1:20000",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    "8000",
                ])
            );
            assert_eq!(r.env["SGLANG_HOST_IP"], ip);
            assert!(!r.env.contains_key("VLLM_HOST_IP"));
        }
        assert_eq!(
            p.ranks[0].env,
            env_a(&[("SGLANG_HOST_IP", "192.168.100.1")])
        );
        assert_eq!(
            p.ranks[1].env,
            env_b(&[("SGLANG_HOST_IP", "192.168.100.2")])
        );
        // Pipeline parallel across the nodes adds --pp-size.
        let p = plan_of("engine = \"sglang\"\nmodel = \"/m\"");
        let a = &p.ranks[0].argv;
        assert_eq!(a[5..9], v(&["--tp-size", "1", "--pp-size", "2"]));
    }

    #[test]
    fn a_custom_template_gets_each_ranks_values() {
        let p = plan_of(
            r#"engine = "custom"
model = "/models/q"
tp = 2
pp = 1
api_port = 9000
template = "docker run --rm --network host -e RANK={rank} -e 'WHO={node} of {nnodes}' img:1 serve {model} --master {head_ip}:{master_port} --bind {fabric_ip} --if {fabric_if} --tp {tp} --pp {pp} --api {api_port} --ray {ray_port} --dist {dist_port} --head {head} --lit {{x}}"
extra_args = ["--verbose"]"#,
        );
        let want = |rank: &str, node: &str, ip: &str, ifname: &str| {
            v(&[
                "docker",
                "run",
                "--rm",
                "--network",
                "host",
                "-e",
                &format!("RANK={rank}"),
                "-e",
                &format!("WHO={node} of 2"),
                "img:1",
                "serve",
                "/models/q",
                "--master",
                "192.168.100.1:29500",
                "--bind",
                ip,
                "--if",
                ifname,
                "--tp",
                "2",
                "--pp",
                "1",
                "--api",
                "9000",
                "--ray",
                "6379",
                "--dist",
                "20000",
                "--head",
                "spark-a",
                "--lit",
                "{x}",
                "--verbose",
            ])
        };
        assert_eq!(
            p.ranks[0].argv,
            want("0", "spark-a", "192.168.100.1", "enp1s0f1np1")
        );
        assert_eq!(
            p.ranks[1].argv,
            want("1", "spark-b", "192.168.100.2", "enp1s0f0np0")
        );
        assert_eq!(
            p.ranks[1].env,
            env_b(&[
                ("VLLM_HOST_IP", "192.168.100.2"),
                ("SGLANG_HOST_IP", "192.168.100.2")
            ])
        );
        // A value with blanks stays one word.
        let p = plan_of("engine = \"custom\"\nmodel = \"/models/my model\"\ntemplate = [\"run\", \"--m={model}\"]");
        assert_eq!(p.ranks[0].argv, v(&["run", "--m=/models/my model"]));
    }

    #[test]
    fn rdma_variables_only_where_rdma_is_configured() {
        // spark-b without RDMA; spark-a with a device but no GID index.
        let text = file("engine = \"vllm\"\nmodel = \"/m\"")
            .replace("gid_index = 3\n", "")
            .replace("rdma_device = \"rocep1s0f0\"\ngid_index = 1\n", "");
        let p = plan(&config::parse(&text, "cluster.toml").unwrap());
        let (a, b) = (&p.ranks[0].env, &p.ranks[1].env);
        assert_eq!(
            a.get("NCCL_IB_HCA").map(String::as_str),
            Some("=rocep1s0f1")
        );
        assert!(!a.contains_key("NCCL_IB_GID_INDEX"), "{a:?}");
        assert!(
            !b.contains_key("NCCL_IB_HCA") && !b.contains_key("NCCL_IB_GID_INDEX"),
            "{b:?}"
        );
        assert_eq!(
            *b,
            env(&[
                ("NCCL_SOCKET_IFNAME", "=enp1s0f0np0"),
                ("GLOO_SOCKET_IFNAME", "enp1s0f0np0"),
                ("HF_HUB_OFFLINE", "1"),
                ("VLLM_HOST_IP", "192.168.100.2"),
            ])
        );
    }

    #[test]
    fn extra_args_and_env_pass_through() {
        let extra = "extra_args = [\"--max-model-len\", \"32768\", \"--enforce-eager\"]\nenv = { NCCL_DEBUG = \"INFO\" }";
        let tail = v(&["--max-model-len", "32768", "--enforce-eager"]);
        for engine in ["vllm", "sglang"] {
            let p = plan_of(&format!("engine = \"{engine}\"\nmodel = \"/m\"\n{extra}"));
            for r in &p.ranks {
                assert!(r.argv.ends_with(&tail), "{engine}: {:?}", r.argv);
                assert_eq!(r.env["NCCL_DEBUG"], "INFO");
            }
        }
        let p = plan_of(&format!("engine = \"vllm-ray\"\nmodel = \"/m\"\n{extra}"));
        assert!(p.ranks[0].argv.ends_with(&tail));
        for r in &p.ranks {
            assert!(
                !r.pre[0].contains(&"--enforce-eager".to_string()),
                "not for ray start"
            );
            assert_eq!(r.env["NCCL_DEBUG"], "INFO", "on every node's ray start");
        }
    }

    #[test]
    fn the_digest_is_stable_and_follows_what_runs() {
        let launch = "engine = \"vllm\"\nmodel = \"/m\"\ntp = 1\npp = 2\nextra_args = [\"--enforce-eager\"]\nenv = { B = \"2\", A = \"1\" }";
        let p1 = plan_of(launch);
        let p2 = plan_of(launch);
        assert_eq!(p1, p2);
        assert_eq!(p1.digest.len(), 64);
        // The digest covers the JSON without the digest itself.
        assert_eq!(
            p1.digest,
            blake3::hash(&serde_json::to_vec(&p1.body).unwrap())
                .to_hex()
                .to_string()
        );
        // The same launch written in another order is the same plan.
        let reordered = "env = { A = \"1\", B = \"2\" }\npp = 2\nextra_args = [\"--enforce-eager\"]\ntp = 1\nmodel = \"/m\"\nengine = \"vllm\"";
        assert_eq!(plan_of(reordered).digest, p1.digest);
        // Anything that changes what runs changes it.
        for other in [
            launch.replace("tp = 1\npp = 2", "tp = 2\npp = 2"),
            launch.replace("\"2\"", "\"3\""),
            launch.replace("--enforce-eager", "--enforce_eager"),
            launch.replace("model = \"/m\"", "model = \"/n\""),
            format!("{launch}\nhead = \"spark-b\""),
        ] {
            assert_ne!(plan_of(&other).digest, p1.digest, "{other}");
        }
        let moved = file(launch).replace(
            "fabric_ip = \"192.168.100.2\"",
            "fabric_ip = \"192.168.100.3\"",
        );
        assert_ne!(
            plan(&config::parse(&moved, "c.toml").unwrap()).digest,
            p1.digest
        );
        // The JSON form carries it next to the plan.
        let json: serde_json::Value = serde_json::to_value(&p1).unwrap();
        assert_eq!(json["digest"], p1.digest.as_str());
        assert_eq!(json["engine"], "vllm");
        assert_eq!(json["ranks"][1]["role"], "worker");
        assert_eq!(json["ranks"][1]["argv"][0], "vllm");
    }

    #[test]
    fn a_plan_in_an_image_says_so_in_one_line_and_in_its_json() {
        let host = plan_of("engine = \"vllm\"\nmodel = \"/m\"");
        let p = plan_of(
            "engine = \"vllm\"\nmodel = \"/m\"\nimage = \"xt/app:1\"\nshm_size = \"16GiB\"",
        );
        // The commands are the engine's own; the agents wrap them.
        assert_eq!(p.ranks, host.ranks);
        assert_ne!(p.digest, host.digest, "the image is part of what runs");
        let text = render_text(&p);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("in image")).collect();
        assert_eq!(
            lines,
            ["# in image xt/app:1 (each agent's docker or podman: host network and IPC, gpus all, shm 16.0 GiB, model mounted read-only); the commands below run inside it"]
        );
        assert!(!render_text(&host).contains("in image"));
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(
            json["container"],
            serde_json::json!({ "image": "xt/app:1", "gpus": "all", "shm_bytes": 17179869184u64 })
        );
        // Without an image the JSON (and so the digest) is as before.
        assert!(serde_json::to_value(&host)
            .unwrap()
            .get("container")
            .is_none());
        let p = plan_of("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"xt/app:1\"\ngpus = [\"/dev/nvidia0\", \"/dev/nvidia1\"]");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(
            json["container"],
            serde_json::json!({ "image": "xt/app:1", "gpus": ["/dev/nvidia0", "/dev/nvidia1"] })
        );
        assert!(render_text(&p).contains("(each agent's docker or podman: host network and IPC, devices /dev/nvidia0 /dev/nvidia1, model mounted read-only)"));
        let p = plan_of("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"xt/app:1\"\ngpus = \"none\"");
        assert_eq!(
            serde_json::to_value(&p).unwrap()["container"]["gpus"],
            "none"
        );
        assert!(render_text(&p).contains("host network and IPC, no gpus, model"));
    }

    #[test]
    fn ipv6_fabric_addresses_are_bracketed_with_ports() {
        let text = TWO_NODES
            .replace("192.168.100.1", "fd00::1")
            .replace("192.168.100.2", "fd00::2");
        for (engine, want) in [
            ("vllm-ray", "[fd00::1]:6379"),
            ("sglang", "[fd00::1]:20000"),
        ] {
            let t = format!("{text}\n[launch]\nengine = \"{engine}\"\nmodel = \"/m\"\n");
            let p = plan(&config::parse(&t, "c.toml").unwrap());
            let all: Vec<&String> = p.ranks[1]
                .pre
                .iter()
                .flatten()
                .chain(&p.ranks[1].argv)
                .collect();
            assert!(all.iter().any(|a| *a == want), "{engine}: {all:?}");
        }
        let t = format!("{text}\n[launch]\nengine = \"vllm\"\nmodel = \"/m\"\n");
        let p = plan(&config::parse(&t, "c.toml").unwrap());
        assert!(p.ranks[1]
            .argv
            .windows(2)
            .any(|w| w == ["--master-addr", "fd00::1"]));
    }

    #[test]
    fn quoting_survives_a_real_shell() {
        assert_eq!(quote("plain-1.2/x:y=z@a%b+c,d"), "plain-1.2/x:y=z@a%b+c,d");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("/x/<COMMIT>"), "'/x/<COMMIT>'");
        let args = v(&[
            "printf",
            "[%s]\\n",
            "a b",
            "it's",
            "$HOME",
            "`id`",
            "<x>",
            "{a,b}",
            "~",
            "*",
            "",
            "--k=v w",
            "\"q\"",
            "back\\slash",
        ]);
        let env = env(&[("XL_A", "=enp1s0"), ("XL_B", "two words; $X 'q'")]);
        let sh = |line: &str| {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(line)
                .output()
                .expect("sh runs");
            assert!(
                out.status.success(),
                "{line}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let line = command_line(&env, &args);
        let want: String = args[2..].iter().map(|a| format!("[{a}]\n")).collect();
        assert_eq!(sh(&line), want, "{line}");
        let line = command_line(
            &env,
            &v(&["sh", "-c", "printf '%s|%s' \"$XL_A\" \"$XL_B\""]),
        );
        assert_eq!(sh(&line), "=enp1s0|two words; $X 'q'", "{line}");
    }

    #[test]
    fn the_text_form_is_one_pasteable_block_per_node() {
        let p = plan_of("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B\"\ntp = 2\npp = 1");
        let text = render_text(&p);
        assert!(text.starts_with(
            "# xfer-launch plan: vllm on 2 node(s) (spark-a, spark-b), tp 2 x pp 1, head spark-a (192.168.100.1)\n"
        ));
        assert!(text.contains(&format!("\n# digest: {}\n", p.digest)));
        assert!(text.contains("# NOTE: Qwen/Qwen3-8B is at a revision (main), not a commit"));
        assert!(text.contains("\n# --- spark-b: rank 1 of 2, worker, fabric enp1s0f0np0 192.168.100.2 ---\nenv \\\n  GLOO_SOCKET_IFNAME=enp1s0f0np0 \\\n"));
        assert!(text.contains("  NCCL_SOCKET_IFNAME==enp1s0f1np1 \\\n"));
        assert!(text.contains(
            "  vllm serve '/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/<COMMIT>' \\\n    --tensor-parallel-size 2 \\\n"
        ));
        assert!(text.contains("    --headless\n"));
        // Every block is valid shell.
        let out = std::process::Command::new("sh")
            .arg("-n")
            .arg("-c")
            .arg(&text)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
