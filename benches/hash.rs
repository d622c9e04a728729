//! Hashing throughput: `xfer::store::scan::scan` (the BLAKE3 chunk tree `xfer push`
//! and `xfer manifest` build) against `b3sum --num-threads 2` run as a
//! process over the same files, with the files in the page cache.
//!
//! `cargo bench -p xfer --bench hash` generates a ~1 GiB model-like tree in a
//! temporary directory. Settings, by environment:
//!
//! - `XFER_BENCH_HASH_MB`: tree size in MiB (default 1024)
//! - `XFER_BENCH_RUNS`: timed runs per side, the median is reported (default 3)
//! - `XFER_BENCH_B3SUM_THREADS`: `b3sum --num-threads` (default 2)
//! - `XFER_BENCH_DIR`: where the temporary tree goes (default: the system temp dir)
//!
//! Without `--bench` (as under `cargo test --all-targets`) it runs one quick
//! pass over 16 MiB, so test runs stay fast.

use std::fs;
use std::hint::black_box;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};

const CHUNK_SIZE: u64 = 4 << 20;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a valid value")),
        Err(_) => default,
    }
}

/// Writes `len` pseudo-random bytes to `path`.
fn write_random(path: &Path, len: u64, rng: &mut rand::rngs::SmallRng) {
    let mut f = BufWriter::with_capacity(1 << 20, fs::File::create(path).expect("create file"));
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        f.write_all(&buf[..n]).expect("write file");
        left -= n as u64;
    }
    f.flush().expect("flush file");
}

/// A model-like tree of about `size` bytes: four safetensors shards (odd
/// sizes), config files, a nested folder and an empty file.
fn generate(dir: &Path, size: u64) {
    fs::create_dir_all(dir.join("original")).expect("create tree");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);
    let small = 1u64 << 20;
    let shard = size.saturating_sub(2 * small) / 4;
    for i in 1..=4u64 {
        let name = format!("model-{i:05}-of-00004.safetensors");
        write_random(&dir.join(name), shard + i * 4099, &mut rng);
    }
    write_random(&dir.join("tokenizer.json"), small, &mut rng);
    write_random(&dir.join("original/consolidated.00.pth"), small, &mut rng);
    fs::write(
        dir.join("config.json"),
        "{\"architectures\": [\"BenchForCausalLM\"], \"hidden_size\": 4096}\n",
    )
    .expect("write config");
    fs::write(dir.join("original/params.json"), "{\"dim\": 4096}\n").expect("write params");
    fs::write(dir.join("generation_config.json"), "").expect("write empty file");
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("read dir") {
        let e = e.expect("dir entry");
        let t = e.file_type().expect("file type");
        if t.is_dir() {
            files_under(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    }
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

fn b3sum_available() -> bool {
    Command::new("b3sum")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let mb: u64 = env_or("XFER_BENCH_HASH_MB", if full { 1024 } else { 16 });
    let runs: usize = env_or("XFER_BENCH_RUNS", if full { 3 } else { 1 }).max(1);
    let threads: usize = env_or("XFER_BENCH_B3SUM_THREADS", 2);
    let base = std::env::var_os("XFER_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);

    let tmp = tempfile::Builder::new()
        .prefix("xfer-bench-hash")
        .tempdir_in(&base)
        .expect("temp dir");
    let root = tmp.path().join("model");
    let started = Instant::now();
    generate(&root, mb << 20);
    let mut files = Vec::new();
    files_under(&root, &mut files);
    files.sort();
    let bytes: u64 = files
        .iter()
        .map(|f| fs::metadata(f).expect("stat").len())
        .sum();
    // Warm the page cache once, so both sides read from memory.
    for f in &files {
        let mut r = fs::File::open(f).expect("open");
        std::io::copy(&mut r, &mut std::io::sink()).expect("read");
    }
    println!(
        "hash bench: {} files, {:.1} MiB in {} (generated in {:.1}s), {runs} run(s) each, chunk {} MiB",
        files.len(),
        bytes as f64 / (1u64 << 20) as f64,
        root.display(),
        started.elapsed().as_secs_f64(),
        CHUNK_SIZE >> 20
    );

    let mut xs = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let tree = xfer::store::scan::scan(&root, CHUNK_SIZE, &|_| {}).expect("scan");
        xs.push(t.elapsed());
        black_box(tree.manifest.root());
    }
    let x = median(xs);
    println!(
        "xfer::store::scan::scan          {:>8.3}s  {:>6.2} GB/s",
        x.as_secs_f64(),
        gbps(bytes, x)
    );

    if !b3sum_available() {
        println!("b3sum not installed: skipping the comparison (apt-get install b3sum)");
        return;
    }
    let mut bs = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let status = Command::new("b3sum")
            .arg("--num-threads")
            .arg(threads.to_string())
            .args(&files)
            .stdout(Stdio::null())
            .status()
            .expect("run b3sum");
        assert!(status.success(), "b3sum failed: {status}");
        bs.push(t.elapsed());
    }
    let b = median(bs);
    println!(
        "b3sum --num-threads {threads}    {:>8.3}s  {:>6.2} GB/s",
        b.as_secs_f64(),
        gbps(bytes, b)
    );
    println!(
        "ratio xfer / b3sum        {:>8.2}   (floor 0.80)",
        gbps(bytes, x) / gbps(bytes, b)
    );
}
