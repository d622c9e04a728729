//! The commands that need no agent: `keygen` (the cluster credential),
//! `manifest` (a tree's hashes, as `b3sum` prints them), `verify` (a tree
//! against a manifest) and `doctor` (this node's inventory).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::args::*;
use xfer_proto::manifest::{Entry, Manifest};
use xfer_proto::units::Bytes;

/// `xfer keygen`.
pub async fn keygen(args: KeygenArgs) -> Result<ExitCode> {
    let KeygenArgs { out, force } = args;
    let cred = xfer::config::auth::keygen(&out, force)?;
    println!(
        "wrote {} (cluster {}); copy it to every node and pass it as --key",
        out.display(),
        cred.cluster_id().short()
    );
    Ok(ExitCode::SUCCESS)
}

/// `xfer manifest`.
pub async fn manifest(args: ManifestArgs) -> Result<ExitCode> {
    let ManifestArgs {
        dir,
        json,
        chunking: Chunking { chunk_size },
    } = args;
    let started = Instant::now();
    let tree =
        tokio::task::spawn_blocking(move || xfer::store::scan::scan(&dir, chunk_size, &|_| {}))
            .await??;
    let m = tree.manifest;
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &m.to_doc())?;
        println!();
    } else {
        print_manifest(&m, started.elapsed());
    }
    Ok(ExitCode::SUCCESS)
}

/// `xfer verify`.
pub async fn verify(args: VerifyArgs) -> Result<ExitCode> {
    let VerifyArgs {
        dir,
        manifest,
        json,
    } = args;
    let m = match manifest {
        Some(p) => Manifest::load_json(&p)?,
        None => xfer::store::verify::recorded_manifest(&dir)?,
    };
    let r = tokio::task::spawn_blocking(move || xfer::store::verify::verify(&dir, &m)).await??;
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &r)?;
        println!();
    } else {
        for p in &r.missing {
            println!("missing   {p}");
        }
        for m in &r.mismatched {
            println!("mismatch  {}: {} {:?}", m.path, m.reason, m.bad_chunks);
        }
        println!(
            "{} root {}: {} files, {}",
            if r.ok { "ok" } else { "FAILED" },
            r.root,
            r.files,
            Bytes(r.bytes)
        );
    }
    if !r.ok {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `xfer doctor`.
pub async fn doctor(args: DoctorArgs) -> Result<ExitCode> {
    let DoctorArgs { json, sys, proc } = args;
    let report = xfer::sysinfo::doctor::gather(&sys, &proc);
    let text = if json {
        let mut t = serde_json::to_string(&report)?;
        t.push('\n');
        t
    } else {
        xfer::sysinfo::doctor::render(&report)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write the report to stdout (was the pipe closed?)")?;
    Ok(ExitCode::SUCCESS)
}

fn print_manifest(m: &Manifest, took: Duration) {
    for e in &m.entries {
        match e {
            Entry::File(f) => println!("{}  {}", f.hash, f.path),
            Entry::Symlink { path, target } => println!("{:<64}  {path} -> {target}", "symlink"),
            Entry::Dir { path } => println!("{:<64}  {path}/", "dir"),
        }
    }
    let bytes = m.total_bytes();
    eprintln!(
        "root {}  {} files, {}, chunk {}, hashed in {:.2}s ({:.2} GB/s)",
        m.root(),
        m.file_count(),
        Bytes(bytes),
        Bytes(m.chunk_size),
        took.as_secs_f64(),
        bytes as f64 / took.as_secs_f64().max(1e-9) / 1e9
    );
}
