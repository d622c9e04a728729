//! Entry points shared by the fuzz targets in fuzz/ and the corpus replay
//! test.
//!
//! Each function takes arbitrary bytes, feeds them to one parser that reads
//! input from a peer, a file or the Hub, and uses whatever it accepts the
//! way the rest of xfer would. None may panic, whatever the bytes: a panic
//! here is a bug in the parser or in a check it relies on. The functions
//! also assert properties that must hold for accepted input (re-encoding
//! round-trips, validated manifests are safe to index), so a broken
//! property shows up as a panic too.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::cluster::Cluster;
use crate::hub::api::{self, RevisionInfo};
use crate::store::ModelRecord;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::chunkset::{ChunkMap, ChunkSet};
use xfer_proto::frame;
use xfer_proto::hello::Hello;
use xfer_proto::launch::{LaunchReply, LaunchRequest};
use xfer_proto::manifest::Manifest;
use xfer_proto::names::ModelName;
use xfer_proto::stream::{ChunkReply, ChunkRequest, RdmaReply, RdmaRequest, StreamRequest};
use xfer_proto::transfer::TransferMsg;

/// Most chunks [`manifest`] walks one by one; enough to cover every file
/// boundary of anything a fuzzer produces.
const WALK_LIMIT: u64 = 1 << 16;

/// The wire decoder: every message type, bare and framed. Whatever decodes
/// must re-encode to a frame that decodes to the same value.
pub fn wire(data: &[u8]) {
    if let Some(prefix) = data.get(..4).and_then(|p| <[u8; 4]>::try_from(p).ok()) {
        let _ = frame::frame_len(prefix);
    }
    if let Some(h) = round_trip::<Hello>(data) {
        let _ = h.check();
    }
    if let Some(m) = round_trip::<TransferMsg>(data) {
        transfer(&m);
    }
    round_trip::<AdminRequest>(data);
    if let Some(r) = round_trip::<AdminReply>(data) {
        let _ = r.kind();
    }
    round_trip::<LaunchRequest>(data);
    if let Some(r) = round_trip::<LaunchReply>(data) {
        let _ = r.kind();
    }
    round_trip::<StreamRequest>(data);
    round_trip::<ChunkRequest>(data);
    round_trip::<ChunkReply>(data);
    round_trip::<RdmaRequest>(data);
    round_trip::<RdmaReply>(data);
    round_trip::<ModelName>(data);
}

/// Decodes `data` as a frame body and as a whole frame; each success must
/// survive encode-then-decode unchanged.
fn round_trip<T>(data: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = frame::decode_frame::<T>(data) {
        check_round_trip(&v);
    }
    let v = frame::decode::<T>(data).ok()?;
    check_round_trip(&v);
    Some(v)
}

fn check_round_trip<T>(v: &T)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let frame = frame::encode(v);
    let again: T = match frame::decode_frame(&frame) {
        Ok(again) => again,
        Err(e) => panic!("{v:?} encodes to a frame that does not decode: {e}"),
    };
    // Floats (a status report's rate) may be NaN, which is unequal to
    // itself; the re-encoding must still be byte for byte the same.
    if same(v, v) {
        assert_eq!(&again, v, "decode(encode(v)) != v");
    }
    assert_eq!(frame::encode(&again), frame, "re-encoding is not stable");
}

fn same<T: PartialEq>(a: &T, b: &T) -> bool {
    a == b
}

/// Uses a decoded transfer message the way a receiver would, after the
/// checks a receiver makes.
fn transfer(m: &TransferMsg) {
    let _ = m.kind();
    match m {
        TransferMsg::Offer { manifest: m, .. } | TransferMsg::Have { manifest: m }
            if m.validate().is_ok() =>
        {
            use_manifest(m)
        }
        TransferMsg::Bitfield { has } if has.is_well_formed() => use_set(has),
        TransferMsg::Failed(r) => {
            let _ = r.to_string();
        }
        _ => {}
    }
}

/// The manifest decoders: the JSON document `xfer manifest --json` writes
/// (and `xfer verify --manifest` reads), an agent's model record, and the
/// postcard form carried in an offer. Whatever is accepted is validated and
/// then used.
pub fn manifest(data: &[u8]) {
    let path = Path::new("fuzz.json");
    match Manifest::parse_json(data, path) {
        Ok(m) => {
            use_manifest(&m);
            // The document it writes back is read back the same.
            let doc = match serde_json::to_vec(&m.to_doc()) {
                Ok(doc) => doc,
                Err(e) => panic!("a loaded manifest does not serialize: {e}"),
            };
            match Manifest::parse_json(&doc, path) {
                Ok(again) => assert_eq!(again, m, "JSON round trip changed the manifest"),
                Err(e) => panic!("a loaded manifest's own JSON is refused: {e:#}"),
            }
        }
        Err(e) => {
            let _ = format!("{e:#}");
        }
    }
    if let Ok(rec) = ModelRecord::parse(data, path) {
        use_manifest(&rec.manifest.manifest);
    }
    if let Ok(m) = frame::decode::<Manifest>(data) {
        check_round_trip(&m);
        match m.validate() {
            Ok(()) => use_manifest(&m),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// What the store, scheduler and verifier do with a validated manifest.
fn use_manifest(m: &Manifest) {
    assert!(
        m.validate().is_ok(),
        "use_manifest takes validated manifests"
    );
    let _ = m.root();
    let bytes = m.total_bytes();
    let chunks = m.total_chunks();
    let map = ChunkMap::new(m);
    assert_eq!(map.len(), chunks);
    assert_eq!(map.files(), m.file_count());
    let mut sum = 0u64;
    for (i, f) in m.files().enumerate() {
        let range = map.file_range(i as u32);
        assert_eq!(range.end - range.start, f.chunks.len() as u64);
        let mut len = 0u64;
        for (index, _) in f.chunks.iter().enumerate() {
            let id = xfer_proto::manifest::ChunkId {
                file: i as u32,
                index: index as u32,
            };
            let n = map.number(id);
            assert_eq!(n, Some(range.start + index as u64));
            assert_eq!(map.chunk_len(id), m.chunk_len(f, index as u32));
            assert!(map.chunk_len(id) > 0, "an empty chunk in {}", f.path);
            len += map.chunk_len(id);
            if range.start + index as u64 >= WALK_LIMIT {
                break;
            }
        }
        if f.chunks.len() as u64 <= WALK_LIMIT {
            assert_eq!(
                len, f.size,
                "chunks of {} do not add up to its size",
                f.path
            );
        }
        sum += f.size;
    }
    assert_eq!(sum, bytes);
    for n in 0..chunks.min(WALK_LIMIT) {
        assert_eq!(map.number(map.id(n)), Some(n));
    }
    let mut held = ChunkSet::empty(chunks);
    for n in (0..chunks).step_by(7).take(WALK_LIMIT as usize) {
        held.insert(n);
    }
    use_set(&held);
}

fn use_set(s: &ChunkSet) {
    let count = s.count();
    assert!(count <= s.capacity());
    let _ = s.is_complete();
    assert_eq!(
        s.iter().take(WALK_LIMIT as usize).count() as u64,
        count.min(WALK_LIMIT)
    );
    let _ = s.contains(s.capacity());
}

/// The cluster-file parser; its errors must format, and an accepted
/// cluster must answer lookups of its own nodes.
pub fn cluster(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Cluster::parse(text, "fuzz/cluster.toml") {
        Ok(c) => {
            let names: Vec<String> = c.nodes.iter().map(|n| n.name.to_string()).collect();
            for n in &names {
                assert!(c.node(n).is_some(), "node {n} not found by name");
            }
            match c.select(&names) {
                Ok(sel) => assert_eq!(sel.len(), names.len()),
                Err(e) => panic!("selecting every node failed: {e}"),
            }
            if let Err(e) = c.select(&["no-such-node-\u{1}".to_string()]) {
                let _ = e.to_string();
            }
        }
        Err(e) => {
            let _ = e.to_string();
            let _ = e.line();
        }
    }
}

/// The Hub's JSON replies: the tree listing and the revision reply, and
/// the `Link` header (first line: the header, second: the endpoint).
pub fn hub_tree(data: &[u8]) {
    if let Ok(files) = api::parse_tree_page(data) {
        // What `pull` does with a listing: totals, and per-file sizes.
        if let Ok(total) = api::total_size(&files) {
            let sum: u64 = files.iter().map(|f| f.size).sum();
            assert_eq!(sum, total);
        }
        for f in &files {
            assert!(
                f.size <= xfer_proto::manifest::MAX_FILE_SIZE,
                "{} too large",
                f.path
            );
        }
    }
    let _ = RevisionInfo::parse(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let (link, endpoint) = text.split_once('\n').unwrap_or((text, "https://hub"));
        let _ = api::next_page(link, endpoint);
    }
}
