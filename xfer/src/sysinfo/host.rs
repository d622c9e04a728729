//! The host's own resources: free space on the filesystem of the agent's
//! root (statvfs), memory (`/proc/meminfo`) and the NVIDIA GPUs with the
//! compute processes already on them (`nvidia-smi`). The parsers are pure
//! functions over the text those sources print.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xfer_proto::launch::{DiskFacts, GpuFacts, GpuInfo, GpuProcess, MemFacts, Probe};

/// How long `nvidia-smi` may take to answer.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// Free and total space on the filesystem holding `root`.
pub fn disk(root: &Path) -> Probe<DiskFacts> {
    let fail = |e: std::io::Error| {
        Probe::Failed(format!(
            "cannot read the filesystem of {}: {e}; check the agent's --root",
            root.display()
        ))
    };
    let c = match std::ffi::CString::new(root.as_os_str().as_encoded_bytes()) {
        Ok(c) => c,
        Err(e) => return fail(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)),
    };
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return fail(std::io::Error::last_os_error());
    }
    let free_bytes = match free_space(root) {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    Probe::Ok(DiskFacts {
        path: root.display().to_string(),
        free_bytes,
        total_bytes: s.f_blocks as u64 * s.f_frsize as u64,
    })
}

/// `MemTotal` and `MemAvailable` from `/proc/meminfo`.
pub fn memory() -> Probe<MemFacts> {
    match std::fs::read_to_string("/proc/meminfo") {
        Ok(text) => match parse_meminfo(&text) {
            Ok(m) => Probe::Ok(m),
            Err(e) => Probe::Failed(e.to_string()),
        },
        Err(e) => Probe::Skipped(format!(
            "cannot read /proc/meminfo: {e}; the agent needs /proc mounted to report memory"
        )),
    }
}

/// Why `/proc/meminfo` gave no memory figures.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MeminfoError {
    /// No readable `MemTotal` line.
    #[error("/proc/meminfo has no readable MemTotal line; is /proc a real procfs?")]
    NoTotal,
    /// No `MemAvailable` line (kernels before 3.14).
    #[error("/proc/meminfo has no MemAvailable line (kernels before 3.14 lack it); upgrade the kernel to check memory")]
    NoAvailable,
}

/// Parses `/proc/meminfo` (values in kB) into bytes.
pub fn parse_meminfo(text: &str) -> Result<MemFacts, MeminfoError> {
    let field = |key: &str| -> Option<u64> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            let mut words = rest.split_whitespace();
            let n: u64 = words.next()?.parse().ok()?;
            match words.next() {
                Some("kB") => n.checked_mul(1024),
                None => Some(n),
                Some(_) => None,
            }
        })
    };
    let mem_total = field("MemTotal").ok_or(MeminfoError::NoTotal)?;
    let mem_available = field("MemAvailable").ok_or(MeminfoError::NoAvailable)?;
    Ok(MemFacts {
        mem_total,
        mem_available,
    })
}

/// The GPUs, their memory and the compute processes on them, from
/// `nvidia-smi`. Blocks for up to [`NVIDIA_SMI_TIMEOUT`] per query.
pub fn gpus() -> Probe<GpuFacts> {
    let gpus = match nvidia_smi(&[
        "--query-gpu=index,name,memory.total,memory.used,driver_version",
        "--format=csv,noheader,nounits",
    ]) {
        Ok(out) => out,
        Err(p) => return p,
    };
    let (gpus, driver) = match parse_gpus(&gpus) {
        Ok(g) => g,
        Err(e) => return Probe::Failed(e.to_string()),
    };
    let apps = match nvidia_smi(&[
        "--query-compute-apps=pid,process_name,used_memory",
        "--format=csv,noheader,nounits",
    ]) {
        Ok(out) => out,
        Err(p) => return p,
    };
    Probe::Ok(GpuFacts {
        gpus,
        processes: parse_apps(&apps),
        driver,
    })
}

/// Whether the GPUs share the host's memory: the Grace-based superchips
/// and the GB10 of DGX Spark, which `nvidia-smi` names, or a GPU that
/// reports no memory of its own. None when there is no GPU to say.
pub fn unified_memory(gpus: &Probe<GpuFacts>) -> Option<bool> {
    let Probe::Ok(g) = gpus else { return None };
    if g.gpus.is_empty() {
        return None;
    }
    Some(g.gpus.iter().any(|gpu| {
        let name = gpu.name.to_ascii_uppercase();
        ["GB10", "GH200", "GB200", "GB300"]
            .iter()
            .any(|chip| name.contains(chip))
            || gpu.memory_total_mib.is_none()
    }))
}

/// Runs `nvidia-smi ARGS`, returning its stdout, or the probe outcome
/// that says why there is none.
fn nvidia_smi(args: &[&str]) -> Result<String, Probe<GpuFacts>> {
    match run_with_timeout("nvidia-smi", args, NVIDIA_SMI_TIMEOUT) {
        Ok(Run::Done {
            code: Some(0),
            stdout,
            ..
        }) => Ok(stdout),
        Ok(Run::Done {
            code,
            stdout,
            stderr,
        }) => {
            let line = first_line(&stderr)
                .or_else(|| first_line(&stdout))
                .unwrap_or("no output");
            let how = match code {
                Some(c) => format!("exited with {c}"),
                None => "was killed by a signal".to_string(),
            };
            Err(Probe::Failed(format!(
                "nvidia-smi {how}: {line}; check the NVIDIA driver (run `nvidia-smi` on this node)"
            )))
        }
        Ok(Run::TimedOut) => Err(Probe::Failed(format!(
            "nvidia-smi did not answer within {}s; the driver may be hung (see `dmesg`)",
            NVIDIA_SMI_TIMEOUT.as_secs()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Probe::Skipped(
            "nvidia-smi not found on PATH; no NVIDIA GPU check".to_string(),
        )),
        Err(e) => Err(Probe::Failed(format!(
            "cannot run nvidia-smi: {e}; check its permissions and the agent's PATH"
        ))),
    }
}

fn first_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).find(|l| !l.is_empty())
}

enum Run {
    Done {
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    TimedOut,
}

/// Runs a command with stdin closed, killing its process group when it
/// outlives `timeout`.
fn run_with_timeout(program: &str, args: &[&str], timeout: Duration) -> std::io::Result<Run> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as _));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some(status) = status else {
        // SAFETY: the child is not reaped yet, so its pid (and process
        // group, which it leads) is still ours to signal.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.kill();
        let _ = child.wait();
        return Ok(Run::TimedOut);
    };
    Ok(Run::Done {
        code: status.code(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// A number from `nvidia-smi --format=csv,nounits`, None for "[N/A]",
/// "[Not Supported]" and the like.
fn number(field: &str) -> Option<u64> {
    field.trim().parse().ok()
}

/// A line of `nvidia-smi --query-gpu` output that is not what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read nvidia-smi's GPU line `{0}` (expected index, name, memory.total, memory.used, driver_version); report this nvidia-smi version")]
pub struct GpuLineError(pub String);

/// Parses `--query-gpu=index,name,memory.total,memory.used,driver_version`
/// output: the GPUs and the driver version (of the first GPU).
pub fn parse_gpus(text: &str) -> Result<(Vec<GpuInfo>, Option<String>), GpuLineError> {
    let mut gpus = Vec::new();
    let mut driver = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || GpuLineError(line.to_string());
        // A name with commas in it takes every field between the index
        // and the last three.
        if fields.len() < 5 {
            return Err(bad());
        }
        let n = fields.len();
        let index: u32 = fields[0].parse().map_err(|_| bad())?;
        gpus.push(GpuInfo {
            index,
            name: fields[1..n - 3].join(", "),
            memory_total_mib: number(fields[n - 3]),
            memory_used_mib: number(fields[n - 2]),
        });
        let d = fields[n - 1];
        if driver.is_none() && !d.is_empty() && !d.starts_with('[') {
            driver = Some(d.to_string());
        }
    }
    Ok((gpus, driver))
}

/// Parses `--query-compute-apps=pid,process_name,used_memory` output.
/// Lines that name no process ("No running processes found" on some
/// versions) are skipped.
pub fn parse_apps(text: &str) -> Vec<GpuProcess> {
    text.lines()
        .map(str::trim)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() < 3 {
                return None;
            }
            let n = fields.len();
            Some(GpuProcess {
                pid: fields[0].parse().ok()?,
                name: fields[1..n - 1].join(", "),
                used_mib: number(fields[n - 1]),
            })
        })
        .collect()
}

/// Free bytes for unprivileged writers on the filesystem holding `path`.
pub fn free_space(path: &Path) -> std::io::Result<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_in_bytes() {
        let text = "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   65536000 kB\nBuffers: 1 kB\n";
        assert_eq!(
            parse_meminfo(text).unwrap(),
            MemFacts {
                mem_total: 131072000 * 1024,
                mem_available: 65536000 * 1024,
            }
        );
    }

    #[test]
    fn meminfo_without_available_says_why() {
        let e = parse_meminfo("MemTotal: 10 kB\nMemFree: 5 kB\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("MemAvailable"), "{e}");
        assert!(parse_meminfo("garbage")
            .unwrap_err()
            .to_string()
            .contains("MemTotal"));
        // A prefix of another key does not count.
        assert!(parse_meminfo("MemTotalX: 1 kB\nMemAvailable: 1 kB\n").is_err());
    }

    #[test]
    fn the_real_meminfo_reads() {
        match memory() {
            Probe::Ok(m) => assert!(m.mem_total >= m.mem_available && m.mem_total > 0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gpu_lines() {
        let text = "0, NVIDIA H100 80GB HBM3, 81559, 1024, 550.54.15\n1, NVIDIA H100 80GB HBM3, 81559, 0, 550.54.15\n";
        let (gpus, driver) = parse_gpus(text).unwrap();
        assert_eq!(driver.as_deref(), Some("550.54.15"));
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            gpus[0],
            GpuInfo {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_mib: Some(81559),
                memory_used_mib: Some(1024),
            }
        );
        assert_eq!(gpus[1].index, 1);
    }

    #[test]
    fn gb10_has_no_memory_numbers() {
        // The GB10 (DGX Spark) shares system memory with the CPU.
        let (gpus, driver) = parse_gpus("0, NVIDIA GB10, [N/A], [N/A], 580.95.05\n").unwrap();
        assert_eq!(
            gpus,
            vec![GpuInfo {
                index: 0,
                name: "NVIDIA GB10".into(),
                memory_total_mib: None,
                memory_used_mib: None,
            }]
        );
        assert_eq!(driver.as_deref(), Some("580.95.05"));
        let facts = |gpus| {
            Probe::Ok(GpuFacts {
                gpus,
                processes: vec![],
                driver: None,
            })
        };
        assert_eq!(unified_memory(&facts(gpus)), Some(true));
        let (h100, _) = parse_gpus("0, NVIDIA H100 80GB HBM3, 81559, 0, 580.95.05\n").unwrap();
        assert_eq!(unified_memory(&facts(h100)), Some(false));
        let (gh200, _) = parse_gpus("0, NVIDIA GH200 480GB, 97871, 0, 580.95.05\n").unwrap();
        assert_eq!(unified_memory(&facts(gh200)), Some(true));
        assert_eq!(unified_memory(&facts(vec![])), None);
        assert_eq!(
            unified_memory(&Probe::Skipped("no nvidia-smi".into())),
            None
        );
    }

    #[test]
    fn gpu_name_with_a_comma_and_bad_lines() {
        let (gpus, _) = parse_gpus("3, Odd, Name, 100, 5, 1.0").unwrap();
        assert_eq!(gpus[0].name, "Odd, Name");
        assert_eq!(gpus[0].memory_total_mib, Some(100));
        assert!(parse_gpus("x, a, 1, 2, 3").is_err());
        assert!(parse_gpus("0, a, 1").is_err());
        assert_eq!(parse_gpus("\n").unwrap(), (vec![], None));
    }

    #[test]
    fn app_lines() {
        let text = "4242, /usr/bin/python3, 40000\n77, vllm, [N/A]\nNo running processes found\n";
        assert_eq!(
            parse_apps(text),
            vec![
                GpuProcess {
                    pid: 4242,
                    name: "/usr/bin/python3".into(),
                    used_mib: Some(40000),
                },
                GpuProcess {
                    pid: 77,
                    name: "vllm".into(),
                    used_mib: None,
                },
            ]
        );
        assert!(parse_apps("").is_empty());
    }

    #[test]
    fn commands_run_with_a_timeout() {
        match run_with_timeout(
            "sh",
            &["-c", "echo out; echo err >&2; exit 3"],
            NVIDIA_SMI_TIMEOUT,
        )
        .unwrap()
        {
            Run::Done {
                code,
                stdout,
                stderr,
            } => {
                assert_eq!(code, Some(3));
                assert_eq!(stdout, "out\n");
                assert_eq!(stderr, "err\n");
            }
            Run::TimedOut => panic!("timed out"),
        }
        let t = Instant::now();
        assert!(matches!(
            run_with_timeout("sh", &["-c", "sleep 30"], Duration::from_millis(200)).unwrap(),
            Run::TimedOut
        ));
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(
            run_with_timeout("/nonexistent/nvidia-smi", &[], NVIDIA_SMI_TIMEOUT)
                .err()
                .map(|e| e.kind()),
            Some(std::io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn disk_of_a_temp_dir() {
        let dir = tempfile::tempdir().unwrap();
        match disk(dir.path()) {
            Probe::Ok(d) => assert!(d.total_bytes >= d.free_bytes && d.total_bytes > 0),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            disk(&dir.path().join("missing")),
            Probe::Failed(e) if e.contains("--root")
        ));
    }
}
