//! Serving chunks from files on disk: the [`ChunkReader`]s the pusher (over
//! its source tree) and the agent (over a model it holds, or the verified
//! chunks of one it is still receiving) use.
//!
//! Each chunk is mapped on its own and the mapping is handed to the transport
//! without a copy, so resident memory is bounded by the chunks in flight,
//! whatever the model size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{ChunkReader, ReadError};
use crate::store::{Store, Transfer};
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::manifest::{ChunkId, Manifest};
use xfer_proto::names::ModelName;

/// Test-only fault injection: how many chunks to corrupt while serving.
pub const FAULT_CORRUPT_SENDS: &str = "XFER_FAULT_CORRUPT_SENDS";

/// Reads chunks of the files of one manifest, indexed like
/// [`xfer_proto::manifest::Manifest::files`].
pub struct FileChunkReader {
    paths: Vec<PathBuf>,
    map: Arc<ChunkMap>,
    open: Mutex<Vec<Option<Arc<File>>>>,
    corrupt_left: AtomicU32,
}

impl FileChunkReader {
    /// Reads the files at `paths`, chunked as `map` says.
    pub fn new(paths: Vec<PathBuf>, map: Arc<ChunkMap>) -> Self {
        let corrupt = fault_corrupt_sends();
        FileChunkReader {
            open: Mutex::new(vec![None; paths.len()]),
            paths,
            map,
            corrupt_left: AtomicU32::new(corrupt),
        }
    }

    fn file(&self, index: usize) -> Result<Arc<File>, ReadError> {
        let mut open = self.open.lock().unwrap();
        let slot = open.get_mut(index).ok_or(ReadError::NoSuchFile)?;
        if let Some(f) = slot {
            return Ok(f.clone());
        }
        let path = &self.paths[index];
        let f = Arc::new(File::open(path).map_err(|source| ReadError::Open {
            path: path.clone(),
            source,
        })?);
        *slot = Some(f.clone());
        Ok(f)
    }
}

impl ChunkReader for FileChunkReader {
    fn read_chunk(&self, id: ChunkId) -> Result<Bytes, ReadError> {
        let f = self.file(id.file as usize)?;
        let path = &self.paths[id.file as usize];
        map_chunk(&f, path, &self.map, id, &self.corrupt_left)
    }
}

/// A complete model an agent holds, ready to serve.
pub struct HeldModel {
    /// Its manifest.
    pub manifest: Manifest,
    /// Its chunks.
    pub map: Arc<ChunkMap>,
    /// Reads its chunks from its files.
    pub reader: Arc<FileChunkReader>,
    /// Its files, in manifest order.
    pub paths: Vec<PathBuf>,
}

impl HeldModel {
    /// The complete model `name` in `store`, if it holds one.
    pub fn open(store: &Store, name: &ModelName) -> Option<HeldModel> {
        let manifest = store.record(name)?.manifest.manifest;
        let dir = store.model_dir(name);
        let paths: Vec<PathBuf> = manifest.files().map(|f| f.path.under(&dir)).collect();
        let map = Arc::new(ChunkMap::new(&manifest));
        let reader = Arc::new(FileChunkReader::new(paths.clone(), map.clone()));
        Some(HeldModel {
            manifest,
            map,
            reader,
            paths,
        })
    }
}

/// Serves the verified chunks of a transfer still in progress (and, once it
/// is placed, of the finished model) to other receivers of the same swarm.
pub struct HeldChunkReader {
    transfer: Arc<Transfer>,
    map: Arc<ChunkMap>,
    corrupt_left: AtomicU32,
}

impl HeldChunkReader {
    /// Serves `transfer`'s verified chunks.
    pub fn new(transfer: Arc<Transfer>) -> Self {
        HeldChunkReader {
            map: Arc::new(transfer.map().clone()),
            transfer,
            corrupt_left: AtomicU32::new(fault_corrupt_sends()),
        }
    }
}

impl ChunkReader for HeldChunkReader {
    fn read_chunk(&self, id: ChunkId) -> Result<Bytes, ReadError> {
        let (f, path) = self.transfer.open_held(id).map_err(ReadError::NotHeld)?;
        map_chunk(&f, &path, &self.map, id, &self.corrupt_left)
    }
}

fn fault_corrupt_sends() -> u32 {
    std::env::var(FAULT_CORRUPT_SENDS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Maps chunk `id` of the open file `f` (at `path`, for messages) without
/// copying it, or, while `corrupt_left` lasts, returns a damaged copy.
fn map_chunk(
    f: &File,
    path: &Path,
    map: &ChunkMap,
    id: ChunkId,
    corrupt_left: &AtomicU32,
) -> Result<Bytes, ReadError> {
    let len = map.chunk_len(id) as usize;
    let offset = map.offset(id);
    if len == 0 {
        return Ok(Bytes::new());
    }
    if corrupt_left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, offset)
            .map_err(|source| ReadError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        buf[0] ^= 0x5a;
        return Ok(Bytes::from(buf));
    }
    let actual = f.metadata().map_err(ReadError::Stat)?.len();
    if actual < offset + len as u64 {
        return Err(ReadError::Shorter {
            path: path.to_path_buf(),
        });
    }
    // SAFETY: a read-only view of a range that exists. If another process
    // rewrites the file meanwhile, the receiver's hash check rejects the
    // chunk; nothing here trusts the bytes.
    let mapped = unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(len)
            .populate()
            .map(f)
    }
    .map_err(|source| ReadError::Map {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Bytes::from_owner(mapped))
}
