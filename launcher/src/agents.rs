//! Talking to the nodes' xfer agents: one request per node, all at once,
//! each answer (or why there is none) kept with its node.

use std::sync::Arc;
use std::time::Duration;

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
    ) -> Vec<Result<LaunchReply, String>> {
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
    ) -> Vec<Result<AdminReply, String>> {
        self.each(|cred, node, addr, _, _| {
            let req = req.clone();
            async move {
                xfer::client::admin(&cred, &node, &addr, &req, timeout)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .await
    }

    /// Runs `ask(cred, node name, agent address, index, node)` for every
    /// node at once; the answers are in node order ("no answer" where a
    /// task died).
    async fn each<T, F, Fut>(&self, ask: F) -> Vec<Result<T, String>>
    where
        T: Send + 'static,
        F: Fn(Arc<Credential>, String, String, usize, &RankNode) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
    {
        let mut set = tokio::task::JoinSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let f = ask(self.cred.clone(), n.name.to_string(), n.agent.clone(), i, n);
            set.spawn(async move { (i, f.await) });
        }
        let mut out: Vec<Result<T, String>> = (0..self.nodes.len())
            .map(|_| Err("no answer".into()))
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
    ) -> Result<LaunchReply, String> {
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
) -> Result<LaunchReply, String> {
    match xfer::client::launch(cred, node, addr, msg, timeout)
        .await
        .map_err(|e| e.to_string())?
    {
        LaunchReply::Failed(r) => Err(refusal(&r)),
        other => Ok(other),
    }
}

fn refusal(r: &Refusal) -> String {
    match r {
        Refusal::Busy(m) | Refusal::Protocol(m) => m.clone(),
        other => other.to_string(),
    }
}

/// The answer did not have the expected kind.
pub fn unexpected(got: &LaunchReply) -> String {
    format!(
        "the agent answered {}; run the same xfer version on every node",
        got.kind()
    )
}
