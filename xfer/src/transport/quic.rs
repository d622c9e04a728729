//! The QUIC adapter: quinn endpoints tuned for bulk transfer, length-prefixed
//! frames on streams, and the chunk fetch/serve loops.
//!
//! Tuning (see `shared/notes/transport.md`): quinn's defaults target 100 Mb/s
//! at 100 ms. We raise per-stream and connection windows well above the
//! bandwidth-delay product of a 200 Gb/s LAN, let MTU discovery climb to
//! jumbo frames, enlarge the UDP socket buffers (drops there look like loss),
//! and give every peer its own endpoint so each socket is driven separately.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    Connection, ConnectionError, Endpoint, IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt,
};
use rustls::pki_types::CertificateDer;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::lanes::Lanes;
use super::{ChunkFetcher, ChunkReader, FetchError};
use crate::config::auth::{Credential, SERVER_NAME};
use crate::util::aligned::AlignedBuf;
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::frame;
use xfer_proto::hello::{Hello, Service};
use xfer_proto::manifest::ChunkId;
use xfer_proto::names::{alpn_version, version_refusal, PROTOCOL_VERSION};
use xfer_proto::stream::{ChunkReply, ChunkRequest, ResetCode, StreamRequest};

/// Default agent port.
pub use xfer_proto::names::DEFAULT_PORT;
/// Largest UDP payload MTU discovery may reach; see `transport_config`.
pub const MAX_MTU: u16 = 6500;
/// Bidirectional streams a peer may hold open at once on one connection
/// (each side grants the other this many). Sixteen times the default
/// request window, and it bounds what one connection can pin: its streams'
/// state, and the agent reads at most one frame per stream.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// UDP socket buffer size we ask for.
const SOCKET_BUFFER: usize = 32 << 20;

/// Transport settings for bulk chunk traffic.
pub fn transport_config() -> TransportConfig {
    let mut t = TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(32 << 20));
    t.receive_window(VarInt::from_u32(256 << 20));
    t.send_window(256 << 20);
    // Streams the peer may hold open at once (quinn's default: 100 each).
    // A peer opens one per chunk request in flight (`--window`, default
    // 16; an RDMA ring's slots, default 16) plus a control stream; more
    // wait for credit, they do not fail. Was 1024; see the constant.
    t.max_concurrent_bidi_streams(VarInt::from_u32(MAX_CONCURRENT_STREAMS));
    // xfer opens no unidirectional streams: a peer may open none.
    t.max_concurrent_uni_streams(VarInt::from_u32(0));
    t.keep_alive_interval(Some(Duration::from_secs(2)));
    t.max_idle_timeout(Some(
        IdleTimeout::try_from(Duration::from_secs(10)).expect("in range"),
    ));
    t.send_fairness(false);
    // quinn batches up to 10 datagrams per GSO send, and one GSO send must
    // fit in a 64 KiB IP datagram, so larger probes are lost in the kernel
    // and trigger black-hole detection (measured: 7000 fails, 6500 holds).
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_MTU);
    t.mtu_discovery_config(Some(mtu));
    if std::env::var("XFER_CONGESTION").as_deref() == Ok("bbr") {
        t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()));
    }
    t
}

/// Endpoint settings: accept datagrams up to jumbo-frame size, so MTU
/// discovery can use 9000-byte fabrics (quinn's default caps at 1472).
fn endpoint_config() -> quinn::EndpointConfig {
    let mut c = quinn::EndpointConfig::default();
    c.max_udp_payload_size(65527).expect("valid payload size");
    c
}

/// Resolves `host[:port]`, defaulting the port to [`DEFAULT_PORT`]; a
/// host name with both an IPv4 and an IPv6 address takes the IPv4 one, as
/// `serve --listen` does (`config::cluster::parse_listen`), so
/// `localhost:7470` is the same socket on both ends.
pub fn resolve(addr: &str) -> Result<SocketAddr> {
    let with_port = if addr.parse::<SocketAddr>().is_ok()
        || addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.ends_with(':') && p.parse::<u16>().is_ok())
    {
        addr.to_string()
    } else {
        format!("{addr}:{DEFAULT_PORT}")
    };
    with_port
        .to_socket_addrs()
        .with_context(|| {
            format!("cannot resolve `{addr}`; write HOST:PORT, e.g. 10.0.0.2:{DEFAULT_PORT}")
        })?
        .fold(None, |best: Option<SocketAddr>, a| match best {
            Some(b) if b.is_ipv4() || !a.is_ipv4() => Some(b),
            _ => Some(a),
        })
        .with_context(|| format!("`{addr}` resolves to no address"))
}

/// Sets an integer socket option; returns whether the kernel accepted it.
fn set_int_option(sock: &socket2::Socket, option: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: setsockopt on a valid fd with a c_int option value.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            libc::SOL_SOCKET,
            option,
            &value as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

fn udp_socket(addr: SocketAddr) -> Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    let size = SOCKET_BUFFER as libc::c_int;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        // The FORCE variants need CAP_NET_ADMIN; unprivileged, the kernel
        // caps the plain ones at net.core.{r,w}mem_max.
        if !set_int_option(&sock, force, size) {
            set_int_option(&sock, plain, size);
        }
    }
    sock.bind(&addr.into()).with_context(|| {
        format!("cannot bind UDP {addr}; is another agent already listening there?")
    })?;
    Ok(sock.into())
}

/// An endpoint that accepts connections from this cluster on `listen`, and
/// connects from the same socket to other agents (peer links).
pub fn server_endpoint(listen: SocketAddr, cred: &Credential) -> Result<Endpoint> {
    let tls = QuicServerConfig::try_from(cred.server_config()?)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(tls));
    cfg.transport_config(Arc::new(transport_config()));
    let mut ep = Endpoint::new(
        endpoint_config(),
        Some(cfg),
        udp_socket(listen)?,
        Arc::new(quinn::TokioRuntime),
    )?;
    ep.set_default_client_config(client_config(cred)?);
    Ok(ep)
}

fn client_config(cred: &Credential) -> Result<quinn::ClientConfig> {
    let tls = QuicClientConfig::try_from(cred.client_config()?)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(tls));
    cfg.transport_config(Arc::new(transport_config()));
    Ok(cfg)
}

/// A client endpoint for connecting to agents of this cluster.
pub fn client_endpoint(cred: &Credential, peer: SocketAddr) -> Result<Endpoint> {
    let cfg = client_config(cred)?;
    let bind: SocketAddr = if peer.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let mut ep = Endpoint::new(
        endpoint_config(),
        None,
        udp_socket(bind)?,
        Arc::new(quinn::TokioRuntime),
    )?;
    ep.set_default_client_config(cfg);
    Ok(ep)
}

/// Why [`connect`] failed, in words that name the address and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The endpoint would not start the connection.
    #[error("cannot connect to {addr}: {source}")]
    Start {
        /// The agent's address.
        addr: SocketAddr,
        /// What quinn said.
        source: quinn::ConnectError,
    },
    /// No handshake completed within the timeout.
    #[error("no agent answered at {addr} within {secs}s; is `xfer serve` running there, and is UDP port {} open?", addr.port())]
    NoAnswer {
        /// The agent's address.
        addr: SocketAddr,
        /// The timeout, in seconds.
        secs: u64,
    },
    /// The handshake failed ([`describe`]'s line).
    #[error("{0}")]
    Handshake(String),
    /// The agent speaks another protocol version ([`refuse_other_version`]'s line).
    #[error(transparent)]
    Version(OtherVersion),
}

/// Connects to an agent, failing within `timeout` with a message that names
/// the address and the likely fix.
pub async fn connect(
    ep: &Endpoint,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Connection, ConnectError> {
    let connecting = ep
        .connect(addr, SERVER_NAME)
        .map_err(|source| ConnectError::Start { addr, source })?;
    match tokio::time::timeout(timeout, connecting).await {
        Err(_) => Err(ConnectError::NoAnswer {
            addr,
            secs: timeout.as_secs(),
        }),
        Ok(Err(e)) => Err(ConnectError::Handshake(describe(addr, &e))),
        Ok(Ok(c)) => refuse_other_version(&c, &format!("the agent at {addr}"))
            .map(|()| c)
            .map_err(ConnectError::Version),
    }
}

/// The application close code of a connection refused for its protocol
/// version (the reason says both versions).
pub const VERSION_CLOSE: u32 = 0x5645;

/// The peer's verified leaf certificate, once the handshake is done.
pub fn peer_certificate(conn: &Connection) -> Option<CertificateDer<'static>> {
    let certs = conn
        .peer_identity()?
        .downcast::<Vec<CertificateDer<'static>>>()
        .ok()?;
    certs.into_iter().next()
}

/// The protocol version the peer's ALPN named, once the handshake is done.
pub fn peer_version(conn: &Connection) -> Option<u32> {
    let data = conn.handshake_data()?;
    let data = data
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .ok()?;
    alpn_version(data.protocol.as_deref()?)
}

/// A peer of another protocol version: one line naming both versions and
/// the node to upgrade ([`version_refusal`]), also the close reason.
#[derive(Debug, thiserror::Error)]
#[error("{}", version_refusal(peer, *theirs))]
pub struct OtherVersion {
    /// The peer, as the user knows it.
    pub peer: String,
    /// The version its ALPN named.
    pub theirs: u32,
}

/// `Err` when the peer (`who`, as the user knows it) speaks another
/// protocol version; the connection is then closed with its line as the
/// reason, so the peer prints it too. Both ends call it: the connecting
/// side in [`connect`], the accepting side before it reads a request.
pub fn refuse_other_version(conn: &Connection, who: &str) -> Result<(), OtherVersion> {
    match peer_version(conn) {
        Some(theirs) if theirs != PROTOCOL_VERSION => {
            let refused = OtherVersion {
                peer: who.to_string(),
                theirs,
            };
            conn.close(VERSION_CLOSE.into(), refused.to_string().as_bytes());
            Err(refused)
        }
        _ => Ok(()),
    }
}

/// Closes `conn` (the last of `ep`'s) as done and returns once the close
/// was sent, not once it drained: draining takes three probe timeouts (0.2
/// to 0.6 s on a loaded link), which nothing the caller reports depends
/// on. `ep` drains on its own afterwards, bounded, while the process lives
/// (an agent); a command that exits at once has told its peer already.
pub async fn close_done(ep: Endpoint, conn: &Connection) {
    // quinn sends the close at its driver's next turn and tells no one: a
    // closed connection sends nothing but its close, so the first datagram
    // counted after `close` is it. Look for it, at most CLOSE_SENT_WITHIN.
    let before = conn.stats().udp_tx.datagrams;
    conn.close(0u32.into(), b"done");
    let within = tokio::time::Instant::now() + CLOSE_SENT_WITHIN;
    while conn.stats().udp_tx.datagrams == before && tokio::time::Instant::now() < within {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(2), ep.wait_idle()).await;
    });
}

/// How long [`close_done`] waits for its closes to leave.
const CLOSE_SENT_WITHIN: Duration = Duration::from_millis(200);

/// Turns a connection error into one line that says what to do.
pub fn describe(addr: SocketAddr, e: &ConnectionError) -> String {
    let text = e.to_string();
    let auth = text.contains("certificate")
        || text.contains("UnknownIssuer")
        || text.contains("unknown CA")
        || text.contains("BadCertificate")
        || text.contains("CertificateRequired")
        || text.contains("crypto")
        || text.contains("alert");
    if auth {
        return format!(
            "authentication with {addr} failed ({text}): both ends must hold credentials of one cluster (issued by its CA with `xfer ca issue`, not expired, or in simple mode the same `xfer keygen` key)"
        );
    }
    match e {
        ConnectionError::TimedOut => {
            format!("connection to {addr} timed out; the agent or the network went away")
        }
        ConnectionError::ApplicationClosed(c) => format!(
            "{addr} closed the connection: {}",
            String::from_utf8_lossy(&c.reason)
        ),
        _ => format!("connection to {addr} failed: {text}"),
    }
}

/// Writes one frame.
pub async fn write_frame<T: Serialize>(send: &mut quinn::SendStream, msg: &T) -> Result<()> {
    send.write_all(&frame::encode(msg)).await?;
    Ok(())
}

/// Reads one frame, refusing oversized or malformed ones.
pub async fn read_frame<T: DeserializeOwned>(recv: &mut quinn::RecvStream) -> Result<T> {
    read_frame_within(recv, frame::MAX_FRAME).await
}

/// [`read_frame`] for a message known to be at most `limit` bytes.
pub async fn read_frame_within<T: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    limit: usize,
) -> Result<T> {
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix).await?;
    let len = frame::frame_len_within(prefix, limit)?;
    let body = read_body(recv, len).await?;
    Ok(frame::decode(&body)?)
}

/// Most bytes a frame's buffer grows by ahead of the bytes received: a
/// peer that claims a 64 MiB frame and sends nothing more costs us this,
/// not the claim.
pub const FRAME_READ_STEP: usize = 64 << 10;

/// Reads a frame body of `len` bytes (already checked against the
/// service's limit) into a buffer that grows with the bytes that actually
/// arrive, [`FRAME_READ_STEP`] at a time, never to the claimed length up
/// front; its capacity is at most `len`.
async fn read_body(recv: &mut quinn::RecvStream, len: usize) -> Result<Vec<u8>> {
    let mut body = Vec::with_capacity(len.min(FRAME_READ_STEP));
    while body.len() < len {
        let missing = len - body.len();
        if body.capacity() == body.len() {
            // Double (an honest large frame costs few copies), never past
            // the claim: the capacity stays within twice what arrived
            // (or one step, at first).
            body.reserve_exact(missing.min(body.len().max(FRAME_READ_STEP)));
        }
        let room = (body.capacity() - body.len()).min(missing);
        match recv.read_chunk(room, true).await? {
            Some(piece) => body.extend_from_slice(&piece.bytes),
            None => anyhow::bail!(
                "the stream ended after {} of the frame's {len} bytes",
                body.len()
            ),
        }
    }
    Ok(body)
}

/// Why [`open_service`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenServiceError {
    /// The connection is gone ([`describe`]'s line).
    #[error("{0}")]
    Closed(String),
    /// The hello could not be written.
    #[error("{addr}: {why:#}")]
    Hello {
        /// The peer's address.
        addr: SocketAddr,
        /// What went wrong.
        why: anyhow::Error,
    },
}

/// Opens a control stream on `conn` for `service`: the stream's first
/// frame is this build's [`Hello`]. The error says why, in the words of
/// [`describe`].
pub async fn open_service(
    conn: &Connection,
    service: Service,
) -> Result<(quinn::SendStream, quinn::RecvStream), OpenServiceError> {
    let addr = conn.remote_address();
    let (mut send, recv) = conn
        .open_bi()
        .await
        .map_err(|e| OpenServiceError::Closed(describe(addr, &e)))?;
    write_frame(&mut send, &Hello::new(service))
        .await
        .map_err(|e| match conn.close_reason() {
            Some(reason) => OpenServiceError::Closed(describe(addr, &reason)),
            None => OpenServiceError::Hello { addr, why: e },
        })?;
    Ok((send, recv))
}

/// Reads the first frame of a chunk stream: a tagged request, at most
/// [`frame::STREAM_REQUEST_LIMIT`] bytes.
pub async fn read_stream_request(recv: &mut quinn::RecvStream) -> Result<StreamRequest> {
    read_frame_within(recv, frame::STREAM_REQUEST_LIMIT).await
}

/// Fetches chunks from one peer over one or more QUIC connections
/// ([`Lanes`]): one bidirectional stream per chunk, on the lane with the
/// fewest requests in flight.
#[derive(Clone, Debug)]
pub struct QuicFetcher {
    lanes: Lanes,
}

impl QuicFetcher {
    /// Over `conn` alone.
    pub fn new(conn: Connection) -> Self {
        QuicFetcher {
            lanes: Lanes::new(conn),
        }
    }

    /// Over `lanes`, which may grow while the fetcher is in use.
    pub fn over(lanes: Lanes) -> Self {
        QuicFetcher { lanes }
    }
}

impl ChunkFetcher for QuicFetcher {
    async fn fetch(&self, chunk: ChunkId, len: usize) -> Result<Bytes, FetchError> {
        loop {
            let lane = self.lanes.take();
            match fetch_on(&lane.conn, chunk, len).await {
                // An extra lane that closed is dropped (by `take`) and the
                // request goes to another; the first lane is the peer.
                Err(FetchError::Connection(why)) if !lane.primary => {
                    tracing::debug!(
                        "a connection to {} closed: {why}",
                        lane.conn.remote_address()
                    );
                }
                r => return r,
            }
        }
    }
}

/// Fetches chunk `chunk` (`len` bytes) on a stream of its own on `conn`.
async fn fetch_on(conn: &Connection, chunk: ChunkId, len: usize) -> Result<Bytes, FetchError> {
    let lost = |e: &dyn std::fmt::Display| FetchError::Connection(e.to_string());
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
    write_frame(&mut send, &StreamRequest::Chunk(ChunkRequest { chunk }))
        .await
        .map_err(|e| lost(&e))?;
    let _ = send.finish();
    let reply: ChunkReply = read_frame(&mut recv).await.map_err(|e| {
        if conn.close_reason().is_some() {
            lost(&e)
        } else {
            FetchError::Protocol(format!("{e:#}"))
        }
    })?;
    match reply {
        ChunkReply::Unavailable(why) => Err(FetchError::Unavailable(chunk, why)),
        ChunkReply::Data => {
            // Gather the stream's buffers into one page-aligned buffer
            // (one copy), which the store can write with O_DIRECT.
            let mut buf = AlignedBuf::with_capacity(len);
            while buf.remaining() > 0 {
                match recv
                    .read_chunk(buf.remaining(), true)
                    .await
                    .map_err(|e| lost(&e))?
                {
                    Some(piece) => buf.extend_from_slice(&piece.bytes),
                    None => {
                        return Err(FetchError::Protocol(format!(
                            "chunk {chunk:?} ended after {} of {len} bytes",
                            buf.len()
                        )))
                    }
                }
            }
            Ok(Bytes::from_owner(buf))
        }
    }
}

/// Answers one chunk request on its stream: the bytes, or why not. The
/// request first passes `admission` (the source's super-seeding gate),
/// unless the fetcher withdraws it meanwhile.
pub async fn answer_chunk(
    mut send: quinn::SendStream,
    req: ChunkRequest,
    map: Arc<ChunkMap>,
    reader: Arc<dyn ChunkReader>,
    limiter: Option<Arc<crate::util::rate::RateLimiter>>,
    on_sent: Arc<dyn Fn(u64) + Send + Sync>,
    admission: Option<Arc<dyn super::Admission>>,
) {
    let Some(number) = map.number(req.chunk) else {
        let _ = write_frame(&mut send, &ChunkReply::Unavailable("no such chunk".into())).await;
        let _ = send.finish();
        return;
    };
    if let Some(a) = &admission {
        tokio::select! {
            _ = a.admit(number) => {}
            _ = send.stopped() => return,
        }
    }
    let r = reader.clone();
    let data = tokio::task::spawn_blocking(move || r.read_chunk(req.chunk)).await;
    let data = match data {
        Ok(Ok(d)) => d,
        Ok(Err(why)) => {
            let _ = write_frame(&mut send, &ChunkReply::Unavailable(why.to_string())).await;
            let _ = send.finish();
            return;
        }
        Err(e) => {
            tracing::warn!("reading chunk {:?} panicked: {e}", req.chunk);
            let _ = send.reset(VarInt::from_u32(ResetCode::SendFailed.code()));
            return;
        }
    };
    if let Some(l) = &limiter {
        l.acquire(data.len() as u64).await;
    }
    let len = data.len() as u64;
    if write_frame(&mut send, &ChunkReply::Data).await.is_ok()
        && send.write_chunk(data).await.is_ok()
    {
        let _ = send.finish();
        on_sent(len);
        crate::util::metrics::served(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::names::ALPN_V1;

    /// A server endpoint of protocol version 1 (it offers only `xfer/1`),
    /// as an agent of the previous release is.
    fn v1_server(cred: &Credential) -> Endpoint {
        let mut tls = cred.server_config().unwrap();
        tls.alpn_protocols = vec![ALPN_V1.to_vec()];
        let tls = QuicServerConfig::try_from(tls).unwrap();
        let cfg = quinn::ServerConfig::with_crypto(Arc::new(tls));
        Endpoint::server(cfg, "127.0.0.1:0".parse().unwrap()).unwrap()
    }

    /// A command that closes its connections with `close_done` and exits at
    /// once (its runtime gone, so nothing drains) has still told the agent:
    /// the agent sees the close, not a timeout.
    #[test]
    fn a_peer_learns_of_close_done_even_if_the_closer_exits_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let cred = crate::config::auth::keygen(&dir.path().join("k"), false).unwrap();
        let server_rt = tokio::runtime::Runtime::new().unwrap();
        let (addr, seen) = server_rt.block_on(async {
            let ep = server_endpoint("127.0.0.1:0".parse().unwrap(), &cred).unwrap();
            let addr = ep.local_addr().unwrap();
            let seen = tokio::spawn(async move {
                let conn = ep.accept().await.unwrap().await.unwrap();
                conn.closed().await
            });
            (addr, seen)
        });
        let client_rt = tokio::runtime::Runtime::new().unwrap();
        client_rt.block_on(async {
            let ep = client_endpoint(&cred, addr).unwrap();
            let conn = connect(&ep, addr, Duration::from_secs(5)).await.unwrap();
            close_done(ep, &conn).await;
        });
        // The process's exit: every task, the endpoint's driver too, gone.
        client_rt.shutdown_background();
        let why = server_rt.block_on(seen).unwrap();
        match why {
            ConnectionError::ApplicationClosed(c) => assert_eq!(&c.reason[..], b"done"),
            other => panic!("the agent saw {other:?}, not the close"),
        }
    }

    #[tokio::test]
    async fn an_agent_of_another_version_is_refused_with_both_versions_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let cred = crate::config::auth::keygen(&dir.path().join("k"), false).unwrap();
        // This build connecting to an agent of version 1.
        let old = v1_server(&cred);
        let addr = old.local_addr().unwrap();
        tokio::spawn(async move {
            while let Some(i) = old.accept().await {
                if let Ok(c) = i.await {
                    c.closed().await;
                }
            }
        });
        let ep = client_endpoint(&cred, addr).unwrap();
        let err = connect(&ep, addr, Duration::from_secs(5))
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "the agent at {addr} speaks xfer protocol 1, this node speaks {PROTOCOL_VERSION}: upgrade xfer on the agent at {addr}"
            )
        );
        // A client of version 1 connecting to this build's server: refused,
        // and told why in the close reason.
        let ours = server_endpoint("127.0.0.1:0".parse().unwrap(), &cred).unwrap();
        let saddr = ours.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let conn = ours.accept().await.unwrap().await.unwrap();
            let who = format!("the node at {}", conn.remote_address());
            refuse_other_version(&conn, &who)
        });
        let mut tls = cred.client_config().unwrap();
        tls.alpn_protocols = vec![ALPN_V1.to_vec()];
        let tls = QuicClientConfig::try_from(tls).unwrap();
        let mut old_client = Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        old_client.set_default_client_config(quinn::ClientConfig::new(Arc::new(tls)));
        let conn = old_client
            .connect(saddr, SERVER_NAME)
            .unwrap()
            .await
            .unwrap();
        let refused = server.await.unwrap().unwrap_err().to_string();
        assert!(refused.contains("speaks xfer protocol 1"), "{refused}");
        match conn.closed().await {
            ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code, VarInt::from_u32(VERSION_CLOSE));
                let reason = String::from_utf8_lossy(&c.reason).into_owned();
                let peer = reason
                    .strip_prefix("the node at ")
                    .and_then(|r| r.split(' ').next())
                    .unwrap_or_default()
                    .to_string();
                assert_eq!(
                    reason,
                    format!("the node at {peer} speaks xfer protocol 1, this node speaks {PROTOCOL_VERSION}: upgrade xfer on the node at {peer}")
                );
            }
            other => panic!("closed with {other:?}"),
        }
    }
}
