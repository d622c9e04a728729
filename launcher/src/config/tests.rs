//! The `[launch]` reader's tests, and the files and setups the other
//! modules' tests build on.

use super::*;

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Two DGX Sparks joined by one cable, cross-wired: the interface and
/// RDMA device names differ per node, and so do the GID indexes.
pub const TWO_NODES: &str = r#"key = "/etc/xfer/cluster.key"

[defaults]
root = "/var/lib/xfer/hub"
gid_index = 3

[[node]]
name = "spark-a"
agent = "10.0.0.1"
fabric_if = "enp1s0f1np1"
fabric_ip = "192.168.100.1"
rdma_device = "rocep1s0f1"

[[node]]
name = "spark-b"
agent = "10.0.0.2"
fabric_if = "enp1s0f0np0"
fabric_ip = "192.168.100.2"
rdma_device = "rocep1s0f0"
gid_index = 1
"#;

/// The two nodes and a `[launch]` table with `launch` in it.
pub fn file(launch: &str) -> String {
    format!("{TWO_NODES}\n[launch]\n{launch}\n")
}

pub fn setup(launch: &str) -> Setup {
    match parse(&file(launch), "cluster.toml") {
        Ok(s) => s,
        Err(e) => panic!("refused: {e}"),
    }
}

/// The one-line message for a file, which must be refused.
pub fn refused_file(text: &str) -> String {
    match parse(text, "cluster.toml") {
        Ok(s) => panic!("accepted: {s:?}"),
        Err(e) => e.to_string(),
    }
}

pub fn refused(launch: &str) -> String {
    refused_file(&file(launch))
}

/// The 1-based line of the first line of `text` containing `needle`.
pub fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the text"))
        + 1
}

#[test]
fn defaults_apply_and_nodes_keep_their_own_fabric() {
    let s = setup("engine = \"vllm\"\nmodel = \"/models/qwen\"");
    assert_eq!(s.engine, Engine::Vllm);
    assert_eq!((s.tp, s.pp), (1, 2), "tp 1, pp = the number of nodes");
    assert_eq!(
        s.ports,
        Ports {
            master: 29500,
            api: 8000,
            ray: 6379,
            dist: 20000
        }
    );
    assert_eq!(s.nodes.len(), 2);
    let (a, b) = (&s.nodes[0], &s.nodes[1]);
    assert_eq!(
        (a.name.as_str(), a.fabric_if.as_str()),
        ("spark-a", "enp1s0f1np1")
    );
    assert_eq!(
        (b.name.as_str(), b.fabric_if.as_str()),
        ("spark-b", "enp1s0f0np0")
    );
    assert_eq!(a.rdma.as_ref().unwrap().gid_index, Some(3));
    assert_eq!(b.rdma.as_ref().unwrap().device, "rocep1s0f0");
    assert_eq!(b.rdma.as_ref().unwrap().gid_index, Some(1));
    assert_eq!(s.model.path, "/models/qwen");
    assert_eq!(s.model.unresolved, None);
    assert!(s.extra_args.is_empty() && s.env.is_empty() && s.template.is_none());
}

#[test]
fn every_key_is_read() {
    let s = setup(
        r#"engine = "sglang"
model = "/models/qwen"
tp = 4
pp = 1
head = "spark-b"
nodes = ["spark-a", "spark-b"]
master_port = 29600
api_port = 30000
ray_port = 6380
dist_port = 20001
extra_args = ["--mem-fraction-static", 0.8, "--context-length", 8192]
env = { NCCL_DEBUG = "INFO", NCCL_IB_TIMEOUT = 22 }"#,
    );
    assert_eq!((s.engine, s.tp, s.pp), (Engine::Sglang, 4, 1));
    assert_eq!(s.nodes[0].name, "spark-b", "the head is rank 0");
    assert_eq!(s.nodes[1].name, "spark-a");
    assert_eq!(
        s.ports,
        Ports {
            master: 29600,
            api: 30000,
            ray: 6380,
            dist: 20001
        }
    );
    assert_eq!(
        s.extra_args,
        ["--mem-fraction-static", "0.8", "--context-length", "8192"]
    );
    assert_eq!(s.env["NCCL_DEBUG"], "INFO");
    assert_eq!(s.env["NCCL_IB_TIMEOUT"], "22");
}

#[test]
fn a_repo_resolves_in_the_nodes_root() {
    let path = format!("/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/{COMMIT}");
    for launch in [
        format!("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""),
        format!("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B\"\nrevision = \"{COMMIT}\""),
        format!(
            "engine = \"vllm\"\nmodel = {{ repo = \"Qwen/Qwen3-8B\", revision = \"{COMMIT}\" }}"
        ),
        format!("engine = \"vllm\"\n[launch.model]\nrepo = \"Qwen/Qwen3-8B@{COMMIT}\""),
    ] {
        let s = setup(&launch);
        assert_eq!(s.model.path, path, "{launch}");
        assert_eq!(s.model.unresolved, None, "{launch}");
    }
    let s = setup("engine = \"vllm\"\nmodel = { path = \"/srv/m\" }");
    assert_eq!(s.model.path, "/srv/m");
}

#[test]
fn a_repo_without_a_commit_keeps_a_placeholder_for_check() {
    let s = setup("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B\"");
    assert_eq!(
        s.model.path,
        "/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/<COMMIT>"
    );
    let note = s.model.unresolved.unwrap();
    assert!(note.contains("xfer-launch check"), "{note}");
    assert!(
        note.contains("/var/lib/xfer/hub/models--Qwen--Qwen3-8B/refs/main"),
        "{note}"
    );
    let s = setup("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@v1.0\"");
    assert!(s.model.path.ends_with("/snapshots/<COMMIT>"));
    assert!(s.model.unresolved.unwrap().contains("refs/v1.0"));
}

#[test]
fn a_repo_on_differing_roots_is_refused() {
    let text = file("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B\"").replace(
        "name = \"spark-b\"\n",
        "name = \"spark-b\"\nroot = \"/data/hf/hub\"\n",
    );
    let msg = refused_file(&text);
    let line = line_of(&text, "model = ");
    assert!(
        msg.starts_with(&format!("cluster.toml:{line}:9: ")),
        "{msg}"
    );
    assert!(
        msg.contains("/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/<COMMIT> on spark-a"),
        "{msg}"
    );
    assert!(
        msg.contains("/data/hf/hub/models--Qwen--Qwen3-8B/snapshots/<COMMIT> on spark-b"),
        "{msg}"
    );
    assert!(msg.contains("same root"), "{msg}");
    // An explicit path is the same everywhere by definition.
    let ok = text.replace("model = \"Qwen/Qwen3-8B\"", "model = \"/models/q\"");
    assert!(parse(&ok, "cluster.toml").is_ok());
}

#[test]
fn model_mistakes_are_refused_with_the_fix() {
    for (launch, want) in [
        ("engine = \"vllm\"", "[launch] has no model; add model = "),
        (
            "model = \"/m\"",
            "[launch] has no engine; add engine = \"vllm\"",
        ),
        (
            "engine = \"vllm\"\nmodel = \"models/../x\"",
            "neither an absolute path nor a Hub repo",
        ),
        (
            "engine = \"vllm\"\nmodel = \"~/models/x\"",
            "neither an absolute path nor a Hub repo",
        ),
        ("engine = \"vllm\"\nmodel = \"/a/../b\"", "\"..\" component"),
        (
            "engine = \"vllm\"\nmodel = 3",
            "model is an integer; write an absolute path or ORG/NAME",
        ),
        (
            "engine = \"vllm\"\nmodel = \"/m\"\nrevision = \"main\"",
            "revision applies to a Hub repo, but model is a path",
        ),
        (
            "engine = \"vllm\"\nmodel = \"org/m@main\"\nrevision = \"v2\"",
            "the revision is given twice (@main in the repo, \"v2\" here); keep one",
        ),
        (
            "engine = \"vllm\"\nmodel = { path = \"/m\", repo = \"org/m\" }",
            "model has both path and repo",
        ),
        (
            "engine = \"vllm\"\nmodel = { path = \"m\" }",
            "model path \"m\" is relative",
        ),
        (
            "engine = \"vllm\"\nmodel = { commit = \"x\" }",
            "unknown key \"commit\" in model; did you mean \"revision\"?",
        ),
        ("engine = \"vllm\"\nmodel = {}", "model names no model"),
    ] {
        let msg = refused(launch);
        assert!(msg.contains(want), "{launch}\n=> {msg}");
        assert!(msg.starts_with("cluster.toml:"), "{msg}");
    }
}

#[test]
fn unknown_keys_and_values_name_the_line_and_the_fix() {
    let text = file("engine = \"vllm\"\nmodel = \"/m\"\ntensor_parallel_size = 2");
    let msg = refused_file(&text);
    let line = line_of(&text, "tensor_parallel_size");
    assert_eq!(
        msg,
        format!("cluster.toml:{line}:1: unknown key \"tensor_parallel_size\" in [launch]; did you mean \"tp\"?")
    );
    for (launch, want) in [
        ("engine = \"vlm\"\nmodel = \"/m\"", "unknown engine \"vlm\"; did you mean \"vllm\"? engine is one of \"vllm\", \"vllm-ray\", \"sglang\" or \"custom\""),
        ("engine = \"ray\"\nmodel = \"/m\"", "did you mean \"vllm-ray\"?"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nextra_arg = []", "did you mean \"extra_args\"?"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nfoo = 1", "[launch] takes engine, model, revision, tp, pp, head, nodes"),
        ("engine = \"vllm\"\nmodel = \"/m\"\ntp = 0", "tp = 0 is out of range"),
        ("engine = \"vllm\"\nmodel = \"/m\"\ntp = \"2\"", "tp is a string; write a whole number, like tp = 2"),
        ("engine = \"vllm\"\nmodel = \"/m\"\napi_port = 70000", "api_port = 70000 is not a port"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nextra_args = \"--enforce-eager\"", "extra_args is a string; write a list"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nextra_args = [true]", "an item of extra_args is a boolean"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nnodes = []", "nodes is empty"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { \"1X\" = \"a\" }", "env name \"1X\" is not a variable name"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { X = true }", "env X is a boolean; write it as a string"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { PATH = \"/root/m/tools\" }", "[launch.env] sets PATH, which chooses the program a name runs, around the agent's --allow-exec; drop it, or set it in the environment of `xfer serve`"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { LD_PRELOAD = \"/root/m/x.so\" }", "[launch.env] sets LD_PRELOAD, which makes the dynamic loader map libraries"),
        ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { DOCKER_HOST = \"tcp://10.0.0.9:2375\" }", "[launch.env] sets DOCKER_HOST, which chooses the container client's daemon"),
    ] {
        let msg = refused(launch);
        assert!(msg.contains(want), "{launch}\n=> {msg}");
        assert!(msg.starts_with("cluster.toml:"), "{msg}");
    }
}

#[test]
fn env_keys_and_devices_around_allow_exec_are_refused_at_their_place() {
    let text =
        file("engine = \"vllm\"\nmodel = \"/m\"\n[launch.env]\nNCCL_DEBUG = \"INFO\"\nLD_PRELOAD = \"/root/m/x.so\"");
    let line = line_of(&text, "LD_PRELOAD");
    let msg = refused_file(&text);
    assert!(
        msg.starts_with(&format!(
            "cluster.toml:{line}:1: [launch.env] sets LD_PRELOAD, which "
        )),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    let text = file(
        "engine = \"vllm\"\nmodel = \"/m\"\nimage = \"x:1\"\ngpus = [\"/dev/nvidia0\", \"/dev/mem\"]",
    );
    let line = line_of(&text, "gpus = ");
    let msg = refused_file(&text);
    assert!(
        msg.starts_with(&format!("cluster.toml:{line}:25: gpus lists \"/dev/mem\", which is not a GPU or RDMA device node")),
        "{msg}"
    );
    // What engines do set still passes.
    let s = setup("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"x:1\"\ngpus = [\"/dev/nvidia0\", \"/dev/nvidiactl\", \"/dev/infiniband/uverbs0\", \"nvidia.com/gpu=0\"]\nenv = { NCCL_DEBUG = \"INFO\", CUDA_VISIBLE_DEVICES = \"0\", NCCL_NET_PLUGIN = \"aws-ofi\" }");
    assert_eq!(s.env.len(), 3);
}

#[test]
fn an_image_runs_every_rank_in_a_container() {
    let s = setup("engine = \"vllm\"\nmodel = \"/m\"");
    assert_eq!(s.container, None, "on the host without an image");
    let s = setup("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"nvcr.io/nvidia/vllm:25.09-py3\"");
    assert_eq!(
        s.container,
        Some(ContainerConfig {
            image: "nvcr.io/nvidia/vllm:25.09-py3".into(),
            gpus: GpuAccess::All,
            shm_bytes: None,
        }),
        "gpus default to all"
    );
    let s = setup(
        "engine = \"sglang\"\nmodel = \"/m\"\nimage = \"xt/app:1\"\ngpus = [\"nvidia.com/gpu=all\", \"/dev/nvidia0\"]\nshm_size = \"16GiB\"",
    );
    let c = s.container.unwrap();
    assert_eq!(
        c.gpus,
        GpuAccess::Devices(vec!["nvidia.com/gpu=all".into(), "/dev/nvidia0".into()])
    );
    assert_eq!(c.shm_bytes, Some(16 << 30));
    let c = setup("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"xt/app:1\"\ngpus = \"none\"\nshm_size = 1048576")
        .container
        .unwrap();
    assert_eq!((c.gpus, c.shm_bytes), (GpuAccess::None, Some(1 << 20)));
}

#[test]
fn container_mistakes_name_the_line_and_the_fix() {
    let text = file("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"-rm\"");
    let line = line_of(&text, "image = ");
    assert_eq!(
        refused_file(&text),
        format!("cluster.toml:{line}:9: image: `-rm` is not an image reference (NAME[:TAG] of a-z, 0-9, . _ - / : @); write the reference the image has in `docker images` on the operator's machine, like image = \"nvcr.io/nvidia/vllm:25.09-py3\"")
    );
    let text = file("engine = \"vllm\"\nmodel = \"/m\"\nshm_size = \"16GiB\"");
    let line = line_of(&text, "shm_size = ");
    assert_eq!(
        refused_file(&text),
        format!("cluster.toml:{line}:12: shm_size only applies to the ranks' containers, but [launch] has no image; add image = \"NAME:TAG\", or remove shm_size")
    );
    for (launch, want) in [
        ("image = \"a b\"", "image: `a b` is not an image reference"),
        ("image = 3", "image is an integer; write a quoted string, like \"nvcr.io/nvidia/vllm:25.09-py3\""),
        ("image = \"x:1\"\ngpus = \"al\"", "gpus = \"al\" is not a choice; did you mean \"all\"? write gpus = \"all\""),
        ("image = \"x:1\"\ngpus = \"some\"", "gpus = \"some\" is not a choice; write gpus = \"all\" (--gpus all, the NVIDIA runtime), gpus = \"none\", or a list of devices"),
        ("image = \"x:1\"\ngpus = 2", "gpus is an integer; write gpus = \"all\""),
        ("image = \"x:1\"\ngpus = []", "gpus is an empty list; write gpus = \"none\" for no GPU"),
        ("image = \"x:1\"\ngpus = [\"--privileged\"]", "gpus lists \"--privileged\", which is not a device"),
        ("image = \"x:1\"\ngpus = [\"/dev/a b\"]", "gpus lists \"/dev/a b\", which is not a device"),
        ("image = \"x:1\"\ngpus = [\"/dev/nvidia0\", \"/dev/mem\"]", "gpus lists \"/dev/mem\", which is not a GPU or RDMA device node; list GPU or RDMA device nodes"),
        ("image = \"x:1\"\ngpus = [\"/dev/sda:/dev/sda:rwm\"]", "gpus lists \"/dev/sda:/dev/sda:rwm\", which adds a container path or permissions to the host path"),
        ("image = \"x:1\"\ngpus = [\"/dev/kmsg\"]", "gpus lists \"/dev/kmsg\", which is not a GPU or RDMA device node"),
        ("image = \"x:1\"\ngpus = [0]", "a device in gpus is an integer; write a quoted string"),
        ("image = \"x:1\"\nshm_size = \"lots\"", "shm_size: `lots` is not a size; write e.g. 4MiB, 512M or 2GiB"),
        ("image = \"x:1\"\nshm_size = \"16 parsecs\"", "shm_size: unknown unit in `16 parsecs`"),
        ("image = \"x:1\"\nshm_size = \"0\"", "shm_size is 0; write a size"),
        ("image = \"x:1\"\nshm_size = -1", "shm_size is negative"),
        ("image = \"x:1\"\nshm_size = true", "shm_size is a boolean; write a size, like shm_size = \"16GiB\""),
        ("gpus = \"all\"", "gpus only applies to the ranks' containers, but [launch] has no image (on the host every rank sees every GPU); add image = \"NAME:TAG\", or remove gpus"),
        ("imag = \"x:1\"", "unknown key \"imag\" in [launch]; did you mean \"image\"?"),
        ("container = \"x:1\"", "unknown key \"container\" in [launch]; did you mean \"image\"?"),
        ("gpu = \"all\"", "unknown key \"gpu\" in [launch]; did you mean \"gpus\"?"),
        ("shm = \"1G\"", "unknown key \"shm\" in [launch]; did you mean \"shm_size\"?"),
        ("shm_sise = \"1G\"", "unknown key \"shm_sise\" in [launch]; did you mean \"shm_size\"?"),
        ("zzz = 1", "[launch] takes engine, model, revision, tp, pp, head, nodes, master_port, api_port, ray_port, dist_port, extra_args, env, template, image, gpus, shm_size, stream_weights, runner and caches"),
        ("runner = \"slurm\"", "unknown runner \"slurm\"; runner is \"agents\""),
        ("runner = \"srun\"\nimage = \"vllm/vllm-openai:v0.10.1\"", "runner = \"srun\" does not go with image"),
        ("stream_weights = \"yes\"", "write stream_weights = true or false"),
        ("streaming = true", "unknown key \"streaming\" in [launch]; did you mean \"stream_weights\"?"),
        ("image = \"x:1\"\nstream_weights = true", "stream_weights and image do not go together yet"),
        ("caches = [\"../../etc\"]", "caches takes kinds of compile cache, not paths, so that a cluster file cannot make an agent write outside its root; \"../../etc\" is a path"),
        ("caches = [\"/etc/cron.d\"]", "not paths"),
        ("caches = [\"vlm\"]", "unknown cache kind \"vlm\"; did you mean \"vllm\"? caches takes \"vllm\", \"inductor\", \"triton\" or \"flashinfer\""),
        ("caches = [\"vllm\", \"vllm\"]", "caches lists \"vllm\" twice"),
        ("caches = \"vllm\"", "write a list of cache kinds"),
        ("compile_cache = [\"vllm\"]", "did you mean \"caches\"?"),
        ("image = \"x:1\"\ncaches = [\"vllm\"]", "caches and image do not go together yet"),
        ("caches = [\"vllm\"]\n[launch.env]\nVLLM_CACHE_ROOT = \"/tmp/x\"", "[launch.env] sets VLLM_CACHE_ROOT too"),
    ] {
        let msg = refused(&format!("engine = \"vllm\"\nmodel = \"/m\"\n{launch}"));
        assert!(msg.contains(want), "{launch}\n=> {msg}");
        assert!(msg.starts_with("cluster.toml:"), "{msg}");
    }
}

#[test]
fn stream_weights_is_for_vllm_and_adds_its_load_format() {
    let msg = refused("engine = \"sglang\"\nmodel = \"/m\"\nstream_weights = true");
    assert!(
        msg.contains("stream_weights needs engine = \"vllm\""),
        "{msg}"
    );
    let s = setup("engine = \"vllm\"\nmodel = \"/m\"\nstream_weights = true");
    assert!(s.stream_weights);
    let p = crate::plan::plan(&s);
    assert!(p
        .ranks
        .iter()
        .all(|r| r.argv.windows(2).any(|w| w == ["--load-format", "xfer"])));
    let s = setup("engine = \"vllm\"\nmodel = \"/m\"");
    assert!(!s.stream_weights);
    let p = crate::plan::plan(&s);
    assert!(p
        .ranks
        .iter()
        .all(|r| !r.argv.contains(&"--load-format".to_string())));
}

#[test]
fn no_launch_table_is_refused() {
    let msg = refused_file(TWO_NODES);
    assert!(
        msg.starts_with("cluster.toml: no [launch] table; add one"),
        "{msg}"
    );
    // The cluster's own errors come first, with their line.
    let msg = refused_file(&file("engine = \"vllm\"").replace("fabric_if = \"enp1s0f0np0\"\n", ""));
    assert!(msg.contains("has fabric_ip but no fabric_if"), "{msg}");
}

#[test]
fn a_node_without_fabric_is_refused() {
    let text = format!(
        "{TWO_NODES}\n[[node]]\nname = \"spark-c\"\nagent = \"10.0.0.3\"\n\n[launch]\nengine = \"vllm\"\nmodel = \"/m\"\n"
    );
    let msg = refused_file(&text);
    let line = line_of(&text, "name = \"spark-c\"") - 1;
    assert!(
        msg.starts_with(&format!(
            "cluster.toml:{line}:1: node \"spark-c\" has no fabric_ip; NCCL/Ray would pick an interface by themselves, which is the hang this tool prevents"
        )),
        "{msg}"
    );
    assert!(msg.contains("add fabric_if and fabric_ip"), "{msg}");
    // Leaving it out of the launch is the other fix.
    let ok = text.replace(
        "model = \"/m\"",
        "model = \"/m\"\nnodes = [\"spark-a\", \"spark-b\"]",
    );
    let s = parse(&ok, "cluster.toml").unwrap();
    assert_eq!(s.nodes.len(), 2);
}

#[test]
fn node_selection_and_head_are_checked() {
    for (launch, want) in [
        ("nodes = [\"spark-a\", \"spark-x\"]", "nodes names \"spark-x\", which is not a [[node]] of this file; the nodes are spark-a, spark-b"),
        ("nodes = [\"spark-a\", \"spark-a\"]", "nodes lists \"spark-a\" twice"),
        ("head = \"spark-x\"", "head \"spark-x\" is not a [[node]] of this file; the head must be one of the launch nodes: spark-a, spark-b"),
        ("nodes = [\"spark-a\"]\nhead = \"spark-b\"", "head \"spark-b\" is not in nodes"),
    ] {
        let msg = refused(&format!("engine = \"vllm\"\nmodel = \"/m\"\n{launch}"));
        assert!(msg.contains(want), "{launch}\n=> {msg}");
    }
    let s = setup("engine = \"vllm\"\nmodel = \"/m\"\nnodes = [\"spark-b\"]");
    assert_eq!(s.nodes.len(), 1);
    assert_eq!((s.tp, s.pp), (1, 1));
}

#[test]
fn parallel_sizes_must_split_over_the_nodes() {
    let text = file("engine = \"vllm\"\nmodel = \"/m\"\ntp = 1\npp = 3");
    let msg = refused_file(&text);
    assert!(
        msg.starts_with(&format!(
            "cluster.toml:{}:6: tp × pp = 1 × 3 = 3 GPUs do not split evenly over 2 nodes",
            line_of(&text, "tp = 1")
        )),
        "{msg}"
    );
    // 2 GPUs per node.
    let s = setup("engine = \"vllm-ray\"\nmodel = \"/m\"\ntp = 2");
    assert_eq!((s.tp, s.pp), (2, 2));
    // The custom engine decides for itself.
    setup("engine = \"custom\"\nmodel = \"/m\"\ntp = 3\npp = 1\ntemplate = \"x\"");
}

#[test]
fn managed_flags_and_variables_are_refused() {
    for (engine, arg, want) in [
        (
            "vllm",
            "--tensor-parallel-size",
            "extra_args has --tensor-parallel-size, which xfer-launch sets itself; set tp = N",
        ),
        (
            "vllm",
            "--tensor_parallel_size=4",
            "has --tensor-parallel-size",
        ),
        ("vllm", "-tp", "has -tp"),
        (
            "vllm-ray",
            "--distributed-executor-backend=mp",
            "choose engine = \\\"vllm\\\" (multiprocess) or \\\"vllm-ray\\\"",
        ),
        ("vllm", "--port", "set api_port"),
        ("vllm", "--headless", "it follows from the launch nodes"),
        ("sglang", "--tp", "has --tp,"),
        ("sglang", "--dist-init-addr", "set dist_port"),
        ("sglang", "--model-path", "set model in [launch]"),
    ] {
        let msg = refused(&format!(
            "engine = \"{engine}\"\nmodel = \"/m\"\nextra_args = [\"--enforce-eager\", \"{arg}\"]"
        ));
        let want = want.replace("\\\"", "\"");
        assert!(msg.contains(&want), "{engine} {arg}\n=> {msg}");
    }
    // Flags of other engines, and anything for custom, pass.
    setup("engine = \"vllm\"\nmodel = \"/m\"\nextra_args = [\"--tp-size-hint\", \"--tp\"]");
    setup(
        "engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"x\"\nextra_args = [\"--port\", \"1\"]",
    );

    let msg =
        refused("engine = \"vllm\"\nmodel = \"/m\"\n[launch.env]\nNCCL_SOCKET_IFNAME = \"eth0\"");
    assert!(
        msg.contains("env sets NCCL_SOCKET_IFNAME, which xfer-launch sets itself from the fabric_if of each [[node]]"),
        "{msg}"
    );
    let msg = refused("engine = \"vllm\"\nmodel = \"/m\"\nenv = { HF_HUB_OFFLINE = \"0\" }");
    assert!(msg.contains("env sets HF_HUB_OFFLINE"), "{msg}");
}

#[test]
fn head_ports_must_differ() {
    let msg = refused("engine = \"vllm\"\nmodel = \"/m\"\napi_port = 29500");
    assert!(
        msg.contains("master_port and api_port are both 29500"),
        "{msg}"
    );
    let msg = refused("engine = \"sglang\"\nmodel = \"/m\"\ndist_port = 8000");
    assert!(
        msg.contains("dist_port and api_port are both 8000"),
        "{msg}"
    );
    // vLLM multiprocess does not use the Ray port.
    setup("engine = \"vllm\"\nmodel = \"/m\"\nray_port = 8000");
}

#[test]
fn template_belongs_to_the_custom_engine() {
    let msg = refused("engine = \"vllm\"\nmodel = \"/m\"\ntemplate = \"x {rank}\"");
    assert!(
        msg.contains("template only applies to engine = \"custom\", but engine is \"vllm\""),
        "{msg}"
    );
    let msg = refused("engine = \"custom\"\nmodel = \"/m\"");
    assert!(
        msg.contains("engine = \"custom\" needs a template"),
        "{msg}"
    );
    assert!(msg.contains("{head_ip}"), "{msg}");
}

#[test]
fn unknown_placeholders_are_all_named_at_the_template_line() {
    let text = file("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"run --r {rank} --g {gpu} --h {hed_ip} --x {gpu}\"");
    let msg = refused_file(&text);
    let line = line_of(&text, "template = ");
    assert!(
        msg.starts_with(&format!(
            "cluster.toml:{line}:12: template: unknown placeholders {{gpu}}, {{hed_ip}} (did you mean {{head_ip}}?); the placeholders are {{rank}}, {{nnodes}}, {{head_ip}}"
        )),
        "{msg}"
    );
    let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = [\"run\", \"{nodes}\"]");
    assert!(
        msg.contains("unknown placeholder {nodes} (did you mean {nnodes}?)"),
        "{msg}"
    );
    let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"run {rank\"");
    assert!(msg.contains("opens a { that is never closed"), "{msg}");
    let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"run rank}\"");
    assert!(msg.contains("has a } that closes nothing"), "{msg}");
    let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"  \"");
    assert!(msg.contains("template is empty"), "{msg}");
}

#[test]
fn template_words_split_like_a_shell_without_expanding() {
    let w = split_words(r#"a 'b c' "d \"e\" \$f" g\ h '' x'y'"z""#).unwrap();
    assert_eq!(w, ["a", "b c", "d \"e\" $f", "g h", "", "xyz"]);
    assert_eq!(split_words("  a\n\tb  ").unwrap(), ["a", "b"]);
    assert_eq!(
        split_words("bash -c 'echo $HOME | wc'").unwrap(),
        ["bash", "-c", "echo $HOME | wc"]
    );
    for (bad, want) in [
        ("run $HOME", "'$' needs a shell"),
        ("run \"$HOME\"", "'$' needs a shell"),
        ("a | b", "'|' needs a shell"),
        ("a; b", "';' needs a shell"),
        ("a > f", "'>' needs a shell"),
        ("a 'b", "a ' is never closed"),
        ("a \"b", "a \" is never closed"),
        ("a \\", "lone \\"),
    ] {
        let e = split_words(bad).unwrap_err().to_string();
        assert!(e.contains(want), "{bad}: {e}");
    }
    let t = parse_template(&["--x={{{rank}}}".to_string(), "{node}{head}".to_string()]).unwrap();
    assert_eq!(
        t.words,
        [
            vec![
                Piece::Lit("--x={".into()),
                Piece::Var(Var::Rank),
                Piece::Lit("}".into())
            ],
            vec![Piece::Var(Var::Node), Piece::Var(Var::Head)],
        ]
    );
}
