//! Which way a node's data goes. Every byte between nodes goes to the
//! node's *data address* (its `fabric_ip`, or whatever its agent was told
//! with `--data`/`--fabric-if`); the management address carries only the
//! operator's commands. A node whose data address cannot be reached is
//! reached over management instead, and that is never silent: the caller
//! gets the reason, to show as a [`FallbackRoute`].
//!
//! [`Destination`] is how a push names one node (`AGENT[/DATA]`),
//! [`learn_data_addrs`] fills in the data addresses the agents advertise,
//! and [`connect`] opens the connection the data goes over.

use std::net::SocketAddr;
use std::time::Duration;

use quinn::{Connection, Endpoint};

use crate::transport::quic;
use crate::util::chain::Chain;

/// Why a destination cannot be used: its text is not `AGENT[/DATA]`, or
/// an address of it does not resolve.
#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    /// `--to` is not `AGENT[/DATA]`.
    #[error("`{0}` is not AGENT[/DATA]; write the agent's address, then optionally a slash and its data address, e.g. 10.0.0.2:7470/192.168.100.2")]
    Syntax(String),
    /// The agent's address is not `HOST[:PORT]`.
    #[error("--to {to}: {why}")]
    Address {
        /// What `--to` said.
        to: String,
        /// What is wrong with the address.
        why: crate::config::cluster::AddressError,
    },
    /// An address does not resolve; `at` says which (empty: the
    /// destination's own).
    #[error("{at}{error}")]
    Resolve {
        /// `--to X: ` (and which address), or nothing.
        at: String,
        /// The lookup's error.
        error: Chain,
    },
}

/// Not permanent: a name that does not resolve now may later.
impl crate::util::permanence::Permanence for DestinationError {
    fn is_permanent(&self) -> bool {
        false
    }
}

/// One node a push delivers to: its agent (management) address and, when
/// known, its data address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// `HOST[:PORT]` of its agent.
    pub agent: String,
    /// `HOST[:PORT]` its data goes to; `None`: the agent address.
    pub data: Option<String>,
    /// What messages call it (its node name); `None`: its agent address.
    pub name: Option<String>,
}

impl Destination {
    /// A destination reached at its agent address alone.
    pub fn agent(agent: &str) -> Destination {
        Destination {
            agent: agent.to_string(),
            data: None,
            name: None,
        }
    }

    /// The destinations of `names` of `cluster` (empty: every node): each
    /// node's agent, data address and name as the cluster file gives them.
    pub fn of_cluster(
        cluster: &crate::config::cluster::Cluster,
        names: &[String],
    ) -> Result<Vec<Destination>, crate::config::cluster::ClusterError> {
        Ok(cluster
            .select(names)?
            .into_iter()
            .map(|n| Destination {
                agent: n.agent.clone(),
                data: n.data_addr(),
                name: Some(n.name.to_string()),
            })
            .collect())
    }

    /// Parses `AGENT[/DATA]` as `xfer push --to` takes it: the agent's
    /// address, then, after a slash, its data address, whose port defaults
    /// to the agent's (`10.0.0.2:7470/192.168.100.2`).
    pub fn parse(s: &str) -> Result<Destination, DestinationError> {
        let (agent, data) = match s.split_once('/') {
            None => (s, None),
            Some((a, d)) => (a, Some(d)),
        };
        if agent.is_empty() || data.is_some_and(|d| d.is_empty() || d.contains('/')) {
            return Err(DestinationError::Syntax(s.to_string()));
        }
        // The syntax the cluster file's `agent` takes, checked before a lookup.
        crate::config::cluster::parse_address(agent).map_err(|why| DestinationError::Address {
            to: s.to_string(),
            why,
        })?;
        let resolve = |addr: &str, at: String| {
            quic::resolve(addr).map_err(|e| DestinationError::Resolve {
                at,
                error: e.into(),
            })
        };
        let agent_addr = resolve(agent, format!("--to {s}: "))?;
        let data = match data {
            None => None,
            Some(d) => {
                let with_port = if has_port(d) {
                    d.to_string()
                } else {
                    let host = d.trim_start_matches('[').trim_end_matches(']');
                    match host.parse::<std::net::IpAddr>() {
                        Ok(ip) => SocketAddr::new(ip, agent_addr.port()).to_string(),
                        Err(_) => format!("{host}:{}", agent_addr.port()),
                    }
                };
                resolve(&with_port, format!("--to {s}: the data address: "))?;
                Some(with_port)
            }
        };
        Ok(Destination {
            agent: agent.to_string(),
            data,
            name: None,
        })
    }

    /// What messages call it.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.agent)
    }

    /// Its data and management addresses, resolved: where to connect
    /// first, and where to fall back to (`None` when they are the same).
    pub fn resolve(&self) -> Result<(SocketAddr, Option<SocketAddr>), DestinationError> {
        let resolve = |addr: &str| {
            quic::resolve(addr).map_err(|e| DestinationError::Resolve {
                at: String::new(),
                error: e.into(),
            })
        };
        let agent = resolve(&self.agent)?;
        match &self.data {
            None => Ok((agent, None)),
            Some(d) => {
                let data = resolve(d)?;
                Ok((data, (data != agent).then_some(agent)))
            }
        }
    }
}

/// Whether `addr` names a port: `H:P`, `[V6]:P` (a bare IPv6 has none).
fn has_port(addr: &str) -> bool {
    addr.parse::<SocketAddr>().is_ok()
        || addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
}

/// How often a connection that fell back to management tries the data
/// address again: the source's to a node (which then adds a lane over
/// it) and a receiver's to a peer (which then links again over it).
pub const REPROBE_EVERY: Duration = Duration::from_secs(2);

/// A connection for data, and why it goes over management if it does.
pub struct Connected {
    /// The connection.
    pub conn: Connection,
    /// `Some(why)`: the data address failed and this is the management one.
    pub fell_back: Option<String>,
}

/// Why [`connect`] found no connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The data address did not answer, and there is no other to try.
    #[error(transparent)]
    Unreachable(quic::ConnectError),
    /// Neither the data address nor the management one answered.
    #[error("neither the data address {data} ({why}) nor the management address {addr} ({fallback_why}) answered")]
    Neither {
        /// The data address.
        data: SocketAddr,
        /// Why it failed.
        why: quic::ConnectError,
        /// The management address.
        addr: SocketAddr,
        /// Why that failed too.
        fallback_why: quic::ConnectError,
    },
}

/// Connects for data: to `data` on `ep`, and, if that fails and a
/// `fallback` (endpoint, management address) is given, there instead.
/// Each attempt may take `timeout`.
pub async fn connect(
    ep: &Endpoint,
    data: SocketAddr,
    fallback: Option<(&Endpoint, SocketAddr)>,
    timeout: Duration,
) -> Result<Connected, ConnectError> {
    let why = match quic::connect(ep, data, timeout).await {
        Ok(conn) => {
            return Ok(Connected {
                conn,
                fell_back: None,
            })
        }
        Err(e) => e,
    };
    let Some((fep, addr)) = fallback else {
        return Err(ConnectError::Unreachable(why));
    };
    tracing::warn!("data address {data} unreachable ({why}); trying management address {addr}");
    match quic::connect(fep, addr, timeout).await {
        Ok(conn) => Ok(Connected {
            conn,
            fell_back: Some(short_reason(&why.to_string(), timeout)),
        }),
        Err(fallback_why) => Err(ConnectError::Neither {
            data,
            why,
            addr,
            fallback_why,
        }),
    }
}

/// The cause of a failed connect, without the advice meant for a lone
/// agent address.
fn short_reason(why: &str, timeout: Duration) -> String {
    if why.starts_with("no agent answered") {
        format!("no answer within {}s", timeout.as_secs())
    } else {
        why.to_string()
    }
}

/// Fills in the data address of every destination that has none with the
/// one its agent advertises (its `--data` or `--fabric-if`), asking them
/// all at once. An agent that cannot be asked keeps its agent address for
/// data (the push then says why it cannot be reached).
pub async fn learn_data_addrs(
    cred: &std::sync::Arc<crate::config::auth::Credential>,
    dests: &mut [Destination],
) {
    use xfer_proto::admin::AdminReply;
    let mut asks = tokio::task::JoinSet::new();
    for (i, d) in dests.iter().enumerate().filter(|(_, d)| d.data.is_none()) {
        let (cred, name, agent) = (cred.clone(), d.name.clone(), d.agent.clone());
        asks.spawn(async move {
            let why = match crate::transport::ask::status(&cred, name.as_deref(), &agent).await {
                Ok(AdminReply::Status(s)) => return (i, s.data),
                Ok(AdminReply::Failed(r)) => r.to_string(),
                Ok(other) => format!("answered {} to a status query", other.kind()),
                Err(e) => e.to_string(),
            };
            tracing::debug!("{agent}: no advertised data address ({why})");
            (i, None)
        });
    }
    while let Some(Ok((i, found))) = asks.join_next().await {
        if let Some(a) = found {
            dests[i].data = Some(a.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse_with_and_without_a_data_address() {
        let d = Destination::parse("127.0.0.1:7470").unwrap();
        assert_eq!(d, Destination::agent("127.0.0.1:7470"));
        assert_eq!(
            d.resolve().unwrap(),
            ("127.0.0.1:7470".parse().unwrap(), None)
        );
        let d = Destination::parse("127.0.0.1:7470/127.0.0.2").unwrap();
        assert_eq!(d.data.as_deref(), Some("127.0.0.2:7470"));
        assert_eq!(
            d.resolve().unwrap(),
            (
                "127.0.0.2:7470".parse().unwrap(),
                Some("127.0.0.1:7470".parse().unwrap())
            )
        );
        let d = Destination::parse("127.0.0.1:7471/[::1]").unwrap();
        assert_eq!(d.data.as_deref(), Some("[::1]:7471"));
        let d = Destination::parse("127.0.0.1/127.0.0.2:9000").unwrap();
        assert_eq!(d.data.as_deref(), Some("127.0.0.2:9000"));
        // The same address twice needs no fallback.
        let d = Destination::parse("127.0.0.1:7470/127.0.0.1").unwrap();
        assert_eq!(d.resolve().unwrap().1, None);
    }

    #[test]
    fn malformed_destinations_name_the_syntax() {
        for bad in ["/127.0.0.2", "127.0.0.1/", "127.0.0.1/a/b"] {
            let e = Destination::parse(bad).unwrap_err().to_string();
            assert!(e.contains("AGENT[/DATA]"), "{bad}: {e}");
        }
        let e = format!(
            "{:#}",
            Destination::parse("127.0.0.1/no such host!").unwrap_err()
        );
        assert!(e.contains("the data address"), "{e}");
        let e = format!("{:#}", Destination::parse("a b:7470").unwrap_err());
        assert!(
            e.starts_with("--to a b:7470: ") && e.contains("HOST[:PORT]"),
            "{e}"
        );
    }
}
