//! What identifies a file's content without reading it: device, inode,
//! size, mtime and ctime. ctime cannot be set back by a user, so any write
//! to the file (or a replacement of it) changes the stamp. The hash cache
//! trusts chunk hashes and the image cache trusts a blob's digest only
//! while the file's stamp is the one recorded with them.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A file's stamp; see the module header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl FileStamp {
    /// The stamp of the file at `path` (following symlinks).
    pub fn of(path: &Path) -> Option<FileStamp> {
        fs::metadata(path).ok().map(|m| Self::from_meta(&m))
    }

    /// The stamp of a file whose metadata is at hand.
    pub fn from_meta(m: &fs::Metadata) -> FileStamp {
        FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }

    /// The size it records.
    pub fn size(&self) -> u64 {
        self.size
    }
}
