//! The tar `docker load` (and `podman load`) reads, written from an
//! image's blobs as it streams: the legacy layout every engine loads
//! (`manifest.json`, `<config hex>.json`, `<layer hex>/layer.tar`).
//!
//! Each blob is hashed as it is copied; a blob whose sha256 is not its
//! digest stops the stream at once with [`LoadTarError::Digest`], before
//! the engine can take the image (it would refuse the layer too, but with
//! a message naming neither the node nor the fix).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};
use xfer_proto::image::{BlobRef, Digest, ImageDesc};

/// Why writing the tar stopped.
#[derive(Debug, thiserror::Error)]
pub enum LoadTarError {
    /// A blob's bytes do not hash to its digest.
    #[error("{what} {want} does not match its digest: its bytes hash to {got}")]
    Digest {
        /// "config" or "layer".
        what: &'static str,
        /// The digest it should have.
        want: Digest,
        /// The digest its bytes have.
        got: Digest,
    },
    /// A blob's file could not be opened or read.
    #[error("{what} {digest}: {source}")]
    Blob {
        /// "config" or "layer".
        what: &'static str,
        /// Its digest.
        digest: Digest,
        /// Why it could not be read.
        source: io::Error,
    },
    /// The engine's end of the stream went away (it failed: its own
    /// message says why).
    #[error("the stream to the engine broke: {0}")]
    Sink(io::Error),
}

/// Writes `desc` as a `docker load` tar to `out`, each blob read from
/// `open(digest)`. Returns the bytes of blobs written.
///
/// A layer in `omit` (one the engine holds already, see
/// [`super::omittable`]) is checked against its digest all the same but
/// left out of the tar; `manifest.json` still names it, and Docker takes it
/// from its own store.
pub fn write(
    desc: &ImageDesc,
    open: impl Fn(&Digest) -> io::Result<File>,
    out: impl Write,
    omit: &BTreeSet<Digest>,
) -> Result<u64, LoadTarError> {
    let mut t = tar::Builder::new(out);
    let config_name = format!("{}.json", desc.id().hex());
    let mut layer_names = Vec::with_capacity(desc.layers.len());
    let mut written = 0u64;
    append_blob(&mut t, &config_name, &desc.config, "config", &open, true)?;
    written += desc.config.size;
    let mut seen = BTreeSet::new();
    for layer in &desc.layers {
        let name = format!("{}/layer.tar", layer.digest.hex());
        if seen.insert(layer.digest) {
            let send = !omit.contains(&layer.digest);
            append_blob(&mut t, &name, layer, "layer", &open, send)?;
            if send {
                written += layer.size;
            }
        }
        layer_names.push(name);
    }
    let tags: Vec<&str> = if desc.reference.contains('@') {
        Vec::new()
    } else {
        vec![desc.reference.as_str()]
    };
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": tags,
        "Layers": layer_names,
    }]);
    let manifest = serde_json::to_vec(&manifest).expect("a JSON value serializes");
    let mut h = header(manifest.len() as u64);
    t.append_data(&mut h, "manifest.json", &manifest[..])
        .map_err(LoadTarError::Sink)?;
    t.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(LoadTarError::Sink)?;
    Ok(written)
}

fn header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_cksum();
    h
}

/// One blob into the tar (or, without `send`, only read), hashed as it
/// goes.
fn append_blob<W: Write>(
    t: &mut tar::Builder<W>,
    name: &str,
    blob: &BlobRef,
    what: &'static str,
    open: &impl Fn(&Digest) -> io::Result<File>,
    send: bool,
) -> Result<(), LoadTarError> {
    let file = open(&blob.digest).map_err(|source| LoadTarError::Blob {
        what,
        digest: blob.digest,
        source,
    })?;
    let mut reader = Hashing {
        inner: file.take(blob.size),
        hash: Sha256::new(),
        read: 0,
        error: None,
    };
    let sent = if send {
        let mut h = header(blob.size);
        t.append_data(&mut h, name, &mut reader)
    } else {
        io::copy(&mut reader, &mut io::sink()).map(|_| ())
    };
    if let Some(source) = reader.error.take() {
        return Err(LoadTarError::Blob {
            what,
            digest: blob.digest,
            source,
        });
    }
    if reader.read != blob.size {
        return Err(LoadTarError::Blob {
            what,
            digest: blob.digest,
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("it holds {} bytes, not {}", reader.read, blob.size),
            ),
        });
    }
    sent.map_err(LoadTarError::Sink)?;
    let got = Digest(reader.hash.finalize().into());
    if got != blob.digest {
        return Err(LoadTarError::Digest {
            what,
            want: blob.digest,
            got,
        });
    }
    Ok(())
}

/// A reader that hashes what passes, and keeps its own read errors apart
/// from the sink's.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    read: u64,
    error: Option<io::Error>,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.hash.update(&buf[..n]);
                self.read += n as u64;
                Ok(n)
            }
            Err(e) => {
                let msg = e.to_string();
                self.error = Some(e);
                Err(io::Error::other(msg))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sha(b: &[u8]) -> Digest {
        Digest(Sha256::digest(b).into())
    }

    fn image(dir: &Path, layers: &[&[u8]]) -> ImageDesc {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha(l).to_string()).collect();
        let config =
            serde_json::to_vec(&serde_json::json!({"rootfs": {"diff_ids": diff_ids}})).unwrap();
        let put = |b: &[u8]| {
            let d = sha(b);
            let p = crate::image::archive::blob_path(dir, &d);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b).unwrap();
            BlobRef {
                digest: d,
                size: b.len() as u64,
            }
        };
        ImageDesc {
            reference: "xt/app:1".into(),
            config: put(&config),
            layers: layers.iter().map(|l| put(l)).collect(),
            diff_ids: Vec::new(),
        }
    }

    #[test]
    fn the_load_tar_unpacks_back_into_the_same_image() {
        let src = tempfile::tempdir().unwrap();
        let desc = image(src.path(), &[b"base", b"top", b"base"]);
        let open = |d: &Digest| File::open(crate::image::archive::blob_path(src.path(), d));
        let mut tar = Vec::new();
        let n = write(&desc, open, &mut tar, &BTreeSet::new()).unwrap();
        assert_eq!(n, desc.config.size + 4 + 3, "a repeated layer goes once");
        let back = tempfile::tempdir().unwrap();
        let again =
            crate::image::archive::unpack(&tar[..], back.path(), "xt/app:1", |_| ()).unwrap();
        assert_eq!(again, desc);

        // Without the layers the engine holds: the manifest names them,
        // the tar carries only the rest.
        let omit: BTreeSet<Digest> = [desc.layers[0].digest].into();
        let mut tar = Vec::new();
        let n = write(&desc, open, &mut tar, &omit).unwrap();
        assert_eq!(n, desc.config.size + 3);
        let names: Vec<String> = tar::Archive::new(&tar[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        let base = format!("{}/layer.tar", desc.layers[0].digest.hex());
        assert!(!names.contains(&base), "{names:?}");
        assert_eq!(names.len(), 3, "config, top layer, manifest: {names:?}");
    }

    #[test]
    fn a_flipped_byte_stops_the_stream_naming_the_layer() {
        let src = tempfile::tempdir().unwrap();
        let desc = image(src.path(), &[b"base layer", b"top"]);
        let p = crate::image::archive::blob_path(src.path(), &desc.layers[0].digest);
        std::fs::write(&p, b"base lazer").unwrap();
        let open = |d: &Digest| File::open(crate::image::archive::blob_path(src.path(), d));
        let e = write(&desc, open, Vec::new(), &BTreeSet::new()).unwrap_err();
        match &e {
            LoadTarError::Digest { what, want, .. } => {
                assert_eq!((*what, *want), ("layer", desc.layers[0].digest))
            }
            other => panic!("{other}"),
        }
        std::fs::write(&p, b"short").unwrap();
        let open = |d: &Digest| File::open(crate::image::archive::blob_path(src.path(), d));
        assert!(matches!(
            write(&desc, open, Vec::new(), &BTreeSet::new()),
            Err(LoadTarError::Blob { .. })
        ));
        // A layer left out of the stream is checked all the same.
        std::fs::write(&p, b"base lazer").unwrap();
        let open = |d: &Digest| File::open(crate::image::archive::blob_path(src.path(), d));
        let omit: BTreeSet<Digest> = [desc.layers[0].digest].into();
        assert!(matches!(
            write(&desc, open, Vec::new(), &omit),
            Err(LoadTarError::Digest { what: "layer", .. })
        ));
    }
}
