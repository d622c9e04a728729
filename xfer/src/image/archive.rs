//! The tar `docker save` (or `podman save`) writes, read as it streams
//! into content-addressed blobs under a folder, and the image it describes
//! ([`ImageDesc`]).
//!
//! Both layouts Docker writes are read: the legacy one (`manifest.json`,
//! `<config hex>.json`, `<id>/layer.tar`) and the OCI one of Docker 25 and
//! later (`blobs/sha256/<hex>`, with the same `manifest.json` beside
//! `index.json`). Every regular file is hashed as it is copied out and
//! kept under its own sha256; once `manifest.json` has said which files
//! are the config and the layers, the config's digest must be its id and
//! each layer's digest its `rootfs.diff_ids` entry, or the save is
//! refused as damaged. Memory stays bounded: metadata files are capped
//! ([`MAX_JSON`]) and blobs go straight to disk.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use xfer_proto::image::{check_reference, BlobRef, Digest, ImageDesc, BLOB_FILE, MAX_LAYERS};

/// The most a metadata file of a saved image (`manifest.json`, a config)
/// may take; a real config is a few KiB.
pub const MAX_JSON: u64 = 16 << 20;

/// Where a blob lives under a blob folder: `<dir>/sha256-<hex>/blob`.
pub fn blob_path(dir: &Path, d: &Digest) -> PathBuf {
    dir.join(d.model().as_str()).join(BLOB_FILE)
}

/// One entry of `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SavedManifest {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// The part of an image config that names its layers.
#[derive(Deserialize)]
struct Config {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// Reads a `docker save` tar of one image from `tar`, keeping every blob
/// under `dir` (existing blobs are kept as they are), and returns the
/// image `reference` names.
///
/// `kept` hears of every blob as soon as it is complete under `dir`
/// (before the image is known to be whole), so that it can be sent on.
pub fn unpack(
    tar: impl Read,
    dir: &Path,
    reference: &str,
    mut kept: impl FnMut(Digest),
) -> Result<ImageDesc> {
    check_reference(reference).map_err(anyhow::Error::msg)?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut archive = tar::Archive::new(tar);
    // Path in the tar → (digest, size) of what it held.
    let mut held: BTreeMap<String, (Digest, u64)> = BTreeMap::new();
    let mut manifest: Option<Vec<u8>> = None;
    for entry in archive.entries().context("cannot read the saved image")? {
        let mut entry = entry.context("the saved image is not a tar (truncated?)")?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if path == "manifest.json" {
            let mut v = Vec::new();
            (&mut entry).take(MAX_JSON + 1).read_to_end(&mut v)?;
            if v.len() as u64 > MAX_JSON {
                bail!("the saved image's manifest.json is over {MAX_JSON} bytes; this is not a docker save");
            }
            manifest = Some(v);
            continue;
        }
        let (digest, size) = keep_blob(&mut entry, dir).with_context(|| {
            format!(
                "cannot keep {path} of the saved image under {}",
                dir.display()
            )
        })?;
        kept(digest);
        held.insert(path, (digest, size));
    }
    let manifest = manifest.context(
        "the saved image has no manifest.json; give `xfer image push` an image as `docker save` writes it",
    )?;
    let entries: Vec<SavedManifest> = serde_json::from_slice(&manifest)
        .context("the saved image's manifest.json is malformed")?;
    let m = match entries.as_slice() {
        [one] => one,
        [] => bail!("the saved image's manifest.json lists no image"),
        _ => bail!(
            "the saved image holds {} images; save one image at a time",
            entries.len()
        ),
    };
    let lookup = |p: &str, what: &str| -> Result<(Digest, u64)> {
        held.get(p.trim_start_matches("./"))
            .copied()
            .with_context(|| {
                format!(
                    "the saved image's manifest.json names {what} {p}, which the tar does not hold"
                )
            })
    };
    let (config_digest, config_size) = lookup(&m.config, "the config")?;
    if let Some(named) = named_digest(&m.config) {
        if named != config_digest {
            bail!(
                "the saved image's config {} hashes to {config_digest}; the save is damaged, run docker save again",
                m.config
            );
        }
    }
    if config_size > MAX_JSON {
        bail!("the saved image's config is {config_size} bytes, over {MAX_JSON}");
    }
    let config: Config = serde_json::from_slice(&fs::read(blob_path(dir, &config_digest))?)
        .context("the saved image's config is malformed (no rootfs.diff_ids)")?;
    if m.layers.is_empty() || m.layers.len() > MAX_LAYERS {
        bail!(
            "the saved image has {} layers; an image has 1 to {MAX_LAYERS}",
            m.layers.len()
        );
    }
    if m.layers.len() != config.rootfs.diff_ids.len() {
        bail!(
            "the saved image lists {} layers and its config {} diff_ids; the save is damaged, run docker save again",
            m.layers.len(),
            config.rootfs.diff_ids.len()
        );
    }
    let mut layers = Vec::with_capacity(m.layers.len());
    for (i, (path, diff_id)) in m.layers.iter().zip(&config.rootfs.diff_ids).enumerate() {
        let (digest, size) = lookup(path, "the layer")?;
        let want = Digest::parse(diff_id).map_err(anyhow::Error::msg)?;
        if digest != want {
            bail!(
                "layer {i} of {reference} ({path}) hashes to {digest}, but its config says {want}: the save is damaged, or the layer is compressed (an engine with the containerd image store); run docker save again"
            );
        }
        layers.push(BlobRef { digest, size });
    }
    let _ = &m.repo_tags;
    let desc = ImageDesc {
        reference: reference.to_string(),
        config: BlobRef {
            digest: config_digest,
            size: config_size,
        },
        layers,
    };
    desc.check().map_err(anyhow::Error::msg)?;
    // Files the manifest does not name (a legacy `<id>/json`, the OCI
    // index) were kept as blobs too; drop the ones no image needs.
    for (path, (d, _)) in &held {
        if !desc.blobs().any(|b| b.digest == *d) {
            let dirp = blob_path(dir, d);
            if let Some(parent) = dirp.parent() {
                let _ = fs::remove_dir_all(parent);
            }
            tracing::debug!("dropped {path} of the saved image: not a blob of the image");
        }
    }
    Ok(desc)
}

/// `blobs/sha256/<hex>` or `<hex>.json`: the digest the name claims.
fn named_digest(path: &str) -> Option<Digest> {
    let base = path.rsplit('/').next()?;
    let hex_part = base.strip_suffix(".json").unwrap_or(base);
    Digest::parse(hex_part).ok()
}

/// Copies one entry into `dir` under its own sha256 (atomically: a
/// temporary file renamed once complete and fsynced); a blob already there
/// is kept and the copy dropped.
fn keep_blob(r: &mut impl Read, dir: &Path) -> Result<(Digest, u64)> {
    let tmp_dir = dir.join(".incoming");
    fs::create_dir_all(&tmp_dir)?;
    let tmp = tempfile::NamedTempFile::new_in(&tmp_dir)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file());
    let (digest, n) = super::sha256_copy(r, &mut out)?;
    out.flush()?;
    drop(out);
    let dest = blob_path(dir, &digest);
    if dest.metadata().is_ok_and(|m| m.len() == n) {
        return Ok((digest, n));
    }
    tmp.as_file().sync_all()?;
    let parent = dest.parent().expect("a blob path has a folder");
    fs::create_dir_all(parent)?;
    tmp.persist(&dest).map_err(|e| e.error)?;
    Ok((digest, n))
}

/// The image described under `dir`'s `images/<id>.json`, if every blob it
/// names is still there with its size (a re-push of the same image then
/// skips `docker save`).
pub fn cached(dir: &Path, id: &Digest, reference: &str) -> Option<ImageDesc> {
    let text = fs::read(desc_path(dir, id)).ok()?;
    let mut desc: ImageDesc = serde_json::from_slice(&text).ok()?;
    let all_there = desc.blobs().all(|b| {
        blob_path(dir, &b.digest)
            .metadata()
            .is_ok_and(|m| m.len() == b.size)
    });
    (all_there && desc.id() == *id).then(|| {
        desc.reference = reference.to_string();
        desc
    })
}

/// Records `desc` under `dir` (after its blobs).
pub fn remember(dir: &Path, desc: &ImageDesc) -> Result<()> {
    let p = desc_path(dir, &desc.id());
    fs::create_dir_all(p.parent().expect("has a folder"))?;
    let tmp = p.with_extension("tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(desc)?)?;
    fs::rename(&tmp, &p)?;
    Ok(())
}

fn desc_path(dir: &Path, id: &Digest) -> PathBuf {
    dir.join("images").join(format!("{}.json", id.hex()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};

    fn sha(b: &[u8]) -> Digest {
        Digest(Sha256::digest(b).into())
    }

    fn append(t: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, path, data).unwrap();
    }

    /// A legacy `docker save` of an image with the given layers.
    fn saved(layers: &[&[u8]], damage_config: bool) -> (Vec<u8>, Digest) {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha(l).to_string()).collect();
        let config = serde_json::json!({"rootfs": {"type": "layers", "diff_ids": diff_ids}});
        let config = serde_json::to_vec(&config).unwrap();
        let id = sha(&config);
        let mut t = tar::Builder::new(Vec::new());
        let cfg_name = format!("{}.json", id.hex());
        let mut stored = config.clone();
        if damage_config {
            stored[0] ^= 1;
        }
        append(&mut t, &cfg_name, &stored);
        let mut paths = Vec::new();
        for (i, l) in layers.iter().enumerate() {
            let p = format!("{i:064}/layer.tar");
            append(&mut t, &format!("{i:064}/json"), b"{}");
            append(&mut t, &p, l);
            paths.push(p);
        }
        let m =
            serde_json::json!([{"Config": cfg_name, "RepoTags": ["xt/app:1"], "Layers": paths}]);
        append(&mut t, "manifest.json", &serde_json::to_vec(&m).unwrap());
        (t.into_inner().unwrap(), id)
    }

    #[test]
    fn a_legacy_save_becomes_blobs_named_by_their_digests() {
        let dir = tempfile::tempdir().unwrap();
        let (tar, id) = saved(&[b"base layer", b"top layer"], false);
        let desc = unpack(&tar[..], dir.path(), "xt/app:1", |_| ()).unwrap();
        assert_eq!(desc.id(), id);
        assert_eq!(desc.layers.len(), 2);
        assert_eq!(desc.layers[1].digest, sha(b"top layer"));
        assert_eq!(
            fs::read(blob_path(dir.path(), &desc.layers[0].digest)).unwrap(),
            b"base layer"
        );
        // The legacy `<id>/json` files are no blobs of the image.
        let kept = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("sha256-"));
        assert_eq!(kept.count(), 3);
        remember(dir.path(), &desc).unwrap();
        assert_eq!(
            cached(dir.path(), &id, "other:2").unwrap().reference,
            "other:2"
        );
        fs::remove_file(blob_path(dir.path(), &desc.layers[0].digest)).unwrap();
        assert!(
            cached(dir.path(), &id, "xt/app:1").is_none(),
            "a blob went missing"
        );
    }

    #[test]
    fn a_damaged_save_is_refused_with_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let (tar, _) = saved(&[b"base"], true);
        let e = unpack(&tar[..], dir.path(), "xt/app:1", |_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("run docker save again"), "{e}");
        let (mut tar, _) = saved(&[b"base"], false);
        tar.truncate(tar.len() / 2);
        assert!(unpack(&tar[..], dir.path(), "xt/app:1", |_| ()).is_err());
        let e = unpack(&b"not a tar at all"[..], dir.path(), "xt/app:1", |_| ()).unwrap_err();
        assert!(
            format!("{e:#}").contains("manifest.json") || format!("{e:#}").contains("tar"),
            "{e:#}"
        );
    }
}
