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
//! and renamed in, never through a symlink.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use xfer_proto::image::Digest;
use xfer_proto::relpath::RelPath;

use super::client::{Refused, Registry};
use super::manifest::{Descriptor, Platform};
use crate::image::archive;

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

/// How `media` packs its files, or why it is not read.
fn packing(media: &str) -> Result<Packing, String> {
    let refuse = |why: &str| {
        format!(
            "a layer of media type `{media}` {why} (xfer reads {})",
            accepted()
        )
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

    /// The bytes of every layer.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|(l, _)| l.size).sum()
    }
}

/// Reads and checks the manifest of the model artifact `reg` names.
pub async fn plan_model(reg: &Registry) -> Result<ModelPlan> {
    let resolved = reg.resolve(&Platform::host()).await?;
    let m = &resolved.manifest;
    let is_model =
        m.artifact_type.as_deref() == Some(MANIFEST_TYPE) || m.config.media_type == CONFIG_TYPE;
    if !is_model {
        return Err(Refused(format!(
            "{} is not a ModelPack model artifact (artifactType `{}`, config `{}`); xfer reads artifacts of type {MANIFEST_TYPE} (modctl's), and `xfer image pull` takes images",
            reg.image(),
            m.artifact_type.as_deref().unwrap_or("none"),
            m.config.media_type
        ))
        .into());
    }
    let mut layers = Vec::with_capacity(m.layers.len());
    let mut paths = std::collections::BTreeSet::new();
    for l in &m.layers {
        let p = packing(&l.media_type).map_err(|why| Refused(format!("{}: {why}", reg.image())))?;
        if p == Packing::Raw {
            let rel = raw_path(l).map_err(|why| Refused(format!("{}: {why}", reg.image())))?;
            if !paths.insert(rel.clone()) {
                return Err(Refused(format!(
                    "{}: two layers are both `{rel}`; a model's files each have one layer",
                    reg.image()
                ))
                .into());
            }
        }
        layers.push((l.clone(), p));
    }
    Ok(ModelPlan {
        image: reg.image().to_string(),
        manifest: resolved.digest,
        layers,
    })
}

/// Places the files of `plan`'s layers, all in the blob cache `cache`,
/// under `dest`: the number of files and their bytes.
pub async fn place_model(
    plan: &ModelPlan,
    cache: &Path,
    dest: &Path,
    placing: Placing,
) -> Result<(usize, u64)> {
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    let dest = dest.to_path_buf();
    let cache = cache.to_path_buf();
    let layers = plan.layers.clone();
    let image = plan.image.clone();
    tokio::task::spawn_blocking(move || -> Result<(usize, u64)> {
        let (mut files, mut bytes) = (0, 0);
        for (l, p) in &layers {
            let blob = archive::blob_path(&cache, &l.digest);
            let (f, b) = match p {
                Packing::Tar => untar(&blob, &dest).map_err(|e| match e.downcast::<Refused>() {
                    Ok(r) => Refused(format!("{image}: layer {}: {r}", l.digest)).into(),
                    Err(e) => anyhow::anyhow!("{image}: layer {}: {e:#}", l.digest),
                })?,
                Packing::Raw => {
                    let rel = raw_path(l).map_err(anyhow::Error::msg)?;
                    (1, place_file(&blob, &dest, &rel, placing)?)
                }
            };
            files += f;
            bytes += b;
        }
        Ok((files, bytes))
    })
    .await?
}

/// Fetches the model artifact `reg` names into the blob cache `cache` and
/// places its files under `dest`.
pub async fn pull_model(
    reg: &Registry,
    cache: &Path,
    dest: &Path,
    placing: Placing,
) -> Result<ArtifactSummary> {
    // Everything is checked before the first byte is placed.
    let plan = plan_model(reg).await?;
    let mut fetched = 0;
    for (l, _) in plan.layers() {
        fetched += reg.blob(l, cache).await?;
    }
    let (files, bytes) = place_model(&plan, cache, dest, placing).await?;
    Ok(ArtifactSummary {
        manifest: plan.manifest,
        files,
        bytes,
        bytes_fetched: fetched,
    })
}

/// The path a raw layer's annotation names, checked.
fn raw_path(l: &Descriptor) -> Result<RelPath, String> {
    let p = l.annotations.get(FILEPATH).ok_or_else(|| {
        format!(
            "raw layer {} has no `{FILEPATH}` annotation, so it names no file",
            l.digest
        )
    })?;
    RelPath::new(p.trim_start_matches("./")).map_err(|e| {
        format!(
            "layer {}'s path `{}` is refused ({e}): an artifact's files stay inside the model folder",
            l.digest,
            p.escape_default()
        )
    })
}

/// Copies (or links, see [`Placing`]) `src` to `rel` under `dest` (a
/// temporary file beside it, renamed in, never through a symlink); returns
/// its bytes.
fn place_file(src: &Path, dest: &Path, rel: &RelPath, placing: Placing) -> Result<u64> {
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
    write_placed(&mut from, dest, rel)
}

/// Writes what `r` yields to `rel` under `dest`, as [`place_file`] does.
fn write_placed(r: &mut impl std::io::Read, dest: &Path, rel: &RelPath) -> Result<u64> {
    let mut tmp = tempfile::NamedTempFile::new_in(dest)?;
    let n = std::io::copy(r, &mut tmp)?;
    tmp.flush()?;
    tmp.as_file().sync_all()?;
    let tmp = tmp.into_temp_path();
    crate::store::place::place(dest, rel, |to| std::fs::rename(&tmp, to))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let _ = tmp.keep();
    Ok(n)
}

/// Places the regular files of the tar at `blob` under `dest`; folders are
/// made as needed, links and anything else refused. The whole tar is read
/// once before anything is placed, so a refused entry places nothing.
fn untar(blob: &Path, dest: &Path) -> Result<(usize, u64)> {
    let mut paths = Vec::new();
    let mut a = tar::Archive::new(std::fs::File::open(blob)?);
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
    }
    let mut a = tar::Archive::new(std::fs::File::open(blob)?);
    let (mut files, mut bytes) = (0, 0);
    let mut it = paths.iter();
    for e in a.entries()? {
        let mut e = e?;
        if matches!(
            e.header().entry_type(),
            tar::EntryType::Regular | tar::EntryType::Continuous
        ) {
            let rel = it.next().expect("the same entries");
            bytes += write_placed(&mut e, dest, rel)?;
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
        assert!(gz.contains("compressed") && gz.contains("tar+gzip"), "{gz}");
        let other = packing("application/vnd.kitops.modelkit.model.v1.tar").unwrap_err();
        assert!(other.contains("is not a ModelPack layer"), "{other}");
        assert!(packing("application/vnd.cncf.model.secret.v1.raw").is_err());
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
        assert_eq!(untar(&ok, &dest).unwrap(), (2, 6));
        assert_eq!(std::fs::read(dest.join("sub/w.bin")).unwrap(), b"abc");
        let out = mk(&[("a.json", None), ("../../evil", None), ("b.json", None)]);
        let e = untar(&out, &dest).unwrap_err().to_string();
        assert!(e.contains("stay inside the model folder"), "{e}");
        assert!(!dest.join("a.json").exists(), "nothing placed");
        let link = mk(&[("x", Some("/etc/passwd"))]);
        let e = untar(&link, &dest).unwrap_err().to_string();
        assert!(e.contains("no links"), "{e}");
        assert!(!dest.join("x").exists());
    }
}
