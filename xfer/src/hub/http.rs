//! The HTTP side of the Hub: one client, HTTP/1.1 only (public CDNs cap each
//! connection, so parallel ranges need parallel connections, not multiplexed
//! streams), redirects followed by hand so `Authorization` is only ever sent
//! to the endpoint's own origin, retries per [`super::retry`], and the Hub's
//! error replies turned into messages that say what to do.

use std::time::Duration;

use rand::Rng;
use reqwest::header::{HeaderMap, ACCEPT_ENCODING, AUTHORIZATION, LOCATION, RANGE};
use reqwest::{Method, Response, StatusCode, Url};

use super::api::refusal;
use super::env::HubEnv;
use super::retry;

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;

/// Why a request did not give what we asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Worth another try, after `wait` if the server said so.
    Transient {
        /// What went wrong.
        why: String,
        /// How long the server asked to wait.
        wait: Option<Duration>,
    },
    /// Trying again will not help; the message says what to do.
    Fatal(String),
    /// The Hub answered a 4xx that names what is wrong (no such repo,
    /// revision or file; not authenticated; not allowed): nothing changes
    /// until someone fixes the name or the token.
    Refused {
        /// The HTTP status.
        status: u16,
        /// What the Hub said and what to do, in one line.
        why: String,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Transient { why, .. } => f.write_str(why),
            Failure::Fatal(why) | Failure::Refused { why, .. } => f.write_str(why),
        }
    }
}

impl std::error::Error for Failure {}

/// A refusal the Hub named (no such repo, revision or file, 401/403) is
/// permanent; anything else is retried, after the wait the Hub asked for.
impl crate::util::permanence::Permanence for Failure {
    fn is_permanent(&self) -> bool {
        matches!(self, Failure::Refused { .. })
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Transient { wait, .. } => *wait,
            _ => None,
        }
    }
}

impl Failure {
    /// The words of a failure that is not [`Failure::Transient`].
    pub fn into_words(self) -> String {
        match self {
            Failure::Transient { why, .. } | Failure::Fatal(why) | Failure::Refused { why, .. } => {
                why
            }
        }
    }
}

/// A client for one endpoint and token.
#[derive(Clone)]
pub struct HubHttp {
    client: reqwest::Client,
    endpoint: Url,
    token: Option<super::env::Token>,
}

impl HubHttp {
    /// A client for the Hub `env` names.
    pub fn new(env: &HubEnv) -> anyhow::Result<HubHttp> {
        let endpoint = Url::parse(&env.endpoint).map_err(|e| {
            anyhow::anyhow!(
                "HF_ENDPOINT `{}` is not a URL ({e}); set it like https://hf-mirror.com",
                env.endpoint
            )
        })?;
        let client = client()?;
        Ok(HubHttp {
            client,
            endpoint,
            token: env.token.clone(),
        })
    }

    /// Whether `url` is on the endpoint's origin, the only place our token
    /// may go.
    fn same_origin(&self, url: &Url) -> bool {
        url.scheme() == self.endpoint.scheme()
            && url.host_str() == self.endpoint.host_str()
            && url.port_or_known_default() == self.endpoint.port_or_known_default()
    }

    /// The token to send with a request for `url`, if any: only to the
    /// endpoint's own origin (an intake node asking for this pull's bytes
    /// carries it no further).
    pub fn token_for(&self, url: &Url) -> Option<String> {
        let t = self.token.as_ref()?;
        self.same_origin(url).then(|| t.expose().to_string())
    }

    fn request(&self, method: Method, url: &Url) -> reqwest::RequestBuilder {
        let mut rb = self
            .client
            .request(method, url.clone())
            .header(ACCEPT_ENCODING, "identity");
        if let (Some(t), true) = (&self.token, self.same_origin(url)) {
            rb = rb.header(AUTHORIZATION, format!("Bearer {}", t.expose()));
        }
        rb
    }

    /// One try of `method url`, following redirects; `stop_off_origin` stops
    /// at the first redirect that leaves the endpoint's origin and returns it
    /// unfollowed (a HEAD must not chase a presigned CDN URL).
    async fn send(
        &self,
        method: Method,
        url: Url,
        range: Option<(u64, u64)>,
        stop_off_origin: bool,
    ) -> Result<(Url, Response), Failure> {
        let mut url = url;
        for _ in 0..=MAX_REDIRECTS {
            let mut rb = self.request(method.clone(), &url);
            if let Some((from, to)) = range {
                rb = rb.header(RANGE, format!("bytes={from}-{}", to - 1));
            }
            let resp = rb.send().await.map_err(|e| Failure::Transient {
                why: format!("{}: {}", host_of(&url), error_chain(&e)),
                wait: None,
            })?;
            if !resp.status().is_redirection() {
                return Ok((url, resp));
            }
            let Some(next) = resp
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .and_then(|l| url.join(l).ok())
            else {
                return Err(Failure::Fatal(format!(
                    "{} answered {} without a usable Location header",
                    host_of(&url),
                    resp.status()
                )));
            };
            if stop_off_origin && !self.same_origin(&next) {
                return Ok((next, resp));
            }
            url = next;
        }
        Err(Failure::Fatal(format!(
            "more than {MAX_REDIRECTS} redirects from {}; check HF_ENDPOINT",
            host_of(&url)
        )))
    }

    /// `GET url` of a JSON API, retried; returns the body (at most
    /// [`API_REPLY_LIMIT`]) and headers.
    /// `repo` and `what` name the request in errors.
    pub async fn get_api(
        &self,
        url: &str,
        repo: &str,
        what: &str,
    ) -> Result<(Vec<u8>, HeaderMap), Failure> {
        self.get_api_within(url, repo, what, API_REPLY_LIMIT).await
    }

    /// [`Self::get_api`] with a smaller bound on the body (a page of the
    /// file listing).
    pub async fn get_api_within(
        &self,
        url: &str,
        repo: &str,
        what: &str,
        limit: usize,
    ) -> Result<(Vec<u8>, HeaderMap), Failure> {
        let url = parse(url)?;
        retrying(|| async {
            let (at, resp) = self.send(Method::GET, url.clone(), None, false).await?;
            let status = resp.status();
            if !status.is_success() {
                return Err(refused(&resp, repo, what, &at));
            }
            let headers = resp.headers().clone();
            let body = read_limited(resp, &at, what, limit).await?;
            Ok((body, headers))
        })
        .await
    }

    /// One try of `GET …/resolve/…` for the bytes `[from, to)` (or the
    /// whole file), which also finds where they are: same-origin redirects
    /// (renamed repos) are followed, and a redirect off the endpoint's
    /// origin (the CDN's presigned URL) is followed once, without the token.
    /// Returns the URL that served the bytes, for the file's other ranges,
    /// the reply, and the size the redirect named (`X-Linked-Size`). No HEAD
    /// first: that would cost a round trip per file, and a mirror such as
    /// olah reads and hashes the whole file to answer one.
    pub async fn get_resolving(
        &self,
        url: &str,
        range: Option<(u64, u64)>,
        repo: &str,
        path: &str,
    ) -> Result<(Url, Response, Option<u64>), Failure> {
        let url = parse(url)?;
        let (at, resp) = self.send(Method::GET, url, range, true).await?;
        if resp.status().is_redirection() {
            let linked = resp
                .headers()
                .get("x-linked-size")
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.parse().ok());
            let (at, resp) = self.send(Method::GET, at, range, false).await?;
            if !resp.status().is_success() {
                return Err(refused(&resp, repo, path, &at));
            }
            return Ok((at, resp, linked));
        }
        if !resp.status().is_success() {
            return Err(refused(&resp, repo, path, &at));
        }
        Ok((at, resp, None))
    }

    /// One try of `GET url` for the bytes `[from, to)` (or the whole file
    /// when `range` is `None`). The caller streams the body and retries.
    pub async fn get_bytes(
        &self,
        url: &Url,
        range: Option<(u64, u64)>,
        repo: &str,
        path: &str,
    ) -> Result<Response, Failure> {
        let (at, resp) = self.send(Method::GET, url.clone(), range, false).await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(refused(&resp, repo, path, &at))
        }
    }
}

/// The HTTP client every request to a Hub or its CDN goes through: HTTP/1,
/// no redirect followed by itself, bounded connect and read waits.
pub fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .http1_only()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .user_agent(concat!(
            "xfer/",
            env!("CARGO_PKG_VERSION"),
            "; huggingface_hub-compatible"
        ))
        .build()
}

/// Runs `attempt` until it succeeds, fails fatally, or [`retry::MAX_TRIES`]
/// tries failed (then the last failure, still [`Failure::Transient`]: a
/// caller that runs again later, such as a sync job, tries again).
pub async fn retrying<T, F, Fut>(mut attempt: F) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    let mut tries = 0;
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(Failure::Transient { why, wait }) => {
                tries += 1;
                if tries >= retry::MAX_TRIES {
                    return Err(Failure::Transient {
                        // The fix is the caller's: a pull says "run it
                        // again", an agent's job tries again itself.
                        why: format!("{why} ({tries} tries)"),
                        wait,
                    });
                }
                let pause = retry::backoff(tries, wait, rand::thread_rng().gen());
                tracing::info!("retrying in {pause:.1?}: {why}");
                tokio::time::sleep(pause).await;
            }
            Err(fatal) => return Err(fatal),
        }
    }
}

/// The failure an unsuccessful reply stands for.
pub fn refused(resp: &Response, repo: &str, what: &str, at: &Url) -> Failure {
    let status = resp.status();
    let h = resp.headers();
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    if retry::is_retryable(status.as_u16()) {
        return Failure::Transient {
            why: format!("{} answered HTTP {}", host_of(at), status.as_u16()),
            wait: retry::server_wait(text("retry-after"), text("ratelimit")),
        };
    }
    if status == StatusCode::RANGE_NOT_SATISFIABLE {
        return Failure::Fatal(format!(
            "{} refused the byte range of {what} (HTTP 416): the file changed on the server; run again to start it over",
            host_of(at)
        ));
    }
    let mut msg = refusal(status.as_u16(), text("x-error-code"), repo, what);
    match text("x-error-message") {
        Some(m) => msg.push_str(&format!(" (HTTP {}; the Hub says: {m})", status.as_u16())),
        None => msg.push_str(&format!(" (HTTP {})", status.as_u16())),
    }
    if status.is_client_error() {
        return Failure::Refused {
            status: status.as_u16(),
            why: msg,
        };
    }
    Failure::Fatal(msg)
}

fn parse(url: &str) -> Result<Url, Failure> {
    Url::parse(url).map_err(|e| Failure::Fatal(format!("bad URL {url}: {e}")))
}

/// `host:port` for messages.
pub fn host_of(url: &Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => url.to_string(),
    }
}

/// An error and its causes on one line (reqwest hides the useful part, such
/// as "connection reset", in the source chain).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// The largest JSON API reply read: a tree page or a model's info is far
/// smaller; a bigger body is not a Hub's.
pub const API_REPLY_LIMIT: usize = 64 << 20;

/// Reads a reply's body as it arrives, refusing it once it passes
/// `limit` (or says it will, in its `content-length`).
async fn read_limited(
    mut resp: reqwest::Response,
    at: &Url,
    what: &str,
    limit: usize,
) -> Result<Vec<u8>, Failure> {
    let too_big = || {
        Failure::Fatal(format!(
            "{}: the reply to {what} is larger than {} MiB, which no Hub API reply is; check HF_ENDPOINT",
            host_of(at),
            limit >> 20
        ))
    };
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(part)) => {
                if body.len() + part.len() > limit {
                    return Err(too_big());
                }
                body.extend_from_slice(&part);
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                return Err(Failure::Transient {
                    why: format!("{}: reply cut short: {}", host_of(at), error_chain(&e)),
                    wait: None,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers every request with `head` and then streams
    /// `body_len` bytes of `[` (so far more than the limit never ends).
    async fn serve(head: String, body_len: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let head = head.clone();
                tokio::spawn(async move {
                    let mut req = [0u8; 4096];
                    let _ = sock.read(&mut req).await;
                    if sock.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let block = vec![b'['; 1 << 20];
                    let mut left = body_len;
                    while left > 0 {
                        let n = left.min(block.len());
                        if sock.write_all(&block[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    fn client(endpoint: &str) -> HubHttp {
        let env = HubEnv::from_lookup(&|k| match k {
            "HF_ENDPOINT" => Some(endpoint.to_string()),
            "HF_HUB_CACHE" => Some("/nonexistent-cache".to_string()),
            _ => None,
        })
        .unwrap();
        HubHttp::new(&env).unwrap()
    }

    #[tokio::test]
    async fn an_api_reply_over_the_limit_is_refused_as_it_arrives() {
        let over = API_REPLY_LIMIT + (8 << 20);
        // Said up front in the content-length: refused before the body.
        let said = serve(
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {over}\r\n\r\n"),
            over,
        )
        .await;
        // Not said (chunked): refused once the bytes pass the limit.
        let unsaid = serve(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n".into(),
            over,
        )
        .await;
        for endpoint in [said, unsaid] {
            let url = format!("{endpoint}/api/models/a/b");
            match client(&endpoint)
                .get_api(&url, "a/b", "the model info")
                .await
            {
                Err(Failure::Fatal(why)) => {
                    assert!(why.contains("larger than 64 MiB"), "{why}");
                    assert!(why.contains("HF_ENDPOINT"), "{why}");
                }
                Err(Failure::Transient { why, .. }) => panic!("retried: {why}"),
                Err(Failure::Refused { why, .. }) => panic!("refused: {why}"),
                Ok((body, _)) => panic!("read {} bytes", body.len()),
            }
        }
    }
}
