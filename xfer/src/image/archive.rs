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
//!
//! The cache is trusted only as far as it is checked: beside each blob a
//! stamp (`.stamps/sha256-<hex>`: device, inode, size, mtime, ctime) records
//! the file as it was when its digest was known. A blob whose stamp no
//! longer matches is hashed again before it is used ([`cached`]), or
//! replaced by the fresh copy of a save ([`unpack`]); one that no longer
//! hashes to its digest is discarded, so the image is saved again rather
//! than a damaged blob sent on every push. Blobs, stamps and image records
//! are written durably (fsync, rename, folder fsync); a batch of small
//! blobs from a registry is made durable at once (one `syncfs`) before
//! any of them is stamped ([`stamp_batch_in`]).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::files::Files;
use crate::util::beneath::{create_dir_all_durable, rename_durable, write_file_durable};
use crate::util::stamp::FileStamp;
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
    create_dir_all_durable(dir).with_context(|| format!("cannot create {}", dir.display()))?;
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
        diff_ids: Vec::new(),
    };
    desc.check().map_err(anyhow::Error::msg)?;
    // Files the manifest does not name (a legacy `<id>/json`, the OCI
    // index) were kept as blobs too; drop the ones no image needs.
    for (path, (d, _)) in &held {
        if !desc.blobs().any(|b| b.digest == *d) {
            discard(dir, d);
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

/// Copies one entry into `dir` under its own sha256 (durably: a temporary
/// file fsynced, renamed in, its folder fsynced); a blob already there is
/// kept only if its stamp says it is unchanged since its digest was
/// known, and otherwise replaced by this copy.
fn keep_blob(r: &mut impl Read, dir: &Path) -> Result<(Digest, u64)> {
    let tmp_dir = dir.join(".incoming");
    create_dir_all_durable(&tmp_dir)?;
    let tmp = tempfile::NamedTempFile::new_in(&tmp_dir)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file());
    let (digest, n) = super::sha256_copy(r, &mut out)?;
    out.flush()?;
    drop(out);
    let dest = blob_path(dir, &digest);
    if stamp_holds(dir, &digest, n) {
        return Ok((digest, n));
    }
    tmp.as_file().sync_all()?;
    let parent = dest.parent().expect("a blob path has a folder");
    create_dir_all_durable(parent)?;
    let tmp = tmp.into_temp_path();
    rename_durable(&tmp, &dest)?;
    // Renamed away: nothing is left for the guard to remove.
    let _ = tmp.keep();
    write_stamp(dir, &digest)?;
    Ok((digest, n))
}

/// Whether the cache at `dir` holds blob `d` of `size` bytes, unchanged
/// since its digest was checked.
pub fn holds(dir: &Path, d: &Digest, size: u64) -> bool {
    holds_in(&Files::plain(), dir, d, size)
}

/// [`holds`], the blob and its stamp reached through `files` (a blob or
/// stamp that is a symlink is not held).
pub fn holds_in(files: &Files, dir: &Path, d: &Digest, size: u64) -> bool {
    let blob = blob_path(dir, d);
    if !matches!(files.len(&blob), Ok(Some(n)) if n == size) {
        return false;
    }
    let Ok(now) = files.open_read(&blob).and_then(|f| f.metadata()) else {
        return false;
    };
    let now = FileStamp::from_meta(&now);
    let recorded = files
        .read(&stamp_path(dir, d))
        .ok()
        .and_then(|b| serde_json::from_slice::<FileStamp>(&b).ok());
    now.size() == size && recorded.as_ref() == Some(&now)
}

/// Puts the file at `verified`, whose sha256 the caller just found to be
/// `d`, into the cache at `dir` as that blob (durably, with its stamp).
pub fn adopt_blob(dir: &Path, d: &Digest, verified: &Path) -> Result<()> {
    adopt_blob_in(&Files::plain(), dir, d, verified)
}

/// [`adopt_blob`], every file reached through `files`.
pub fn adopt_blob_in(files: &Files, dir: &Path, d: &Digest, verified: &Path) -> Result<()> {
    let dest = blob_path(dir, d);
    let parent = dest.parent().expect("a blob path has a folder");
    files.create_dir_all(parent)?;
    files.open_read(verified)?.sync_all()?;
    files.rename(verified, &dest)?;
    let stamp = FileStamp::from_meta(&files.open_read(&dest)?.metadata()?);
    files
        .write_durable(&stamp_path(dir, d), &serde_json::to_vec(&stamp)?)
        .with_context(|| format!("cannot record blob {d} in {}", dir.display()))
}

/// [`adopt_blob_in`] for a batch of small blobs: nothing is fsynced, and
/// no stamp is written (a blob without one is never trusted: a crash
/// before [`stamp_batch_in`] costs its fetch again, never a damaged blob).
pub fn adopt_blob_lazy_in(files: &Files, dir: &Path, d: &Digest, verified: &Path) -> Result<()> {
    let dest = blob_path(dir, d);
    files.mkdir_lazy(dest.parent().expect("a blob path has a folder"))?;
    files.rename_lazy(verified, &dest)?;
    Ok(())
}

/// Stamps the blobs `ds` of the cache at `dir` that [`adopt_blob_lazy_in`]
/// placed: first the file system is synced (the blobs are durable), then
/// the stamps are written, then synced again: two `syncfs` for the batch.
pub fn stamp_batch_in(files: &Files, dir: &Path, ds: &[Digest]) -> Result<()> {
    if ds.is_empty() {
        return Ok(());
    }
    files.syncfs(dir)?;
    let stamps = dir.join(".stamps");
    files.create_dir_all(&stamps)?;
    for d in ds {
        let meta = files.open_read(&blob_path(dir, d))?.metadata()?;
        let bytes = serde_json::to_vec(&FileStamp::from_meta(&meta))?;
        let to = stamp_path(dir, d);
        let tmp = super::files::temp_beside(&to);
        files.create_new(&tmp)?.write_all(&bytes)?;
        files.rename_lazy(&tmp, &to)?;
    }
    files.syncfs(dir)?;
    Ok(())
}

/// Where the stamp of blob `d` is kept.
fn stamp_path(dir: &Path, d: &Digest) -> PathBuf {
    dir.join(".stamps").join(d.model().as_str())
}

/// Records blob `d` as it is now (its digest just checked).
fn write_stamp(dir: &Path, d: &Digest) -> Result<()> {
    let stamp = FileStamp::of(&blob_path(dir, d))
        .with_context(|| format!("blob {d} vanished from {}", dir.display()))?;
    write_file_durable(&stamp_path(dir, d), &serde_json::to_vec(&stamp)?, 0o644)
        .with_context(|| format!("cannot record blob {d} in {}", dir.display()))
}

/// Whether blob `d` is there with `size` bytes and unchanged since its
/// stamp was written (so its digest still holds without reading it).
fn stamp_holds(dir: &Path, d: &Digest, size: u64) -> bool {
    let Some(now) = FileStamp::of(&blob_path(dir, d)) else {
        return false;
    };
    let recorded = fs::read(stamp_path(dir, d))
        .ok()
        .and_then(|b| serde_json::from_slice::<FileStamp>(&b).ok());
    now.size() == size && recorded.as_ref() == Some(&now)
}

/// Removes blob `d` and its stamp from the cache.
fn discard(dir: &Path, d: &Digest) {
    let _ = fs::remove_file(stamp_path(dir, d));
    if let Some(folder) = blob_path(dir, d).parent() {
        let _ = fs::remove_dir_all(folder);
    }
}

/// What the cache made of blob `b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobCheck {
    /// There, and its bytes hash to its digest.
    Sound,
    /// Missing, or of another size.
    Missing,
    /// Its bytes no longer hash to its digest: discarded.
    Damaged(Digest),
}

/// Checks blob `b` of the cache: trusted as it is while its stamp holds,
/// hashed again otherwise (a damaged one is discarded; a sound one gets a
/// fresh stamp).
pub fn check_blob(dir: &Path, b: &BlobRef) -> BlobCheck {
    let path = blob_path(dir, &b.digest);
    if !path.metadata().is_ok_and(|m| m.len() == b.size) {
        return BlobCheck::Missing;
    }
    if stamp_holds(dir, &b.digest, b.size) {
        return BlobCheck::Sound;
    }
    let hashed = fs::File::open(&path).and_then(|f| super::sha256_copy(f, std::io::sink()));
    match hashed {
        Ok((d, n)) if d == b.digest && n == b.size => {
            if let Err(e) = write_stamp(dir, &b.digest) {
                tracing::warn!("{e:#}");
            }
            BlobCheck::Sound
        }
        Ok((d, _)) => {
            discard(dir, &b.digest);
            BlobCheck::Damaged(d)
        }
        Err(_) => BlobCheck::Missing,
    }
}

/// What [`cached`] found.
#[derive(Debug, Default)]
pub struct CacheLookup {
    /// The image, if every blob it names is there and sound (a re-push of
    /// the same image then skips `docker save`).
    pub desc: Option<ImageDesc>,
    /// Blobs found damaged (bytes that no longer hash to their digest) and
    /// discarded: the image must be saved again.
    pub discarded: Vec<BlobRef>,
}

/// The image described under `dir`'s `images/<id>.json`, if every blob it
/// names is still there and sound ([`check_blob`]).
pub fn cached(dir: &Path, id: &Digest, reference: &str) -> CacheLookup {
    let mut out = CacheLookup::default();
    let Some(mut desc) = fs::read(desc_path(dir, id))
        .ok()
        .and_then(|text| serde_json::from_slice::<ImageDesc>(&text).ok())
        .filter(|d| d.id() == *id)
    else {
        return out;
    };
    let mut all_sound = true;
    for b in desc.blobs() {
        match check_blob(dir, b) {
            BlobCheck::Sound => {}
            BlobCheck::Missing => all_sound = false,
            BlobCheck::Damaged(_) => {
                all_sound = false;
                out.discarded.push(b.clone());
            }
        }
    }
    if all_sound {
        desc.reference = reference.to_string();
        out.desc = Some(desc);
    }
    out
}

/// Forgets the stamps of `desc`'s blobs, so that the next push hashes each
/// again before sending it (after a node refused one as damaged: damage
/// that left the stamp alone, such as a failing disk).
pub fn distrust(dir: &Path, desc: &ImageDesc) {
    for b in desc.blobs() {
        let _ = fs::remove_file(stamp_path(dir, &b.digest));
    }
}

/// Records `desc` under `dir` (after its blobs), durably.
pub fn remember(dir: &Path, desc: &ImageDesc) -> Result<()> {
    let p = desc_path(dir, &desc.id());
    write_file_durable(&p, &serde_json::to_vec_pretty(desc)?, 0o644)
        .with_context(|| format!("cannot write {}", p.display()))
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
            cached(dir.path(), &id, "other:2").desc.unwrap().reference,
            "other:2"
        );
        fs::remove_file(blob_path(dir.path(), &desc.layers[0].digest)).unwrap();
        let lookup = cached(dir.path(), &id, "xt/app:1");
        assert!(lookup.desc.is_none(), "a blob went missing");
        assert!(lookup.discarded.is_empty());
    }

    /// Overwrites a blob with bytes of the same size (a damaged disk, a
    /// stray write), flipping one byte in the middle.
    fn damage(path: &Path) {
        let mut b = fs::read(path).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0xff;
        fs::write(path, &b).unwrap();
    }

    /// Regression (issue 30, finding 9): a same-size damaged blob passed
    /// `cached` (which checked sizes only), so every push sent it and every
    /// load failed. Now it is hashed again, discarded, and the next save
    /// rebuilds it; a save also replaces a damaged copy it finds.
    #[test]
    fn a_damaged_cached_blob_is_found_discarded_and_rebuilt_by_the_next_save() {
        let dir = tempfile::tempdir().unwrap();
        let (tar, id) = saved(&[b"base layer bytes", b"top layer bytes"], false);
        let desc = unpack(&tar[..], dir.path(), "xt/app:1", |_| ()).unwrap();
        remember(dir.path(), &desc).unwrap();
        let top = desc.layers[1].clone();
        let top_path = blob_path(dir.path(), &top.digest);
        assert!(cached(dir.path(), &id, "xt/app:1").desc.is_some());

        damage(&top_path);
        let lookup = cached(dir.path(), &id, "xt/app:1");
        assert!(lookup.desc.is_none(), "a damaged blob must not be pushed");
        assert_eq!(lookup.discarded, std::slice::from_ref(&top));
        assert!(!top_path.exists(), "the damaged blob is discarded");
        // The next save (what `xfer image push` runs on a miss) rebuilds it.
        let again = unpack(&tar[..], dir.path(), "xt/app:1", |_| ()).unwrap();
        assert_eq!(again, desc);
        assert_eq!(fs::read(&top_path).unwrap(), b"top layer bytes");
        assert!(cached(dir.path(), &id, "xt/app:1").desc.is_some());

        // A save that finds a damaged copy in place replaces it (it used
        // to keep any blob of the right size).
        damage(&top_path);
        unpack(&tar[..], dir.path(), "xt/app:1", |_| ()).unwrap();
        assert_eq!(fs::read(&top_path).unwrap(), b"top layer bytes");
        assert_eq!(check_blob(dir.path(), &top), BlobCheck::Sound);
    }

    /// A blob unchanged since its stamp is trusted without reading it;
    /// `distrust` (after a node refused a blob) makes the next check hash
    /// it again, which finds damage the stamp could not show.
    #[test]
    fn stamps_spare_rehashing_until_distrusted() {
        let dir = tempfile::tempdir().unwrap();
        let (tar, id) = saved(&[b"only layer"], false);
        let desc = unpack(&tar[..], dir.path(), "xt/app:1", |_| ()).unwrap();
        remember(dir.path(), &desc).unwrap();
        let layer = desc.layers[0].clone();
        let path = blob_path(dir.path(), &layer.digest);
        // Damage that leaves the stamp matching (as a failing disk would):
        // the stamp is rewritten to the damaged file's.
        damage(&path);
        write_stamp(dir.path(), &layer.digest).unwrap();
        assert_eq!(check_blob(dir.path(), &layer), BlobCheck::Sound);
        distrust(dir.path(), &desc);
        assert!(matches!(
            check_blob(dir.path(), &layer),
            BlobCheck::Damaged(d) if d != layer.digest
        ));
        assert!(cached(dir.path(), &id, "xt/app:1").desc.is_none());
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
