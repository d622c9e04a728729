//! Versions to compare across nodes (engine, torch, NCCL, ...), found by
//! running the command the launcher gives and keeping the last non-empty
//! line of its stdout: engines print their warnings first. A command that
//! hangs (an import stuck on a GPU) is killed after a timeout.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::task::JoinHandle;

use super::{Probe, VersionFacts, VersionProbe};

/// How long a version command may run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long to wait for the output once the command exited (a child it
/// left behind may hold its stdout).
const DRAIN: Duration = Duration::from_secs(2);

/// Runs `p.argv` with stdin closed and reports its version line.
pub async fn run(p: &VersionProbe, timeout: Duration) -> VersionFacts {
    VersionFacts {
        what: p.what.clone(),
        version: version(p, timeout).await,
    }
}

async fn version(p: &VersionProbe, timeout: Duration) -> Probe<String> {
    let Some((argv0, args)) = p.argv.split_first() else {
        return Probe::Failed(format!(
            "no command to ask the {} version; fix the launcher's version probe",
            p.what
        ));
    };
    let mut child = match Command::new(argv0)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Probe::Skipped(format!("{argv0}: not found on PATH of the agent"))
        }
        Err(e) => {
            return Probe::Failed(format!(
                "{argv0}: cannot run: {e}; check it is executable by the agent's user"
            ))
        }
    };
    let drain = |pipe: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>| {
        tokio::spawn(async move {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf).await;
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let pid = child.id();
    let kill_group = || {
        if let Some(pid) = pid {
            // SAFETY: signalling a process group: the one the child leads,
            // which lives on while any of its processes does.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
    };
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Probe::Failed(format!("{argv0}: cannot wait for it: {e}")),
        Err(_) => {
            kill_group();
            let _ = child.kill().await;
            out.abort();
            err.abort();
            return Probe::Failed(format!(
                "{argv0} did not finish within {}s and was killed; run `{}` on this node to see where it hangs",
                timeout.as_secs_f64(),
                p.argv.join(" ")
            ));
        }
    };
    // A child it left behind may still hold the pipes: give it a moment,
    // then end it.
    if !finished(&out, &err).await {
        kill_group();
        finished(&out, &err).await;
    }
    let (stdout, stderr) = (text(out).await, text(err).await);
    let last = |s: &str| {
        s.lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .map(str::to_string)
    };
    if !status.success() {
        let how = match status.code() {
            Some(c) => format!("exited with {c}"),
            None => "was killed by a signal".to_string(),
        };
        let why = last(&stderr)
            .or_else(|| last(&stdout))
            .unwrap_or_else(|| "no output".into());
        return Probe::Failed(format!("{argv0} {how}: {why}"));
    }
    match last(&stdout) {
        Some(v) => Probe::Ok(v),
        None => Probe::Failed(format!(
            "{argv0} printed nothing on stdout{}; run `{}` on this node",
            last(&stderr)
                .map(|l| format!(" (stderr: {l})"))
                .unwrap_or_default(),
            p.argv.join(" ")
        )),
    }
}

/// Waits up to [`DRAIN`] for both readers to reach the end of their pipe.
async fn finished(a: &JoinHandle<String>, b: &JoinHandle<String>) -> bool {
    let end = tokio::time::Instant::now() + DRAIN;
    while !(a.is_finished() && b.is_finished()) {
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// What a reader read, if it reached the end of its pipe.
async fn text(t: JoinHandle<String>) -> String {
    if t.is_finished() {
        t.await.unwrap_or_default()
    } else {
        t.abort();
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> VersionProbe {
        VersionProbe {
            what: "vllm".into(),
            argv: vec!["sh".into(), "-c".into(), script.into()],
        }
    }

    #[tokio::test]
    async fn the_last_line_after_the_warnings() {
        let f = run(
            &sh("echo 'WARNING: something noisy'; echo; echo '  0.11.0  '; echo; echo warn >&2"),
            DEFAULT_TIMEOUT,
        )
        .await;
        assert_eq!(f.what, "vllm");
        assert_eq!(f.version, Probe::Ok("0.11.0".into()));
    }

    #[tokio::test]
    async fn failures_say_why() {
        let f = run(
            &sh("echo partial; echo first >&2; echo 'ModuleNotFoundError: No module named vllm' >&2; exit 1"),
            DEFAULT_TIMEOUT,
        )
        .await;
        assert_eq!(
            f.version,
            Probe::Failed("sh exited with 1: ModuleNotFoundError: No module named vllm".into())
        );
        let f = run(&sh("echo only-stderr >&2"), DEFAULT_TIMEOUT).await;
        assert!(
            matches!(&f.version, Probe::Failed(e) if e.starts_with("sh printed nothing on stdout (stderr: only-stderr)")),
            "{f:?}"
        );
        let missing = VersionProbe {
            what: "sglang".into(),
            argv: vec!["no-such-engine-xyz".into(), "--version".into()],
        };
        assert_eq!(
            run(&missing, DEFAULT_TIMEOUT).await.version,
            Probe::Skipped("no-such-engine-xyz: not found on PATH of the agent".into())
        );
        let empty = VersionProbe {
            what: "torch".into(),
            argv: vec![],
        };
        assert!(matches!(
            run(&empty, DEFAULT_TIMEOUT).await.version,
            Probe::Failed(_)
        ));
    }

    #[tokio::test]
    async fn a_hanging_command_is_killed() {
        let start = std::time::Instant::now();
        // The background sleep holds stdout: killing the group ends it too.
        let f = run(
            &sh("sleep 30 & echo 1.0; sleep 30"),
            Duration::from_millis(300),
        )
        .await;
        assert!(
            matches!(&f.version, Probe::Failed(e) if e.starts_with("sh did not finish within 0.3s and was killed")),
            "{f:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_child_left_behind_does_not_hold_the_answer() {
        let start = std::time::Instant::now();
        let f = run(&sh("sleep 30 & echo 2.0"), DEFAULT_TIMEOUT).await;
        // The background sleep keeps stdout open until it is killed.
        assert_eq!(f.version, Probe::Ok("2.0".into()), "{f:?}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}
