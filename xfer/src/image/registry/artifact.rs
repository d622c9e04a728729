//! OCI model artifacts as a model source: a CNCF ModelPack artifact (what
//! `modctl build` writes: an OCI manifest whose `artifactType` is
//! [`MANIFEST_TYPE`] and whose config is [`CONFIG_TYPE`]) fetched from its
//! registry and placed as a model folder. ModelPack rather than KitOps'
//! ModelKit: it is the CNCF's, Harbor and Kubernetes image volumes serve
//! it, and each layer names its own file path.
//!
//! Each layer is checked against its digest (by the registry client), then
//! placed under the folder: a `.raw` layer is one file, at the path its
//! [`FILEPATH`] annotation names; a `.tar` layer holds files (and folders)
//! at their paths. A path that leaves the folder (`..`, absolute), a link
//! of any kind, or a layer of another media type is refused in one line
//! before anything of it is placed. Files are written beside the folder
//! and renamed in, never through a symlink; under an agent's root (a
//! [`Registry::confined`] client's plan) every path is resolved beneath it
//! ([`crate::image::files`]).
//!
//! A registry states each layer's size, and nothing is fetched before the
//! sizes are checked: their sum must fit in 64 bits (a manifest whose sum
//! overflows is refused, naming it), and the disk must have room for what
//! is still to be fetched ([`check_space`], one line with both numbers).
//! Layers are fetched [`LANES`] at once ([`prefetch`]), so that a model of
//! many small files does not wait for the registry one file at a time.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xfer_proto::image::Digest;
use xfer_proto::relpath::RelPath;
use xfer_proto::units::Bytes;

use super::client::{Refused, Registry};
use super::manifest::{Descriptor, ImageManifest, Platform};
use crate::image::archive;
use crate::image::files::{self, Files};

/// A ModelPack manifest's `artifactType`.
pub const MANIFEST_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
/// A ModelPack config's media type.
pub const CONFIG_TYPE: &str = "application/vnd.cncf.model.config.v1+json";
/// The layer annotation that names a file's path in the model.
pub const FILEPATH: &str = "org.cncf.model.filepath";
/// The kinds of ModelPack layer (`application/vnd.cncf.model.KIND.v1.*`).
const KINDS: &[&str] = &["weight", "weight.config", "doc", "code", "dataset"];

/// How a layer holds its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packing {
    /// The file itself.
    Raw,
    /// A tar of files.
    Tar,
}

/// The media types read, for messages.
pub fn accepted() -> String {
    "application/vnd.cncf.model.{weight,weight.config,doc,code,dataset}.v1.{raw,tar}".into()
}

/// Why a layer's media type is not read: the type and what is wrong
/// with it.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("a layer of media type `{media}` {why} (xfer reads {accepted})", accepted = accepted())]
pub struct MediaError {
    /// The layer's media type.
    pub media: String,
    /// What is wrong with it, as words after the type.
    pub why: &'static str,
}

/// Why a raw layer names no file xfer places.
#[derive(Debug, thiserror::Error)]
pub enum RawPathError {
    /// The layer has no path annotation.
    #[error("raw layer {0} has no `{FILEPATH}` annotation, so it names no file")]
    Unnamed(Digest),
    /// The path it names is refused.
    #[error("layer {digest}'s path `{}` is refused ({why}): an artifact's files stay inside the model folder", .path.escape_default())]
    Refused {
        /// The layer.
        digest: Digest,
        /// The path it names.
        path: String,
        /// Why it is refused.
        why: xfer_proto::relpath::PathError,
    },
}

/// How `media` packs its files, or why it is not read.
fn packing(media: &str) -> Result<Packing, MediaError> {
    let refuse = |why: &'static str| MediaError {
        media: media.to_string(),
        why,
    };
    let rest = media
        .strip_prefix("application/vnd.cncf.model.")
        .ok_or_else(|| refuse("is not a ModelPack layer"))?;
    let (kind, pack) = rest
        .rsplit_once(".v1.")
        .ok_or_else(|| refuse("is not a ModelPack layer"))?;
    if !KINDS.contains(&kind) {
        return Err(refuse("is of a kind xfer does not know"));
    }
    match pack {
        "raw" => Ok(Packing::Raw),
        "tar" => Ok(Packing::Tar),
        "tar+gzip" | "tar+zstd" => Err(refuse(
            "is compressed, which xfer does not read yet; build the artifact without compression (modctl build --raw, or plain tar layers)",
        )),
        _ => Err(refuse("is not a packing xfer knows")),
    }
}

/// What a model artifact pull placed.
#[derive(Debug, serde::Serialize)]
pub struct ArtifactSummary {
    /// The manifest's digest.
    pub manifest: Digest,
    /// Files placed.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes downloaded from the registry this run (0: all cached).
    pub bytes_fetched: u64,
}

/// How a raw layer's file is made from its blob in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placing {
    /// A copy: the folder is the user's, the cache stays intact whatever
    /// is done to it.
    Copy,
    /// A hard link to the blob (a copy where the file system cannot): for
    /// a staging folder that lives and goes with its cache, so the model
    /// takes its room once.
    Link,
}

/// A ModelPack artifact's manifest, checked before a byte is fetched: its
/// layers, each read or refused by media type, each raw layer's path safe.
pub struct ModelPlan {
    /// The reference, for messages.
    image: String,
    /// The manifest's digest.
    pub manifest: Digest,
    layers: Vec<(Descriptor, Packing)>,
    /// The layers' declared bytes, summed without overflow.
    total: u64,
    /// How the blob cache and the model folder are reached.
    files: Files,
}

impl ModelPlan {
    /// Every layer in the manifest's order, with the path of its file
    /// when it is a raw layer (one file of the model; `None`: a tar).
    pub fn layers(&self) -> Vec<(&Descriptor, Option<RelPath>)> {
        self.layers
            .iter()
            .map(|(l, p)| (l, (*p == Packing::Raw).then(|| raw_path(l).ok()).flatten()))
            .collect()
    }

    /// The bytes of every layer, as the manifest declares them (their sum
    /// was checked to fit when the plan was made).
    pub fn bytes(&self) -> u64 {
        self.total
    }

    /// The bytes still to be fetched into the blob cache `cache`: each
    /// distinct layer's declared size, less what its blob or partial file
    /// there holds.
    pub fn to_fetch(&self, cache: &Path) -> u64 {
        let mut seen = std::collections::BTreeSet::new();
        let mut need = 0u64;
        for (l, _) in &self.layers {
            if !seen.insert(l.digest) || archive::holds_in(&self.files, cache, &l.digest, l.size) {
                continue;
            }
            let part = Registry::partial_path(cache, l);
            let have = match self.files.len(&part) {
                Ok(Some(n)) => n.min(l.size),
                _ => 0,
            };
            // Below the checked total, so it cannot overflow.
            need = need.saturating_add(l.size - have);
        }
        need
    }
}

/// Too little room on a disk for what a pull is to write there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSpace {
    /// The bytes it is to write.
    pub need: u64,
    /// The bytes free there.
    pub have: u64,
    /// The folder they were to go to.
    pub dir: PathBuf,
}

impl NoSpace {
    /// One line: `what` (the pull) needs this much and has that much under
    /// the folder; `fix` says what to do.
    pub fn line(&self, what: &str, fix: &str) -> String {
        format!(
            "not enough disk space for {what}: need {} ({} bytes), have {} under {}; {fix}",
            Bytes(self.need),
            self.need,
            Bytes(self.have),
            self.dir.display()
        )
    }
}

/// The nearest folder of `p` that exists (`p` itself, or an ancestor).
fn existing(p: &Path) -> PathBuf {
    let mut cur = p;
    loop {
        if cur.is_dir() {
            return cur.to_path_buf();
        }
        match cur.parent() {
            Some(up) if !up.as_os_str().is_empty() => cur = up,
            _ => return PathBuf::from("."),
        }
    }
}

/// Checks, before a byte is fetched, that the disk of the blob cache
/// `cache` has room for what `plan` still has to fetch there, and, when
/// the files are copied into `copy_to` (a folder of the operator's), that
/// its disk has room for them too (both on one disk: for both).
pub fn check_space(plan: &ModelPlan, cache: &Path, copy_to: Option<&Path>) -> Result<(), NoSpace> {
    use std::os::unix::fs::MetadataExt;
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let at = existing(cache);
    let mut checks = vec![(at.clone(), plan.to_fetch(cache), dev(&at))];
    if let Some(dest) = copy_to {
        let d = existing(dest);
        let dd = dev(&d);
        match checks.iter_mut().find(|(_, _, c)| c.is_some() && *c == dd) {
            Some(same) => same.1 = same.1.saturating_add(plan.total),
            None => checks.push((d, plan.total, dd)),
        }
    }
    for (dir, need, _) in checks {
        if need == 0 {
            continue;
        }
        // A disk that cannot be asked is not refused here: a write that
        // finds it full says so.
        let Ok(have) = crate::store::free_space(&dir) else {
            continue;
        };
        if need > have {
            return Err(NoSpace { need, have, dir });
        }
    }
    Ok(())
}

/// Reads and checks the manifest of the model artifact `reg` names.
pub async fn plan_model(reg: &Registry) -> Result<ModelPlan> {
    let resolved = reg.resolve(&Platform::host()).await?;
    plan_of(
        &reg.image().to_string(),
        &resolved.manifest,
        resolved.digest,
        reg.files(),
    )
}

/// The plan of the manifest `m` (of digest `digest`) of `image`, or why it
/// is refused; its files are reached through `files`.
fn plan_of(image: &str, m: &ImageManifest, digest: Digest, files: &Files) -> Result<ModelPlan> {
    let is_model =
        m.artifact_type.as_deref() == Some(MANIFEST_TYPE) || m.config.media_type == CONFIG_TYPE;
    if !is_model {
        return Err(Refused(format!(
            "{image} is not a ModelPack model artifact (artifactType `{}`, config `{}`); xfer reads artifacts of type {MANIFEST_TYPE} (modctl's), and `xfer image pull` takes images",
            m.artifact_type.as_deref().unwrap_or("none"),
            m.config.media_type
        ))
        .into());
    }
    let mut layers = Vec::with_capacity(m.layers.len());
    let mut paths = std::collections::BTreeSet::new();
    let mut total = 0u64;
    for l in &m.layers {
        total = total.checked_add(l.size).ok_or_else(|| {
            Refused(format!(
                "{image}: manifest {digest} declares layers of more than {} bytes in all, more than any disk holds: the registry is broken or hostile; xfer fetches nothing of it",
                u64::MAX
            ))
        })?;
        let p = packing(&l.media_type).map_err(|why| Refused(format!("{image}: {why}")))?;
        if p == Packing::Raw {
            let rel = raw_path(l).map_err(|why| Refused(format!("{image}: {why}")))?;
            if !paths.insert(rel.clone()) {
                return Err(Refused(format!(
                    "{image}: two layers are both `{rel}`; a model's files each have one layer"
                ))
                .into());
            }
        }
        layers.push((l.clone(), p));
    }
    Ok(ModelPlan {
        image: image.to_string(),
        manifest: digest,
        layers,
        total,
        files: files.clone(),
    })
}

/// Places the files of `plan`'s layers, all in the blob cache `cache`,
/// under `dest`: the number of files and their bytes. They are durable
/// when it returns (one `syncfs` for them all, not one fsync a file).
pub async fn place_model(
    plan: &ModelPlan,
    cache: &Path,
    dest: &Path,
    placing: Placing,
) -> Result<(usize, u64)> {
    let into = Into {
        files: plan.files.clone(),
        dest: dest.to_path_buf(),
    };
    if into.files.is_beneath() {
        into.files.create_dir_all(dest).map_err(local)?;
    } else {
        std::fs::create_dir_all(dest)
            .with_context(|| format!("cannot create {}", dest.display()))?;
    }
    let cache = cache.to_path_buf();
    let layers = plan.layers.clone();
    let image = plan.image.clone();
    // A dropped placement (a cancelled job, whose folder goes) stops at
    // its next file rather than making the folder again.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let _stop = StopOnDrop(stop.clone());
    tokio::task::spawn_blocking(move || -> Result<(usize, u64)> {
        let (mut files, mut bytes) = (0, 0);
        for (l, p) in &layers {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                anyhow::bail!("{image}: the placement was stopped");
            }
            let blob = archive::blob_path(&cache, &l.digest);
            let (f, b) = match p {
                Packing::Tar => untar(&blob, &into).map_err(|e| {
                    if files::planted(&e).is_some() {
                        return local_any(e);
                    }
                    match e.downcast::<Refused>() {
                        Ok(r) => Refused(format!("{image}: layer {}: {r}", l.digest)).into(),
                        Err(e) => anyhow::anyhow!("{image}: layer {}: {e:#}", l.digest),
                    }
                })?,
                Packing::Raw => {
                    let rel = raw_path(l)?;
                    (
                        1,
                        place_file(&blob, &into, &rel, placing).map_err(local_any)?,
                    )
                }
            };
            files += f;
            bytes += b;
        }
        // The files' bytes and renames, durable at once.
        into.files.syncfs(&into.dest).map_err(local)?;
        Ok((files, bytes))
    })
    .await?
}

/// A model folder files are placed in, and how its paths are reached.
struct Into {
    files: Files,
    dest: PathBuf,
}

impl Into {
    /// Makes the folders between the model folder, which must be there
    /// (a removed one is not made again), and the file `to`.
    fn make_parent(&self, to: &Path) -> std::io::Result<()> {
        if !self.files.is_dir(&self.dest)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} was removed", self.dest.display()),
            ));
        }
        self.files
            .create_dir_all(to.parent().expect("under the folder"))
    }
}

/// A symlink planted where a file was to go: a [`Refused`] naming it.
fn local(e: std::io::Error) -> anyhow::Error {
    match crate::util::beneath::Planted::of(&e) {
        Some(p) => Refused(p.to_string()).into(),
        None => e.into(),
    }
}

/// [`local`], for an error whose chain may hold the planted symlink.
fn local_any(e: anyhow::Error) -> anyhow::Error {
    match files::planted(&e) {
        Some(p) => Refused(p.to_string()).into(),
        None => e,
    }
}

/// Layers fetched at once by [`prefetch`].
pub const LANES: usize = 8;

/// Fetches the distinct layers of `plan` of at most `max_size` bytes that
/// the blob cache `cache` lacks, [`LANES`] at once (a model of many small
/// files waits for one registry round trip per [`LANES`] files, not per
/// file), the small ones as one batch made durable by one `syncfs` at the
/// end ([`Registry::blob_batched`]); the bytes downloaded. The first
/// failure stops the lanes from taking more, and is returned.
pub async fn prefetch(
    reg: &Registry,
    plan: &ModelPlan,
    cache: &Path,
    max_size: u64,
) -> Result<u64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let mut seen = std::collections::BTreeSet::new();
    let todo: Vec<&Descriptor> = plan
        .layers
        .iter()
        .map(|(l, _)| l)
        .filter(|l| l.size <= max_size && seen.insert(l.digest))
        .collect();
    let (next, fetched, stop) = (
        AtomicUsize::new(0),
        AtomicU64::new(0),
        AtomicBool::new(false),
    );
    let (next, fetched, stop, todo) = (&next, &fetched, &stop, &todo);
    let lane = move || async move {
        while !stop.load(Ordering::Relaxed) {
            let Some(l) = todo.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            match reg.blob_batched(l, cache).await {
                Ok(n) => {
                    fetched.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(())
    };
    let lanes = tokio::join!(
        lane(),
        lane(),
        lane(),
        lane(),
        lane(),
        lane(),
        lane(),
        lane()
    );
    let [a, b, c, d, e, f, g, h] = [
        lanes.0, lanes.1, lanes.2, lanes.3, lanes.4, lanes.5, lanes.6, lanes.7,
    ];
    const _: () = assert!(LANES == 8, "one lane per future joined");
    // What came in is made durable and trusted, even when a lane failed.
    let settled = reg.settle(cache).await;
    for r in [a, b, c, d, e, f, g, h] {
        r?;
    }
    settled?;
    Ok(fetched.load(Ordering::Relaxed))
}

/// Fetches the model artifact `reg` names into the blob cache `cache` and
/// places its files under `dest`.
pub async fn pull_model(
    reg: &Registry,
    cache: &Path,
    dest: &Path,
    placing: Placing,
) -> Result<ArtifactSummary> {
    // Everything is checked before the first byte is placed, and the
    // disks before the first byte is fetched.
    let plan = plan_model(reg).await?;
    let copy_to = (placing == Placing::Copy).then_some(dest);
    check_space(&plan, cache, copy_to).map_err(|n| {
        Refused(n.line(
            &format!("{} (manifest {})", plan.image, plan.manifest),
            "free some there, or point XDG_CACHE_HOME (the blob cache) and --local-dir at a larger disk",
        ))
    })?;
    let fetched = prefetch(reg, &plan, cache, u64::MAX).await?;
    let (files, bytes) = place_model(&plan, cache, dest, placing).await?;
    Ok(ArtifactSummary {
        manifest: plan.manifest,
        files,
        bytes,
        bytes_fetched: fetched,
    })
}

/// The path a raw layer's annotation names, checked.
fn raw_path(l: &Descriptor) -> Result<RelPath, RawPathError> {
    let p = l
        .annotations
        .get(FILEPATH)
        .ok_or(RawPathError::Unnamed(l.digest))?;
    RelPath::new(p.trim_start_matches("./")).map_err(|why| RawPathError::Refused {
        digest: l.digest,
        path: p.clone(),
        why,
    })
}

/// Copies (or links, see [`Placing`]) `src` to `rel` under `into` (a
/// temporary file beside it, renamed in, never through a symlink); returns
/// its bytes.
fn place_file(src: &Path, into: &Into, rel: &RelPath, placing: Placing) -> Result<u64> {
    if into.files.is_beneath() {
        let to = rel.under(&into.dest);
        let fs = &into.files;
        into.make_parent(&to)?;
        let tmp = files::temp_beside(&to);
        if placing == Placing::Link && fs.hard_link(src, &tmp).is_ok() {
            let len = fs.len(&tmp)?.unwrap_or(0);
            return finish_beneath(fs, &tmp, &to).map(|()| len);
        }
        let mut from = fs.open_read(src)?;
        return write_placed(&mut from, into, rel);
    }
    let dest = into.dest.as_path();
    if placing == Placing::Link {
        let tmp = tempfile::Builder::new()
            .prefix(".xfer-link-")
            .make_in(dest, |p| std::fs::hard_link(src, p));
        if let Ok(tmp) = tmp {
            let len = std::fs::metadata(tmp.path())?.len();
            let tmp = tmp.into_temp_path();
            crate::store::place::place(dest, rel, |to| std::fs::rename(&tmp, to))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let _ = tmp.keep();
            return Ok(len);
        }
    }
    let mut from = std::fs::File::open(src)?;
    write_placed(&mut from, into, rel)
}

/// Renames `tmp` over `to` beneath the root; `tmp` goes if that fails.
fn finish_beneath(fs: &Files, tmp: &Path, to: &Path) -> Result<()> {
    if let Err(e) = fs.rename_lazy(tmp, to) {
        let _ = fs.remove_file(tmp);
        return Err(e.into());
    }
    Ok(())
}

/// Writes what `r` yields to `rel` under `into`, as [`place_file`] does.
fn write_placed(r: &mut impl std::io::Read, into: &Into, rel: &RelPath) -> Result<u64> {
    if into.files.is_beneath() {
        let to = rel.under(&into.dest);
        let fs = &into.files;
        into.make_parent(&to)?;
        let tmp = files::temp_beside(&to);
        let mut f = fs.create_new(&tmp)?;
        let n = std::io::copy(r, &mut f);
        drop(f);
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                let _ = fs.remove_file(&tmp);
                return Err(e.into());
            }
        };
        return finish_beneath(fs, &tmp, &to).map(|()| n);
    }
    let dest = into.dest.as_path();
    let mut tmp = tempfile::NamedTempFile::new_in(dest)?;
    let n = std::io::copy(r, &mut tmp)?;
    tmp.flush()?;
    let tmp = tmp.into_temp_path();
    crate::store::place::place(dest, rel, |to| std::fs::rename(&tmp, to))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let _ = tmp.keep();
    Ok(n)
}

/// Places the regular files of the tar at `blob` under `dest`; folders are
/// made as needed, links and anything else refused. The whole tar is read
/// once before anything is placed, so a refused entry places nothing.
fn untar(blob: &Path, into: &Into) -> Result<(usize, u64)> {
    let open = || into.files.open_read(blob);
    let mut paths = Vec::new();
    let mut folders = std::collections::HashSet::new();
    let mut a = tar::Archive::new(open()?);
    for e in a.entries()? {
        let e = e?;
        let raw = e.path()?.to_string_lossy().to_string();
        let name = raw.trim_start_matches("./").trim_end_matches('/');
        match e.header().entry_type() {
            tar::EntryType::Directory => {
                if !name.is_empty() {
                    RelPath::new(name).map_err(|why| leaves(&raw, &why.to_string()))?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                paths.push(RelPath::new(name).map_err(|why| leaves(&raw, &why.to_string()))?);
            }
            other => {
                return Err(Refused(format!(
                    "`{}` is a {other:?} entry; xfer places only files and folders from an artifact (no links)",
                    raw.escape_default()
                ))
                .into())
            }
        }
        if !name.is_empty() && e.header().entry_type() == tar::EntryType::Directory {
            folders.insert(name.to_string());
        }
    }
    // A name both a file and a folder (`sub/x`, then `sub/x/y`) could not
    // be placed whole: refused before the first file, like a bad path.
    for p in &paths {
        let mut at = p.as_str();
        while let Some((parent, _)) = at.rsplit_once('/') {
            folders.insert(parent.to_string());
            at = parent;
        }
    }
    if let Some(p) = paths.iter().find(|p| folders.contains(p.as_str())) {
        return Err(Refused(format!(
            "`{}` is both a file and a folder in this layer; an artifact's layer must name each path once",
            p.as_str().escape_default()
        ))
        .into());
    }
    let mut a = tar::Archive::new(open()?);
    let (mut files, mut bytes) = (0, 0);
    let mut it = paths.iter();
    for e in a.entries()? {
        let mut e = e?;
        if matches!(
            e.header().entry_type(),
            tar::EntryType::Regular | tar::EntryType::Continuous
        ) {
            let rel = it.next().context("the tar changed while it was read")?;
            bytes += write_placed(&mut e, into, rel)?;
            files += 1;
        }
    }
    Ok((files, bytes))
}

fn leaves(path: &str, why: &str) -> anyhow::Error {
    Refused(format!(
        "`{}` is refused ({why}): an artifact's files stay inside the model folder",
        path.escape_default()
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modelpack_media_types_are_read_or_refused_by_name() {
        assert_eq!(
            packing("application/vnd.cncf.model.weight.v1.raw"),
            Ok(Packing::Raw)
        );
        assert_eq!(
            packing("application/vnd.cncf.model.weight.config.v1.tar"),
            Ok(Packing::Tar)
        );
        assert_eq!(
            packing("application/vnd.cncf.model.doc.v1.tar"),
            Ok(Packing::Tar)
        );
        let gz = packing("application/vnd.cncf.model.weight.v1.tar+gzip").unwrap_err();
        let gz = gz.to_string();
        assert!(gz.contains("compressed") && gz.contains("tar+gzip"), "{gz}");
        let other = packing("application/vnd.kitops.modelkit.model.v1.tar").unwrap_err();
        assert!(
            other.to_string().contains("is not a ModelPack layer"),
            "{other}"
        );
        assert!(packing("application/vnd.cncf.model.secret.v1.raw").is_err());
    }

    /// A ModelPack manifest of raw layers of the given declared sizes.
    fn manifest(sizes: &[u64]) -> ImageManifest {
        let layers: Vec<serde_json::Value> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                serde_json::json!({
                    "mediaType": "application/vnd.cncf.model.weight.v1.raw",
                    "digest": format!("sha256:{}", format!("{i:x}").repeat(64).get(..64).unwrap()),
                    "size": n,
                    "annotations": {FILEPATH: format!("w{i}.bin")},
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "artifactType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": format!("sha256:{}", "c".repeat(64)), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn declared_sizes_that_overflow_are_refused_naming_the_manifest() {
        let d = Digest([7; 32]);
        let e = plan_of(
            "reg/evil:v1",
            &manifest(&[1 << 63, 1 << 63]),
            d,
            &Files::plain(),
        )
        .err()
        .unwrap();
        assert!(e.is::<Refused>(), "{e}");
        let e = e.to_string();
        assert!(
            e.contains(&d.to_string()) && e.contains("reg/evil:v1"),
            "{e}"
        );
        let ok = plan_of(
            "reg/ok:v1",
            &manifest(&[1 << 62, 1 << 62, 5]),
            d,
            &Files::plain(),
        );
        assert_eq!(ok.unwrap().bytes(), (1 << 63) + 5);
    }

    #[test]
    fn a_layer_larger_than_the_disk_is_refused_before_a_byte_and_a_part_counts() {
        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("cache");
        let huge = plan_of(
            "r/h:1",
            &manifest(&[1 << 40, 10]),
            Digest([1; 32]),
            &Files::plain(),
        )
        .unwrap();
        let n = check_space(&huge, &cache, None).unwrap_err();
        assert_eq!(n.need, (1 << 40) + 10);
        assert!(n.have < n.need && n.dir == t.path(), "{n:?}");
        let line = n.line("r/h:1", "free some");
        assert!(
            line.contains("need 1.0 TiB") && line.contains("have "),
            "{line}"
        );
        // What a partial file holds is not fetched again.
        let small = plan_of(
            "r/s:1",
            &manifest(&[10, 20]),
            Digest([1; 32]),
            &Files::plain(),
        )
        .unwrap();
        let (l, _) = &small.layers[1];
        let part = Registry::partial_path(&cache, l);
        std::fs::create_dir_all(part.parent().unwrap()).unwrap();
        std::fs::write(&part, [0u8; 15]).unwrap();
        assert_eq!(small.to_fetch(&cache), 10 + 5);
        assert!(check_space(&small, &cache, Some(t.path())).is_ok());
    }

    #[test]
    fn a_tar_with_a_path_out_or_a_link_places_nothing() {
        let t = tempfile::tempdir().unwrap();
        let dest = t.path().join("m");
        std::fs::create_dir_all(&dest).unwrap();
        let mk = |entries: &[(&str, Option<&str>)]| {
            let p = t.path().join(format!("t{}.tar", entries.len()));
            let mut b = tar::Builder::new(std::fs::File::create(&p).unwrap());
            for (name, link) in entries {
                let mut h = tar::Header::new_gnu();
                match link {
                    None => {
                        h.set_size(3);
                        h.set_entry_type(tar::EntryType::Regular);
                        h.set_mode(0o644);
                        // `append_data` refuses `..`; write the name raw.
                        h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
                        h.set_cksum();
                        b.append(&h, &b"abc"[..]).unwrap();
                    }
                    Some(to) => {
                        h.set_size(0);
                        h.set_entry_type(tar::EntryType::Symlink);
                        h.set_mode(0o777);
                        b.append_link(&mut h, name, to).unwrap();
                    }
                }
            }
            b.finish().unwrap();
            p
        };
        let ok = mk(&[("config.json", None), ("sub/w.bin", None)]);
        let dest_dir = dest.clone();
        let dest = Into {
            files: Files::plain(),
            dest: dest_dir.clone(),
        };
        assert_eq!(untar(&ok, &dest).unwrap(), (2, 6));
        let dest = &dest_dir;
        let plain = Into {
            files: Files::plain(),
            dest: dest.clone(),
        };
        assert_eq!(std::fs::read(dest.join("sub/w.bin")).unwrap(), b"abc");
        let out = mk(&[("a.json", None), ("../../evil", None), ("b.json", None)]);
        let e = untar(&out, &plain).unwrap_err().to_string();
        assert!(e.contains("stay inside the model folder"), "{e}");
        assert!(!dest.join("a.json").exists(), "nothing placed");
        let link = mk(&[("x", Some("/etc/passwd"))]);
        let e = untar(&link, &plain).unwrap_err().to_string();
        assert!(e.contains("no links"), "{e}");
        assert!(!dest.join("x").exists());
        // A path both a file and a folder: refused before `sub/x` is placed.
        let clash = mk(&[("c.json", None), ("sub/x", None), ("sub/x/y", None)]);
        let e = untar(&clash, &plain).unwrap_err().to_string();
        assert!(e.contains("both a file and a folder"), "{e}");
        assert!(!dest.join("c.json").exists() && !dest.join("sub/x").exists());
    }
}
