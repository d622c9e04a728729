//! A streamed delivery's feed: the draft of a pull still downloading and
//! every event it has had, in order, for each receiver's control stream to
//! replay and follow. Shared by the source's push ([`crate::flow::push`])
//! and the streamed delivery ([`crate::flow::stream`]), so neither imports
//! the other for it.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use xfer_proto::draft::{Draft, DraftError, DraftEvent};
use xfer_proto::hash::Hash;
use xfer_proto::manifest::Manifest;

/// Told of a pull's feed once its listing is known (the agent that pulls
/// reports the pull's progress from it).
pub type OnFeed = Arc<dyn Fn(Arc<DraftFeed>) + Send + Sync>;

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
    /// The draft-wide chunks of every withdrawal, in order (one per
    /// withdrawn download: a few per pull).
    withdrawn: Vec<std::ops::Range<u64>>,
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
                withdrawn: Vec::new(),
            }),
            len: watch::channel(0).0,
        })
    }

    /// The draft's id (named where a root would be).
    pub fn id(&self) -> Hash {
        self.id
    }

    /// Appends an event, if the draft takes it.
    pub fn push(&self, ev: DraftEvent) -> Result<(), DraftError> {
        let mut st = self.state.lock().unwrap();
        if let xfer_proto::draft::Applied::Withdrawn(_, chunks) = st.draft.apply(&ev)? {
            st.withdrawn.push(chunks);
        }
        st.log.push(ev);
        let n = st.log.len();
        drop(st);
        self.len.send_replace(n);
        Ok(())
    }

    /// The chunk ranges withdrawn, from the `from`th withdrawal on.
    pub fn withdrawn_from(&self, from: usize) -> Vec<std::ops::Range<u64>> {
        let st = self.state.lock().unwrap();
        st.withdrawn
            .get(from..)
            .map(<[_]>::to_vec)
            .unwrap_or_default()
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

    /// The files not sealed yet and the symlinks that lead to them
    /// ([`Draft::pending`]).
    pub fn pending(&self) -> Vec<xfer_proto::relpath::RelPath> {
        self.state.lock().unwrap().draft.pending()
    }

    /// Bytes of the sealed files, and of all files.
    pub fn sealed_bytes(&self) -> (u64, u64) {
        self.state.lock().unwrap().draft.sealed_bytes()
    }

    /// The draft as it started (its shape; the events fill in the rest).
    pub fn draft(&self) -> Draft {
        self.state.lock().unwrap().draft.clone()
    }
}
