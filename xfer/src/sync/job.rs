//! A sync job as the agents own it: what to deliver (a folder on one node,
//! or a Hub repo that one node pulls), to which nodes, and where it stands.
//! Every member agent keeps the job in `<root>/.xfer/jobs/<id>.json`, so a
//! restarted agent carries on without being told again.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::transport::select::TransportChoice;
use crate::wire::ModelName;

/// Where a job's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobSource {
    /// A folder on the source node.
    Path(PathBuf),
    /// `ORG/NAME[@REV]` of the given type (`model`, `dataset`), pulled once
    /// by the source node into its root as an HF cache.
    Hub { repo: String, repo_type: String },
}

/// One node of a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMember {
    pub node: String,
    /// `HOST:PORT` of its agent.
    pub agent: String,
}

/// What `xfer sync` hands to the agents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: String,
    /// The model's name on every node (`<root>/<name>`).
    pub name: ModelName,
    pub source: JobSource,
    /// The node that reads the source and drives the job.
    pub source_node: String,
    /// Every node that must end with the model (may include the source node).
    pub members: Vec<JobMember>,
    pub chunk_size: u64,
    /// Cap on the source's send rate, bytes per second.
    pub limit_rate: Option<u64>,
    /// The data plane the source node offers (`xfer sync --transport`).
    #[serde(default)]
    pub transport: TransportChoice,
}

impl JobSpec {
    /// Checks what an agent cannot trust blindly: the id (it names a file)
    /// and that the source node and members make sense.
    pub fn validate(&self) -> Result<(), String> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 64
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !id_ok {
            return Err(format!("job id `{}` is not [A-Za-z0-9-]{{1,64}}", self.id));
        }
        if self.members.is_empty() {
            return Err("a job needs at least one node".into());
        }
        if let JobSource::Path(p) = &self.source {
            if !p.is_absolute() {
                return Err(format!(
                    "source {} is relative; give the absolute path on {}",
                    p.display(),
                    self.source_node
                ));
            }
        }
        if !crate::hash::is_valid_chunk_size(self.chunk_size) {
            return Err(format!("chunk size {} is not valid", self.chunk_size));
        }
        Ok(())
    }

    /// The members other than `node`, and `node` itself when it is one.
    pub fn is_member(&self, node: &str) -> bool {
        self.members.iter().any(|m| m.node == node)
    }
}

/// Where a job stands, as the source node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Handed over; the source has not started a round yet.
    Queued,
    /// Rounds are running (and retried until every member completes).
    Syncing,
    /// Every member reported `root`.
    Complete {
        root: String,
    },
    Cancelled,
    /// Cannot go on without the user (bad source path, ...).
    Failed {
        reason: String,
    },
}

impl JobState {
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            JobState::Complete { .. } | JobState::Cancelled | JobState::Failed { .. }
        )
    }

    pub fn label(&self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Syncing => "syncing",
            JobState::Complete { .. } => "complete",
            JobState::Cancelled => "cancelled",
            JobState::Failed { .. } => "failed",
        }
    }
}

/// A job on one agent's disk.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    pub spec: JobSpec,
    /// This node's name in the job.
    #[serde(default)]
    pub me: Option<String>,
    pub state: JobState,
    /// The last error a round met (kept after a later success, for status).
    pub last_error: Option<String>,
    /// Rounds run so far.
    pub rounds: u64,
    /// Per member, the bytes it got from the source and from peers in the
    /// last round that reached it.
    pub delivered: Vec<MemberTally>,
}

/// What one member got in the last round.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberTally {
    pub node: String,
    pub from_source: u64,
    pub from_peers: u64,
    pub ok: bool,
}

impl JobRecord {
    pub fn new(spec: JobSpec) -> JobRecord {
        JobRecord {
            spec,
            me: None,
            state: JobState::Queued,
            last_error: None,
            rounds: 0,
            delivered: Vec::new(),
        }
    }
}

/// The jobs folder of an agent root.
#[derive(Clone, Debug)]
pub struct JobDir {
    dir: PathBuf,
}

impl JobDir {
    pub fn new(root: &Path) -> JobDir {
        JobDir {
            dir: root.join(".xfer/jobs"),
        }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes a record atomically.
    pub fn save(&self, rec: &JobRecord) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{}.tmp", rec.spec.id));
        let bytes = serde_json::to_vec_pretty(rec).expect("plain data");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.path(&rec.spec.id))
    }

    pub fn load(&self, id: &str) -> Option<JobRecord> {
        let bytes = std::fs::read(self.path(id)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Deletes a record (a missing one is fine).
    pub fn remove(&self, id: &str) {
        let _ = std::fs::remove_file(self.path(id));
    }

    /// Every readable record (unreadable ones are logged and skipped).
    pub fn all(&self) -> Vec<JobRecord> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<JobRecord> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|e| {
                let r = std::fs::read(e.path())
                    .ok()
                    .and_then(|b| serde_json::from_slice::<JobRecord>(&b).ok());
                if r.is_none() {
                    tracing::warn!("ignoring unreadable job record {}", e.path().display());
                }
                r
            })
            .collect();
        out.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
        out
    }
}

/// A fresh job id: 12 hex digits.
pub fn new_id() -> String {
    use rand::Rng;
    format!(
        "{:012x}",
        rand::thread_rng().gen::<u64>() & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            id: new_id(),
            name: ModelName::new("m").unwrap(),
            source: JobSource::Path("/models/m".into()),
            source_node: "a".into(),
            members: vec![JobMember {
                node: "b".into(),
                agent: "10.0.0.2:7470".into(),
            }],
            chunk_size: 4 << 20,
            limit_rate: None,
            transport: TransportChoice::Auto,
        }
    }

    #[test]
    fn records_round_trip_and_specs_are_checked() {
        let t = tempfile::tempdir().unwrap();
        let dir = JobDir::new(t.path());
        let mut rec = JobRecord::new(spec());
        dir.save(&rec).unwrap();
        rec.state = JobState::Complete { root: "r".into() };
        dir.save(&rec).unwrap();
        let all = dir.all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].state, rec.state);
        assert!(dir.load(&rec.spec.id).is_some());

        let mut bad = spec();
        bad.id = "../x".into();
        assert!(bad.validate().unwrap_err().contains("job id"));
        let mut bad = spec();
        bad.source = JobSource::Path("rel".into());
        assert!(bad.validate().unwrap_err().contains("relative"));
        let mut bad = spec();
        bad.members.clear();
        assert!(bad.validate().is_err());
        spec().validate().unwrap();
    }
}
