//! The control-stream messages: a transfer (offer, swarm, join, bitfield,
//! has, progress), the admin requests (sync jobs, status, rm, cancel) and
//! the launch requests (preflight, ranks, logs), each answered on the same
//! stream, and [`Refusal`], why a receiver refused or abandoned a transfer.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::admin::{AgentStatus, JobSpec};
use crate::chunkset::ChunkSet;
use crate::hash::Hash;
use crate::launch::{
    LogChunk, NodeFacts, PreflightRequest, Probe, RankReport, RankSpec, ReachFacts, ReachTarget,
};
use crate::manifest::Manifest;
use crate::names::ModelName;

/// Why a receiver refused or abandoned a transfer. Each says what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    #[error("protocol version {theirs} is not {ours}; run the same xfer version on every node")]
    Version { ours: u32, theirs: u32 },
    #[error("rejected manifest: {0}")]
    BadManifest(String),
    #[error("rejected: {0}")]
    BadName(String),
    #[error("no space: need {need}, have {have} at {path}; free space there or start the agent with another --root", need = crate::units::Bytes(*need), have = crate::units::Bytes(*have))]
    NoSpace { need: u64, have: u64, path: String },
    #[error("disk error at {path}: {message}")]
    Io { path: String, message: String },
    #[error("refusing to write {path}: {reason}")]
    Unsafe { path: String, reason: String },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("chunk {file}/{index} failed its BLAKE3 check {times} times; the source's copy may be changing or damaged")]
    Corrupt { file: u32, index: u32, times: u32 },
    #[error("transfer superseded by a newer push of the same model")]
    Superseded,
    #[error("lost the source: {0}; run the push again to resume")]
    SourceLost(String),
    #[error("this agent holds no complete model named `{0}`; push it there first")]
    NotHeld(String),
    #[error("the source sent {strikes} chunks that failed their BLAKE3 check and was dropped; its files may be changing while being sent, or its disk or memory is damaged (run `xfer verify` or `b3sum` there)")]
    CorruptSource { strikes: u32 },
    #[error("busy: {0}")]
    Busy(String),
}

/// Messages on the control stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Control {
    /// Source → receiver: store this tree under `name`.
    Offer {
        version: u32,
        name: ModelName,
        manifest: Manifest,
    },
    /// Receiver → source: accepted; this much is already held.
    Accepted {
        held_bytes: u64,
        held_chunks: u64,
        need_bytes: u64,
    },
    /// Receiver → source: the tree is complete and verified.
    Done {
        root: Hash,
        received_bytes: u64,
        corrupt_chunks: u64,
    },
    /// Receiver → source: refused or failed.
    Failed(Refusal),
    /// Peer → agent: send me the complete model `name` you hold.
    Want { version: u32, name: ModelName },
    /// Agent → peer: this is the model; fetch its chunks on this connection.
    Have { manifest: Manifest },
    /// Source → receiver, right after `Offer`: you are `me` in a swarm of
    /// these receivers; fetch from them too. Without it a receiver fetches
    /// from the source alone.
    Swarm { me: u32, peers: Vec<SwarmPeer> },
    /// Receiver → receiver, opening a peer link: I am `from` in the swarm
    /// for model `name` with root `root`; announce what you hold.
    Join {
        version: u32,
        name: ModelName,
        root: Hash,
        from: u32,
    },
    /// Receiver → peer: the verified chunks I hold now (global numbers).
    Bitfield { has: ChunkSet },
    /// Receiver → peer: chunks verified since the last announcement.
    Has { chunks: Vec<u64> },
    /// Receiver → source: how far along this node is, and where its bytes
    /// came from.
    Progress {
        held_bytes: u64,
        from_source: u64,
        from_peers: u64,
    },
    /// Receiver → source: a peer was excluded from this transfer.
    PeerDropped { peer: SocketAddr, reason: String },
    /// CLI → agent: own this sync job; you are `node` in it.
    SyncJob {
        version: u32,
        node: String,
        job: JobSpec,
    },
    /// Agent → CLI: the job is stored (and started, on its source node).
    JobAccepted { id: String },
    /// CLI → agent: report your models and jobs.
    StatusQuery { version: u32 },
    /// Agent → CLI: the answer to [`Control::StatusQuery`].
    StatusReport(AgentStatus),
    /// CLI → agent: stop sync job `id`.
    CancelJob { version: u32, id: String },
    /// Agent → CLI: `known` says whether this agent had the job.
    JobCancelled { id: String, known: bool },
    /// CLI → agent: delete the model `name` from your root.
    RemoveModel { version: u32, name: ModelName },
    /// Agent → CLI: removed (`existed` false: there was nothing to remove).
    ModelRemoved { name: ModelName, existed: bool },
    /// Launcher → agent: look at this node before a launch.
    Preflight {
        version: u32,
        request: Box<PreflightRequest>,
    },
    /// Agent → launcher: what it found.
    PreflightReport(Box<NodeFacts>),
    /// Launcher → agent: start your rank of a launch.
    StartRank { version: u32, spec: Box<RankSpec> },
    /// Agent → launcher, agent → agent: how the ranks named are doing
    /// (`run` None: every rank this agent knows).
    RunQuery { version: u32, run: Option<String> },
    /// Agent → launcher: ranks, newest first.
    Runs(Vec<RankReport>),
    /// Launcher → agent, agent → agent: stop a run's rank (`run` None:
    /// every live one), SIGKILL after `grace_ms`; answered with `Runs` once
    /// stopped.
    StopRun {
        version: u32,
        run: Option<String>,
        grace_ms: u64,
        reason: String,
    },
    /// Launcher → agent: part of a rank's log.
    ReadLog {
        version: u32,
        run: String,
        offset: u64,
        max: u64,
    },
    /// Agent → launcher: the part asked for.
    Log(Box<LogChunk>),
    /// Launcher → agent: listen on `listen` and connect to every peer for
    /// `window_ms` (run on every node at once, after the port checks).
    Reach {
        version: u32,
        listen: Option<SocketAddr>,
        peers: Vec<ReachTarget>,
        window_ms: u64,
    },
    /// Agent → launcher: whether it could listen, and each peer's result.
    Reached {
        listen: Probe<SocketAddr>,
        reach: Vec<ReachFacts>,
    },
}

/// One member of a swarm, as the source lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwarmPeer {
    pub id: u32,
    pub addr: SocketAddr,
}

impl Control {
    /// The message's name, for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Control::Offer { .. } => "Offer",
            Control::Accepted { .. } => "Accepted",
            Control::Done { .. } => "Done",
            Control::Failed(_) => "Failed",
            Control::Want { .. } => "Want",
            Control::Have { .. } => "Have",
            Control::Swarm { .. } => "Swarm",
            Control::Join { .. } => "Join",
            Control::Bitfield { .. } => "Bitfield",
            Control::Has { .. } => "Has",
            Control::Progress { .. } => "Progress",
            Control::PeerDropped { .. } => "PeerDropped",
            Control::SyncJob { .. } => "SyncJob",
            Control::JobAccepted { .. } => "JobAccepted",
            Control::StatusQuery { .. } => "StatusQuery",
            Control::StatusReport(_) => "StatusReport",
            Control::CancelJob { .. } => "CancelJob",
            Control::JobCancelled { .. } => "JobCancelled",
            Control::RemoveModel { .. } => "RemoveModel",
            Control::ModelRemoved { .. } => "ModelRemoved",
            Control::Preflight { .. } => "Preflight",
            Control::PreflightReport(_) => "PreflightReport",
            Control::StartRank { .. } => "StartRank",
            Control::RunQuery { .. } => "RunQuery",
            Control::Runs(_) => "Runs",
            Control::StopRun { .. } => "StopRun",
            Control::ReadLog { .. } => "ReadLog",
            Control::Log(_) => "Log",
            Control::Reach { .. } => "Reach",
            Control::Reached { .. } => "Reached",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, decode_frame, encode, frame_len, WireError};
    use crate::manifest::{ChunkId, MANIFEST_VERSION};
    use crate::names::PROTOCOL_VERSION;
    use crate::stream::ChunkRequest;

    #[test]
    fn messages_round_trip() {
        let m = Control::Offer {
            version: PROTOCOL_VERSION,
            name: ModelName::new("llama-3").unwrap(),
            manifest: Manifest {
                version: MANIFEST_VERSION,
                chunk_size: 1 << 22,
                entries: vec![],
            },
        };
        assert_eq!(decode_frame::<Control>(&encode(&m)).unwrap(), m);
        let r = ChunkRequest {
            chunk: ChunkId { file: 3, index: 9 },
        };
        assert_eq!(decode_frame::<ChunkRequest>(&encode(&r)).unwrap(), r);
        let f = Control::Failed(Refusal::NoSpace {
            need: 10,
            have: 2,
            path: "/x".into(),
        });
        assert_eq!(decode_frame::<Control>(&encode(&f)).unwrap(), f);
    }

    #[test]
    fn launch_messages_round_trip() {
        use crate::launch::*;
        let facts = NodeFacts {
            hostname: "n1".into(),
            agent_version: "0.1.0".into(),
            weights: WeightFacts {
                problems: vec!["x: missing".into()],
                ..WeightFacts::default()
            },
            disk: Probe::Ok(DiskFacts {
                path: "/r".into(),
                free_bytes: 1,
                total_bytes: 2,
            }),
            memory: Probe::Skipped("why".into()),
            gpus: Probe::Failed("nvidia-smi exited with 9".into()),
            fabric: Probe::Ok(IfaceFacts {
                name: "fab0".into(),
                operstate: "up".into(),
                carrier: Some(true),
                mtu: 9000,
                addrs: vec![("10.0.0.1".parse().unwrap(), 24)],
            }),
            interfaces: vec![],
            default_route: Probe::Skipped("no IPv4 default route".into()),
            ports: vec![PortFacts {
                what: "api".into(),
                port: 8000,
                free: Probe::Ok(()),
            }],
            listen: Probe::Ok("10.0.0.1:29500".parse().unwrap()),
            reach: vec![ReachFacts {
                node: "n2".into(),
                addr: "10.0.0.2:29500".parse().unwrap(),
                result: Probe::Ok(120),
            }],
            versions: vec![VersionFacts {
                what: "vllm".into(),
                version: Probe::Ok("0.11.0".into()),
            }],
            rdma: Probe::Skipped("none".into()),
        };
        let spec = RankSpec {
            run: "r1".into(),
            node: "n1".into(),
            rank: 0,
            env: [("A".to_string(), "B".to_string())].into(),
            procs: vec![ProcSpec {
                argv: vec!["vllm".into()],
                wait_tcp: Some("10.0.0.1:6379".parse().unwrap()),
            }],
            on_stop: vec![],
            group: vec![GroupPeer {
                node: "n2".into(),
                addrs: vec!["10.0.0.2:7470".into()],
            }],
            wait_timeout_ms: 1,
            grace_ms: 2,
        };
        for m in [
            Control::PreflightReport(Box::new(facts)),
            Control::StartRank {
                version: PROTOCOL_VERSION,
                spec: Box::new(spec),
            },
            Control::StopRun {
                version: PROTOCOL_VERSION,
                run: None,
                grace_ms: 5,
                reason: "down".into(),
            },
            Control::Reached {
                listen: Probe::Failed("in use".into()),
                reach: vec![],
            },
        ] {
            assert_eq!(
                decode_frame::<Control>(&encode(&m)).unwrap(),
                m,
                "{}",
                m.kind()
            );
        }
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(matches!(
            frame_len([0xff; 4]),
            Err(WireError::TooLarge { .. })
        ));
        assert!(decode_frame::<Control>(&[0, 0]).is_err());
        assert!(decode_frame::<Control>(&[0, 0, 0, 2, 0xff, 0xff]).is_err());
        let mut good = encode(&ChunkRequest {
            chunk: ChunkId { file: 1, index: 1 },
        });
        good.push(0);
        good[3] += 1;
        assert!(matches!(
            decode_frame::<ChunkRequest>(&good),
            Err(WireError::Malformed(_))
        ));
        // A name that would escape the root is refused while decoding.
        let evil = encode(&String::from("../etc"));
        assert!(decode_frame::<ModelName>(&evil).is_err());
        // Random bytes never panic.
        let mut x = 12345u64;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode::<Control>(&bytes);
        }
    }

    #[test]
    fn model_names() {
        assert!(ModelName::new("models--org--name").is_ok());
        for bad in ["", ".xfer", "a/b", "..", "a b", &"x".repeat(201)] {
            assert!(ModelName::new(bad).is_err(), "{bad}");
        }
    }
}
