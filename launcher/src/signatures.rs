//! Known signatures of engines that hang or die, found in a rank's log,
//! each with what to do about it.
//!
//! The patterns are the lines NCCL, torch.distributed, Ray, vLLM, SGLang
//! and the kernel print in the failures multi-node launches actually hit
//! (wrong NIC, NCCL on TCP instead of RDMA, a port taken, out of memory, a
//! Ray placement that never happens). Matching is plain substring search
//! over the last [`SCAN_BYTES`] of the log, so it costs nothing and cannot
//! misfire on regex syntax.
//!
//! The agents only report facts (a rank's state, exit, log tail); the
//! launcher reads the end of a failed rank's log through its agent
//! ([`crate::diagnose`]) and scans it here.

use serde::{Deserialize, Serialize};

/// How much of the end of a rank's log is scanned.
pub const SCAN_BYTES: u64 = 256 << 10;

/// One signature found in a log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hint {
    /// A short name: "nccl-socket", "port-in-use", ...
    pub id: String,
    /// The log line that matched (trimmed).
    pub line: String,
    /// What it means and what to do.
    pub hint: String,
}

struct Signature {
    id: &'static str,
    /// Every needle must be on the line.
    all: &'static [&'static str],
    hint: &'static str,
}

const SIGNATURES: &[Signature] = &[
    Signature {
        id: "nccl-socket",
        all: &["NET/Socket"],
        hint: "NCCL is moving tensors over TCP sockets, not RDMA (NET/IB): on a RoCE/InfiniBand fabric set rdma_device for this node (NCCL_IB_HCA) and check `xfer-launch check`'s RDMA row; expect much lower throughput, and a hang if that interface cannot reach the other ranks",
    },
    Signature {
        id: "nccl-system-error",
        all: &["NCCL error", "unhandled system error"],
        hint: "NCCL failed in a system call, most often the wrong interface or a down RDMA port: check that fabric_if/fabric_ip are right (`xfer-launch check`) and rerun with NCCL_DEBUG=INFO in [launch.env]",
    },
    Signature {
        id: "nccl-timeout",
        all: &["Watchdog caught collective operation timeout"],
        hint: "an NCCL collective timed out: the ranks cannot exchange data over the fabric (wrong NIC, MTU mismatch, firewall); run `xfer-launch check` and look at the reach and links rows",
    },
    Signature {
        id: "dist-network",
        all: &["DistNetworkError"],
        hint: "torch.distributed could not reach the rendezvous: the master address or port is unreachable from this rank; run `xfer-launch check` (reach row) and check that master_port is free on the head",
    },
    Signature {
        id: "port-in-use",
        all: &["Address already in use"],
        hint: "a port the engine binds is taken: `xfer-launch check` names the process holding it; stop it or change master_port/api_port/ray_port/dist_port in [launch]",
    },
    Signature {
        id: "cuda-oom",
        all: &["CUDA out of memory"],
        hint: "the GPU ran out of memory: lower --gpu-memory-utilization or --max-model-len in extra_args, stop other GPU processes (`xfer-launch check` lists them), or spread the model over more GPUs (tp/pp)",
    },
    Signature {
        id: "torch-oom",
        all: &["OutOfMemoryError"],
        hint: "the GPU ran out of memory: lower --gpu-memory-utilization or --max-model-len in extra_args, or spread the model over more GPUs (tp/pp)",
    },
    Signature {
        id: "oom-killer",
        all: &["Out of memory: Killed process"],
        hint: "the kernel's OOM killer stopped a process: free memory on this node (`xfer-launch up --evict-page-cache` drops the model's pages from the page cache first), or lower the memory the engine takes",
    },
    Signature {
        id: "killed",
        all: &["[xfer agent]", "was killed by signal 9"],
        hint: "a rank's process was killed with SIGKILL, the whole group was stopped with it: by the kernel's OOM killer (look for \"Out of memory: Killed process\" in `dmesg` or the journal, then free memory or start with `xfer-launch up --evict-page-cache`), or by someone on that node",
    },
    Signature {
        id: "ray-placement",
        all: &["placement group"],
        hint: "Ray cannot place the workers: every node must run its `ray start` with GPUs visible; look at `ray status` on the head, and at the workers' logs (`xfer-launch logs`)",
    },
    Signature {
        id: "ray-wrong-ip",
        all: &["This node has an IP address of", "Ray cluster has"],
        hint: "Ray registered this node under another address than the one the cluster uses: set fabric_ip for every node (it becomes --node-ip-address and VLLM_HOST_IP)",
    },
    Signature {
        id: "model-missing",
        all: &["Can't load the configuration of"],
        hint: "the engine cannot find the model at its path on this node: run `xfer-launch check` (weights row) and `xfer sync` the model to it",
    },
    Signature {
        id: "hf-offline",
        all: &["HF_HUB_OFFLINE"],
        hint: "the engine tried to download while offline: the model path is not a complete snapshot on this node; run `xfer-launch check` (weights row)",
    },
];

/// The signatures found in `log` (the most recent match of each), in the
/// order of [`SIGNATURES`].
pub fn scan(log: &str) -> Vec<Hint> {
    let mut found: Vec<Option<Hint>> = vec![None; SIGNATURES.len()];
    for line in log.lines() {
        for (i, sig) in SIGNATURES.iter().enumerate() {
            if sig.all.iter().all(|n| line.contains(n)) {
                found[i] = Some(Hint {
                    id: sig.id.to_string(),
                    line: clip(line.trim(), 300),
                    hint: sig.hint.to_string(),
                });
            }
        }
    }
    found.into_iter().flatten().collect()
}

/// `s` cut to at most `max` bytes (at a character boundary), with `…`.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_real_lines() {
        let log = "\
INFO 12-01 03:00:00 [api_server.py:1] vLLM API server version 0.11.0
spark-b:1234:1300 [0] NCCL INFO NET/Socket : Using [0]enP7s7:192.168.1.20<0>
RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)
OSError: [Errno 98] Address already in use
";
        let ids: Vec<String> = scan(log).into_iter().map(|h| h.id).collect();
        assert_eq!(ids, ["nccl-socket", "nccl-system-error", "port-in-use"]);
    }

    #[test]
    fn all_needles_must_be_on_one_line() {
        assert!(scan("NCCL error: invalid usage\nunhandled system error\n").is_empty());
    }

    #[test]
    fn keeps_the_latest_match_and_clips_long_lines() {
        let long = format!("torch.OutOfMemoryError: {}", "é".repeat(400));
        let log = format!("torch.OutOfMemoryError: first\n{long}\n");
        let hints = scan(&log);
        assert_eq!(hints.len(), 1);
        assert!(hints[0].line.ends_with('…'));
        assert!(hints[0].line.len() <= 304);
    }

    #[test]
    fn quiet_logs_have_no_hints() {
        assert!(scan("INFO: Uvicorn running on http://0.0.0.0:8000\n").is_empty());
    }
}
