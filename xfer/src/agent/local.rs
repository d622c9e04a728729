//! The loader link's server: the agent's Unix socket
//! ([`xfer_proto::local::SOCKET_FILE`] under its root), where a rank on
//! this node asks what the agent says of a model
//! ([`xfer_proto::local`]). Every rank the agent starts gets its path as
//! [`xfer_proto::local::SOCKET_KEY`].
//!
//! Only this node's processes of the agent's own user reach it: the socket
//! is made mode 0600 right after the bind (before it, the umask's mode
//! leaves others no write, which connecting needs) and a connection from
//! any other user (root aside) is closed unanswered, whatever the modes. The only question is read-only.
//! A stale socket of an agent that died is replaced; one another agent
//! still answers on is refused (two agents on one root).
//!
//! [`probe`] is the preflight's check of the link: it asks the socket as a
//! rank would.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::agent::sync::runner::Runner;
use crate::agent::sync::status::Activity;
use crate::store::Store;
use xfer_proto::launch::Probe;
use xfer_proto::local::{
    decode_request, encode_reply, LocalReply, LocalRequest, LOCAL_REQUEST_LIMIT, SOCKET_FILE,
};

/// Connections answered at once; more wait for a slot (a rank asks about
/// twice a second, a node runs a few ranks).
const MAX_CONNECTIONS: usize = 64;
/// A connection with no request for this long is closed.
const IDLE: Duration = Duration::from_secs(120);

/// The socket's path for the agent whose root is `root`.
pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET_FILE)
}

/// What the link answers from.
#[derive(Clone)]
pub struct LocalCtx {
    /// The store the models are in.
    pub store: Store,
    /// The transfers running.
    pub activity: Arc<Activity>,
    /// The sync jobs.
    pub runner: Arc<Runner>,
}

impl LocalCtx {
    fn answer(&self, request: LocalRequest) -> LocalReply {
        match request {
            LocalRequest::Model { name } => {
                let me = self.runner.me();
                let status = self
                    .activity
                    .report(&self.store, me.clone(), &self.runner.records());
                LocalReply::Model {
                    node: me,
                    model: status
                        .models
                        .into_iter()
                        .find(|m| m.name == name)
                        .map(Box::new),
                }
            }
        }
    }
}

/// What the ranks lose when the socket cannot be bound.
const BIND_FIX: &str = "the ranks of `xfer-launch up` under stream_weights cannot ask this agent";

/// Why the loader socket could not be bound. Each line ends with what the
/// ranks lose, or what to do.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The socket's path is longer than `sun_path` holds.
    #[error("{} is longer than a Unix socket's path may be (107 bytes); {BIND_FIX}: give the agent a shorter --root", .0.display())]
    TooLong(PathBuf),
    /// Another agent answers on the socket.
    #[error("another agent answers on {}: two agents on one --root would overwrite each other's files; stop the other one", .0.display())]
    Taken(PathBuf),
    /// A file operation failed: `what` is "cannot create DIR" and the like.
    #[error("{what}: {why}; {BIND_FIX}")]
    Io {
        /// What could not be done, with its path.
        what: String,
        /// What the system said.
        why: std::io::Error,
    },
}

/// Binds the socket (replacing a stale one) with mode 0600.
pub fn bind(root: &Path) -> Result<UnixListener, BindError> {
    let path = socket_path(root);
    let io = |what: String| move |why| BindError::Io { what, why };
    // sun_path holds 108 bytes, its NUL included.
    if path.as_os_str().len() > 107 {
        return Err(BindError::TooLong(path));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
    }
    if std::fs::symlink_metadata(&path).is_ok() {
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return Err(BindError::Taken(path));
        }
        std::fs::remove_file(&path)
            .map_err(io(format!("cannot remove the stale {}", path.display())))?;
    }
    let listener =
        UnixListener::bind(&path).map_err(io(format!("cannot listen on {}", path.display())))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("cannot make {} mode 0600", path.display())))?;
    Ok(listener)
}

/// Answers every connection on `listener` until the process ends.
pub async fn serve(listener: UnixListener, ctx: LocalCtx) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("the loader link could not accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match stream.peer_cred().map(|c| c.uid()) {
            Ok(uid) if uid == me || uid == 0 => {}
            Ok(uid) => {
                tracing::warn!(
                    "refused a loader-link connection from user {uid}: only this agent's user (uid {me}) may ask it"
                );
                continue;
            }
            Err(e) => {
                tracing::warn!("refused a loader-link connection whose user is unknown: {e}");
                continue;
            }
        }
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = answer_all(stream, &ctx).await {
                tracing::debug!("a loader-link connection ended: {e}");
            }
        });
    }
}

/// Answers one connection's requests, a line each, until it closes, goes
/// idle, or sends a line that is not a request.
async fn answer_all(stream: UnixStream, ctx: &LocalCtx) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        let mut limited = (&mut read).take(LOCAL_REQUEST_LIMIT as u64);
        let n = match tokio::time::timeout(IDLE, limited.read_until(b'\n', &mut line)).await {
            Err(_) | Ok(Ok(0)) => return Ok(()),
            Ok(r) => r?,
        };
        if line.last() != Some(&b'\n') {
            let why = if n >= LOCAL_REQUEST_LIMIT {
                format!("a request over {LOCAL_REQUEST_LIMIT} bytes; ask about one model per line")
            } else {
                "a request without its closing newline; end each request with \\n".to_string()
            };
            let reply = encode_reply(&LocalReply::Refused { why });
            return write.write_all(&reply).await;
        }
        line.pop();
        let (reply, go_on) = match decode_request(&line) {
            Ok(request) => {
                let ctx = ctx.clone();
                let reply = tokio::task::spawn_blocking(move || ctx.answer(request))
                    .await
                    .unwrap_or_else(|e| LocalReply::Refused {
                        why: format!("the agent failed to answer ({e}); report this bug"),
                    });
                (reply, true)
            }
            Err(why) => (
                LocalReply::Refused {
                    why: why.to_string(),
                },
                false,
            ),
        };
        write.write_all(&encode_reply(&reply)).await?;
        if !go_on {
            return Ok(());
        }
    }
}

/// Asks the socket at `path` about `model` as a rank does: what the
/// preflight reports for the loader link.
pub async fn probe(path: &Path, model: &str) -> Probe<String> {
    let asked = async {
        let stream = UnixStream::connect(path).await.map_err(|e| {
            format!(
                "cannot connect to {} ({e}); the agent serves it from its start: see its log for why it does not",
                path.display()
            )
        })?;
        let (read, mut write) = stream.into_split();
        let request = serde_json::json!({"ask": "model", "name": model}).to_string() + "\n";
        write
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("cannot ask {}: {e}", path.display()))?;
        let mut line = String::new();
        BufReader::new(read)
            .take(1 << 20)
            .read_line(&mut line)
            .await
            .map_err(|e| format!("no answer on {}: {e}", path.display()))?;
        match serde_json::from_str::<LocalReply>(&line) {
            Ok(LocalReply::Model { model: Some(m), .. }) => Ok(format!(
                "{} answers ({model}: {})",
                path.display(),
                m.state.label()
            )),
            Ok(LocalReply::Model { model: None, .. }) => Ok(format!(
                "{} answers (it holds no {model} yet)",
                path.display()
            )),
            Ok(LocalReply::Refused { why }) => Err(format!("{} refused: {why}", path.display())),
            Err(e) => Err(format!(
                "{} answered no reply of the loader link ({e}); is another program listening there?",
                path.display()
            )),
        }
    };
    match tokio::time::timeout(Duration::from_secs(10), asked).await {
        Ok(Ok(line)) => Probe::Ok(line),
        Ok(Err(why)) => Probe::Failed(why),
        Err(_) => Probe::Failed(format!(
            "{} did not answer within 10 s; see the agent's log",
            path.display()
        )),
    }
}
