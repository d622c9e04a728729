//! The Hub's JSON API, as data: the revision reply, tree entries, the
//! `Link: <...>; rel="next"` paging header (rewritten onto a mirror's host),
//! and the `X-Error-Code` replies turned into errors that say what to do,
//! and the bounds of a whole listing ([`ListingBudget`]: a hostile Hub's
//! endless pages stop there, not when memory runs out). No I/O here; the
//! HTTP client feeds it.

use serde::Deserialize;

use super::digest::Expected;
use xfer_proto::manifest::MAX_FILE_SIZE;
use xfer_proto::relpath::{shown, RelPath};

/// A Hub reply that is not what it should be.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The revision reply is not the JSON it should be.
    #[error("the Hub's revision reply is not what it should be: {0}")]
    RevisionReply(serde_json::Error),
    /// The revision reply names something that is not a commit.
    #[error("the Hub answered commit `{0}`, not 40 hex digits")]
    NotACommit(String),
    /// A listing page is not the JSON it should be.
    #[error("the Hub's file listing is not what it should be: {0}")]
    ListingReply(serde_json::Error),
    /// The listing names a path that could leave the snapshot.
    #[error("the Hub listed an unsafe path `{path}`: {why}")]
    UnsafePath {
        /// The path, shown safely.
        path: String,
        /// What is wrong with it.
        why: xfer_proto::relpath::PathError,
    },
    /// The listing gives a file more than [`MAX_FILE_SIZE`] bytes.
    #[error("the Hub listed `{path}` at {size} bytes, more than the 1 PiB limit")]
    TooBig {
        /// The file's path.
        path: String,
        /// The size listed.
        size: u64,
    },
    /// The listing gives a file a hash that is not hex of the right length.
    #[error("the Hub listed `{path}` with a malformed hash `{hash}`")]
    MalformedHash {
        /// The file's path.
        path: String,
        /// The hash listed (lower-cased, without `sha256:`).
        hash: String,
    },
    /// The listing passed one of [`ListingBudget`]'s bounds.
    #[error("the Hub's file list of {repo} runs to {what} after {pages} pages, past what any real repo has, so the endpoint is broken or hostile: point HF_ENDPOINT at the Hub or a sound mirror")]
    ListingTooLong {
        /// The repo.
        repo: String,
        /// Which bound it passed.
        what: String,
        /// Pages taken so far.
        pages: usize,
    },
    /// The listed sizes add up to more than a `u64` holds.
    #[error(
        "the Hub's file list adds up to more than {} bytes; it cannot be real",
        u64::MAX
    )]
    TotalOverflow,
}

/// `GET /api/models/{id}/revision/{rev}`, the part we use.
#[derive(Debug, Deserialize)]
pub struct RevisionInfo {
    /// The 40-hex commit the revision points at.
    pub sha: String,
}

impl RevisionInfo {
    /// Parses a reply and checks the commit looks like one.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let info: RevisionInfo = serde_json::from_slice(body).map_err(ApiError::RevisionReply)?;
        let ok = xfer_proto::repo::is_commit_sha(&info.sha);
        if !ok {
            return Err(ApiError::NotACommit(info.sha));
        }
        Ok(info)
    }
}

/// One entry of `GET /api/models/{id}/tree/{commit}?recursive=true`.
#[derive(Debug, Clone, Deserialize)]
pub struct TreeEntry {
    #[serde(rename = "type")]
    /// `file` or `directory`.
    pub kind: String,
    /// The path in the repo, as the Hub gives it.
    pub path: String,
    #[serde(default)]
    /// Size in bytes (of the LFS pointer, for an LFS file).
    pub size: u64,
    /// The git blob sha1.
    #[serde(default)]
    pub oid: String,
    /// The LFS object, for a file stored in LFS.
    pub lfs: Option<LfsInfo>,
    /// The Xet hash, on Xet-backed repos.
    #[serde(default, rename = "xetHash")]
    pub xet_hash: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
/// The LFS part of a tree entry.
pub struct LfsInfo {
    /// The sha256 of the contents.
    pub oid: String,
    /// The size of the contents.
    pub size: u64,
}

/// A file to download: where it goes, how big, and the hash it must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Where it goes, relative to the snapshot.
    pub path: RelPath,
    /// Size of its contents in bytes.
    pub size: u64,
    /// The hash its contents must have.
    pub expected: Expected,
    /// The listing's own fields, as `huggingface_hub` caches them in
    /// `trees/<commit>.json`.
    pub listed: Listed,
}

/// One file of the tree listing as the Hub gave it (see
/// [`RemoteFile::listed`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listed {
    /// The size listed.
    pub size: u64,
    /// The git blob sha1 (of the pointer, for an LFS file).
    pub blob_id: String,
    /// The LFS sha256 and size.
    pub lfs: Option<(String, u64)>,
    /// The Xet hash, when it is 64 hex digits.
    pub xet_hash: Option<String>,
}

/// Parses one page of the tree listing into files (folders are dropped;
/// they exist through their files). Paths are checked like any manifest
/// path, so a hostile listing cannot write outside the snapshot, nor put
/// control characters in a name.
pub fn parse_tree_page(body: &[u8]) -> Result<Vec<RemoteFile>, ApiError> {
    parse_tree_page_counted(body).map(|(files, _)| files)
}

/// [`parse_tree_page`], also returning how many entries (files and folders)
/// the page held.
pub fn parse_tree_page_counted(body: &[u8]) -> Result<(Vec<RemoteFile>, usize), ApiError> {
    let entries: Vec<TreeEntry> = serde_json::from_slice(body).map_err(ApiError::ListingReply)?;
    let listed = entries.len();
    let mut files = Vec::new();
    for e in entries.into_iter().filter(|e| e.kind == "file") {
        let path = RelPath::new(&e.path).map_err(|why| ApiError::UnsafePath {
            path: shown(&e.path),
            why,
        })?;
        let (size, expected) = match &e.lfs {
            Some(lfs) => (lfs.size, Expected::Sha256(hex_of(&lfs.oid, 64, &e.path)?)),
            None => (e.size, Expected::GitSha1(hex_of(&e.oid, 40, &e.path)?)),
        };
        if size > MAX_FILE_SIZE {
            return Err(ApiError::TooBig { path: e.path, size });
        }
        let listed = Listed {
            size: e.size,
            blob_id: e.oid.clone(),
            lfs: e.lfs.as_ref().map(|l| (l.oid.clone(), l.size)),
            // Kept only when it looks like one (huggingface_hub drops the
            // tree cache otherwise).
            xet_hash: e
                .xet_hash
                .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
        };
        files.push(RemoteFile {
            path,
            size,
            expected,
            listed,
        });
    }
    Ok((files, listed))
}

/// Most entries (files and folders) a repo's listing may hold, over all its
/// pages. The biggest real model repos list tens of thousands; each entry
/// kept costs a few hundred bytes, so this bounds the listing's memory near
/// 80 MB whatever a Hub sends.
pub const MAX_LISTED_ENTRIES: usize = 200_000;
/// Most bytes of listing replies, over all pages (a real entry is ~300
/// bytes; this allows ~2.7 KiB per entry at the entry bound).
pub const MAX_LISTING_BYTES: usize = 512 << 20;
/// Largest single page: the Hub sends 1000 entries (~300 KiB) at most.
pub const MAX_PAGE_BYTES: usize = 16 << 20;

/// What a repo's listing has taken so far, against [`MAX_LISTED_ENTRIES`]
/// and [`MAX_LISTING_BYTES`].
#[derive(Debug, Clone)]
pub struct ListingBudget {
    repo: String,
    max_entries: usize,
    max_bytes: usize,
    entries: usize,
    bytes: usize,
    pages: usize,
}

impl ListingBudget {
    /// The budget of `repo`'s listing, at the default bounds.
    pub fn new(repo: &str) -> Self {
        Self::with_bounds(repo, MAX_LISTED_ENTRIES, MAX_LISTING_BYTES)
    }

    /// The budget of `repo`'s listing, at the given bounds.
    pub fn with_bounds(repo: &str, max_entries: usize, max_bytes: usize) -> Self {
        ListingBudget {
            repo: repo.to_string(),
            max_entries,
            max_bytes,
            entries: 0,
            bytes: 0,
            pages: 0,
        }
    }

    /// Counts a page of `bytes` bytes holding `entries` entries; an error
    /// (naming the repo, the bound and the fix) once either total passes
    /// its bound.
    pub fn take(&mut self, bytes: usize, entries: usize) -> Result<(), ApiError> {
        self.pages += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        self.entries = self.entries.saturating_add(entries);
        let over = if self.entries > self.max_entries {
            Some(format!("more than {} entries", self.max_entries))
        } else if self.bytes > self.max_bytes {
            Some(format!("more than {} MiB of listing", self.max_bytes >> 20))
        } else {
            None
        };
        match over {
            Some(what) => Err(ApiError::ListingTooLong {
                repo: self.repo.clone(),
                what,
                pages: self.pages,
            }),
            None => Ok(()),
        }
    }
}

/// The listing's total size, or an error if it does not fit in a `u64`;
/// once this passed, sums over any of its files cannot overflow.
pub fn total_size(files: &[RemoteFile]) -> Result<u64, ApiError> {
    files
        .iter()
        .try_fold(0u64, |sum, f| sum.checked_add(f.size))
        .ok_or(ApiError::TotalOverflow)
}

fn hex_of(s: &str, len: usize, path: &str) -> Result<String, ApiError> {
    let s = s.strip_prefix("sha256:").unwrap_or(s).to_ascii_lowercase();
    if s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s)
    } else {
        Err(ApiError::MalformedHash {
            path: path.to_string(),
            hash: s,
        })
    }
}

/// The next page from a `Link` header, with its scheme and host replaced by
/// `endpoint`'s: mirrors pass the Hub's own absolute links through, and
/// following them would leave the mirror.
pub fn next_page(link: &str, endpoint: &str) -> Option<String> {
    let next = link.split(',').find_map(|part| {
        let (url, params) = part.trim().split_once(';')?;
        let is_next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"" || p.trim() == "rel=next");
        is_next.then(|| {
            url.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
    })?;
    let path_and_query = match next.split_once("://") {
        Some((_, rest)) => rest.find('/').map(|i| &rest[i..]).unwrap_or("/"),
        None => next.as_str(),
    };
    // The endpoint may itself have a path (a mirror under /hf): keep it once.
    let ep = endpoint.trim_end_matches('/');
    let ep_path = ep
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
        .unwrap_or("");
    let path_and_query = if !ep_path.is_empty() && path_and_query.starts_with(ep_path) {
        &path_and_query[ep_path.len()..]
    } else {
        path_and_query
    };
    Some(format!("{ep}{path_and_query}"))
}

/// Why the Hub refused, from the status and its `X-Error-Code` header; each
/// says what to do.
pub fn refusal(status: u16, error_code: Option<&str>, repo: &str, what: &str) -> String {
    match (status, error_code) {
        (_, Some("GatedRepo")) | (403, _) => format!(
            "{repo} is gated: set HF_TOKEN to a token of an account that accepted its licence on the Hub"
        ),
        (_, Some("RevisionNotFound")) => {
            format!("{repo} has no revision {what}; check the name after @")
        }
        (_, Some("EntryNotFound")) => format!("{repo} has no file {what}"),
        (401, None) | (_, Some("RepoNotFound")) | (404, None) => format!(
            "{repo} was not found: check the name, or set HF_TOKEN if it is private or gated"
        ),
        (401, Some(_)) => format!(
            "{repo} needs authentication: set HF_TOKEN to a token that can read it"
        ),
        (s, code) => format!(
            "the Hub answered HTTP {s}{} for {what}",
            code.map(|c| format!(" ({c})")).unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_reply() {
        let c = "0123456789abcdef0123456789abcdef01234567";
        let r = RevisionInfo::parse(format!(r#"{{"sha":"{c}","siblings":[]}}"#).as_bytes());
        assert_eq!(r.unwrap().sha, c);
        assert!(RevisionInfo::parse(br#"{"sha":"main"}"#).is_err());
        assert!(RevisionInfo::parse(b"<html>").is_err());
    }

    #[test]
    fn tree_page() {
        let sha = "a".repeat(64);
        let body = format!(
            r#"[{{"type":"directory","path":"original","oid":"{g}","size":0}},
               {{"type":"file","path":"config.json","oid":"{g}","size":12}},
               {{"type":"file","path":"original/w.safetensors","oid":"{g}","size":134,
                 "lfs":{{"oid":"{sha}","size":5000000000,"pointerSize":134}}}}]"#,
            g = "c".repeat(40)
        );
        let files = parse_tree_page(body.as_bytes()).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].expected, Expected::GitSha1("c".repeat(40)));
        assert_eq!(files[0].size, 12);
        assert_eq!(files[1].path.as_str(), "original/w.safetensors");
        assert_eq!(files[1].expected, Expected::Sha256(sha));
        assert_eq!(
            files[1].size, 5_000_000_000,
            "the LFS size, not the pointer's"
        );

        for evil in ["../etc/passwd", "/abs", "a/../../b"] {
            let body = format!(
                r#"[{{"type":"file","path":"{evil}","oid":"{}","size":1}}]"#,
                "c".repeat(40)
            );
            let e = parse_tree_page(body.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("unsafe path"), "{e}");
        }
        // A name with a newline and an escape sequence: refused, and the
        // message shows it escaped (JSON `\n` and `\u001b` decode to the
        // raw characters).
        let body = format!(
            r#"[{{"type":"file","path":"a\nb\u001b[31mRED","oid":"{}","size":1}}]"#,
            "c".repeat(40)
        );
        let e = parse_tree_page(body.as_bytes()).unwrap_err().to_string();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(e.contains(r"`a\nb\u{1b}[31mRED`"), "{e}");
        assert!(e.contains("control character"), "{e}");
        let bad = r#"[{"type":"file","path":"x","oid":"zz","size":1}]"#;
        assert!(parse_tree_page(bad.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("malformed hash"));
    }

    /// Regression (found writing the hub_tree fuzz target; the input is in
    /// fuzz/regressions/hub_tree/): sizes
    /// near `u64::MAX` made the pull's byte totals overflow (a panic in a
    /// debug build, a wrapped free-space check in release).
    #[test]
    fn tree_page_sizes_are_bounded() {
        let g = "c".repeat(40);
        let body = format!(
            r#"[{{"type":"file","path":"a","oid":"{g}","size":18446744073709551615}},
               {{"type":"file","path":"b","oid":"{g}","size":18446744073709551615}}]"#
        );
        let e = parse_tree_page(body.as_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("`a` at 18446744073709551615 bytes, more than the 1 PiB limit"),
            "{e}"
        );
        let lfs = format!(
            r#"[{{"type":"file","path":"w","oid":"{g}","size":1,
                 "lfs":{{"oid":"{}","size":1125899906842625}}}}]"#,
            "a".repeat(64)
        );
        assert!(
            parse_tree_page(lfs.as_bytes()).is_err(),
            "the LFS size is bounded too"
        );

        // At the limit each file is fine; 16 Ki of them are not.
        let pib = RemoteFile {
            path: RelPath::new("x").unwrap(),
            size: MAX_FILE_SIZE,
            expected: Expected::GitSha1(g.clone()),
            listed: Listed::default(),
        };
        assert_eq!(
            total_size(&vec![pib.clone(); 3]).unwrap(),
            3 * MAX_FILE_SIZE
        );
        let e = total_size(&vec![pib; 1 << 14]).unwrap_err().to_string();
        assert!(e.contains("adds up to more than"), "{e}");
    }

    #[test]
    fn a_listing_is_bounded_in_entries_and_bytes() {
        let mut b = ListingBudget::with_bounds("o/m", 10, 1000);
        for _ in 0..5 {
            b.take(100, 2).unwrap();
        }
        let e = b.take(1, 1).unwrap_err().to_string();
        assert!(
            e.contains("o/m") && e.contains("more than 10 entries"),
            "{e}"
        );
        assert!(
            e.contains("after 6 pages") && e.contains("HF_ENDPOINT"),
            "{e}"
        );
        let mut b = ListingBudget::with_bounds("o/m", 10, 2 << 20);
        b.take(2 << 20, 0).unwrap();
        let e = b.take(1, 0).unwrap_err().to_string();
        assert!(e.contains("more than 2 MiB of listing"), "{e}");
        // The default bounds leave room for the biggest real repos.
        let mut b = ListingBudget::new("o/m");
        for _ in 0..100 {
            b.take(300 << 10, 1000).unwrap();
        }
        let (files, n) =
            parse_tree_page_counted(br#"[{"type":"directory","path":"d","oid":"x","size":0}]"#)
                .unwrap();
        assert_eq!((files.len(), n), (0, 1), "folders count against the bound");
    }

    #[test]
    fn next_links_stay_on_the_mirror() {
        let link = r#"<https://huggingface.co/api/models/o/m/tree/c?recursive=true&cursor=abc>; rel="next""#;
        assert_eq!(
            next_page(link, "http://127.0.0.1:8090").as_deref(),
            Some("http://127.0.0.1:8090/api/models/o/m/tree/c?recursive=true&cursor=abc")
        );
        assert_eq!(
            next_page(link, "https://mirror.example/hf/").as_deref(),
            Some("https://mirror.example/hf/api/models/o/m/tree/c?recursive=true&cursor=abc")
        );
        let both = r#"<https://x/a?p=1>; rel="prev", <https://x/a?p=3>; rel="next""#;
        assert_eq!(
            next_page(both, "https://hub").as_deref(),
            Some("https://hub/a?p=3")
        );
        assert_eq!(
            next_page(r#"<https://x/a>; rel="prev""#, "https://hub"),
            None
        );
    }

    #[test]
    fn refusals_say_what_to_do() {
        assert!(refusal(401, Some("GatedRepo"), "o/m", "").contains("HF_TOKEN"));
        assert!(refusal(403, None, "o/m", "").contains("licence"));
        assert!(refusal(404, Some("RevisionNotFound"), "o/m", "v9").contains("no revision v9"));
        assert!(refusal(404, Some("EntryNotFound"), "o/m", "x.bin").contains("no file x.bin"));
        assert!(refusal(401, Some("RepoNotFound"), "o/m", "").contains("not found"));
        assert!(refusal(500, None, "o/m", "config.json").contains("HTTP 500"));
    }
}
