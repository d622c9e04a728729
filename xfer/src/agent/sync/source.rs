//! The source agent's side of what `xfer sync SOURCE` means: whether a
//! bare `ORG/NAME` is a folder on this node, under the operator's working
//! directory or this node's root (the operator reads SOURCE and decides,
//! in `crate::client::source`).

use std::path::{Component, Path, PathBuf};

use xfer_proto::refusal::Refusal;

/// The source agent's answer to `AdminRequest::FindFolder` (the operator
/// read SOURCE as `ORG/NAME`, which may be a folder here): which of `cwd/text` and
/// `root/text` are folders on this node (the second dropped when it is
/// the same folder as the first).
pub fn find_folder(root: &Path, text: &str, cwd: &Path) -> Result<Vec<PathBuf>, Refusal> {
    let rel = Path::new(text);
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if text.is_empty() || !plain || !cwd.is_absolute() || text.chars().any(char::is_control) {
        return Err(Refusal::Protocol(format!(
            "cannot look for folder {:?} under {}: it must be a plain relative path and the working directory absolute",
            text.escape_default().to_string(),
            cwd.display()
        )));
    }
    let mut found: Vec<PathBuf> = Vec::new();
    for p in [cwd.join(rel), root.join(rel)] {
        if !p.is_dir() {
            continue;
        }
        let real = p.canonicalize().ok();
        let same = found
            .iter()
            .any(|f| f.canonicalize().ok() == real && real.is_some());
        if !same {
            found.push(p);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_node_finds_the_folder_under_the_cwd_or_its_root() {
        let t = tempfile::tempdir().unwrap();
        let (cwd, root) = (t.path().join("cwd"), t.path().join("root"));
        std::fs::create_dir_all(cwd.join("org/a")).unwrap();
        std::fs::create_dir_all(root.join("org/b")).unwrap();
        std::fs::create_dir_all(root.join("org/a")).unwrap();
        assert_eq!(
            find_folder(&root, "org/b", &cwd).unwrap(),
            vec![root.join("org/b")]
        );
        assert_eq!(
            find_folder(&root, "org/c", &cwd).unwrap(),
            Vec::<PathBuf>::new()
        );
        assert_eq!(find_folder(&root, "org/a", &cwd).unwrap().len(), 2);
        // The root seen through the working directory is one folder.
        assert_eq!(find_folder(&root, "org/b", &root).unwrap().len(), 1);
        for bad in ["../etc", "/etc", "org/../x", ""] {
            assert!(find_folder(&root, bad, &cwd).is_err(), "{bad}");
        }
    }
}
