//! The loader link: what a rank on a node may ask that node's own agent,
//! over the agent's Unix socket ([`SOCKET_FILE`] under its root, mode
//! 0600, answered only for the agent's own user), never over the network
//! and never with the operator's key.
//!
//! One JSON object per line each way: its client is the vLLM loader plugin
//! (`launcher/python/xfer_vllm_loader`), in Python. Every request is tagged
//! by `ask`, every reply by `answer`; a request over
//! [`LOCAL_REQUEST_LIMIT`] bytes, or one that does not decode as a
//! [`LocalRequest`], is answered [`LocalReply::Refused`] and the connection
//! closed. The only question is read-only: what the agent says of one
//! model, the entry `xfer status` shows for it.

use serde::{Deserialize, Serialize};

use crate::admin::ModelStatus;

/// The socket's path below the agent's root.
pub const SOCKET_FILE: &str = ".xfer/agent.sock";

/// The variable naming the socket in every rank's environment: the
/// agent's own key, set by the agent (a launch may not set it).
pub const SOCKET_KEY: &str = "XFER_AGENT_SOCKET";

/// Largest request line, its newline included: a model name is at most a
/// few hundred bytes.
pub const LOCAL_REQUEST_LIMIT: usize = 4 << 10;

/// A question of a rank to its agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case", deny_unknown_fields)]
pub enum LocalRequest {
    /// What the agent says of the model of this name.
    Model {
        /// The model's name in the store (`models--org--name`, `tiny`).
        name: String,
    },
}

/// The agent's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum LocalReply {
    /// The model's entry (`None`: the agent holds nothing of that name).
    Model {
        /// This node's name, when its credential names one.
        node: Option<String>,
        /// The model's entry, as `xfer status --json` shows it.
        model: Option<Box<ModelStatus>>,
    },
    /// Not answered: why, and what to do.
    Refused {
        /// One line.
        why: String,
    },
}

/// A line that is no request of the loader link: the `why` of the
/// [`LocalReply::Refused`] the agent answers it with.
#[derive(Debug, thiserror::Error)]
#[error("not a request of the loader link ({0}); send one JSON object per line, such as {{\"ask\":\"model\",\"name\":\"NAME\"}}")]
pub struct BadRequest(#[source] serde_json::Error);

/// Decodes one request line (without its newline).
pub fn decode_request(line: &[u8]) -> Result<LocalRequest, BadRequest> {
    serde_json::from_slice(line).map_err(BadRequest)
}

/// Encodes a reply as one line, its newline included.
pub fn encode_reply(reply: &LocalReply) -> Vec<u8> {
    let mut out = serde_json::to_vec(reply).expect("in-memory encoding cannot fail");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_told_apart_by_their_tag_and_nothing_else_decodes() {
        assert_eq!(
            decode_request(br#"{"ask":"model","name":"tiny"}"#).unwrap(),
            LocalRequest::Model {
                name: "tiny".into()
            }
        );
        for bad in [
            &br#"{"name":"tiny"}"#[..],
            br#"{"ask":"rm","name":"tiny"}"#,
            br#"{"ask":"model","name":"tiny","force":true}"#,
            br#"{"ask":"model"}"#,
            b"not json",
            b"",
        ] {
            let e = decode_request(bad).unwrap_err().to_string();
            assert!(e.contains("one JSON object per line"), "{e}");
        }
    }

    #[test]
    fn a_reply_is_one_tagged_line() {
        let line = encode_reply(&LocalReply::Refused { why: "no".into() });
        assert_eq!(line, b"{\"answer\":\"refused\",\"why\":\"no\"}\n");
        let line = encode_reply(&LocalReply::Model {
            node: None,
            model: None,
        });
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(line.starts_with(b"{\"answer\":\"model\""));
    }
}
