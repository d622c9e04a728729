//! The Hub look-alike's routes and replies: the repo info, the paged tree
//! listing and `resolve` (whole files or `Range` parts, streamed from disk in
//! slices, each connection paced by its own [`RateLimiter`]), and errors as
//! the Hub words them (`X-Error-Code`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RANGE};
use hyper::{Method, Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::json;
use sha1::Digest as _;
use tokio::sync::mpsc;

use super::repo::Repo;
use super::{FULL_SPEED_SLICE, PAGE_SIZE};
use crate::util::rate::RateLimiter;

/// Routes one request.
pub(super) fn answer(repo: &Arc<Repo>, pace: &Pace, req: &Request<Incoming>) -> Response<Body> {
    let head = req.method() == Method::HEAD;
    if !head && req.method() != Method::GET {
        return hub_error(StatusCode::METHOD_NOT_ALLOWED, None, "method not allowed");
    }
    let raw = req.uri().path();
    // Each segment decoded on its own: an encoded `/` stays inside one.
    let segs: Option<Vec<String>> = raw
        .split('/')
        .skip(1)
        .map(|s| {
            percent_decode_str(s)
                .decode_utf8()
                .ok()
                .map(|s| s.into_owned())
        })
        .collect();
    let Some(segs) = segs else {
        return hub_error(StatusCode::BAD_REQUEST, None, "the path is not UTF-8");
    };
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let id: Vec<&str> = repo.id.split('/').collect();
    let not_found = || hub_error(StatusCode::NOT_FOUND, None, &format!("Not found: {raw}"));
    let repo_not_found = || {
        hub_error(
            StatusCode::UNAUTHORIZED,
            Some("RepoNotFound"),
            "Repository not found",
        )
    };

    if segs.len() >= 3 && segs[0] == "api" {
        let rest = &segs[2..];
        if segs[1] != "models" || !rest.starts_with(&id) {
            return repo_not_found();
        }
        let rest = &rest[id.len()..];
        return match rest.first().copied() {
            None | Some("revision") => {
                let rev = rest.get(1..).map(|r| r.join("/")).unwrap_or_default();
                let rev = if rev.is_empty() { "main" } else { rev.as_str() };
                match repo.check_revision(rev) {
                    Some(refused) => refused,
                    None => repo.revision_info(),
                }
            }
            Some("tree") if rest.len() >= 2 => match repo.check_revision(rest[1]) {
                Some(refused) => refused,
                None => repo.tree(
                    raw,
                    req.uri().query(),
                    rest[1],
                    rest[2..].join("/").trim_matches('/'),
                ),
            },
            Some(_) => not_found(),
        };
    }
    let Some(at) = segs.iter().position(|s| *s == "resolve") else {
        return not_found();
    };
    if !(1..=2).contains(&at) || segs.len() < at + 3 {
        return not_found();
    }
    if segs[..at] != id[..] {
        return repo_not_found();
    }
    if let Some(refused) = repo.check_revision(segs[at + 1]) {
        return refused;
    }
    let range = req.headers().get(RANGE).and_then(|v| v.to_str().ok());
    repo.resolve(&segs[at + 2..].join("/"), range, head, pace)
}

impl Repo {
    /// `None` when `rev` names the commit, else the Hub's refusal.
    fn check_revision(&self, rev: &str) -> Option<Response<Body>> {
        (rev != "main" && rev != self.commit).then(|| {
            hub_error(
                StatusCode::NOT_FOUND,
                Some("RevisionNotFound"),
                &format!("Invalid rev id: {rev}"),
            )
        })
    }

    /// `GET /api/models/{repo}/revision/{rev}`.
    fn revision_info(&self) -> Response<Body> {
        let siblings: Vec<_> = self
            .files
            .keys()
            .map(|p| json!({ "rfilename": p }))
            .collect();
        let body = json!({
            "_id": &self.commit[..24],
            "id": self.id,
            "modelId": self.id,
            "author": self.id.split('/').next(),
            "sha": self.commit,
            "private": false,
            "disabled": false,
            "gated": false,
            "tags": [],
            "siblings": siblings,
            "usedStorage": self.files.values().map(|e| e.size).sum::<u64>(),
        });
        self.json(StatusCode::OK, &body, None)
    }

    /// `GET /api/models/{repo}/tree/{rev}[/{dir}]`, one page of it.
    pub(super) fn tree(
        &self,
        path: &str,
        query: Option<&str>,
        rev: &str,
        dir: &str,
    ) -> Response<Body> {
        let params: Vec<(String, String)> = query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let v = percent_decode_str(v).decode_utf8_lossy().into_owned();
                (k.to_string(), v)
            })
            .collect();
        let param = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let recursive = matches!(param("recursive"), Some("true" | "True" | "1"));
        if !dir.is_empty() && !self.dirs.contains(dir) {
            return hub_error(
                StatusCode::NOT_FOUND,
                Some("EntryNotFound"),
                &format!("{dir} does not exist on \"{rev}\""),
            );
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let listed = |p: &str| {
            p.strip_prefix(prefix.as_str())
                .is_some_and(|rest| recursive || !rest.contains('/'))
        };
        let mut entries: Vec<(String, serde_json::Value)> = self
            .dirs
            .iter()
            .filter(|d| listed(d))
            .map(|d| {
                let oid = hex::encode(sha1::Sha1::digest(format!("{}:{d}", self.commit)));
                (
                    d.clone(),
                    json!({ "type": "directory", "oid": oid, "size": 0, "path": d }),
                )
            })
            .collect();
        for e in self.files.values().filter(|e| listed(&e.path)) {
            let mut item =
                json!({ "type": "file", "oid": e.tree_oid(), "size": e.size, "path": e.path });
            if let (Some(sha), Some(p)) = (&e.sha256, e.pointer()) {
                item["lfs"] = json!({ "oid": sha, "size": e.size, "pointerSize": p.len() });
            }
            entries.push((e.path.clone(), item));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let Ok(start) = param("cursor").unwrap_or("0").parse::<usize>() else {
            return hub_error(StatusCode::BAD_REQUEST, None, "bad cursor");
        };
        let page: Vec<_> = entries
            .iter()
            .skip(start)
            .take(PAGE_SIZE)
            .map(|(_, v)| v)
            .collect();
        let next = start + page.len();
        let link = (next < entries.len()).then(|| {
            let mut q: Vec<String> = params
                .iter()
                .filter(|(k, _)| k != "cursor")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            q.push(format!("cursor={next}"));
            format!("<{}{path}?{}>; rel=\"next\"", self.origin, q.join("&"))
        });
        self.json(StatusCode::OK, &json!(page), link)
    }

    /// `GET|HEAD /{repo}/resolve/{rev}/{path}`: the file's bytes, or the
    /// part `range` asks for.
    fn resolve(&self, path: &str, range: Option<&str>, head: bool, pace: &Pace) -> Response<Body> {
        let Some(e) = self.files.get(path) else {
            let mut r = hub_error(
                StatusCode::NOT_FOUND,
                Some("EntryNotFound"),
                &format!("{path} does not exist on \"{}\"", self.commit),
            );
            r.headers_mut()
                .insert("x-repo-commit", header(&self.commit));
            return r;
        };
        let mut builder = Response::builder()
            .header("x-repo-commit", &self.commit)
            .header("etag", format!("\"{}\"", e.etag()))
            .header("accept-ranges", "bytes");
        if let Some(sha) = &e.sha256 {
            builder = builder
                .header("x-linked-etag", format!("\"{sha}\""))
                .header("x-linked-size", e.size);
        }
        let (status, start, end) = match parse_range(range, e.size) {
            Asked::Whole => (StatusCode::OK, 0, e.size),
            Asked::Part(a, b) => {
                builder =
                    builder.header("content-range", format!("bytes {a}-{}/{}", b - 1, e.size));
                (StatusCode::PARTIAL_CONTENT, a, b)
            }
            Asked::Unsatisfiable => {
                return builder
                    .status(StatusCode::RANGE_NOT_SATISFIABLE)
                    .header("content-range", format!("bytes */{}", e.size))
                    .header(CONTENT_LENGTH, 0)
                    .body(Body::empty())
                    .expect("a response of valid parts");
            }
        };
        let builder = builder
            .status(status)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, end - start);
        if head || start == end {
            return builder
                .body(Body::empty())
                .expect("a response of valid parts");
        }
        let file = match File::open(&e.abs) {
            Ok(f) => Arc::new(f),
            Err(err) => {
                tracing::warn!("demo Hub cannot open {}: {err}", e.abs.display());
                return hub_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    None,
                    &format!("cannot read {path}"),
                );
            }
        };
        let (tx, rx) = mpsc::channel(1);
        let send = send_range(
            file,
            start,
            end,
            self.rate,
            pace.clone(),
            self.served.clone(),
            tx,
        );
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = send => {}
                _ = stop.cancelled() => {}
            }
        });
        builder
            .body(Body::File {
                rx,
                left: end - start,
            })
            .expect("a response of valid parts")
    }

    /// A JSON reply with `X-Repo-Commit` and, for a paged listing, `Link`.
    fn json(
        &self,
        status: StatusCode,
        body: &serde_json::Value,
        link: Option<String>,
    ) -> Response<Body> {
        let mut r = json_reply(status, body);
        r.headers_mut()
            .insert("x-repo-commit", header(&self.commit));
        if let Some(l) = link {
            r.headers_mut().insert("link", header(&l));
        }
        r
    }
}

/// Streams `[start, end)` of `file` into `tx` in slices, each after the
/// connection's pace allows it; stops early if the client goes away.
async fn send_range(
    file: Arc<File>,
    start: u64,
    end: u64,
    rate: u64,
    pace: Pace,
    served: Arc<AtomicU64>,
    tx: mpsc::Sender<std::io::Result<Bytes>>,
) {
    let slice = if rate == 0 {
        FULL_SPEED_SLICE
    } else {
        rate_slice(rate)
    };
    let mut pos = start;
    while pos < end {
        let n = slice.min(end - pos);
        if let Some(limiter) = &pace {
            limiter.acquire(n).await;
        }
        let f = file.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n as usize];
            f.read_exact_at(&mut buf, pos).map(|()| Bytes::from(buf))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        let failed = read.is_err();
        if let Err(e) = &read {
            tracing::warn!("demo Hub cannot read at byte {pos}: {e}");
        }
        // A failed read ends the body with an error: the client sees the
        // connection cut and retries, rather than wrong bytes.
        if tx.send(read).await.is_err() || failed {
            return;
        }
        served.fetch_add(n, Ordering::Relaxed);
        pos += n;
    }
}

/// The send slice at `rate` bytes/s: about 20 ms of data, as
/// `hub_server.py`.
pub(super) fn rate_slice(rate: u64) -> u64 {
    (rate / 50).clamp(16 << 10, 256 << 10)
}

/// A connection's pace, shared by its requests in turn: its own limiter at
/// the repo's rate, like a CDN's per-connection limit, or none when the rate
/// is unlimited.
pub(super) type Pace = Option<Arc<RateLimiter>>;

/// A new connection's [`Pace`] at `rate` bytes/s (0 = unlimited).
pub(super) fn connection_pace(rate: u64) -> Pace {
    (rate > 0).then(|| Arc::new(RateLimiter::new(rate)))
}

/// What a `Range` header asks of a file of some size.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Asked {
    /// No range (or one we do not take, as several): the whole file, `200`.
    Whole,
    /// Bytes `[a, b)`, `206`.
    Part(u64, u64),
    /// Past the end, `416`.
    Unsatisfiable,
}

/// Parses `bytes=a-b`, `bytes=a-` or `bytes=-n`, as `hub_server.py` does.
pub(super) fn parse_range(value: Option<&str>, size: u64) -> Asked {
    let Some(spec) = value.and_then(|v| v.strip_prefix("bytes=")) else {
        return Asked::Whole;
    };
    if spec.contains(',') {
        return Asked::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Asked::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return match b.parse::<u64>() {
            Ok(n) if n > 0 && size > 0 => Asked::Part(size.saturating_sub(n), size),
            Ok(_) => Asked::Unsatisfiable,
            Err(_) => Asked::Whole,
        };
    }
    let Ok(start) = a.parse::<u64>() else {
        return Asked::Whole;
    };
    let end = if b.is_empty() {
        size
    } else {
        match b.parse::<u64>() {
            Ok(last) => last.saturating_add(1),
            Err(_) => return Asked::Whole,
        }
    };
    if start >= size || end <= start {
        Asked::Unsatisfiable
    } else {
        Asked::Part(start, end.min(size))
    }
}

// ----------------------------------------------------------------- reply ---

/// A reply body: a small one in memory, or a file streamed in slices.
pub(super) enum Body {
    Full(Option<Bytes>),
    File {
        rx: mpsc::Receiver<std::io::Result<Bytes>>,
        /// Bytes still to come.
        left: u64,
    },
}

impl Body {
    fn empty() -> Body {
        Body::Full(None)
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::File { rx, left } => rx.poll_recv(cx).map(|slice| {
                slice.map(|r| {
                    r.map(|b| {
                        *left = left.saturating_sub(b.len() as u64);
                        Frame::data(b)
                    })
                })
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::File { left, .. } => *left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::File { left, .. } => SizeHint::with_exact(*left),
        }
    }
}

fn json_reply(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let bytes = Bytes::from(body.to_string());
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .header(CONTENT_LENGTH, bytes.len())
        .body(Body::Full(Some(bytes)))
        .expect("a response of valid parts")
}

/// An error as the Hub sends it: `{"error": message}`, and with a `code`,
/// `X-Error-Code` and `X-Error-Message`.
fn hub_error(status: StatusCode, code: Option<&str>, message: &str) -> Response<Body> {
    let mut r = json_reply(status, &json!({ "error": message }));
    if let Some(code) = code {
        r.headers_mut().insert("x-error-code", header(code));
        r.headers_mut().insert("x-error-message", header(message));
    }
    r
}

/// A header value of any text (non-ASCII and control characters escaped).
fn header(text: &str) -> HeaderValue {
    HeaderValue::from_str(text)
        .or_else(|_| HeaderValue::from_str(&text.escape_default().to_string()))
        .expect("escaped text is visible ASCII")
}
