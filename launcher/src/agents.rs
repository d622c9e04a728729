//! Talking to the nodes' xfer agents: one request per node, all at once,
//! each answer (or why there is none, a [`NodeError`]) kept with its node.

use std::sync::Arc;
use std::time::Duration;

use xfer::client::AskError;
use xfer::config::auth::Credential;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::launch::{LaunchReply, LaunchRequest, Refusal};

use crate::config::{RankNode, Setup};

/// How long an agent gets to answer a quick question.
pub const QUICK: Duration = Duration::from_secs(5);

/// The cluster credential could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{cause}; the cluster file {} names it as `key`", cluster_file.display())]
pub struct CredentialError {
    /// Why, with its causes.
    pub cause: String,
    /// The cluster file naming the credential.
    pub cluster_file: std::path::PathBuf,
}

/// Why a node gave no usable answer: the one error of every ask here,
/// kept typed until a row or a line shows it (its text is that line).
#[derive(Clone, Debug, thiserror::Error)]
pub enum NodeError {
    /// The node could not be asked: no connection, the wrong node, no
    /// reply in time (the client's words).
    #[error("{0}")]
    Ask(Arc<AskError>),
    /// The node refused, saying why (a busy or protocol refusal by its
    /// message alone).
    #[error("{}", refusal_line(.0))]
    Refused(Refusal),
    /// The node answered another kind of reply than the one asked for
    /// (another xfer version there), named by its kind.
    #[error("the agent answered {0}; run the same xfer version on every node")]
    Unexpected(&'static str),
    /// The ask's task ended without an answer.
    #[error("no answer")]
    NoAnswer,
}

impl From<AskError> for NodeError {
    fn from(e: AskError) -> Self {
        NodeError::Ask(Arc::new(e))
    }
}

/// As its line: `--json` shows a node's error as the table does.
impl serde::Serialize for NodeError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A refusal's line: a busy or protocol refusal by its message alone.
fn refusal_line(r: &Refusal) -> String {
    match r {
        Refusal::Busy(m) | Refusal::Protocol(m) => m.clone(),
        other => other.to_string(),
    }
}

/// The agents of a launch and the credential to reach them.
#[derive(Clone)]
pub struct Agents {
    cred: Arc<Credential>,
    /// The launch nodes, in rank order.
    pub nodes: Vec<RankNode>,
}

impl Agents {
    /// Loads the cluster credential named by the cluster file.
    pub fn new(setup: &Setup) -> Result<Agents, CredentialError> {
        let cred = Credential::load(&setup.key).map_err(|e| CredentialError {
            cause: format!("{e:#}"),
            cluster_file: setup.path.clone(),
        })?;
        Ok(Agents {
            cred: Arc::new(cred),
            nodes: setup.nodes.clone(),
        })
    }

    /// Sends `msg(node)` to every node's agent at once; the answers are in
    /// node order. A refusal (`LaunchReply::Failed`) comes back as its message.
    pub async fn ask_all(
        &self,
        msg: impl Fn(usize, &RankNode) -> LaunchRequest,
        timeout: Duration,
    ) -> Vec<Result<LaunchReply, NodeError>> {
        self.each(|cred, node, addr, i, n| {
            let m = msg(i, n);
            async move { ask(&cred, &node, &addr, &m, timeout).await }
        })
        .await
    }

    /// Sends `req` to every node's admin service at once (the status that
    /// `xfer status` shows); the answers are in node order.
    pub async fn admin_all(
        &self,
        req: &AdminRequest,
        timeout: Duration,
    ) -> Vec<Result<AdminReply, NodeError>> {
        self.each(|cred, node, addr, _, _| {
            let req = req.clone();
            async move {
                xfer::client::admin(&cred, &node, &addr, &req, timeout)
                    .await
                    .map_err(NodeError::from)
            }
        })
        .await
    }

    /// Runs `ask(cred, node name, agent address, index, node)` for every
    /// node at once; the answers are in node order ("no answer" where a
    /// task died).
    async fn each<T, F, Fut>(&self, ask: F) -> Vec<Result<T, NodeError>>
    where
        T: Send + 'static,
        F: Fn(Arc<Credential>, String, String, usize, &RankNode) -> Fut,
        Fut: std::future::Future<Output = Result<T, NodeError>> + Send + 'static,
    {
        let mut set = tokio::task::JoinSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let f = ask(self.cred.clone(), n.name.to_string(), n.agent.clone(), i, n);
            set.spawn(async move { (i, f.await) });
        }
        let mut out: Vec<Result<T, NodeError>> = (0..self.nodes.len())
            .map(|_| Err(NodeError::NoAnswer))
            .collect();
        while let Some(done) = set.join_next().await {
            if let Ok((i, r)) = done {
                out[i] = r;
            }
        }
        out
    }

    /// Sends one message to node `i`.
    pub async fn ask(
        &self,
        i: usize,
        msg: &LaunchRequest,
        timeout: Duration,
    ) -> Result<LaunchReply, NodeError> {
        let n = &self.nodes[i];
        ask(&self.cred, n.name.as_str(), &n.agent, msg, timeout).await
    }
}

async fn ask(
    cred: &Credential,
    node: &str,
    addr: &str,
    msg: &LaunchRequest,
    timeout: Duration,
) -> Result<LaunchReply, NodeError> {
    match xfer::client::launch(cred, node, addr, msg, timeout).await? {
        LaunchReply::Failed(r) => Err(NodeError::Refused(r)),
        other => Ok(other),
    }
}

/// The answer did not have the expected kind.
pub fn unexpected(got: &LaunchReply) -> NodeError {
    NodeError::Unexpected(got.kind())
}
