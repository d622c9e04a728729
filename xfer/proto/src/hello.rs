//! The first frame of every control stream: the service the opener wants
//! and the protocol version it speaks, checked in one place
//! ([`Hello::check`]). After it, the stream carries only that service's
//! messages: [`crate::transfer::TransferMsg`], [`crate::admin::AdminRequest`]
//! and its reply, or [`crate::launch::LaunchRequest`] and its reply.

use serde::{Deserialize, Serialize};

use crate::names::PROTOCOL_VERSION;
use crate::refusal::Refusal;

/// The services an agent offers, one per kind of caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Service {
    /// Moving models: a push's offer, a swarm peer's join, a fetch's want.
    Transfer,
    /// The operator's requests: sync jobs, status, cancel, rm.
    Admin,
    /// The launcher's requests: preflight, ranks, logs.
    Launch,
}

/// Opens a control stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The opener's protocol version.
    pub version: u32,
    /// The service the stream is for.
    pub service: Service,
}

impl Hello {
    /// This build's hello for `service`.
    pub fn new(service: Service) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            service,
        }
    }

    /// The service asked for, if the opener speaks this build's version.
    pub fn check(&self) -> Result<Service, Refusal> {
        if self.version == PROTOCOL_VERSION {
            Ok(self.service)
        } else {
            Err(Refusal::Version {
                ours: PROTOCOL_VERSION,
                theirs: self.version,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_frame, encode};

    #[test]
    fn a_hello_round_trips_and_another_version_is_refused_naming_both() {
        let h = Hello::new(Service::Launch);
        assert_eq!(decode_frame::<Hello>(&encode(&h)).unwrap(), h);
        assert_eq!(h.check(), Ok(Service::Launch));
        let old = Hello {
            version: PROTOCOL_VERSION - 1,
            service: Service::Admin,
        };
        let r = old.check().unwrap_err();
        assert_eq!(
            r,
            Refusal::Version {
                ours: PROTOCOL_VERSION,
                theirs: PROTOCOL_VERSION - 1
            }
        );
        assert!(r.to_string().contains(&PROTOCOL_VERSION.to_string()));
    }

    #[test]
    fn an_unknown_service_is_an_error_not_a_panic() {
        // Tag 9 names no service.
        let mut bad = encode(&Hello::new(Service::Admin));
        let last = bad.len() - 1;
        bad[last] = 9;
        assert!(decode_frame::<Hello>(&bad).is_err());
    }
}
