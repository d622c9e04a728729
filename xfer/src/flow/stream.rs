//! The source's side of a streamed delivery (issue 17): the files of a
//! pull that is still downloading them go to the agents chunk by chunk.
//!
//! The pull's announcements ([`crate::hub::announce`]) are appended to a
//! [`DraftFeed`], which checks them against its own [`Draft`] and keeps
//! them in order; every receiver's control stream replays the feed from
//! the start and then follows it. The source serves a chunk only once its
//! hash is announced ([`DraftReader`]), from the file being downloaded or,
//! once it is placed, from the placed file. Receivers stage what they
//! fetch, relay it to each other, and place a file when it is sealed; the
//! delivery ends when every file is sealed and every agent has all of it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use bytes::Bytes;
use tokio::sync::watch;

use crate::flow::push::{self, NodeSummary, Plan, PushOptions};
use crate::hub::announce::DraftPaths;
use crate::transport::ChunkReader;
use crate::util::progress::Progress;
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::draft::{Draft, DraftError, DraftEvent};
use xfer_proto::hash::Hash;
use xfer_proto::manifest::{ChunkId, Manifest};
use xfer_proto::names::ModelName;
use xfer_proto::transfer::TransferMsg;

/// A draft and every event it has had, in order.
pub struct DraftFeed {
    id: Hash,
    state: Mutex<FeedState>,
    /// The number of events, for writers waiting for more.
    len: watch::Sender<usize>,
}

struct FeedState {
    draft: Draft,
    log: Vec<DraftEvent>,
}

impl DraftFeed {
    /// A feed of `draft`, whose id is keyed by `commit` (the same pull run
    /// again has the same id, so receivers resume).
    pub fn new(draft: Draft, commit: &str) -> Arc<DraftFeed> {
        Arc::new(DraftFeed {
            id: draft.id(commit),
            state: Mutex::new(FeedState {
                draft,
                log: Vec::new(),
            }),
            len: watch::channel(0).0,
        })
    }

    pub fn id(&self) -> Hash {
        self.id
    }

    /// Appends an event, if the draft takes it.
    pub fn push(&self, ev: DraftEvent) -> Result<(), DraftError> {
        let mut st = self.state.lock().unwrap();
        st.draft.apply(&ev)?;
        st.log.push(ev);
        let n = st.log.len();
        drop(st);
        self.len.send_replace(n);
        Ok(())
    }

    /// The events from the `from`th on.
    pub fn events_from(&self, from: usize) -> Vec<DraftEvent> {
        let st = self.state.lock().unwrap();
        st.log.get(from..).map(<[_]>::to_vec).unwrap_or_default()
    }

    /// Told each time events are appended.
    pub fn subscribe(&self) -> watch::Receiver<usize> {
        self.len.subscribe()
    }

    /// Whether chunk `chunk`'s hash is announced (its bytes are here).
    pub fn is_hashed(&self, chunk: u64) -> bool {
        self.state.lock().unwrap().draft.expected(chunk).is_some()
    }

    /// Whether every file is sealed (the download is over).
    pub fn is_sealed_all(&self) -> bool {
        self.state.lock().unwrap().draft.is_sealed_all()
    }

    /// The manifest, once every file is sealed.
    pub fn manifest(&self) -> Option<Manifest> {
        self.state.lock().unwrap().draft.manifest()
    }

    /// The draft as it started (its shape; the events fill in the rest).
    pub fn draft(&self) -> Draft {
        self.state.lock().unwrap().draft.clone()
    }
}

/// Serves a draft's announced chunks from the pulling node's disk.
pub struct DraftReader {
    feed: Arc<DraftFeed>,
    paths: Vec<DraftPaths>,
    map: Arc<ChunkMap>,
}

impl ChunkReader for DraftReader {
    fn read_chunk(&self, id: ChunkId) -> Result<Bytes, String> {
        let num = self.map.number(id).ok_or("no such chunk")?;
        if !self.feed.is_hashed(num) {
            return Err("not downloaded yet".into());
        }
        let at = self.paths.get(id.file as usize).ok_or("no such file")?;
        let mut buf = vec![0u8; self.map.chunk_len(id) as usize];
        let offset = self.map.offset(id);
        // Placed while we look: the incomplete file was renamed.
        for path in [&at.content, &at.incomplete, &at.content] {
            if let Ok(f) = File::open(path) {
                return match f.read_exact_at(&mut buf, offset) {
                    Ok(()) => Ok(Bytes::from(buf)),
                    Err(e) => Err(format!("cannot read {}: {e}", path.display())),
                };
            }
        }
        Err(format!(
            "neither {} nor {} can be opened",
            at.content.display(),
            at.incomplete.display()
        ))
    }
}

/// Delivers the draft `feed` (whose files' bytes are at `paths`) to every
/// agent in `opts.to` as `name`, while it grows; returns when each agent
/// is done or failed. Each agent's root is that of `feed`'s manifest.
pub async fn stream(
    opts: &PushOptions,
    name: &ModelName,
    feed: Arc<DraftFeed>,
    paths: Vec<DraftPaths>,
    progress: &Progress,
) -> Result<Vec<NodeSummary>> {
    let draft = feed.draft();
    let shape = draft.shape();
    let map = Arc::new(ChunkMap::new(&shape));
    let plan = Plan {
        offer: TransferMsg::OfferDraft {
            name: name.clone(),
            id: feed.id(),
            listing: draft.listing(),
        },
        name: name.clone(),
        key: feed.id(),
        reader: Arc::new(DraftReader {
            feed: feed.clone(),
            paths,
            map: map.clone(),
        }),
        map,
        // The files grow and move while they are served: QUIC only.
        rdma_files: None,
        total_bytes: shape.total_bytes(),
        events: Some(feed),
    };
    push::deliver_plan(opts, plan, progress).await
}
