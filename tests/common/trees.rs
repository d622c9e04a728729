//! Model trees: generating, walking, comparing and damaging them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::*;

/// Pseudo-random, incompressible bytes: BLAKE3's XOF keyed by `seed` and `tag`.
pub fn random_bytes(seed: u64, tag: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(tag.as_bytes());
    h.finalize_xof().fill(&mut out);
    out
}

/// Writes `len` pseudo-random bytes to `path` in 1 MiB pieces.
pub fn write_random(path: &Path, len: u64, seed: u64) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(path.file_name().unwrap().as_encoded_bytes());
    let mut xof = h.finalize_xof();
    let mut f = std::io::BufWriter::new(fs::File::create(path).unwrap());
    let mut buf = vec![0u8; MIB as usize];
    let mut left = len;
    while left > 0 {
        let n = left.min(MIB) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.into_inner().unwrap().sync_all().unwrap();
}

/// Paths of the generated model.
pub const SHARD1: &str = "model-00001-of-00002.safetensors";
pub const SHARD2: &str = "model-00002-of-00002.safetensors";
pub const BLOB: &str = "blobs/x";
pub const LINK: &str = "snapshots/c1/model.safetensors";
pub const LINK_TARGET: &str = "../../blobs/x";
pub const NESTED: &str = "nested/deeper/tokenizer.bin";
pub const EMPTY_FILE: &str = "empty.txt";
pub const EMPTY_DIR: &str = "empty_dir";
pub const EXEC: &str = "run.sh";
pub const CONFIG: &str = "config.json";

/// Writes a model-like tree of about `total` bytes into `dir` (created):
/// two shards, a blob with an in-tree symlink to it
/// (`snapshots/c1/model.safetensors -> ../../blobs/x`), `config.json`, a
/// nested folder, an executable script, an empty file and an empty folder.
/// File sizes are deliberately not multiples of any chunk size.
pub fn gen_model(dir: &Path, total: u64, seed: u64) {
    gen_model_opts(dir, total, seed, true)
}

/// [`gen_model`], optionally without the empty folder.
pub fn gen_model_opts(dir: &Path, total: u64, seed: u64, empty_dir: bool) {
    fs::create_dir_all(dir).unwrap();
    let nested = 100_003;
    let blob = total * 15 / 100 + 7;
    let shard1 = total * 50 / 100 + 1234;
    let shard2 = total
        .saturating_sub(nested + blob + shard1 + 2000)
        .max(4099);
    write_random(&dir.join(SHARD1), shard1, seed);
    write_random(&dir.join(SHARD2), shard2, seed);
    write_random(&dir.join(BLOB), blob, seed);
    write_random(&dir.join(NESTED), nested, seed);
    fs::write(
        dir.join(CONFIG),
        format!(
            "{{\"architectures\": [\"TestForCausalLM\"], \"hidden_size\": 4096, \"seed\": {seed}}}\n"
        ),
    )
    .unwrap();
    fs::write(dir.join(EXEC), "#!/bin/sh\necho hello\n").unwrap();
    fs::set_permissions(dir.join(EXEC), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(dir.join(EMPTY_FILE), b"").unwrap();
    if empty_dir {
        fs::create_dir_all(dir.join(EMPTY_DIR)).unwrap();
    }
    fs::create_dir_all(dir.join("snapshots/c1")).unwrap();
    std::os::unix::fs::symlink(LINK_TARGET, dir.join(LINK)).unwrap();
}

/// Total bytes of the regular files under `dir` (symlinks not followed).
pub fn tree_bytes(dir: &Path) -> u64 {
    walk(dir)
        .values()
        .map(|n| match n {
            Node::File { len, .. } => *len,
            _ => 0,
        })
        .sum()
}

/// Overwrites `len` bytes at `offset` of an existing file with new random
/// bytes (size unchanged).
pub fn scribble(path: &Path, offset: u64, len: usize, seed: u64) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&random_bytes(seed, "scribble", len), offset)
        .unwrap();
    f.sync_all().unwrap();
}

/// Flips one byte of `path` at `offset` (XOR 0x5a); with `keep_mtime`, puts
/// the file's mtime back, as silent bit rot would leave it.
pub fn flip_byte(path: &Path, offset: u64, keep_mtime: bool) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, offset).unwrap();
    if keep_mtime {
        f.set_modified(mtime).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    if keep_mtime {
        assert_eq!(fs::metadata(path).unwrap().modified().unwrap(), mtime);
    }
}

/// Flips one byte of `path` at `offset` and puts its mtime back.
pub fn flip_byte_keep_mtime(path: &Path, offset: u64) {
    flip_byte(path, offset, true)
}

/// One entry of a walked tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File { len: u64, exec: bool },
    Link(PathBuf),
    Dir,
}

/// Every entry under `root` by relative path (symlinks not followed).
pub fn walk(root: &Path) -> BTreeMap<String, Node> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.insert(rel, Node::Link(fs::read_link(&p).unwrap()));
            } else if m.is_dir() {
                out.insert(rel, Node::Dir);
                go(root, &p, out);
            } else {
                out.insert(
                    rel,
                    Node::File {
                        len: m.len(),
                        exec: m.permissions().mode() & 0o111 != 0,
                    },
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    go(root, root, &mut out);
    out
}

/// Names directly inside `dir`.
pub fn listing(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Compares two files byte by byte; on a difference, says where.
pub fn same_bytes(a: &Path, b: &Path) -> Result<(), String> {
    let (fa, fb) = (
        fs::File::open(a).map_err(|e| format!("{}: {e}", a.display()))?,
        fs::File::open(b).map_err(|e| format!("{}: {e}", b.display()))?,
    );
    let (la, lb) = (fa.metadata().unwrap().len(), fb.metadata().unwrap().len());
    if la != lb {
        return Err(format!(
            "{} is {la} bytes, {} is {lb}",
            a.display(),
            b.display()
        ));
    }
    let mut ra = BufReader::with_capacity(MIB as usize, fa);
    let mut rb = BufReader::with_capacity(MIB as usize, fb);
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut offset = 0u64;
    while offset < la {
        let n = (la - offset).min(MIB) as usize;
        ra.read_exact(&mut ba[..n]).unwrap();
        rb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            let i = (0..n).find(|&i| ba[i] != bb[i]).unwrap();
            return Err(format!(
                "{} and {} differ at byte {}",
                a.display(),
                b.display(),
                offset + i as u64
            ));
        }
        offset += n as u64;
    }
    Ok(())
}

/// Asserts that `dst` is an exact copy of `src`: the same entries (files,
/// symlinks kept as symlinks with the same target, empty dirs, empty files),
/// the same executable bits and the same bytes.
pub fn assert_same_tree(src: &Path, dst: &Path) {
    let (a, b) = (walk(src), walk(dst));
    let ka: Vec<&String> = a.keys().collect();
    let kb: Vec<&String> = b.keys().collect();
    assert_eq!(
        ka,
        kb,
        "entries of {} and {} differ",
        src.display(),
        dst.display()
    );
    for (rel, na) in &a {
        let nb = &b[rel];
        assert_eq!(na, nb, "{rel}: kind, size, mode or link target differs");
        if let Node::File { .. } = na {
            if let Err(e) = same_bytes(&src.join(rel), &dst.join(rel)) {
                panic!("{rel}: {e}");
            }
        }
    }
}

/// Asserts that every regular file present under `model_dir` (if it exists)
/// is a complete, byte-exact copy of the same path under `src`: a file may
/// be missing, but never wrong or partial.
pub fn assert_no_wrong_files(src: &Path, model_dir: &Path) {
    if !model_dir.exists() {
        return;
    }
    for (rel, node) in walk(model_dir) {
        match node {
            Node::File { .. } => {
                if let Err(e) = same_bytes(&src.join(&rel), &model_dir.join(&rel)) {
                    panic!("{rel} is under its final path with wrong content: {e}");
                }
            }
            Node::Link(t) => {
                assert_eq!(
                    fs::read_link(src.join(&rel)).ok(),
                    Some(t.clone()),
                    "{rel} is a symlink to {t:?} that the source does not have"
                );
            }
            Node::Dir => assert!(src.join(&rel).is_dir(), "{rel}: unexpected directory"),
        }
    }
}
