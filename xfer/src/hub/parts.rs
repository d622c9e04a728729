//! How a file is cut into ranged requests, and the record of how far each
//! range got, kept in a sidecar next to the incomplete file so a pull killed
//! with `kill -9` resumes where it was. The file's length says nothing (it is
//! preallocated); only the sidecar does. Pure data and its encoding; the
//! downloader writes the bytes before it advances a range here.

use serde::{Deserialize, Serialize};

/// Sidecar format version.
const SIDECAR_VERSION: u32 = 1;

/// One file's ranges: `[i * part_size, min((i + 1) * part_size, size))`,
/// each with the length of its prefix already written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parts {
    version: u32,
    /// What the parts belong to: the expected hash, so a sidecar of another
    /// version of the file is never trusted.
    etag: String,
    size: u64,
    part_size: u64,
    /// Bytes written from the start of each part.
    done: Vec<u64>,
}

impl Parts {
    /// A file with nothing written yet.
    pub fn new(etag: &str, size: u64, part_size: u64) -> Parts {
        assert!(part_size > 0);
        let n = size.div_ceil(part_size).max(1) as usize;
        Parts {
            version: SIDECAR_VERSION,
            etag: etag.to_string(),
            size,
            part_size,
            done: vec![0; n],
        }
    }

    /// Reads a sidecar, keeping it only if it describes this very file and
    /// is consistent; anything else means "start over".
    pub fn decode(bytes: &[u8], etag: &str, size: u64) -> Option<Parts> {
        let p: Parts = serde_json::from_slice(bytes).ok()?;
        let ok = p.version == SIDECAR_VERSION
            && p.etag == etag
            && p.size == size
            && p.part_size > 0
            && p.done.len() == size.div_ceil(p.part_size).max(1) as usize
            && (0..p.done.len()).all(|i| p.done[i] <= p.part_len(i));
        ok.then_some(p)
    }

    /// The sidecar's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain data")
    }

    /// Number of parts.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// Whether there are no parts (never: an empty file has one).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The file's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Where part `i` starts in the file.
    pub fn start(&self, i: usize) -> u64 {
        i as u64 * self.part_size
    }

    /// Part `i`'s length.
    pub fn part_len(&self, i: usize) -> u64 {
        let start = self.start(i);
        self.size.saturating_sub(start).min(self.part_size)
    }

    /// The byte range part `i` still lacks, as `[from, to)`; empty when done.
    pub fn missing(&self, i: usize) -> (u64, u64) {
        let start = self.start(i);
        (start + self.done[i], start + self.part_len(i))
    }

    /// Whether part `i` is all written.
    pub fn is_done(&self, i: usize) -> bool {
        self.done[i] == self.part_len(i)
    }

    /// Whether every part is all written.
    pub fn is_complete(&self) -> bool {
        (0..self.len()).all(|i| self.is_done(i))
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.done.iter().sum()
    }

    /// Records that the bytes `[start(i), start(i) + upto)` of part `i` are
    /// written. Never moves backwards.
    pub fn advance(&mut self, i: usize, upto: u64) {
        let upto = upto.min(self.part_len(i));
        if upto > self.done[i] {
            self.done[i] = upto;
        }
    }

    /// Records a whole-file stream written up to file offset `end`: every
    /// part before it is (partly) done. For servers that ignore Range.
    pub fn advance_prefix(&mut self, end: u64) {
        for i in 0..self.len() {
            let start = self.start(i);
            if start >= end {
                break;
            }
            self.advance(i, end - start);
        }
    }

    /// Where a whole-file stream would have to restart: the end of the
    /// written prefix of the file.
    pub fn prefix(&self) -> u64 {
        let mut at = 0;
        for i in 0..self.len() {
            at += self.done[i];
            if !self.is_done(i) {
                break;
            }
        }
        at
    }

    /// Forgets everything (the finished file failed its hash check).
    pub fn reset(&mut self) {
        self.done.iter_mut().for_each(|d| *d = 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_a_file_into_ranges() {
        let p = Parts::new("e", 10, 4);
        assert_eq!(p.len(), 3);
        assert_eq!(
            (0..3).map(|i| p.missing(i)).collect::<Vec<_>>(),
            [(0, 4), (4, 8), (8, 10)]
        );
        let empty = Parts::new("e", 0, 4);
        assert_eq!(empty.len(), 1);
        assert!(empty.is_complete(), "an empty file needs no request");
    }

    #[test]
    fn progress_only_moves_forward_and_round_trips() {
        let mut p = Parts::new("etag", 10, 4);
        p.advance(1, 3);
        p.advance(1, 1);
        assert_eq!(p.missing(1), (7, 8));
        p.advance(2, 99);
        assert!(p.is_done(2));
        assert_eq!(p.written(), 5);
        assert_eq!(p.prefix(), 0);
        let back = Parts::decode(&p.encode(), "etag", 10).unwrap();
        assert_eq!(back, p);
        assert!(
            Parts::decode(&p.encode(), "other", 10).is_none(),
            "another file"
        );
        assert!(
            Parts::decode(&p.encode(), "etag", 11).is_none(),
            "another size"
        );
        assert!(Parts::decode(b"{garbage", "etag", 10).is_none());
        let mut lying = p.clone();
        lying.done[0] = 5;
        assert!(Parts::decode(&lying.encode(), "etag", 10).is_none());
    }

    #[test]
    fn a_whole_file_stream_fills_parts_in_order() {
        let mut p = Parts::new("e", 10, 4);
        p.advance_prefix(6);
        assert_eq!(p.missing(0), (4, 4));
        assert_eq!(p.missing(1), (6, 8));
        assert_eq!(p.prefix(), 6);
        p.advance_prefix(10);
        assert!(p.is_complete());
        p.reset();
        assert_eq!(p.written(), 0);
    }
}
