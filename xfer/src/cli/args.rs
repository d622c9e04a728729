//! The `xfer` command line's arguments: one clap struct per command.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use xfer_proto::units::parse_size;

#[derive(Parser)]
#[command(
    name = "xfer",
    version,
    about = "Move model checkpoints to every GPU node at line rate, verified chunk by chunk."
)]
pub struct Cli {
    /// Log filter, e.g. `info` or `xfer=debug` (overrides RUST_LOG).
    #[arg(long, global = true)]
    pub log: Option<String>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Simple mode: create one cluster key for every node (equivalent to
    /// root on every node; `xfer ca` gives each node its own identity).
    #[command(after_help = "Example:\n  xfer keygen --out /etc/xfer/cluster.key")]
    Keygen(KeygenArgs),
    /// The cluster CA, kept by the operator: init, issue, rotate.
    #[command(subcommand)]
    Ca(CaCmd),
    /// Describe a directory: per-file BLAKE3 (as b3sum prints it) and the root hash.
    #[command(after_help = "Example:\n  xfer manifest /models/Qwen3-8B --json > manifest.json")]
    Manifest(ManifestArgs),
    /// Run the node agent: receive models into ROOT and serve them to peers.
    #[command(
        after_help = "Example:\n  xfer serve --root /var/lib/xfer --key /etc/xfer/node.pem --listen 0.0.0.0:7470"
    )]
    Serve(ServeArgs),
    /// Hand a sync job to the cluster's agents and return (they own it from then on).
    #[command(
        after_help = "Example:\n  xfer sync ./local/my-model --cluster cluster.toml --from spark-a --wait\n  xfer sync hf://Qwen/Qwen3-8B --cluster cluster.toml --nodes spark-a,spark-b"
    )]
    Sync(SyncArgs),
    /// One table of every node's models: root, state, progress, rate, ETA, last error.
    #[command(
        after_help = "Example:\n  XFER_CLUSTER=cluster.toml xfer status --nodes spark-a,spark-b"
    )]
    Status(StatusArgs),
    /// Stop a sync job on every node (what was delivered stays).
    #[command(after_help = "Example:\n  xfer cancel 20260101-120000-ab12 --cluster cluster.toml")]
    Cancel(CancelArgs),
    /// Delete a model from the nodes' roots.
    #[command(
        after_help = "Example:\n  xfer rm Qwen/Qwen3-8B --cluster cluster.toml --nodes spark-b --yes"
    )]
    Rm(RmArgs),
    /// Remove ended sync jobs from the nodes (running jobs and models stay).
    ///
    /// Ended: complete, cancelled or failed. Operators only.
    #[command(after_help = "Example:\n  xfer prune --cluster cluster.toml --nodes a,b")]
    Prune(PruneArgs),
    /// Evict models within each node's budget, least recently used first.
    ///
    /// Never a model a live run uses, one being transferred, or a pinned
    /// one; down to the node's low watermark (`serve --evict-to`), or with
    /// --need SIZE until that much more fits under its budget. Operators
    /// only.
    #[command(
        after_help = "Example:\n  xfer gc --cluster cluster.toml --dry-run\n  xfer gc --cluster cluster.toml --nodes spark-b --need 120GiB"
    )]
    Gc(GcArgs),
    /// List each node's models: size, last use, pin, what holds it, and
    /// the node's budget.
    #[command(after_help = "Example:\n  xfer ls --cluster cluster.toml --nodes spark-a")]
    Ls(LsArgs),
    /// Pin a model on the nodes: never evicted until unpinned.
    #[command(after_help = "Example:\n  xfer pin Qwen/Qwen3-8B --cluster cluster.toml")]
    Pin(PinArgs),
    /// Unpin a model on the nodes.
    #[command(after_help = "Example:\n  xfer unpin Qwen/Qwen3-8B --cluster cluster.toml")]
    Unpin(PinArgs),
    /// Deliver a directory to one or more agents.
    #[command(
        after_help = "Example:\n  xfer push /models/my-model --cluster cluster.toml --nodes spark-a,spark-b\n  xfer push /models/my-model --to 10.0.0.2:7470,10.0.0.3 --key operator.pem"
    )]
    Push(PushArgs),
    /// Download a Hugging Face repo (or HF_ENDPOINT's mirror) into the HF cache, verified.
    #[command(
        after_help = "Example:\n  xfer pull Qwen/Qwen3-8B@main --include '*.safetensors' --include '*.json'"
    )]
    Pull(PullArgs),
    /// Container images: deliver a local image to nodes like a model.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Copy a complete model from an agent into a local root (ROOT/NAME).
    #[command(
        after_help = "Example:\n  xfer fetch Qwen/Qwen3-8B --from spark-a.lan:7470 --root /var/lib/xfer --key operator.pem"
    )]
    Fetch(FetchArgs),
    /// Re-hash a received tree against its manifest.
    #[command(after_help = "Example:\n  xfer verify /var/lib/xfer/my-model")]
    Verify(VerifyArgs),
    /// What this node offers the data plane: RDMA devices and their GIDs,
    /// the interfaces a fabric could use, the UDP socket buffer limits.
    #[command(after_help = "Example:\n  xfer doctor --json")]
    Doctor(DoctorArgs),
    /// Local multi-node demo: generate a model, start agents on 127.0.0.x, push, verify.
    #[command(after_help = "Example:\n  xfer demo --size 256MiB --nodes 3")]
    Demo(DemoArgs),
    /// Serve a folder as a Hub model repo on this machine (a Hub look-alike
    /// for trying `xfer sync ORG/NAME` and `xfer-launch deploy` offline).
    #[command(
        name = "hub-serve",
        after_help = "Example:\n  xfer hub-serve ./my-model --repo acme/tiny --listen 127.0.0.1:8088\n  HF_ENDPOINT=http://127.0.0.1:8088 xfer sync acme/tiny --wait"
    )]
    HubServe(HubServeArgs),
    /// Predict a push to N nodes with the network simulator (JSON on stdout).
    #[command(
        hide = true,
        after_help = "Example:\n  xfer simulate --nodes 16 --rate-mbit 100 --size-mib 128\n  xfer simulate --nodes 1024 --rate-mbit 100 --size-mib 2048 --ideal"
    )]
    Simulate(SimulateArgs),
}

/// The arguments of `xfer simulate`: the shape of the push, then the
/// model's knobs (each defaults to the development machine's preset,
/// `engine::sim::Setup::this_machine`).
#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Receiving nodes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub nodes: u32,
    /// Every node's link rate, both ways, in Mbit/s.
    #[arg(long)]
    pub rate_mbit: f64,
    /// The model's size in MiB.
    #[arg(long)]
    pub size_mib: u64,
    #[command(flatten)]
    pub chunking: Chunking,
    /// Peer links each receiver keeps at most (2-64).
    #[arg(long, default_value_t = xfer::engine::topology::DEFAULT_DEGREE, value_parser = parse_peers)]
    pub degree: u32,
    /// One-way latency of each node's link, in ms.
    #[arg(long)]
    pub latency_ms: Option<f64>,
    /// Seed of the topology's random graph.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Start from no costs at all (the simulator's plain model) instead of
    /// the development machine's; the knobs below still apply.
    #[arg(long)]
    pub ideal: bool,
    /// Cores all the agents share equally (the source counts as one agent).
    #[arg(long)]
    pub cores: Option<f64>,
    /// A sender's time on a request before its first byte, in ms.
    #[arg(long)]
    pub service_ms: Option<f64>,
    /// Verification time on one whole core, in ms per MiB.
    #[arg(long)]
    pub verify_ms_per_mib: Option<f64>,
    /// MiB/s one whole core sends and receives (0: no CPU cap).
    #[arg(long)]
    pub cpu_mib_s: Option<f64>,
    /// Share of a link's rate lost when many transfers share it (0 to 1).
    #[arg(long)]
    pub share_loss: Option<f64>,
    /// Extra latency of every control message, in ms.
    #[arg(long)]
    pub control_ms: Option<f64>,
    /// Seconds from the push's start until the receivers fetch
    /// (connections, the offer, the swarm's links).
    #[arg(long)]
    pub start_s: Option<f64>,
}

/// `xfer ca`: the operator's certificate authority.
#[derive(Subcommand)]
pub enum CaCmd {
    /// Create the CA (its key never leaves this folder).
    #[command(after_help = "Example:\n  xfer ca init --dir ~/xfer-ca")]
    Init {
        /// The CA folder (created 0700).
        #[arg(long)]
        dir: PathBuf,
        /// Replace an existing CA (every credential it issued stops working).
        #[arg(long)]
        force: bool,
    },
    /// Write the credential of one node (its name in the cluster file) or operator.
    #[command(
        after_help = "Example:\n  xfer ca issue spark-a --dir ~/xfer-ca --out spark-a.pem\n  xfer ca issue alice --role operator --dir ~/xfer-ca --out operator.pem"
    )]
    Issue {
        /// The node's name in the cluster file, or the operator's name.
        name: String,
        /// The CA folder (`xfer ca init --dir`).
        #[arg(long)]
        dir: PathBuf,
        /// Where to write the credential (mode 0600).
        #[arg(long)]
        out: PathBuf,
        /// `node` (an agent: moves models) or `operator` (syncs, removes, launches).
        #[arg(long, default_value = "node", value_parser = ["node", "operator"])]
        role: String,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = xfer::config::auth::ca::DEFAULT_DAYS)]
        days: u32,
        /// Replace an existing file (a renewal).
        #[arg(long)]
        force: bool,
    },
    /// Replace the CA key. Old and new are both trusted until `--finish`.
    #[command(
        after_help = "Example:\n  xfer ca rotate --dir ~/xfer-ca\n  xfer ca rotate --dir ~/xfer-ca --finish"
    )]
    Rotate {
        /// The CA folder (`xfer ca init --dir`).
        #[arg(long)]
        dir: PathBuf,
        /// End the rotation: credentials issued from now on trust only the new CA.
        #[arg(long)]
        finish: bool,
    },
}

/// The arguments of `xfer keygen`.
#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Where to write the key (mode 0600); copy it to every node.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing file.
    #[arg(long)]
    pub force: bool,
}

/// The arguments of `xfer manifest`.
#[derive(clap::Args)]
pub struct ManifestArgs {
    /// The directory to describe.
    pub dir: PathBuf,
    /// Print the full manifest as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub chunking: Chunking,
}

/// The arguments of `xfer serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Where the agent listens (management; with 0.0.0.0 the fabric too):
    /// HOST[:PORT] as the cluster file's `agent` takes it (a host name such
    /// as localhost:7470, an IPv4, [IPv6]:PORT; the port defaults to 7470).
    #[arg(long, default_value = "0.0.0.0:7470", value_parser = xfer::config::cluster::parse_listen)]
    pub listen: std::net::SocketAddr,
    /// This node's data address, IP[:PORT] (the port defaults to
    /// --listen's): advertised to sources, and listened on too when
    /// --listen does not cover it. Models from other nodes come here.
    #[arg(long, value_name = "ADDR", conflicts_with = "fabric_if")]
    pub data: Option<String>,
    /// Take the data address from this interface's first address (IPv4
    /// first), with --listen's port.
    #[arg(long, value_name = "IFACE")]
    pub fabric_if: Option<String>,
    /// The folder models are received into and served from (ROOT/NAME).
    #[arg(long)]
    pub root: PathBuf,
    /// This node's credential (`xfer ca issue NODE`, or simple mode's key).
    #[arg(long, env = "XFER_KEY")]
    pub key: PathBuf,
    /// Chunk requests in flight per peer.
    #[arg(long, default_value_t = 16)]
    pub window: u32,
    /// Re-hash complete models every SECS seconds and repair damaged
    /// files from the other nodes of their jobs (0: never).
    #[arg(long, default_value_t = 21600)]
    pub verify_every: u64,
    /// Serve Prometheus metrics at /metrics on PORT (127.0.0.1) or IP:PORT.
    #[arg(long, value_parser = xfer::util::metrics::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,
    /// The data plane: RDMA when this node has an active RDMA port (and
    /// this build can drive it), else QUIC; `rdma` refuses without one.
    #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
    pub transport: xfer::transport::select::TransportChoice,
    /// Let `xfer-launch` start processes here: engine ranks, their stop
    /// hooks and version probes (off: every such request is refused).
    #[arg(long)]
    pub allow_launch: bool,
    /// With --allow-launch, start only this program (argv[0] as the
    /// launcher sends it, e.g. `vllm`); repeat for more.
    #[arg(long, value_name = "PROGRAM", requires = "allow_launch")]
    pub allow_exec: Vec<String>,
    /// Let sync jobs read their source folder under DIR too (besides the
    /// root); repeat for more.
    #[arg(long, value_name = "DIR")]
    pub export: Vec<PathBuf>,
    /// Let operators load images into this container engine (`xfer image
    /// push`) and, with --allow-launch, run ranks in them (`[launch]
    /// image`). The engine is the one DOCKER_HOST (or podman's default)
    /// names.
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub container_engine: Option<xfer_proto::image::ContainerRuntime>,
    /// With issued credentials: accept node certificates only for the
    /// nodes this cluster file lists (operators are not nodes, and pass).
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// QUIC connections to each receiving node when this agent's sync jobs
    /// push, 1 to 64 (default: one per two cores, at most 4).
    #[arg(long, value_parser = xfer::transport::lanes::parse_connections, default_value_t = xfer::transport::lanes::default_connections())]
    pub connections: usize,
    /// The most the root's models may take, e.g. 800GiB (`xfer gc` and the
    /// watermarks evict within it; default: the filesystem's size).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_bytes: Option<u64>,
    /// The budget as a share of the root's filesystem, e.g. 90%.
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT")]
    pub max_percent: Option<u8>,
    /// Past this share of the budget, evict models least recently used
    /// first (never one in use, being transferred or pinned)...
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT")]
    pub evict_above: Option<u8>,
    /// ... down to this share (default: 10 points under --evict-above).
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT", requires = "evict_above")]
    pub evict_to: Option<u8>,
    /// When an incoming connection must answer a QUIC Retry (prove its
    /// address) before its handshake; see `agent::guard`. Hidden: for
    /// measurements and tests.
    #[arg(long, value_enum, hide = true, default_value_t = xfer::agent::guard::RetryPolicy::Always)]
    pub retry: xfer::agent::guard::RetryPolicy,
    /// Connections one source IP may hold (hidden; for tests).
    #[arg(long, hide = true, default_value_t = xfer::agent::guard::MAX_CONNECTIONS_PER_SOURCE)]
    pub max_connections_per_source: usize,
    /// Failed handshakes one source IP may start in a burst; 0: no limit
    /// (hidden; for tests and measurements).
    #[arg(long, hide = true, default_value_t = xfer::agent::guard::HANDSHAKE_BURST)]
    pub handshake_burst: u32,
    /// Refill rate of that burst, per second (hidden).
    #[arg(long, hide = true, default_value_t = xfer::agent::guard::HANDSHAKES_PER_SECOND)]
    pub handshakes_per_second: u32,
    /// Seconds a stream's first message may take to arrive whole (hidden;
    /// for tests).
    #[arg(long, hide = true, default_value_t = xfer::agent::FIRST_MESSAGE_TIMEOUT.as_secs())]
    pub first_message_timeout: u64,
}

/// The arguments of `xfer sync`.
#[derive(clap::Args)]
pub struct SyncArgs {
    /// A folder on the --from node, a Hub repo, or a model artifact.
    /// /abs/path, ./x and ../x (against this working directory) are
    /// folders; hf://ORG/NAME[@REV] is a repo; oci://REGISTRY/NAME:TAG is
    /// a ModelPack artifact the --from node pulls from its registry; a bare
    /// ORG/NAME[@REV] is the folder of that name on the --from node (under
    /// this working directory or its root) when it has one, is refused
    /// when only this machine has it, and is the Hub repo otherwise.
    pub source: String,
    #[command(flatten)]
    pub at: ClusterNodes,
    /// The node holding the path, or pulling the repo (default: the first
    /// of --nodes). For a Hub repo, `a,b,c` stripes the download: every
    /// node named fetches ranges from the Hub over its own link, `a`
    /// drives the job and checks every file; `all`: every node of --nodes.
    #[arg(long, value_name = "NODE[,NODE...]|all")]
    pub from: Option<String>,
    /// Name on the nodes (default: the folder's name; Hub repos use
    /// models--org--name); a repo id ORG/NAME names models--ORG--NAME.
    #[arg(long)]
    pub name: Option<String>,
    /// The kind of Hub repo: model or dataset.
    #[arg(long, default_value = "model", value_parser = parse_repo_type)]
    pub repo_type: xfer_proto::repo::RepoType,
    #[command(flatten)]
    pub chunking: Chunking,
    /// Cap the source's send rate, e.g. 500MiB (bytes per second).
    #[arg(long, value_parser = parse_size)]
    pub limit_rate: Option<u64>,
    /// Peer links each receiver keeps at most (2-64; default 8).
    #[arg(long, value_parser = parse_peers)]
    pub peers: Option<u32>,
    /// Follow the job with progress bars until it completes (Ctrl-C leaves it running).
    #[arg(long)]
    pub wait: bool,
    /// The data plane the source node offers: RDMA where its agent has
    /// it (auto), never (quic), or fail the job without it (rdma).
    #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
    pub transport: xfer::transport::select::TransportChoice,
    /// Print the job (and with --wait its outcome) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// For an `oci://` source: the source node reaches the registry over
    /// plain HTTP.
    #[arg(long)]
    pub insecure: bool,
    /// For an `oci://` source: a PEM file of CAs to trust for the
    /// registry, read here and sent with the job.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Fail the job when its rounds have made no progress for this long
    /// (e.g. 90s, 5m, 2h; `never` retries until cancelled). A Hub that is
    /// down or a node that is gone then ends `--wait` with the cause.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = xfer_proto::admin::GiveUp::parse)]
    pub give_up_after: xfer_proto::admin::GiveUp,
}

/// The arguments of `xfer status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub at: ClusterNodes,
    /// Print every node's report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Refresh every second until interrupted (Ctrl-C); the exit code is
    /// the last refresh's.
    #[arg(long)]
    pub watch: bool,
}

/// The arguments of `xfer cancel`.
#[derive(clap::Args)]
pub struct CancelArgs {
    /// The job's id, as `xfer sync` printed it and `xfer status` lists it.
    pub job: String,
    #[command(flatten)]
    pub at: ClusterFile,
}

/// The arguments of `xfer rm`.
#[derive(clap::Args)]
pub struct RmArgs {
    /// The model: its name on the nodes (models--Qwen--Qwen3-8B, my-model)
    /// or its Hub repo id (Qwen/Qwen3-8B).
    pub name: String,
    #[command(flatten)]
    pub at: ClusterNodes,
    /// The kind of repo a repo id names: model or dataset.
    #[arg(long, default_value = "model", value_parser = parse_repo_type)]
    pub repo_type: xfer_proto::repo::RepoType,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
    /// Delete the folder even where xfer did not place it (no model
    /// record on that node).
    #[arg(long)]
    pub force: bool,
}

/// The arguments of `xfer gc`.
#[derive(clap::Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub at: ClusterNodes,
    /// Only print what would be evicted, and why.
    #[arg(long)]
    pub dry_run: bool,
    /// Make room for this many more bytes under each node's budget
    /// (instead of its watermarks), e.g. 120GiB.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub need: Option<u64>,
    /// Print each node's report as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `xfer ls`.
#[derive(clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub at: ClusterNodes,
    /// Print each node's models and budget as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `xfer pin` and `xfer unpin`.
#[derive(clap::Args)]
pub struct PinArgs {
    /// The model: its name on the nodes or its Hub repo id.
    pub name: String,
    #[command(flatten)]
    pub at: ClusterNodes,
    /// The kind of repo a repo id names: model or dataset.
    #[arg(long, default_value = "model", value_parser = parse_repo_type)]
    pub repo_type: xfer_proto::repo::RepoType,
}

/// The arguments of `xfer prune`.
#[derive(clap::Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub at: ClusterNodes,
    /// Print what was removed as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `xfer push`.
#[derive(clap::Args)]
pub struct PushArgs {
    /// The local directory to deliver.
    pub src: PathBuf,
    #[command(flatten)]
    pub dests: Destinations,
    /// Name on the agents (default: the directory's name); a repo id
    /// ORG/NAME names models--ORG--NAME.
    #[arg(long)]
    pub name: Option<String>,
    /// Print one JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sending: Sending,
    /// Re-read every file instead of trusting the hash cache.
    #[arg(long)]
    pub rehash: bool,
}

/// `xfer image`.
#[derive(Subcommand)]
pub enum ImageCmd {
    /// Deliver a local image (its layers as content-addressed blobs,
    /// through the swarm) and load it into every node's container engine.
    #[command(
        after_help = "Example:\n  xfer image push vllm/vllm-openai:v0.10.1 --cluster cluster.toml --nodes spark-a,spark-b"
    )]
    Push(ImagePushArgs),
    /// Pull an image from its registry once (each blob checked against its
    /// digest) and load it into every node's container engine, with no
    /// `docker pull` or `docker save` on any node.
    #[command(
        after_help = "Example:\n  xfer image pull ghcr.io/org/vllm-gb10:0.10 --cluster cluster.toml\n\nCredentials: XFER_REGISTRY_USERNAME and XFER_REGISTRY_PASSWORD, else\n~/.docker/config.json (what `docker login` writes; $DOCKER_CONFIG moves it)."
    )]
    Pull(ImagePullArgs),
}

/// The arguments of `xfer image push`.
#[derive(clap::Args)]
pub struct ImagePushArgs {
    /// The local image: NAME[:TAG], as `docker images` lists it.
    pub image: String,
    /// The local engine the image is saved from.
    #[arg(long, value_enum, default_value = "docker")]
    pub engine: xfer_proto::image::ContainerRuntime,
    #[command(flatten)]
    pub delivery: ImageDelivery,
}

/// The arguments of `xfer image pull`.
#[derive(clap::Args)]
pub struct ImagePullArgs {
    /// The image in its registry: [REGISTRY/]NAME[:TAG][@sha256:DIGEST]
    /// (`ubuntu` is docker.io/library/ubuntu:latest).
    pub reference: String,
    /// The platform to take from a multi-platform image, OS/ARCH[/VARIANT]
    /// (default: the nodes' own, as their agents report it).
    #[arg(long, value_name = "OS/ARCH")]
    pub platform: Option<String>,
    /// Reach the registry over plain HTTP (an insecure registry on a
    /// trusted network).
    #[arg(long)]
    pub insecure: bool,
    /// A PEM file of CAs to trust for the registry, besides the system's.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    #[command(flatten)]
    pub delivery: ImageDelivery,
}

/// Where and how an image is delivered (`xfer image push` and `pull`).
#[derive(clap::Args)]
pub struct ImageDelivery {
    #[command(flatten)]
    pub dests: Destinations,
    /// Where the image's blobs are kept between pushes (default
    /// $XDG_CACHE_HOME/xfer/images or ~/.cache/xfer/images).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Print one JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sending: Sending,
}

/// The nodes a push delivers to: a cluster file's (or some of them), or
/// agents named by address with a credential (`xfer push`, `xfer image`).
#[derive(clap::Args)]
pub struct Destinations {
    /// The cluster file: every node in it (or --nodes), with their
    /// addresses and its key, as `xfer sync` takes them (default:
    /// $XFER_CLUSTER when --to is not given).
    #[arg(long, value_name = "FILE", conflicts_with = "to")]
    pub cluster: Option<PathBuf>,
    /// With --cluster: only these nodes, comma separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "to")]
    pub nodes: Vec<String>,
    /// Agents, comma separated: AGENT[/DATA],... Each is its agent's
    /// address, then optionally a slash and its data (fabric) address, whose
    /// port defaults to the agent's: 10.0.0.2:7470/192.168.100.2. Without a
    /// data address, the one the agent advertises (serve --data or
    /// --fabric-if), else the agent address.
    #[arg(long, value_delimiter = ',')]
    pub to: Vec<String>,
    /// The credential, with --to (--cluster names its own).
    #[arg(long, env = "XFER_KEY")]
    pub key: Option<PathBuf>,
}

/// How a push sends: chunking, rate, timeouts, the swarm's degree, the
/// data plane and its connections (`xfer push`, `xfer image`).
#[derive(clap::Args)]
pub struct Sending {
    #[command(flatten)]
    pub chunking: Chunking,
    /// Cap the total send rate, e.g. 500MiB (bytes per second).
    #[arg(long, value_parser = parse_size)]
    pub limit_rate: Option<u64>,
    /// Seconds to wait for each agent to answer.
    #[arg(long, default_value_t = 5)]
    pub connect_timeout: u64,
    /// Peer links each receiver keeps at most (2-64); the swarm's graph is
    /// a random regular one of this degree, rewired when a node dies.
    #[arg(long, default_value_t = xfer::engine::topology::DEFAULT_DEGREE, value_parser = parse_peers)]
    pub peers: u32,
    /// The data plane: RDMA when this node has an active RDMA port (and
    /// this build can drive it), else QUIC; `rdma` refuses without one.
    #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
    pub transport: xfer::transport::select::TransportChoice,
    /// QUIC connections to each agent, 1 to 64, each on its own socket so
    /// they spread over cores (default: one per two cores, at most 4).
    #[arg(long, value_parser = xfer::transport::lanes::parse_connections, default_value_t = xfer::transport::lanes::default_connections())]
    pub connections: usize,
}

/// The cluster file a command reads its nodes, addresses and key from.
#[derive(clap::Args)]
pub struct ClusterFile {
    /// The cluster file: nodes, addresses and the key (default: $XFER_CLUSTER).
    #[arg(
        long,
        value_name = "FILE",
        env = "XFER_CLUSTER",
        hide_env_values = true
    )]
    pub cluster: Option<PathBuf>,
}

/// The cluster file and which of its nodes a command is about.
#[derive(clap::Args)]
pub struct ClusterNodes {
    #[command(flatten)]
    pub file: ClusterFile,
    /// Only these nodes, comma separated (default: every node).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
}

/// The chunk size a model is cut into.
#[derive(clap::Args)]
pub struct Chunking {
    /// Chunk size: `auto` (from the model's size: 256KiB for 128 MiB, 4MiB
    /// from 2 GiB up) or a power of two from 64KiB to 256MiB.
    #[arg(long, default_value = "auto", value_parser = parse_chunk)]
    pub chunk_size: xfer_proto::manifest::ChunkSize,
}

/// The arguments of `xfer pull`.
#[derive(clap::Args)]
pub struct PullArgs {
    /// ORG/NAME[@REVISION] (a branch, tag or commit; default main), or
    /// oci://REGISTRY/NAME:TAG, a ModelPack model artifact (with
    /// --local-dir).
    pub repo: String,
    /// The kind of repo: model or dataset.
    #[arg(long, default_value = "model", value_parser = parse_repo_type)]
    pub repo_type: xfer_proto::repo::RepoType,
    /// Only files matching this glob (repeatable), e.g. '*.safetensors'.
    #[arg(long)]
    pub include: Vec<String>,
    /// Skip files matching this glob (repeatable), e.g. 'original/*'.
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Write plain files into DIR instead of the HF cache layout.
    #[arg(long)]
    pub local_dir: Option<PathBuf>,
    /// Parallel HTTP connections (ranged requests across and within files).
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Bytes per ranged request.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    pub part_size: u64,
    /// Also deliver to these agents while downloading: AGENT[/DATA],... as
    /// push --to takes them (their --root can be their HF cache).
    #[arg(long, value_delimiter = ',')]
    pub to: Vec<String>,
    /// The cluster credential, needed with --to.
    #[arg(long, env = "XFER_KEY")]
    pub key: Option<PathBuf>,
    #[command(flatten)]
    pub chunking: Chunking,
    /// Seconds to wait for each agent to answer.
    #[arg(long, default_value_t = 5)]
    pub connect_timeout: u64,
    /// With --to: `stream` sends each verified chunk as it lands; `files`
    /// sends whole files in push rounds (the older way, to compare).
    #[arg(long, value_enum, default_value = "stream")]
    pub fan_out: FanOutArg,
    /// Print one JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// The data plane: RDMA when this node has an active RDMA port (and
    /// this build can drive it), else QUIC; `rdma` refuses without one.
    #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
    pub transport: xfer::transport::select::TransportChoice,
    /// For an `oci://` source: reach the registry over plain HTTP.
    #[arg(long)]
    pub insecure: bool,
    /// For an `oci://` source: a PEM file of CAs to trust for the registry.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// The arguments of `xfer fetch`.
#[derive(clap::Args)]
pub struct FetchArgs {
    /// The model: its name on the agent (models--Qwen--Qwen3-8B, my-model)
    /// or its Hub repo id (Qwen/Qwen3-8B).
    pub name: String,
    /// The agent holding the model: HOST[:PORT] (the port defaults to 7470).
    #[arg(long)]
    pub from: String,
    /// The local folder to copy into (ROOT/NAME).
    #[arg(long)]
    pub root: PathBuf,
    /// The credential to connect with.
    #[arg(long, env = "XFER_KEY")]
    pub key: PathBuf,
    /// The kind of repo a repo id names: model or dataset.
    #[arg(long, default_value = "model", value_parser = parse_repo_type)]
    pub repo_type: xfer_proto::repo::RepoType,
    /// Print one JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the agent to answer.
    #[arg(long, default_value_t = 5)]
    pub connect_timeout: u64,
}

/// The arguments of `xfer verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The received tree (ROOT/NAME).
    pub dir: PathBuf,
    /// Manifest from `xfer manifest --json` (default: the one the agent recorded).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Print the outcome as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `xfer doctor`.
#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print one JSON object with the same data.
    #[arg(long)]
    pub json: bool,
    /// The sysfs root to read (tests point it at a fake tree).
    #[arg(long, default_value = "/sys", hide = true)]
    pub sys: PathBuf,
    /// The procfs root to read (tests point it at a fake tree).
    #[arg(long, default_value = "/proc", hide = true)]
    pub proc: PathBuf,
}

/// The arguments of `xfer demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// The generated model's size, e.g. 256MiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub size: u64,
    /// How many local agents to start (on 127.0.0.x).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// The demo's working folder (model, roots, keys, logs).
    #[arg(long, default_value = "/tmp/xfer-demo")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub chunking: Chunking,
    /// The local Hub look-alike's cap per connection (bytes per second),
    /// as a CDN caps each connection; the pull uses 8.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    pub hub_rate: u64,
    /// Stop after `xfer-launch check`, even when a real vLLM is installed
    /// (otherwise the demo ends by serving a tiny model across two nodes).
    #[arg(long)]
    pub no_engine: bool,
}

/// The arguments of `xfer hub-serve`.
#[derive(clap::Args)]
pub struct HubServeArgs {
    /// The folder whose files are the repo's (hashed once at start).
    pub dir: PathBuf,
    /// The repo id it answers as, ORG/NAME.
    #[arg(long, value_name = "ORG/NAME")]
    pub repo: String,
    /// Where to listen: an address on this machine (the Hub protocol is
    /// plain HTTP here: keep it on loopback or a trusted network).
    #[arg(long, default_value = "127.0.0.1:8088")]
    pub listen: std::net::SocketAddr,
    /// Cap each connection's bodies at this many bytes per second, as a
    /// CDN does (0: no cap).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub rate: u64,
}

/// `--chunk-size`: `auto`, or a power of two from 64 KiB to 256 MiB.
pub fn parse_chunk(s: &str) -> Result<xfer_proto::manifest::ChunkSize, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(xfer_proto::manifest::ChunkSize::Auto);
    }
    let n = parse_size(s).map_err(|e| e.to_string())?;
    if xfer_proto::hash::is_valid_chunk_size(n) {
        Ok(xfer_proto::manifest::ChunkSize::Fixed(n))
    } else {
        Err(format!(
            "{s} is neither auto nor a power of two between 64KiB and 256MiB"
        ))
    }
}

/// `--repo-type`: `model` or `dataset`.
pub fn parse_repo_type(s: &str) -> Result<xfer_proto::repo::RepoType, String> {
    xfer_proto::repo::RepoType::parse(s)
}

/// `--peers K`: 2 to 64 links per receiver.
fn parse_peers(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(k) if (2..=64).contains(&k) => Ok(k),
        _ => Err(format!(
            "{s} is not a peer count; give 2 to 64 links per receiver (default {})",
            xfer::engine::topology::DEFAULT_DEGREE
        )),
    }
}

/// How `xfer pull --to` overlaps the download and the fan-out
/// (`--fan-out`), as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FanOutArg {
    /// Chunk by chunk: each verified chunk goes out as it lands.
    #[default]
    Stream,
    /// File by file, in push rounds (the older way, kept to compare).
    Files,
}

impl From<FanOutArg> for xfer::flow::pull_fanout::FanOut {
    fn from(a: FanOutArg) -> Self {
        match a {
            FanOutArg::Stream => xfer::flow::pull_fanout::FanOut::Stream,
            FanOutArg::Files => xfer::flow::pull_fanout::FanOut::Files,
        }
    }
}

/// A percentage, `85` or `85%`, from 1 to 100.
fn parse_percent(s: &str) -> Result<u8, String> {
    let n = s.trim().trim_end_matches('%');
    match n.parse::<u8>() {
        Ok(p) if (1..=100).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a percentage from 1 to 100, like 85%")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use crate::cli::cli_docs::undocumented;

    /// The README's quick start, read as a newcomer copies it: every
    /// `xfer` line in it parses with these arguments.
    #[test]
    fn every_xfer_command_in_the_quick_start_parses() {
        crate::cli::cli_docs::assert_quick_start_parses::<super::Cli>("xfer", 8);
    }

    /// Every `--cluster FILE` an operator passes (all but `serve`'s, which
    /// limits whom an agent trusts) falls back to `$XFER_CLUSTER`: through
    /// clap, or (`push`, `image push`, `image pull`, where `--to` is the other choice) in
    /// the command, which its help says.
    #[test]
    fn every_operators_cluster_flag_reads_xfer_cluster() {
        fn walk(c: &clap::Command, path: &str, out: &mut Vec<String>) {
            for a in c.get_arguments() {
                let by_clap = a.get_env().and_then(|e| e.to_str()) == Some("XFER_CLUSTER");
                let in_help = a
                    .get_help()
                    .is_some_and(|h| h.to_string().contains("XFER_CLUSTER"));
                let by_command =
                    matches!(path, "xfer push" | "xfer image push" | "xfer image pull") && in_help;
                if a.get_id() == "cluster" && path != "xfer serve" && !by_clap && !by_command {
                    out.push(path.to_string());
                }
            }
            for s in c.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), out);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "xfer", &mut missing);
        assert!(missing.is_empty(), "no XFER_CLUSTER: {missing:?}");
    }

    #[test]
    fn every_argument_has_help_and_every_command_an_example() {
        let mut missing = Vec::new();
        undocumented(&super::Cli::command(), "xfer", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
