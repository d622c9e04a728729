//! The demo's last step: a real engine on the weights xfer delivered.
//! When vLLM is installed (its CPU build, by `scripts/engines.sh install`,
//! which the README's test command runs), the demo makes a tiny random
//! Llama, pushes it to two of its agents, and brings vLLM up across them
//! with tensor parallelism 2 through `xfer-launch up` (which checks first,
//! gates on the weights, and pins every rank to its fabric), asks it one
//! completion, prints it, and takes it down. Without vLLM it says in one
//! line how to get it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where `scripts/engines.sh` installs the engines.
const DEFAULT_VENV: &str = "/var/tmp/xfer-venv-engines";

/// The tiny-model maker (the same file the tests and benchmarks run).
const TINY_LLAMA: &str = include_str!("../../../scripts/tiny_llama.py");

/// The folder of the engines' programs, if vLLM is installed there.
pub fn engine_bin() -> Option<PathBuf> {
    let venv = std::env::var_os("XFER_ENGINES_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_VENV));
    let bin = venv.join("bin");
    (bin.join("vllm").is_file() && bin.join("python").is_file()).then_some(bin)
}

/// PATH for the demo's agents: the engines first, when they are there.
pub fn agent_path() -> Option<std::ffi::OsString> {
    let bin = engine_bin()?;
    let mut parts = vec![bin];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(parts).ok()
}

/// One of the demo's agents, as this step needs it.
pub struct Node<'a> {
    pub addr: &'a str,
}

/// Brings vLLM up on `nodes` (two) through `xfer-launch`; returns false
/// only if it was there and failed.
pub async fn serve_tiny_model(
    dir: &Path,
    launcher: &Path,
    key: &Path,
    mount: &Path,
    nodes: &[Node<'_>],
    push: impl std::future::Future<Output = anyhow::Result<bool>>,
) -> bool {
    let tiny = dir.join("tiny-llama-src");
    println!();
    let Some(bin) = engine_bin() else {
        println!("engine: no real vLLM here, so the demo stops at the check; `scripts/engines.sh install` installs vLLM's CPU build (the README's test command does), then run `xfer demo` again to see it serve across two nodes");
        return true;
    };
    println!(
        "engine: real vLLM found in {}; bringing it up on 2 nodes with a tiny random Llama",
        bin.display()
    );
    let script = dir.join("tiny_llama.py");
    let made = std::fs::write(&script, TINY_LLAMA).is_ok()
        && Command::new(bin.join("python"))
            .arg(&script)
            .arg(&tiny)
            .output()
            .is_ok_and(|o| o.status.success());
    if !made {
        println!("engine: cannot make the tiny model with {}/python; reinstall with `scripts/engines.sh install`", bin.display());
        return false;
    }
    match push.await {
        Ok(true) => println!("engine: pushed the tiny model to both nodes"),
        Ok(false) | Err(_) => {
            println!("engine: the push of the tiny model failed");
            return false;
        }
    }
    let mut file = format!("key = \"{}\"\n", key.display());
    for (i, n) in nodes.iter().enumerate() {
        let ip = n.addr.rsplit_once(':').map_or(n.addr, |(h, _)| h);
        file += &format!(
            "\n[[node]]\nname = \"node{}\"\nagent = \"{}\"\nroot = \"{}\"\nfabric_if = \"lo\"\nfabric_ip = \"{ip}\"\n",
            i + 1,
            n.addr,
            mount.display()
        );
    }
    file += &format!(
        "\n[launch]\nengine = \"vllm\"\nmodel = \"{}/tiny\"\ntp = 2\npp = 1\napi_port = 8000\nextra_args = [\"--dtype\", \"float32\", \"--max-model-len\", \"256\", \"--enforce-eager\"]\n\n[launch.env]\nVLLM_CPU_KVCACHE_SPACE = \"1\"\nVLLM_CPU_OMP_THREADS_BIND = \"nobind\"\nOMP_NUM_THREADS = \"1\"\n",
        mount.display()
    );
    let cluster = dir.join("engine.toml");
    if std::fs::write(&cluster, file).is_err() {
        println!("engine: cannot write {}", cluster.display());
        return false;
    }
    println!(
        "$ xfer-launch up --cluster {} --timeout 300",
        cluster.display()
    );
    let up = Command::new(launcher)
        .args(["up", "--timeout", "300", "--grace", "5", "--cluster"])
        .arg(&cluster)
        .env("XDG_STATE_HOME", dir.join("state"))
        .status();
    if !up.is_ok_and(|s| s.success()) {
        println!("engine: xfer-launch up failed (above)");
        down(launcher, &cluster, dir);
        return false;
    }
    let head = nodes[0]
        .addr
        .rsplit_once(':')
        .map_or(nodes[0].addr, |(h, _)| h);
    let answer = complete(head, &format!("{}/tiny", mount.display())).await;
    let ok = match answer {
        Ok(text) => {
            println!(
                "engine: asked \"the quick brown fox\"; vLLM answered through http://{head}:8000: {text:?} (random weights: the words mean nothing, the path is real)"
            );
            true
        }
        Err(e) => {
            println!("engine: the completion failed: {e}");
            false
        }
    };
    down(launcher, &cluster, dir);
    ok
}

async fn complete(head: &str, model: &str) -> anyhow::Result<String> {
    let body =
        serde_json::json!({"model": model, "prompt": "the quick brown fox", "max_tokens": 8});
    let bytes = reqwest::Client::new()
        .post(format!("http://{head}:8000/v1/completions"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(120))
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    let reply: serde_json::Value = serde_json::from_slice(&bytes)?;
    reply["choices"][0]["text"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no text in {reply}"))
}

fn down(launcher: &Path, cluster: &Path, dir: &Path) {
    println!("$ xfer-launch down --cluster {}", cluster.display());
    let _ = Command::new(launcher)
        .args(["down", "--grace", "5", "--cluster"])
        .arg(cluster)
        .env("XDG_STATE_HOME", dir.join("state"))
        .status();
}
