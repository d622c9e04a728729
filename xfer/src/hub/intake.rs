//! Striped intake's seam in the download (issue 36): other nodes that
//! fetch ranges from the origin over their own links for this node's
//! download. The download ([`super::download`]) hands each of them parts
//! on demand, beside its own connections, writes what they send where its
//! own bytes go, and checks every file's Hub hash over all of it; a file
//! that fails is fetched again by this node alone, and a node whose ranges
//! differ from the origin's second answer is named and given no more work.
//!
//! The transport lives above this module (`crate::flow::intake`): here a
//! remote is only "ask for `[from, to)` of `url`, read the bytes".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use reqwest::Url;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::http::Failure;

/// The bytes of one range as they arrive; an `Err` ends it early.
pub type RangeBody = mpsc::Receiver<Result<Bytes, String>>;

/// What [`RemoteRanges::fetch`] returns.
pub type Fetching = Pin<Box<dyn Future<Output = Result<RangeBody, Failure>> + Send>>;

/// A node that fetches ranges from the origin for this download.
pub trait RemoteRanges: Send + Sync + 'static {
    /// The node's name, for reports.
    fn name(&self) -> &str;
    /// Asks the node for one range.
    fn fetch(&self, ask: RangeAsk) -> Fetching;
}

/// One range an intake node is asked to fetch.
#[derive(Debug, Clone)]
pub struct RangeAsk {
    /// The resolved URL of the file.
    pub url: Url,
    /// The Hub token, only for a URL on the Hub's own origin.
    pub token: Option<String>,
    /// First byte.
    pub from: u64,
    /// One past the last byte.
    pub to: u64,
    /// The file's index in the pull's draft, when the pull streams one:
    /// the node, a receiver of that draft too, keeps what it fetched.
    pub draft_file: Option<u32>,
}

/// The intake nodes of a download and how many ranges each carries at once.
#[derive(Clone, Default)]
pub struct Intake {
    /// The nodes.
    pub remotes: Vec<Arc<dyn RemoteRanges>>,
    /// Ranges in flight per node (its connections to the origin).
    pub connections: usize,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.remotes.iter().map(|r| r.name()))
            .finish()
    }
}

/// One downloader's share of a pull, for the summary and `--json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntakeShare {
    /// The node (`this node` for the pulling node's own connections).
    pub node: String,
    /// Bytes it fetched from the origin that were written.
    pub bytes: u64,
    /// Its ranges differed from the origin's: named, no more work.
    pub blamed: bool,
    /// It stopped taking work after repeated failures (dead or cut off).
    pub retired: Option<String>,
}
