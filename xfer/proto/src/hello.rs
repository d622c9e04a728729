//! The first frame of every control stream: which protocol version the
//! opener speaks and which service it wants. This is the one place the
//! version is checked; the messages after it carry none.

use serde::{Deserialize, Serialize};

use crate::names::PROTOCOL_VERSION;

/// The services an agent offers, each with its own messages and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Service {
    /// Moving a model: a source's offer, a peer's want, a swarm join.
    Transfer,
    /// The operator's requests: sync jobs, status, rm, cancel.
    Admin,
    /// The launcher's requests: preflight, ranks, logs.
    Launch,
}

impl Service {
    /// The largest frame this service's messages may take.
    pub fn frame_limit(self) -> usize {
        match self {
            // An offer carries the manifest.
            Service::Transfer => crate::frame::MAX_FRAME,
            // A sync job names at most a few thousand nodes; a status a
            // few thousand models.
            Service::Admin => 16 << 20,
            // A log piece is at most 1 MiB; facts and specs are small.
            Service::Launch => 4 << 20,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Service::Transfer => "transfer",
            Service::Admin => "admin",
            Service::Launch => "launch",
        }
    }
}

/// The opening frame of a control stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    pub service: Service,
}

/// A peer speaking another protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("protocol version {theirs} there, {ours} here")]
pub struct VersionMismatch {
    pub ours: u32,
    pub theirs: u32,
}

impl VersionMismatch {
    /// The sentence a user sees: both versions, and which node to upgrade
    /// (`node` is the peer's name as the user knows it).
    pub fn explain(&self, node: &str) -> String {
        let fix = if self.theirs < self.ours {
            format!("upgrade xfer on {node}")
        } else {
            "upgrade xfer on this node".to_string()
        };
        format!(
            "{node} speaks xfer protocol {}, this node speaks {}: {fix}",
            self.theirs, self.ours
        )
    }
}

impl Hello {
    /// This build's hello for `service`.
    pub fn new(service: Service) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            service,
        }
    }

    /// The service asked for, if the versions agree.
    pub fn check(&self) -> Result<Service, VersionMismatch> {
        if self.version == PROTOCOL_VERSION {
            Ok(self.service)
        } else {
            Err(VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: self.version,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_frame, encode, HELLO_LIMIT};

    #[test]
    fn a_hello_of_this_version_passes_and_another_names_both_and_the_fix() {
        let h = Hello::new(Service::Admin);
        let frame = encode(&h);
        assert!(frame.len() <= HELLO_LIMIT);
        assert_eq!(
            decode_frame::<Hello>(&frame).unwrap().check(),
            Ok(Service::Admin)
        );
        let old = Hello {
            version: PROTOCOL_VERSION - 1,
            service: Service::Transfer,
        };
        let e = old.check().unwrap_err();
        let line = e.explain("n2");
        assert!(
            line.contains(&format!("protocol {}", PROTOCOL_VERSION - 1)),
            "{line}"
        );
        assert!(line.contains(&PROTOCOL_VERSION.to_string()), "{line}");
        assert!(line.ends_with("upgrade xfer on n2"), "{line}");
        let newer = Hello {
            version: PROTOCOL_VERSION + 1,
            service: Service::Launch,
        };
        assert!(newer
            .check()
            .unwrap_err()
            .explain("n2")
            .ends_with("on this node"));
    }
}
