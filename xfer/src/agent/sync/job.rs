//! A sync job as the agents own it: what to deliver (a folder on one node,
//! or a Hub repo that one node pulls), to which nodes, and where it stands.
//! Every member agent keeps the job in `<root>/.xfer/jobs/<id>.json`, so a
//! restarted agent carries on without being told again. The folder is
//! reached through [`Root`]: no symlink planted in it is ever followed.
//! A Hub job's source also keeps the operator's Hub token, if one came
//! with the job, in `<id>.token` beside it: mode 0600, never in the
//! record, deleted when the job ends.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::util::beneath::Root;

pub use xfer_proto::admin::{JobMember, JobSource, JobSpec, JobState, MemberTally, Secret};

/// A job on one agent's disk.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job as it was handed over.
    pub spec: JobSpec,
    /// This node's name in the job.
    #[serde(default)]
    pub me: Option<String>,
    /// How far it got.
    pub state: JobState,
    /// The last error a round met (kept after a later success, for status).
    pub last_error: Option<String>,
    /// Rounds run so far.
    pub rounds: u64,
    /// Per member, the bytes it got from the source and from peers in the
    /// last round that reached it.
    pub delivered: Vec<MemberTally>,
    /// On the source, once the job is final: the members that acknowledged
    /// its end ([`xfer_proto::admin::AdminRequest::JobEnded`]).
    #[serde(default)]
    pub told_ended: Vec<String>,
    /// Rounds that failed in a row and are being retried.
    #[serde(default)]
    pub attempt: u32,
    /// When the next round starts (Unix seconds), while waiting to retry.
    #[serde(default)]
    pub next_attempt_unix: Option<u64>,
    /// The Hub endpoint the job's last round pulled from (on its source).
    #[serde(default)]
    pub hub_endpoint: Option<String>,
    /// On the source: where its last round's seconds went.
    #[serde(default)]
    pub last_round: Option<xfer_proto::admin::RoundTimeline>,
    /// Since when (Unix seconds) the job's rounds have failed without
    /// progress, while it retries: its budget ([`JobSpec::give_up`]) counts
    /// from here.
    #[serde(default)]
    pub stalled_since_unix: Option<u64>,
}

impl JobRecord {
    /// A new record of `spec`, not started.
    pub fn new(spec: JobSpec) -> JobRecord {
        JobRecord {
            spec,
            me: None,
            state: JobState::Queued,
            last_error: None,
            rounds: 0,
            delivered: Vec::new(),
            told_ended: Vec::new(),
            attempt: 0,
            next_attempt_unix: None,
            hub_endpoint: None,
            last_round: None,
            stalled_since_unix: None,
        }
    }
}

/// The jobs folder of an agent root.
#[derive(Clone, Debug)]
pub struct JobDir {
    root: PathBuf,
    dir: PathBuf,
}

/// The jobs folder, relative to the root.
const JOBS: &str = ".xfer/jobs";

impl JobDir {
    /// The jobs folder under the store root `root`.
    pub fn new(root: &Path) -> JobDir {
        JobDir {
            root: root.to_path_buf(),
            dir: root.join(JOBS),
        }
    }

    /// The record's file, relative to the root; None for an id that could
    /// name a file outside the jobs folder.
    fn rel(&self, id: &str) -> Option<PathBuf> {
        xfer_proto::admin::check_job_id(id).ok()?;
        Some(Path::new(JOBS).join(format!("{id}.json")))
    }

    /// Reads the file `rel` beneath the root, never through a symlink.
    fn read(&self, rel: &Path) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let mut bytes = Vec::new();
        Root::open(&self.root)?
            .open_read(rel)?
            .read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// Writes a record atomically and durably (`<id>.json.tmp`, created
    /// exclusively, fsynced, renamed in, the folder fsynced).
    pub fn save(&self, rec: &JobRecord) -> std::io::Result<()> {
        let rel = self.rel(&rec.spec.id).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "invalid job id")
        })?;
        let bytes = serde_json::to_vec_pretty(rec).expect("plain data");
        Root::open(&self.root)?.write_durable(&rel, &bytes)
    }

    /// The record of job `id`, if there is one.
    pub fn load(&self, id: &str) -> Option<JobRecord> {
        let bytes = self.read(&self.rel(id)?).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Deletes a record and its token (a missing one is fine).
    pub fn remove(&self, id: &str) {
        if let Some(rel) = self.rel(id) {
            if let Ok(root) = Root::open(&self.root) {
                let _ = root.remove_file(&rel);
            }
        }
        self.remove_token(id);
    }

    /// The token file of job `id`, relative to the root.
    fn token_rel(&self, id: &str) -> Option<PathBuf> {
        xfer_proto::admin::check_job_id(id).ok()?;
        Some(Path::new(JOBS).join(format!("{id}.token")))
    }

    /// Keeps the operator's Hub token for job `id`, readable by this
    /// agent's user only (mode 0600), written durably.
    pub fn save_token(&self, id: &str, token: &Secret) -> std::io::Result<()> {
        let rel = self.token_rel(id).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "invalid job id")
        })?;
        Root::open(&self.root)?.write_private(&rel, token.expose().as_bytes())
    }

    /// The operator's Hub token of job `id`, if one came with it.
    pub fn load_token(&self, id: &str) -> Option<Secret> {
        let bytes = self.read(&self.token_rel(id)?).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        Some(Secret::new(text))
    }

    /// Deletes job `id`'s token (a missing one is fine).
    pub fn remove_token(&self, id: &str) {
        if let Some(rel) = self.token_rel(id) {
            if let Ok(root) = Root::open(&self.root) {
                let _ = root.remove_file(&rel);
            }
        }
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
                let r = self
                    .read(&Path::new(JOBS).join(e.file_name()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::admin::TransportChoice;
    use xfer_proto::names::ModelName;

    fn spec() -> JobSpec {
        JobSpec {
            id: "0123456789ab".into(),
            name: ModelName::new("m").unwrap(),
            source: JobSource::Path("/models/m".into()),
            source_node: "a".into(),
            members: vec![JobMember {
                node: "b".into(),
                agent: "10.0.0.2:7470".into(),
                data: None,
            }],
            chunk_size: xfer_proto::manifest::ChunkSize::Auto,
            limit_rate: None,
            transport: TransportChoice::Auto,
            peers: None,
            hub_endpoint: None,
            intake: Vec::new(),
            give_up: Default::default(),
        }
    }

    #[test]
    fn records_round_trip_and_specs_are_checked() {
        let t = tempfile::tempdir().unwrap();
        let dir = JobDir::new(t.path());
        let mut rec = JobRecord::new(spec());
        dir.save(&rec).unwrap();
        rec.state = JobState::Complete {
            root: xfer_proto::hash::Hash([7; 32]),
        };
        dir.save(&rec).unwrap();
        let all = dir.all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].state, rec.state);
        assert!(dir.load(&rec.spec.id).is_some());

        let mut bad = spec();
        bad.id = "../x".into();
        assert!(bad.validate().unwrap_err().to_string().contains("job id"));
        let mut bad = spec();
        bad.source = JobSource::Path("rel".into());
        assert!(bad.validate().unwrap_err().to_string().contains("relative"));
        let mut bad = spec();
        bad.members.clear();
        assert!(bad.validate().is_err());
        spec().validate().unwrap();
    }

    #[test]
    fn a_token_is_kept_apart_owner_only_and_goes_with_the_job() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = JobDir::new(t.path());
        let rec = JobRecord::new(spec());
        let id = rec.spec.id.clone();
        dir.save(&rec).unwrap();
        dir.save_token(&id, &Secret::new("hf_secret".into()))
            .unwrap();
        let file = t.path().join(JOBS).join(format!("{id}.token"));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
        assert_eq!(dir.load_token(&id).unwrap().expose(), "hf_secret");
        let record =
            std::fs::read_to_string(t.path().join(JOBS).join(format!("{id}.json"))).unwrap();
        assert!(!record.contains("hf_secret"), "{record}");
        assert_eq!(dir.all().len(), 1, "the token file is not a record");
        dir.remove(&id);
        assert!(!file.exists(), "removing the job removes its token");
        assert!(dir.load_token(&id).is_none());
    }
}
