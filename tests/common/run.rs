//! Running commands: `xfer` processes with timeouts and their output, and the first line a child prints.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::*;

/// A finished command.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with the command's output unless it exited 0.
    pub fn assert_ok(&self, what: &str) -> &Self {
        assert!(self.success(), "{what} failed: {self:#?}");
        self
    }

    /// The JSON document printed on stdout (the last non-empty line).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_else(|| panic!("no JSON on stdout: {self:#?}"));
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout is not the expected JSON ({e}): {self:#?}"))
    }
}

/// A child process whose stdout and stderr are collected by threads.
pub struct Proc {
    child: Child,
    started: Instant,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    what: String,
}

fn drain<R: Read + Send + 'static>(r: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = BufReader::new(r).read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let out = drain(child.stdout.take().unwrap());
        let err = drain(child.stderr.take().unwrap());
        Proc {
            child,
            started: Instant::now(),
            out: Some(out),
            err: Some(err),
            what,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    fn collect(&mut self, status: ExitStatus) -> Run {
        Run {
            status,
            stdout: self
                .out
                .take()
                .map(|h| h.join().unwrap())
                .unwrap_or_default(),
            stderr: self
                .err
                .take()
                .map(|h| h.join().unwrap())
                .unwrap_or_default(),
            elapsed: self.started.elapsed(),
        }
    }

    /// Waits for the process to exit; kills it and panics after `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Run {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return self.collect(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let status = self.child.wait().expect("wait");
                let run = self.collect(status);
                panic!("{} did not finish within {timeout:?}: {run:#?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9`, then reap.
    pub fn kill9(mut self) -> Run {
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait");
        self.collect(status)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a command to completion (at most `timeout`).
pub fn run(cmd: &mut Command, timeout: Duration) -> Run {
    Proc::spawn(cmd).wait(timeout)
}

/// `xfer keygen --out PATH`.
pub fn keygen(path: &Path) {
    run(
        xfer().arg("keygen").arg("--out").arg(path),
        Duration::from_secs(30),
    )
    .assert_ok("xfer keygen");
    assert!(path.is_file());
}

/// A UDP port on 127.0.0.1 that nothing listens on (bound, then released).
pub fn unused_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// The first line `child` prints on stdout (empty if none within
/// `within`); the rest is drained so the child never writes into a closed
/// pipe.
pub fn first_line(child: &mut Child, within: Duration) -> String {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("stdout is piped");
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut first = String::new();
        let _ = r.read_line(&mut first);
        let _ = tx.send(first);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    rx.recv_timeout(within).unwrap_or_default()
}
