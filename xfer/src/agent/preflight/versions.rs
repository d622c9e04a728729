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
    if p.argv.is_empty() {
        return Probe::Failed(format!(
            "no command to ask the {} version; fix the launcher's version probe",
            p.what
        ));
    }
    if let Some(mut python) = p.python_of.as_deref().and_then(python_of) {
        python.extend(["-c".into(), MODULE_VERSION.into(), p.what.clone()]);
        if let Probe::Ok(v) = last_line(&python, &[], timeout).await {
            return Probe::Ok(v);
        }
    }
    last_line(&p.argv, &[], timeout).await
}

/// Finds the version of the module named by its argument without
/// importing the package (vLLM's import takes seconds): from the
/// package's `version.py` or `_version.py` (torch keeps its `+cu130`
/// there), else its distribution's metadata, else by importing it.
const MODULE_VERSION: &str = r#"
import importlib.util, importlib.metadata as md, os, re, sys
name = sys.argv[1]
spec = importlib.util.find_spec(name)
if spec is None:
    sys.exit(f"{name} is not installed for {sys.executable}")
pat = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)
for d in spec.submodule_search_locations or []:
    for f in ("version.py", "_version.py"):
        try:
            with open(os.path.join(d, f)) as fh:
                m = pat.search(fh.read())
        except OSError:
            continue
        if m:
            print(m.group(1))
            sys.exit(0)
try:
    print(md.version(name))
except md.PackageNotFoundError:
    print(__import__(name).__version__)
"#;

/// The interpreter of `program` as found on PATH, when it is a Python
/// script (`#!/venv/bin/python3`, `#!/usr/bin/env python3`), or `program`
/// itself when it is a Python: what the ranks that run `program` run in.
/// None when it is not found or no Python.
pub fn python_of(program: &str) -> Option<Vec<String>> {
    // A Python itself (SGLang runs as `python3 -m sglang.launch_server`).
    let named = std::path::Path::new(program).file_name()?.to_string_lossy();
    if named.starts_with("python") && !named.ends_with(".py") {
        return Some(vec![program.to_string()]);
    }
    let path = if program.contains('/') {
        std::path::PathBuf::from(program)
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(program))
            .find(|p| p.is_file())?
    };
    let mut head = [0u8; 256];
    let n = {
        use std::io::Read;
        std::fs::File::open(&path).ok()?.read(&mut head).ok()?
    };
    let first = head[..n].split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(first.strip_prefix(b"#!")?).ok()?;
    let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    // `/venv/bin/python3` or `/usr/bin/env python3`: a Python, or nothing.
    let python = |w: &String| {
        std::path::Path::new(w)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("python"))
    };
    let is_python = match words.as_slice() {
        [interp, ..] if python(interp) => true,
        [env, arg, ..] if env.ends_with("/env") => python(arg),
        _ => false,
    };
    is_python.then_some(words)
}

/// Runs `argv` (with `env` added) with stdin closed, for `timeout` at most,
/// and returns the last non-empty line of its stdout, or why there is none.
pub async fn last_line(
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
) -> Probe<String> {
    run_to_last_line(argv, env, timeout).await.into_probe()
}

/// How a command run for its last line ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LastLine {
    /// It succeeded and printed this last non-empty line on stdout.
    Line(String),
    /// It could not be started: not on the agent's `PATH` (the text says
    /// so).
    NotFound(String),
    /// It ran and exited with a failure code.
    Exited {
        /// Its exit code.
        code: i32,
        /// The last line of its stderr (else stdout), or "no output".
        last: String,
        /// The whole failure in words: "ARGV0 exited with CODE: LAST".
        why: String,
    },
    /// Any other failure (killed, timed out, printed nothing, cannot run),
    /// in words.
    Failed(String),
}

impl LastLine {
    /// As a probe's answer: the line, a skip when not found, else a
    /// failure with its words.
    pub fn into_probe(self) -> Probe<String> {
        match self {
            LastLine::Line(l) => Probe::Ok(l),
            LastLine::NotFound(why) => Probe::Skipped(why),
            LastLine::Exited { why, .. } | LastLine::Failed(why) => Probe::Failed(why),
        }
    }
}

/// [`last_line`], saying how the command ended.
pub async fn run_to_last_line(
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
) -> LastLine {
    let Some((argv0, args)) = argv.split_first() else {
        return LastLine::Failed("no command to run; report this bug".into());
    };
    let mut child = match Command::new(argv0)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return LastLine::NotFound(format!("{argv0}: not found on PATH of the agent"))
        }
        Err(e) => {
            return LastLine::Failed(format!(
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
        Ok(Err(e)) => return LastLine::Failed(format!("{argv0}: cannot wait for it: {e}")),
        Err(_) => {
            kill_group();
            let _ = child.kill().await;
            out.abort();
            err.abort();
            return LastLine::Failed(format!(
                "{argv0} did not finish within {}s and was killed; run `{}` on this node to see where it hangs",
                timeout.as_secs_f64(),
                argv.join(" ")
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
        let why = last(&stderr)
            .or_else(|| last(&stdout))
            .unwrap_or_else(|| "no output".into());
        return match status.code() {
            Some(code) => LastLine::Exited {
                code,
                why: format!("{argv0} exited with {code}: {why}"),
                last: why,
            },
            None => LastLine::Failed(format!("{argv0} was killed by a signal: {why}")),
        };
    }
    match last(&stdout) {
        Some(v) => LastLine::Line(v),
        None => LastLine::Failed(format!(
            "{argv0} printed nothing on stdout{}; run `{}` on this node",
            last(&stderr)
                .map(|l| format!(" (stderr: {l})"))
                .unwrap_or_default(),
            argv.join(" ")
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
            python_of: None,
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
            python_of: None,
        };
        assert_eq!(
            run(&missing, DEFAULT_TIMEOUT).await.version,
            Probe::Skipped("no-such-engine-xyz: not found on PATH of the agent".into())
        );
        let empty = VersionProbe {
            what: "torch".into(),
            argv: vec![],
            python_of: None,
        };
        assert!(matches!(
            run(&empty, DEFAULT_TIMEOUT).await.version,
            Probe::Failed(_)
        ));
    }

    #[tokio::test]
    async fn a_python_script_is_asked_through_its_interpreter() {
        let dir = std::env::temp_dir().join(format!("xfer-pyof-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("fakemod")).unwrap();
        std::fs::write(
            dir.join("fakemod/__init__.py"),
            "raise SystemExit('imported')\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("fakemod/version.py"),
            "__version__ = '9.8.7+cu130'\n",
        )
        .unwrap();
        let script = dir.join("engine");
        std::fs::write(&script, "#!/usr/bin/env python3\nprint('slow path')\n").unwrap();
        let shell = dir.join("shell-engine");
        std::fs::write(&shell, "#!/bin/sh\necho 1\n").unwrap();
        assert_eq!(
            python_of(script.to_str().unwrap()),
            Some(vec!["/usr/bin/env".to_string(), "python3".to_string()])
        );
        assert_eq!(python_of(shell.to_str().unwrap()), None);
        assert_eq!(python_of("python3"), Some(vec!["python3".to_string()]));
        assert_eq!(python_of("no-such-engine-xyz"), None);
        // The version file is read, the package is not imported (its
        // __init__ would exit), and the command is not run.
        let mut argv = python_of(script.to_str().unwrap()).unwrap();
        argv.extend(["-c".into(), MODULE_VERSION.into(), "fakemod".into()]);
        let env = [("PYTHONPATH".to_string(), dir.display().to_string())];
        assert_eq!(
            last_line(&argv, &env, DEFAULT_TIMEOUT).await,
            Probe::Ok("9.8.7+cu130".into())
        );
        // Not installed: the snippet fails, and `version` falls back to argv.
        let p = VersionProbe {
            what: "no_such_module_xyz".into(),
            argv: vec!["sh".into(), "-c".into(), "echo 1.2.3".into()],
            python_of: Some(script.display().to_string()),
        };
        assert_eq!(
            run(&p, DEFAULT_TIMEOUT).await.version,
            Probe::Ok("1.2.3".into())
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
