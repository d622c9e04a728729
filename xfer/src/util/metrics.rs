//! Process-wide counters of an agent, served in the Prometheus text format
//! on `xfer serve --metrics ADDR` (127.0.0.1 unless an address says
//! otherwise): verified bytes and chunks in, chunks that failed their
//! check, chunk bytes served, and verified bytes per peer (rates come from
//! Prometheus' `rate()`).
//!
//! The counters and their exposition are `prometheus-client`'s; the
//! endpoint is a `hyper` HTTP/1 server answering `GET /metrics`. Counting
//! is an atomic add, so it never blocks a transfer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::LazyLock;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The agent's counters, registered once.
struct Metrics {
    registry: Registry,
    bytes_in: Counter,
    chunks_verified: Counter,
    chunks_failed: Counter,
    bytes_out: Counter,
    per_peer: Family<Vec<(String, String)>, Counter>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix("xfer");
    let m = Metrics {
        registry: Registry::default(),
        bytes_in: Counter::default(),
        chunks_verified: Counter::default(),
        chunks_failed: Counter::default(),
        bytes_out: Counter::default(),
        per_peer: Family::default(),
    };
    registry.register(
        "bytes_received",
        "Verified chunk bytes stored",
        m.bytes_in.clone(),
    );
    registry.register(
        "chunks_verified",
        "Chunks that passed their BLAKE3 check",
        m.chunks_verified.clone(),
    );
    registry.register(
        "chunks_failed",
        "Chunks that failed their BLAKE3 check and were fetched again",
        m.chunks_failed.clone(),
    );
    registry.register(
        "bytes_sent",
        "Chunk bytes served to sources' receivers and peers",
        m.bytes_out.clone(),
    );
    registry.register(
        "peer_bytes_received",
        "Verified bytes by the peer they came from",
        m.per_peer.clone(),
    );
    Metrics { registry, ..m }
});

/// A chunk of `bytes` from `peer` (a label: `source`, `peer3`) was verified
/// and stored.
pub fn verified(peer: &str, bytes: u64) {
    let m = &*METRICS;
    m.bytes_in.inc_by(bytes);
    m.chunks_verified.inc();
    m.per_peer
        .get_or_create(&vec![("peer".to_string(), peer.to_string())])
        .inc_by(bytes);
}

/// A chunk failed its BLAKE3 check on arrival.
pub fn failed() {
    METRICS.chunks_failed.inc();
}

/// `bytes` of chunk data were sent to someone.
pub fn served(bytes: u64) {
    METRICS.bytes_out.inc_by(bytes);
}

/// The counters in Prometheus' text exposition format.
pub fn render() -> String {
    let mut s = String::new();
    encode(&mut s, &METRICS.registry).expect("writing to a String cannot fail");
    s
}

/// A `--metrics` value that is neither `PORT` nor `IP:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--metrics {0}: give PORT (on 127.0.0.1) or IP:PORT")]
pub struct MetricsAddrError(String);

/// `PORT` means 127.0.0.1:PORT; anything else must be `IP:PORT` (clap's
/// value parser).
pub fn parse_addr(s: &str) -> Result<SocketAddr, MetricsAddrError> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| MetricsAddrError(s.to_string()))
}

/// The one route: `GET /metrics`.
async fn answer(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = if req.method() == Method::GET && req.uri().path() == "/metrics" {
        Response::builder()
            .header(
                hyper::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Full::new(Bytes::from(render())))
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"try /metrics\n")))
    };
    Ok(reply.expect("a response of static parts"))
}

/// Serves `GET /metrics` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot serve metrics on {addr}: {e}; pick another --metrics port")
    })?;
    tracing::info!("metrics on http://{addr}/metrics");
    serve_on(listener).await
}

/// Serves `GET /metrics` on a bound listener until the process ends.
pub async fn serve_on(listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    loop {
        let (sock, _) = listener.accept().await?;
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(sock);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(5))
                .serve_connection(io, hyper::service::service_fn(answer));
            if let Err(e) = conn.await {
                tracing::debug!("metrics connection: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_in_the_exposition() {
        verified("source", 10);
        verified("peer2", 5);
        failed();
        served(7);
        let text = render();
        assert!(
            text.contains("# TYPE xfer_bytes_received counter"),
            "{text}"
        );
        assert!(text.contains("xfer_bytes_received_total "), "{text}");
        assert!(
            text.contains("xfer_peer_bytes_received_total{peer=\"peer2\"}"),
            "{text}"
        );
        assert_eq!(parse_addr("9470").unwrap().to_string(), "127.0.0.1:9470");
        assert_eq!(parse_addr("0.0.0.0:9").unwrap().to_string(), "0.0.0.0:9");
        assert!(parse_addr("x").unwrap_err().to_string().contains("PORT"));
    }

    #[tokio::test]
    async fn the_endpoint_answers_get_metrics_over_http() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_on(listener));
        served(3);
        let client = reqwest::Client::new();
        let got = client
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), 200);
        let body = got.text().await.unwrap();
        assert!(body.contains("xfer_bytes_sent_total"), "{body}");
        let missing = client
            .get(format!("http://{addr}/other"))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), 404);
    }
}
