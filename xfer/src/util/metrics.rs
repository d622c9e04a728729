//! Process-wide counters of an agent, served in the Prometheus text format
//! on `xfer serve --metrics ADDR` (127.0.0.1 unless an address says
//! otherwise): verified bytes and chunks in, chunks that failed their check,
//! chunk bytes served, and verified bytes per peer (rates come from
//! Prometheus' `rate()`). Plain atomics; reading them never blocks a transfer.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

static BYTES_IN: AtomicU64 = AtomicU64::new(0);
static CHUNKS_VERIFIED: AtomicU64 = AtomicU64::new(0);
static CHUNKS_FAILED: AtomicU64 = AtomicU64::new(0);
static BYTES_OUT: AtomicU64 = AtomicU64::new(0);
static PER_PEER: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// A chunk of `bytes` from `peer` (a label: `source`, `peer3`) was verified
/// and stored.
pub fn verified(peer: &str, bytes: u64) {
    BYTES_IN.fetch_add(bytes, Ordering::Relaxed);
    CHUNKS_VERIFIED.fetch_add(1, Ordering::Relaxed);
    *PER_PEER
        .lock()
        .unwrap()
        .entry(peer.to_string())
        .or_default() += bytes;
}

/// A chunk failed its BLAKE3 check on arrival.
pub fn failed() {
    CHUNKS_FAILED.fetch_add(1, Ordering::Relaxed);
}

/// `bytes` of chunk data were sent to someone.
pub fn served(bytes: u64) {
    BYTES_OUT.fetch_add(bytes, Ordering::Relaxed);
}

/// The counters in Prometheus' text exposition format.
pub fn render() -> String {
    let mut s = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        s.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
        ));
    };
    counter(
        "xfer_bytes_received_total",
        "Verified chunk bytes stored.",
        BYTES_IN.load(Ordering::Relaxed),
    );
    counter(
        "xfer_chunks_verified_total",
        "Chunks that passed their BLAKE3 check.",
        CHUNKS_VERIFIED.load(Ordering::Relaxed),
    );
    counter(
        "xfer_chunks_failed_total",
        "Chunks that failed their BLAKE3 check and were fetched again.",
        CHUNKS_FAILED.load(Ordering::Relaxed),
    );
    counter(
        "xfer_bytes_sent_total",
        "Chunk bytes served to sources' receivers and peers.",
        BYTES_OUT.load(Ordering::Relaxed),
    );
    s.push_str(
        "# HELP xfer_peer_bytes_received_total Verified bytes by the peer they came from.\n",
    );
    s.push_str("# TYPE xfer_peer_bytes_received_total counter\n");
    for (peer, v) in PER_PEER.lock().unwrap().iter() {
        s.push_str(&format!(
            "xfer_peer_bytes_received_total{{peer=\"{peer}\"}} {v}\n"
        ));
    }
    s
}

/// `PORT` means 127.0.0.1:PORT; anything else must be `IP:PORT`.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("--metrics {s}: give PORT (on 127.0.0.1) or IP:PORT"))
}

/// Serves `GET /metrics` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot serve metrics on {addr}: {e}; pick another --metrics port")
    })?;
    tracing::info!("metrics on http://{addr}/metrics");
    loop {
        let (mut sock, _) = listener.accept().await?;
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n =
                match tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
            let req = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if req.starts_with("GET /metrics") {
                ("200 OK", render())
            } else {
                ("404 Not Found", "try /metrics\n".to_string())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
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
        assert!(text.contains("# TYPE xfer_bytes_received_total counter"));
        assert!(text.contains("xfer_peer_bytes_received_total{peer=\"peer2\"}"));
        assert_eq!(parse_addr("9470").unwrap().to_string(), "127.0.0.1:9470");
        assert_eq!(parse_addr("0.0.0.0:9").unwrap().to_string(), "0.0.0.0:9");
        assert!(parse_addr("x").unwrap_err().contains("PORT"));
    }
}
