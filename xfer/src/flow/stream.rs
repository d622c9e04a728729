//! The source's side of a streamed delivery (issue 17): the files of a
//! pull that is still downloading them go to the agents chunk by chunk.
//!
//! The pull's announcements ([`crate::hub::announce`]) are appended to a
//! [`DraftFeed`] ([`crate::flow::feed`]), which checks them against its own [`Draft`] and keeps
//! them in order; every receiver's control stream replays the feed from
//! the start and then follows it. The source serves a chunk only once its
//! hash is announced ([`DraftReader`]), from the file being downloaded or,
//! once it is placed, from the placed file. Receivers stage what they
//! fetch, relay it to each other, and place a file when it is sealed; the
//! delivery ends when every file is sealed and every agent has all of it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::flow::feed::DraftFeed;
use crate::flow::push::{self, NodeSummary, Plan, PushError, PushOptions};
use crate::flow::timeline::Clock;
use crate::hub::announce::DraftPaths;
use crate::transport::{ChunkReader, ReadError};
use crate::util::progress::Progress;
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::manifest::ChunkId;
use xfer_proto::names::ModelName;
use xfer_proto::transfer::TransferMsg;

/// Serves a draft's announced chunks from the pulling node's disk.
pub struct DraftReader {
    feed: Arc<DraftFeed>,
    paths: Vec<DraftPaths>,
    map: Arc<ChunkMap>,
}

impl ChunkReader for DraftReader {
    fn read_chunk(&self, id: ChunkId) -> Result<Bytes, ReadError> {
        let num = self.map.number(id).ok_or(ReadError::NoSuchChunk)?;
        if !self.feed.is_hashed(num) {
            return Err(ReadError::NotDownloaded);
        }
        let at = self
            .paths
            .get(id.file as usize)
            .ok_or(ReadError::NoSuchFile)?;
        let mut buf = vec![0u8; self.map.chunk_len(id) as usize];
        let offset = self.map.offset(id);
        // Placed while we look: the incomplete file was renamed.
        for path in [&at.content, &at.incomplete, &at.content] {
            if let Ok(f) = File::open(path) {
                return match f.read_exact_at(&mut buf, offset) {
                    Ok(()) => Ok(Bytes::from(buf)),
                    Err(source) => Err(ReadError::Read {
                        path: path.clone(),
                        source,
                    }),
                };
            }
        }
        Err(ReadError::Unopenable {
            content: at.content.clone(),
            incomplete: at.incomplete.clone(),
        })
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
) -> Result<Vec<NodeSummary>, PushError> {
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
        clock: Clock::since(Instant::now()),
    };
    push::deliver_plan(opts, plan, progress).await
}
