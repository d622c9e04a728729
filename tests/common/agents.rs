//! Agents: `xfer serve` processes that die with their guard.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::*;

/// An `xfer serve` child process; `kill -9`ed when dropped.
pub struct Agent {
    child: Option<Child>,
    /// `IP:PORT` the agent listens on.
    pub addr: String,
    pub root: PathBuf,
    /// The log so far, and a signal at each new line.
    stderr: Arc<(Mutex<String>, Condvar)>,
}

impl Agent {
    /// Starts `xfer serve --listen LISTEN --root ROOT --key KEY` and waits
    /// for its `xfer agent listening on ADDR ...` line.
    pub fn start(listen: &str, root: &Path, key: &Path) -> Agent {
        Self::start_with(listen, root, key, &[])
    }

    pub fn start_with(listen: &str, root: &Path, key: &Path, extra: &[&str]) -> Agent {
        Self::start_cmd(listen, root, key, extra, |_| {})
    }

    /// [`Self::start_with`], with `configure` applied to the command first
    /// (to set the agent's environment, e.g. `HF_ENDPOINT`).
    pub fn start_cmd(
        listen: &str,
        root: &Path,
        key: &Path,
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Agent {
        let mut cmd = xfer();
        configure(&mut cmd);
        let mut child = cmd
            .args(["serve", "--listen", listen, "--root"])
            .arg(root)
            .arg("--key")
            .arg(key)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start xfer serve");
        let stderr = Arc::new((Mutex::new(String::new()), Condvar::new()));
        {
            let sink = stderr.clone();
            let r = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines() {
                    let Ok(line) = line else { break };
                    let mut s = sink.0.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                    sink.1.notify_all();
                }
            });
        }
        let line = first_line(&mut child, Duration::from_secs(30));
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !line.starts_with("xfer agent listening on ") || fields.len() < 5 {
            std::thread::sleep(Duration::from_millis(200));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "agent on {listen} did not start: first line {line:?}, stderr:\n{}",
                stderr.0.lock().unwrap()
            );
        }
        Agent {
            child: Some(child),
            addr: fields[4].to_string(),
            root: root.to_path_buf(),
            stderr,
        }
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        self.stderr.0.lock().unwrap().clone()
    }

    /// Waits until the agent logs a line containing `needle` (an event:
    /// a reply can reach the test before the agent writes the line that
    /// goes with it); panics with the log if it does not (see [`wait_until`]).
    pub fn wait_log(&self, needle: &str) {
        wait_until(&format!("the agent to log {needle:?}"), HANG, || {
            let log = self.log();
            if log.contains(needle) {
                Ok(())
            } else {
                Err(Text(log))
            }
        });
    }

    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// `kill -9` the agent and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Where a model named `name` lands.
    pub fn model_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn staging_dir(&self, name: &str) -> PathBuf {
        self.root.join(".xfer/staging").join(name)
    }

    pub fn journal(&self, name: &str) -> PathBuf {
        self.staging_dir(name).join("journal")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Asks `node`'s agent at `agent.addr` one launch request through the
/// product's typed client; panics if no answer comes.
pub fn ask_launch(
    cred: &xfer::config::auth::Credential,
    node: &str,
    agent: &Agent,
    req: &xfer_proto::launch::LaunchRequest,
) -> xfer_proto::launch::LaunchReply {
    let ask = xfer::client::launch(cred, node, &agent.addr, req, Duration::from_secs(30));
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(ask)
        .expect("the agent answers")
}

/// [`ask_launch`] for the admin service.
pub fn ask_admin(
    cred: &xfer::config::auth::Credential,
    node: &str,
    agent: &Agent,
    req: &xfer_proto::admin::AdminRequest,
) -> xfer_proto::admin::AdminReply {
    let ask = xfer::client::admin(cred, node, &agent.addr, req, Duration::from_secs(30));
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(ask)
        .expect("the agent answers")
}
