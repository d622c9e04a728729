//! The chunk journal: which chunks of a staged transfer are on disk.
//!
//! An append-only file: a 56-byte header (magic, manifest root, boot id),
//! then fixed 12-byte records. A chunk's record is appended right after its
//! verified bytes were written, without an fsync, so a `kill -9` of the agent
//! loses nothing the kernel already has. Every checkpoint fsyncs the data
//! files and then appends `Synced(k)`: the first `k` records are durable even
//! across a power cut. When the journal is reopened after a reboot (the boot
//! id differs), only records covered by the last `Synced` mark are kept. A
//! torn tail or a record that does not fit the manifest is ignored.
//!
//! The journal lives beneath the agent's root and is opened through
//! [`Root`], so a symlink planted in its place is never followed.

use std::fs::File;
use std::io::{Read, Result, Write};
use std::path::Path;

use crate::util::beneath::Root;

use xfer_proto::hash::Hash;
use xfer_proto::manifest::ChunkId;

const MAGIC: &[u8; 8] = b"XFERJNL2";
const HEADER_LEN: usize = 56;
const RECORD_LEN: usize = 12;

/// One journal record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// A chunk was verified and written to the staging file.
    Chunk(ChunkId),
    /// A file was verified, fsynced and renamed to its final path.
    FileDone(u32),
    /// Data of the first `n` records has been fsynced.
    Synced(u32),
}

impl Record {
    fn encode(self) -> [u8; RECORD_LEN] {
        let (tag, a, b) = match self {
            Record::Chunk(c) => (1u32, c.file, c.index),
            Record::FileDone(f) => (2, f, 0),
            Record::Synced(n) => (3, n, 0),
        };
        let mut out = [0u8; RECORD_LEN];
        out[..4].copy_from_slice(&tag.to_le_bytes());
        out[4..8].copy_from_slice(&a.to_le_bytes());
        out[8..].copy_from_slice(&b.to_le_bytes());
        out
    }

    fn decode(b: &[u8]) -> Option<Record> {
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        match word(0) {
            1 => Some(Record::Chunk(ChunkId {
                file: word(4),
                index: word(8),
            })),
            2 => Some(Record::FileDone(word(4))),
            3 => Some(Record::Synced(word(4))),
            _ => None,
        }
    }
}

/// This boot's id, so a reopened journal knows whether the machine restarted
/// (and unsynced page-cache writes may be lost) or only the process did.
pub fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let h = blake3::hash(text.trim().as_bytes());
    h.as_bytes()[..16].try_into().unwrap()
}

/// An open journal, appending.
#[derive(Debug)]
pub struct Journal {
    file: File,
    records: u32,
}

impl Journal {
    /// Opens the journal at `path` beneath `fs` for `root` on the boot
    /// `boot`. Returns the records that can be trusted, or none if the
    /// journal was missing, unreadable (a symlink, say: it is replaced) or
    /// belonged to another manifest (then it is started afresh).
    pub fn open(
        fs: &Root,
        path: &Path,
        root: &Hash,
        boot: [u8; 16],
    ) -> Result<(Journal, Vec<Record>)> {
        let mut buf = Vec::new();
        if let Ok(mut f) = fs.open_read(path) {
            if f.read_to_end(&mut buf).is_err() {
                buf.clear();
            }
        }
        let mut records = Vec::new();
        if buf.len() >= HEADER_LEN && &buf[..8] == MAGIC && buf[8..40] == root.0 {
            records = buf[HEADER_LEN..]
                .chunks_exact(RECORD_LEN)
                .map(|r| Record::decode(r).unwrap_or(Record::FileDone(u32::MAX)))
                .collect();
            if buf[40..HEADER_LEN] != boot {
                // The machine rebooted: keep only what a checkpoint made durable.
                let durable = records
                    .iter()
                    .rev()
                    .find_map(|r| match r {
                        Record::Synced(n) => Some(*n as usize),
                        _ => None,
                    })
                    .unwrap_or(0);
                records.truncate(durable.min(records.len()));
            }
        }
        // Rewrite the journal with exactly the trusted records and this boot,
        // durably (its `.tmp` is created exclusively, then renamed in).
        let mut out = Vec::with_capacity(HEADER_LEN + records.len() * RECORD_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&root.0);
        out.extend_from_slice(&boot);
        for r in &records {
            out.extend_from_slice(&r.encode());
        }
        fs.write_durable(path, &out)?;
        let file = fs.open_append(path)?;
        let n = records.len() as u32;
        records.retain(|r| !matches!(r, Record::Synced(_) | Record::FileDone(u32::MAX)));
        Ok((Journal { file, records: n }, records))
    }

    /// Number of records written so far.
    pub fn len(&self) -> u32 {
        self.records
    }

    /// Whether no record was written.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Appends records (to the page cache; see [`Journal::sync`]).
    pub fn append(&mut self, records: &[Record]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(records.len() * RECORD_LEN);
        for r in records {
            buf.extend_from_slice(&r.encode());
        }
        self.file.write_all(&buf)?;
        self.records += records.len() as u32;
        Ok(())
    }

    /// Marks the first `durable` records as backed by synced data, and makes
    /// the journal itself durable.
    pub fn sync(&mut self, durable: u32) -> std::io::Result<()> {
        self.append(&[Record::Synced(durable)])?;
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: [u8; 16] = [1; 16];

    #[test]
    fn records_survive_a_process_crash_and_torn_tails_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Root::open(dir.path()).unwrap();
        let p = Path::new("j");
        let root = Hash([7; 32]);
        let (mut j, old) = Journal::open(&fs, p, &root, BOOT).unwrap();
        assert!(old.is_empty());
        let c = Record::Chunk(ChunkId { file: 1, index: 2 });
        j.append(&[c, Record::FileDone(3)]).unwrap();
        drop(j);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(p))
            .unwrap();
        f.write_all(&[1, 0, 0]).unwrap();
        drop(f);
        let (mut j, recs) = Journal::open(&fs, p, &root, BOOT).unwrap();
        assert_eq!(
            recs,
            [c, Record::FileDone(3)],
            "same boot: unsynced records count"
        );
        j.append(&[Record::FileDone(4)]).unwrap();
        let (_, recs) = Journal::open(&fs, p, &root, BOOT).unwrap();
        assert_eq!(recs.len(), 3, "the torn tail must not shift later records");
        let (_, recs) = Journal::open(&fs, p, &Hash([8; 32]), BOOT).unwrap();
        assert!(recs.is_empty(), "another manifest starts afresh");
    }

    #[test]
    fn after_a_reboot_only_synced_records_count() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Root::open(dir.path()).unwrap();
        let p = Path::new("j");
        let root = Hash([7; 32]);
        let (mut j, _) = Journal::open(&fs, p, &root, BOOT).unwrap();
        let c = |i| Record::Chunk(ChunkId { file: 0, index: i });
        j.append(&[c(0), c(1)]).unwrap();
        let durable = j.len();
        j.append(&[c(2)]).unwrap(); // written while the checkpoint synced
        j.sync(durable).unwrap();
        j.append(&[c(3)]).unwrap();
        drop(j);
        let (_, recs) = Journal::open(&fs, p, &root, [2; 16]).unwrap();
        assert_eq!(recs, [c(0), c(1)]);
    }
}
