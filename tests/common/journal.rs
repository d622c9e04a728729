//! The agent's chunk journal, read back to see what a node holds.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// Reads an agent's journal (`<root>/.xfer/staging/<name>/journal`: a
/// 56-byte header, then 12-byte records of three little-endian u32: tag
/// 1 = chunk(file, index), 2 = file done(file), 3 = synced(n)) and returns
/// the bytes of the distinct chunks it records as held, with `manifest` the
/// pushed tree's manifest. A missing journal holds nothing.
pub fn journal_held_bytes(journal: &Path, manifest: &xfer_proto::manifest::Manifest) -> u64 {
    let Ok(bytes) = fs::read(journal) else {
        return 0;
    };
    if bytes.len() < 56 {
        return 0;
    }
    let files: Vec<&xfer_proto::manifest::FileEntry> = manifest.files().collect();
    let cs = manifest.chunk_size;
    let chunk_len = |f: usize, i: u64| cs.min(files[f].size.saturating_sub(i * cs));
    let mut held: BTreeSet<(usize, u64)> = BTreeSet::new();
    for r in bytes[56..].chunks_exact(12) {
        let w = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap());
        match w(0) {
            1 if (w(4) as usize) < files.len() => {
                held.insert((w(4) as usize, w(8) as u64));
            }
            2 if (w(4) as usize) < files.len() => {
                let f = w(4) as usize;
                for i in 0..files[f].chunks.len() as u64 {
                    held.insert((f, i));
                }
            }
            _ => {}
        }
    }
    held.iter().map(|&(f, i)| chunk_len(f, i)).sum()
}
