//! `trees/<commit>.json`: the tree listing `huggingface_hub` 2.x keeps next
//! to a snapshot (in the repo's cache folder, or in a local dir's
//! `.cache/huggingface/`), so an offline client can list the snapshot and
//! tell a complete download from a partial one. Same format: version 1,
//! every file of the listing (not only those pulled), sorted by path.
//! Written once the pulled files are in place and before the ref.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::api::RemoteFile;

/// Where the listing of `commit` goes under `folder`.
pub fn path(folder: &Path, commit: &str) -> PathBuf {
    folder.join("trees").join(format!("{commit}.json"))
}

#[derive(Serialize)]
struct TreeFile<'a> {
    format_version: u32,
    files: BTreeMap<&'a str, Info<'a>>,
}

#[derive(Serialize)]
struct Info<'a> {
    size: u64,
    blob_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lfs_sha256: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lfs_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    xet_hash: Option<&'a str>,
}

/// The file's bytes for `files`.
pub fn render(files: &[RemoteFile]) -> Vec<u8> {
    let tree = TreeFile {
        format_version: 1,
        files: files
            .iter()
            .map(|f| {
                let l = &f.listed;
                let info = Info {
                    size: l.size,
                    blob_id: &l.blob_id,
                    lfs_sha256: l.lfs.as_ref().map(|(h, _)| h.as_str()),
                    lfs_size: l.lfs.as_ref().map(|(_, n)| *n),
                    xet_hash: l.xet_hash.as_deref(),
                };
                (f.path.as_str(), info)
            })
            .collect(),
    };
    serde_json::to_vec_pretty(&tree).expect("plain data")
}

/// Writes the listing of `commit` under `folder`, atomically and durably.
pub fn write(folder: &Path, commit: &str, files: &[RemoteFile]) -> std::io::Result<PathBuf> {
    let dest = path(folder, commit);
    crate::util::beneath::write_file_durable(&dest, &render(files), 0o644)?;
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::api::parse_tree_page;

    #[test]
    fn the_listing_is_written_as_huggingface_hub_reads_it() {
        let g = "c".repeat(40);
        let s = "d".repeat(64);
        let page = format!(
            r#"[{{"type":"file","path":"z.json","oid":"{g}","size":5}},
               {{"type":"directory","path":"sub","oid":"{g}","size":0}},
               {{"type":"file","path":"sub/w.safetensors","oid":"{g}","size":9,
                 "lfs":{{"oid":"{s}","size":9,"pointerSize":130}}}}]"#
        );
        let files = parse_tree_page(page.as_bytes()).unwrap();
        let t = tempfile::tempdir().unwrap();
        let at = write(t.path(), &"e".repeat(40), &files).unwrap();
        assert!(at.ends_with(format!("trees/{}.json", "e".repeat(40))));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&at).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "format_version": 1,
                "files": {
                    "sub/w.safetensors": {"size": 9, "blob_id": g, "lfs_sha256": s, "lfs_size": 9},
                    "z.json": {"size": 5, "blob_id": g},
                }
            })
        );
    }
}
