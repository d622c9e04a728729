//! The intake node's side of a striped pull (issue 36): a sync job's
//! source asks this node to fetch a byte range of a file from the origin
//! (the Hub's CDN, or the mirror `HF_ENDPOINT` names) over this node's own
//! link, and streams the bytes back as they arrive. The source writes them
//! into its download and checks the file's Hub hash over all of it: what
//! this node sends is never trusted on its own.
//!
//! The first request comes on the connection's control stream; the
//! connection then stays an intake session: each further request is one
//! more stream opening with its own [`TransferMsg::Intake`], served at
//! once (at most [`MAX_INTAKE_STREAMS`] at a time), until the source
//! closes the connection.
//!
//! Only the source of a running sync job from the Hub for the model that
//! names this node as an intake node (or an operator) may ask, the session
//! serves that one model, and a node's ask is fetched only from that job's
//! origin ([`Origin`]: the endpoint's host, the Hub's CDN domains); the
//! URL must be `http(s)`, the span at most
//! [`MAX_INTAKE_SPAN`], and no redirect is followed (the source resolved
//! the file once for the cluster). `XFER_FAULT_CORRUPT_INTAKE=1` makes
//! this node flip one byte of every range it relays: the tests' lying
//! downloader.

use anyhow::Result;
use reqwest::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_RANGE, RANGE};
use reqwest::StatusCode;

use xfer_proto::admin::Secret;
use xfer_proto::names::ModelName;
use xfer_proto::transfer::{Refusal, TransferMsg, MAX_INTAKE_SPAN};

use std::sync::Arc;

use xfer_proto::draft::FileIndex;

use crate::flow::swarm::Shares;
use crate::store::fetched::Fetched;
use crate::transport::quic::write_frame;

/// The fault hook of the tests' lying downloader.
pub const FAULT_CORRUPT_INTAKE: &str = "XFER_FAULT_CORRUPT_INTAKE";
/// The fault hook of the tests' "slow down" sayer: 5 of every 6 asks are
/// answered "the origin asks to wait 20 s", whatever the origin said.
pub const FAULT_BUSY_INTAKE: &str = "XFER_FAULT_BUSY_INTAKE";

/// What the source asked for.
pub(super) struct IntakeAsk {
    pub(super) name: ModelName,
    /// The file of the source's draft, when its pull streams one.
    pub(super) file: Option<FileIndex>,
    pub(super) url: String,
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) token: Option<Secret>,
    /// The job's origin, the only hosts fetched from (`None`: an
    /// operator's ask).
    pub(super) origin: Option<Origin>,
}

/// The hosts a striped job's origin serves its files from: the endpoint's
/// host (any port: a mirror's CDN may listen on another), and, for the
/// Hub itself, its CDN domains (`*.huggingface.co`, `hf.co`, `*.hf.co`),
/// plus the hosts the agent's `XFER_INTAKE_HOSTS` (comma-separated) adds.
#[derive(Debug, Clone)]
pub struct Origin {
    hosts: Vec<String>,
    domains: Vec<String>,
}

/// The variable naming more hosts an intake node may fetch from.
pub const INTAKE_HOSTS: &str = "XFER_INTAKE_HOSTS";

/// Why a URL does not parse (the `url` crate's `ParseError`, named
/// through reqwest).
type UrlError = <reqwest::Url as std::str::FromStr>::Err;

/// Why a job's endpoint names no origin.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// It is not a URL.
    #[error("its job's endpoint `{endpoint}` is not a URL ({why})")]
    NotUrl {
        /// The endpoint.
        endpoint: String,
        /// Why it does not parse.
        why: UrlError,
    },
    /// It names no host.
    #[error("its job's endpoint `{0}` names no host")]
    NoHost(String),
}

/// Why an intake ask is refused (a protocol refusal's text).
#[derive(Debug, thiserror::Error)]
enum AskShapeError {
    /// The URL does not parse.
    #[error("intake URL `{url}` is not a URL: {why}")]
    NotUrl { url: String, why: UrlError },
    /// The URL is not http(s).
    #[error("intake URL `{0}` is not http(s); only an origin's files are fetched")]
    NotHttp(String),
    /// The span is empty or too long.
    #[error("intake span {from}..{to} is empty or longer than {MAX_INTAKE_SPAN} bytes")]
    Span { from: u64, to: u64 },
}

impl Origin {
    /// The origin of the endpoint `HF_ENDPOINT` (or a job) names.
    pub fn of_endpoint(endpoint: &str) -> Result<Origin, EndpointError> {
        let url = reqwest::Url::parse(endpoint).map_err(|why| EndpointError::NotUrl {
            endpoint: endpoint.to_string(),
            why,
        })?;
        let host = url
            .host_str()
            .ok_or_else(|| EndpointError::NoHost(endpoint.to_string()))?
            .to_ascii_lowercase();
        let mut hosts = vec![host.clone()];
        let mut domains = Vec::new();
        if host == "huggingface.co" || host.ends_with(".huggingface.co") {
            hosts.push("hf.co".into());
            domains.extend([".huggingface.co".to_string(), ".hf.co".to_string()]);
        }
        if let Ok(more) = std::env::var(INTAKE_HOSTS) {
            hosts.extend(
                more.split(',')
                    .map(|h| h.trim().to_ascii_lowercase())
                    .filter(|h| !h.is_empty()),
            );
        }
        Ok(Origin { hosts, domains })
    }

    /// Whether `url`'s host is this origin's.
    fn allows(&self, url: &reqwest::Url) -> bool {
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        self.hosts.contains(&host) || self.domains.iter().any(|d| host.ends_with(d.as_str()))
    }
}

/// Ranges one session fetches at once, whatever the source opens.
pub const MAX_INTAKE_STREAMS: usize = 64;

/// Serves the session that `first` opened on `conn` (the caller's right to
/// ask for `first.name` was checked): `first`, then every further stream's
/// ask for the same model, until the connection closes.
pub(super) async fn session(
    conn: quinn::Connection,
    send: quinn::SendStream,
    first: IntakeAsk,
    shares: Arc<Shares>,
) -> Result<()> {
    let name = first.name.clone();
    let origin = first.origin.clone();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_INTAKE_STREAMS));
    // One HTTP client for the session: its ranges reuse kept-alive
    // connections to the origin (a new one per range would pay a TCP and
    // TLS handshake and a slow start every few megabytes).
    let client = crate::hub::http::client()?;
    let permit = slots.clone().acquire_owned().await?;
    let (keep, http) = (shares.clone(), client.clone());
    tokio::spawn(async move {
        let _permit = permit;
        let _ = serve(send, first, &keep, &http).await;
    });
    loop {
        let Ok((mut send, mut recv)) = conn.accept_bi().await else {
            return Ok(()); // the source closed the session
        };
        let permit = slots.clone().acquire_owned().await?;
        let (name, shares, http) = (name.clone(), shares.clone(), client.clone());
        let origin = origin.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let ask = crate::transport::quic::read_frame_within::<TransferMsg>(
                &mut recv,
                INTAKE_ASK_LIMIT,
            )
            .await;
            let ask = match ask {
                Ok(TransferMsg::Intake {
                    name: n,
                    file,
                    url,
                    from,
                    to,
                    token,
                }) if n == name => IntakeAsk {
                    name: n,
                    file,
                    url,
                    from,
                    to,
                    token,
                    origin: origin.clone(),
                },
                Ok(other) => {
                    let why = format!(
                        "an intake session for `{name}` carries only intake requests for it, not {}",
                        other.kind()
                    );
                    let _ = super::refuse(&mut send, Refusal::Protocol(why)).await;
                    return;
                }
                Err(e) => {
                    tracing::debug!("intake stream: {e:#}");
                    return;
                }
            };
            let _ = serve(send, ask, &shares, &http).await;
        });
    }
}

/// Most bytes an intake request's frame may have (a URL, a token).
const INTAKE_ASK_LIMIT: usize = 16 << 10;

/// Checks `ask`, fetches it and streams it back on `send`, keeping the
/// bytes in this node's own transfer of the draft when one runs (see
/// [`keeper`]).
async fn serve(
    mut send: quinn::SendStream,
    ask: IntakeAsk,
    shares: &Shares,
    client: &reqwest::Client,
) -> Result<()> {
    let url = match check(&ask) {
        Ok(u) => u,
        Err(why) => return super::refuse(&mut send, Refusal::Protocol(why.to_string())).await,
    };
    if std::env::var(FAULT_BUSY_INTAKE).is_ok_and(|v| v == "1") {
        static ASKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if ASKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 6 != 5 {
            let busy = Refusal::OriginBusy {
                why: "the origin answered HTTP 429 to a range request from this node".into(),
                wait_ms: Some(20_000),
            };
            return super::refuse(&mut send, busy).await;
        }
    }
    if let Some(origin) = ask.origin.as_ref().filter(|o| !o.allows(&url)) {
        // Said without the URL's host or path: no answer maps a network.
        tracing::warn!(
            "refused an intake of `{}` from {}: not its job's origin ({origin:?})",
            ask.name,
            url.host_str().unwrap_or("?")
        );
        let why = format!(
            "the URL is not on the origin of `{}`'s sync job; an intake node fetches only from its job's endpoint and, for the Hub, its CDN (more hosts: {INTAKE_HOSTS} on this agent)",
            ask.name
        );
        return super::refuse(&mut send, Refusal::Forbidden(why)).await;
    }
    if let Some(why) = outside_listing(shares.transfer(&ask.name).as_deref(), &ask) {
        return super::refuse(&mut send, Refusal::Forbidden(why)).await;
    }
    let mut resp = match request(client, &url, &ask).await {
        Ok(r) => r,
        Err(refusal) => return super::refuse(&mut send, refusal).await,
    };
    let len = ask.to - ask.from;
    tracing::debug!("fetching {len} bytes of `{}` from the origin", ask.name);
    write_frame(&mut send, &TransferMsg::IntakeBody { len }).await?;
    let lie = std::env::var(FAULT_CORRUPT_INTAKE).is_ok_and(|v| v == "1");
    let mut keep = keeper(shares, &ask);
    let mut sent = 0u64;
    while sent < len {
        let piece = match resp.chunk().await {
            Ok(Some(p)) => p,
            // The source sees a short body and asks again (itself or
            // another node): nothing to say but stop.
            Ok(None) | Err(_) => break,
        };
        let take = piece.len().min((len - sent) as usize);
        let mut piece = piece.slice(..take);
        if lie && sent <= len / 2 && len / 2 < sent + take as u64 {
            let mut bad = piece.to_vec();
            bad[(len / 2 - sent) as usize] ^= 0xFF;
            piece = bad.into();
        }
        // Kept before it is sent: the source cannot announce a chunk of
        // it before it is a candidate here.
        if let Some(k) = &mut keep {
            if let Err(e) = k.write(&piece) {
                tracing::debug!("no longer keeping `{}`'s intake bytes: {e}", ask.name);
                keep = None;
            }
        }
        send.write_all(&piece).await?;
        sent += take as u64;
    }
    let _ = send.finish();
    if let Some(k) = keep {
        tracing::debug!("kept {} chunks of `{}` it fetched", k.kept(), ask.name);
    }
    Ok(())
}

/// Where this node keeps the bytes it fetches for the source: its own
/// running transfer of the same draft (it is a receiver of the job too),
/// so the swarm need not send them back. What is kept is only a candidate
/// until the source announces its chunks' hashes
/// ([`crate::store::fetched`]).
fn keeper(shares: &Shares, ask: &IntakeAsk) -> Option<Fetched> {
    let file = ask.file?;
    shares.transfer(&ask.name)?.keep_fetched(file, ask.from)
}

/// Why the ask's range is not inside the file of the job's listing it
/// names, when this node receives that listing (its own transfer of the
/// source's draft, which every intake node of a streamed job runs).
fn outside_listing(t: Option<&crate::store::Transfer>, ask: &IntakeAsk) -> Option<String> {
    let t = t?;
    if !t.is_draft() {
        return None;
    }
    let Some(file) = ask.file else {
        return Some(format!(
            "the ask names no file of `{}`'s listing, which this node receives",
            ask.name
        ));
    };
    match t.draft_file_size(file) {
        None => Some(format!("`{}`'s listing has no file {file}", ask.name)),
        Some(size) if ask.to > size => Some(format!(
            "bytes {}..{} run past file {file} of `{}`'s listing ({size} bytes)",
            ask.from, ask.to, ask.name
        )),
        Some(_) => None,
    }
}

/// The URL, if the ask is well formed.
fn check(ask: &IntakeAsk) -> Result<reqwest::Url, AskShapeError> {
    let url = reqwest::Url::parse(&ask.url).map_err(|why| AskShapeError::NotUrl {
        url: ask.url.clone(),
        why,
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(AskShapeError::NotHttp(ask.url.clone()));
    }
    if ask.to <= ask.from || ask.to - ask.from > MAX_INTAKE_SPAN {
        return Err(AskShapeError::Span {
            from: ask.from,
            to: ask.to,
        });
    }
    Ok(url)
}

/// One ranged GET; the reply must be `206` from `from`. An origin that
/// asks to slow down (429, 5xx) is [`Refusal::OriginBusy`] with its wait,
/// which the source applies to the whole cluster.
async fn request(
    client: &reqwest::Client,
    url: &reqwest::Url,
    ask: &IntakeAsk,
) -> Result<reqwest::Response, Refusal> {
    let mut rb = client
        .get(url.clone())
        .header(ACCEPT_ENCODING, "identity")
        .header(RANGE, format!("bytes={}-{}", ask.from, ask.to - 1));
    if let Some(t) = &ask.token {
        rb = rb.header(AUTHORIZATION, format!("Bearer {}", t.expose()));
    }
    let host = url.host_str().unwrap_or("?").to_string();
    let resp = rb
        .send()
        .await
        .map_err(|e| Refusal::Origin(format!("{host}: {}", crate::hub::http::error_chain(&e))))?;
    let status = resp.status().as_u16();
    if crate::hub::retry::is_retryable(status) {
        let h = resp.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
        let wait = crate::hub::retry::server_wait(text("retry-after"), text("ratelimit"));
        return Err(Refusal::OriginBusy {
            why: format!("{host} answered HTTP {status} to a range request from this node"),
            wait_ms: wait.map(|w| w.as_millis() as u64),
        });
    }
    if resp.status() != StatusCode::PARTIAL_CONTENT {
        return Err(Refusal::Origin(format!(
            "{host} answered {} to a range request from this node; check this node's route to it",
            resp.status()
        )));
    }
    let start = resp
        .headers()
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes "))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse::<u64>().ok());
    if start != Some(ask.from) {
        return Err(Refusal::Origin(format!(
            "{host} answered bytes from {start:?} when asked for {}",
            ask.from
        )));
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_outside_the_listed_file_is_refused() {
        use xfer_proto::relpath::RelPath;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let draft = xfer_proto::draft::Draft::new(
            1 << 20,
            vec![
                (RelPath::new("blobs/a").unwrap(), 1000),
                (RelPath::new("blobs/b").unwrap(), 5000),
            ],
        )
        .unwrap();
        let id = draft.id("c");
        let b = draft.index_of(&RelPath::new("blobs/b").unwrap()).unwrap();
        let t = store
            .begin_draft(&ModelName::new("m").unwrap(), id, draft)
            .unwrap();
        let mut a = ask("https://cdn.example/x", 0, 5000);
        assert_eq!(
            outside_listing(None, &a),
            None,
            "no listing here: unchecked"
        );
        a.file = Some(b);
        assert_eq!(outside_listing(Some(&t), &a), None);
        a.to = 5001;
        let why = outside_listing(Some(&t), &a).unwrap();
        assert!(why.contains("run past file"), "{why}");
        a.file = Some(7);
        assert!(outside_listing(Some(&t), &a)
            .unwrap()
            .contains("has no file 7"));
        a.file = None;
        assert!(outside_listing(Some(&t), &a)
            .unwrap()
            .contains("names no file"));
    }

    fn ask(url: &str, from: u64, to: u64) -> IntakeAsk {
        IntakeAsk {
            name: ModelName::new("m").unwrap(),
            file: None,
            url: url.into(),
            from,
            to,
            token: None,
            origin: None,
        }
    }

    #[test]
    fn only_an_http_span_within_the_bound_is_fetched() {
        assert!(check(&ask("https://cdn.example/b/1", 0, 10)).is_ok());
        for bad in [
            ask("file:///etc/shadow", 0, 10),
            ask("not a url", 0, 10),
            ask("http://h/x", 10, 10),
            ask("http://h/x", 0, MAX_INTAKE_SPAN + 1),
        ] {
            let why = check(&bad).unwrap_err();
            assert!(why.to_string().contains("intake"), "{why}");
        }
    }
}

#[cfg(test)]
mod origin_tests {
    use super::*;

    fn url(u: &str) -> reqwest::Url {
        reqwest::Url::parse(u).unwrap()
    }

    /// The SSRF of issue 53: a job's source may not point an intake node
    /// at a metadata service or a LAN host; the Hub's own CDN and a
    /// mirror's other port are its origin.
    #[test]
    fn an_intake_node_fetches_only_from_its_jobs_origin() {
        let hub = Origin::of_endpoint("https://huggingface.co").unwrap();
        for ok in [
            "https://huggingface.co/acme/m/resolve/c/x",
            "https://cdn-lfs.huggingface.co/repos/x",
            "https://cas-bridge.xethub.hf.co/x",
            "https://hf.co/x",
        ] {
            assert!(hub.allows(&url(ok)), "{ok}");
        }
        for bad in [
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.5:8080/admin",
            "https://evilhuggingface.co/x",
            "https://huggingface.co.evil.example/x",
            "http://localhost:22/",
        ] {
            assert!(!hub.allows(&url(bad)), "{bad}");
        }
        let mirror = Origin::of_endpoint("http://10.1.2.3:8088").unwrap();
        assert!(mirror.allows(&url("http://10.1.2.3:9099/blobs/x")));
        assert!(!mirror.allows(&url("http://10.1.2.4:8088/")));
        assert!(Origin::of_endpoint("not a url").is_err());
    }
}
