//! Where a registry pull writes: the files of a blob cache (partial
//! blobs, blobs, their stamps) and of the model folder placed from it,
//! reached in one of two ways ([`Files`]).
//!
//! - Plain: a folder the operator names (the CLI's image cache, its
//!   `--local-dir`). The last component of every file opened is opened
//!   with `O_NOFOLLOW`, a fresh file is created exclusively (`O_EXCL`,
//!   after unlinking what was there: a link itself, never its target), so
//!   a symlink planted at a partial blob's name fails the pull, naming it,
//!   and no byte goes through it.
//! - Beneath a root: an agent's staging under `<root>/.xfer/oci/<job>`.
//!   Every path is taken relative to the agent's root and resolved with
//!   [`crate::util::beneath`] (no symlink followed at any component, not
//!   even `.xfer/oci`); renames and hard links go between descriptors of
//!   folders opened that way.
//!
//! A symlink found either way is a [`Planted`] error: one line naming it
//! and the fix. Folders made and renames done are fsynced as
//! [`crate::util::beneath`]'s durable helpers do, except the lazy ones
//! ([`Files::rename_lazy`], [`Files::mkdir_lazy`], [`Files::hard_link`])
//! that a batch of many small files uses, made durable together by one
//! [`Files::syncfs`] at its end.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::util::beneath::{self, Planted, Root};

/// How the files of a pull are reached; see the module header.
#[derive(Clone, Debug, Default)]
pub struct Files {
    beneath: Option<Root>,
}

fn cstr(s: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `p`'s folder and last component.
fn split(p: &Path) -> io::Result<(&Path, &std::ffi::OsStr)> {
    let name = p.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", p.display()),
        )
    })?;
    Ok((p.parent().unwrap_or(Path::new("")), name))
}

impl Files {
    /// Plain paths (a folder the operator names).
    pub fn plain() -> Files {
        Files { beneath: None }
    }

    /// Paths beneath `root`, resolved without following a symlink.
    pub fn beneath(root: Root) -> Files {
        Files {
            beneath: Some(root),
        }
    }

    /// Whether paths are resolved beneath a root.
    pub fn is_beneath(&self) -> bool {
        self.beneath.is_some()
    }

    /// `p` relative to the root, when paths are resolved beneath one.
    fn rel<'a>(&'a self, p: &'a Path) -> io::Result<Option<(&'a Root, &'a Path)>> {
        let Some(root) = &self.beneath else {
            return Ok(None);
        };
        let rel = p.strip_prefix(root.path()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not under the root {}",
                    p.display(),
                    root.path().display()
                ),
            )
        })?;
        Ok(Some((root, rel)))
    }

    /// The [`Planted`] error for `p` when it is a symlink, else `e`.
    fn plain_error(p: &Path, e: io::Error) -> io::Error {
        let link = std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
        if link && e.raw_os_error() == Some(libc::ELOOP) {
            return io::Error::other(Planted {
                path: p.to_path_buf(),
                root: p.parent().unwrap_or(Path::new("/")).to_path_buf(),
            });
        }
        io::Error::new(e.kind(), format!("{}: {e}", p.display()))
    }

    /// The size of the regular file `p`; `None` when there is none. A
    /// symlink there is a [`Planted`] error, anything else but a file an
    /// error naming it.
    pub fn len(&self, p: &Path) -> io::Result<Option<u64>> {
        let stat = match self.rel(p)? {
            None => std::fs::symlink_metadata(p).map(|m| (m.file_type().is_symlink(), m)),
            Some((root, rel)) => {
                let (parent, name) = split(rel)?;
                let dir = match root.dir(parent) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    r => r?,
                };
                let name = cstr(name)?;
                // SAFETY: a zeroed stat is a valid out-value for fstatat.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: a valid dirfd, NUL-terminated name and out-pointer.
                let r = unsafe {
                    libc::fstatat(
                        dir.as_raw_fd(),
                        name.as_ptr(),
                        &mut st,
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                };
                match cvt(r) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => {
                        return Err(io::Error::new(e.kind(), format!("{}: {e}", p.display())))
                    }
                    Ok(()) => {}
                }
                let kind = st.st_mode & libc::S_IFMT;
                if kind == libc::S_IFLNK {
                    return Err(io::Error::other(Planted {
                        path: p.to_path_buf(),
                        root: root.path().to_path_buf(),
                    }));
                }
                if kind != libc::S_IFREG {
                    return Err(not_a_file(p));
                }
                return Ok(Some(st.st_size as u64));
            }
        };
        match stat {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", p.display()))),
            Ok((true, _)) => Err(io::Error::other(Planted {
                path: p.to_path_buf(),
                root: p.parent().unwrap_or(Path::new("/")).to_path_buf(),
            })),
            Ok((false, m)) if !m.is_file() => Err(not_a_file(p)),
            Ok((false, m)) => Ok(Some(m.len())),
        }
    }

    /// Whether the folder `p` is there (a symlink there is a [`Planted`]
    /// error beneath a root, and no folder by a plain path).
    pub fn is_dir(&self, p: &Path) -> io::Result<bool> {
        match self.rel(p)? {
            Some((root, rel)) => match root.dir(rel) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
            },
            None => Ok(std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())),
        }
    }

    /// Opens the existing file `p` for reading.
    pub fn open_read(&self, p: &Path) -> io::Result<File> {
        match self.rel(p)? {
            Some((root, rel)) => root.open_read(rel),
            None => std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
                .map_err(|e| Self::plain_error(p, e)),
        }
    }

    /// Reads the whole file `p`.
    pub fn read(&self, p: &Path) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.open_read(p)?.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Opens the existing file `p` for appending.
    pub fn open_append(&self, p: &Path) -> io::Result<File> {
        match self.rel(p)? {
            Some((root, rel)) => {
                // `open_append` would create a missing file: it must be there.
                self.len(p)?.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("{} vanished", p.display()))
                })?;
                root.open_append(rel)
            }
            None => std::fs::OpenOptions::new()
                .append(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
                .map_err(|e| Self::plain_error(p, e)),
        }
    }

    /// Creates `p` empty, for writing, exclusively: what was there (a
    /// stale file, or a link, never its target) is unlinked first.
    pub fn create_new(&self, p: &Path) -> io::Result<File> {
        match self.rel(p)? {
            Some((root, rel)) => root.create_temp(rel),
            None => {
                match std::fs::remove_file(p) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(Self::plain_error(p, e))
                    }
                    _ => {}
                }
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(p)
                    .map_err(|e| Self::plain_error(p, e))
            }
        }
    }

    /// Removes the file (or link) `p`; a missing one is fine.
    pub fn remove_file(&self, p: &Path) -> io::Result<()> {
        let r = match self.rel(p)? {
            Some((root, rel)) => root.remove_file(rel),
            None => std::fs::remove_file(p),
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Removes the tree `p` (a link there is removed, not followed); a
    /// missing one is fine.
    pub fn remove_dir_all(&self, p: &Path) -> io::Result<()> {
        let r = match self.rel(p)? {
            Some((root, rel)) => root.remove_dir_all(rel),
            None => std::fs::remove_dir_all(p),
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Makes the folder `p` and its missing parents, durably.
    pub fn create_dir_all(&self, p: &Path) -> io::Result<()> {
        match self.rel(p)? {
            Some((root, rel)) => root.create_dir_all(rel).map(drop),
            None => beneath::create_dir_all_durable(p).map(drop),
        }
    }

    /// Replaces `p` with `bytes`, durably (a temporary renamed in).
    pub fn write_durable(&self, p: &Path, bytes: &[u8]) -> io::Result<()> {
        match self.rel(p)? {
            Some((root, rel)) => root.write_durable(rel, bytes),
            None => beneath::write_file_durable(p, bytes, 0o644),
        }
    }

    /// Renames the file `from` over `to` (a link at `to` is replaced, not
    /// followed) and fsyncs both folders.
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.between(from, to, true, renameat)
    }

    /// [`Files::rename`] without the fsyncs: durable only once
    /// [`Files::syncfs`] ran (a batch of many small files).
    pub fn rename_lazy(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.between(from, to, false, renameat)
    }

    /// Makes `to` a hard link to the file `from` (never to what a link at
    /// `from` points to); `to` must not exist. Durable once
    /// [`Files::syncfs`] ran.
    pub fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.between(from, to, false, |a, na, b, nb| {
            // SAFETY: linkat between two valid dirfds without
            // AT_SYMLINK_FOLLOW: a link at `from` is linked itself.
            cvt(unsafe { libc::linkat(a, na.as_ptr(), b, nb.as_ptr(), 0) })
        })
    }

    /// Makes the folder `p`, whose parent is there (one that is there
    /// already is fine). Durable once [`Files::syncfs`] ran.
    pub fn mkdir_lazy(&self, p: &Path) -> io::Result<()> {
        let (parent, name) = split(p)?;
        let dir = self.open_dir(parent)?;
        let name = cstr(name)?;
        // SAFETY: mkdirat with a valid dirfd and NUL-terminated name.
        match cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o777) }) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                Err(io::Error::new(e.kind(), format!("{}: {e}", p.display())))
            }
            _ => Ok(()),
        }
    }

    /// Flushes everything written on the file system that holds the
    /// folder `p` (`syncfs`): one call that makes a batch of files,
    /// renames and folders durable.
    pub fn syncfs(&self, p: &Path) -> io::Result<()> {
        let dir = self.open_dir(p)?;
        // SAFETY: syncfs on a valid descriptor.
        cvt(unsafe { libc::syncfs(dir.as_raw_fd()) })
            .map_err(|e| io::Error::new(e.kind(), format!("cannot sync {}: {e}", p.display())))
    }

    /// The folder `d`, opened beneath the root or by its plain path.
    fn open_dir(&self, d: &Path) -> io::Result<File> {
        match self.rel(d)? {
            Some((root, rel)) => root.dir(rel),
            None => File::open(if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            })
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", d.display()))),
        }
    }

    /// Runs `op` on the folders of `from` and `to` (opened beneath the
    /// root, or by their plain paths) and their last components, then,
    /// when `durable`, fsyncs both folders.
    fn between(
        &self,
        from: &Path,
        to: &Path,
        durable: bool,
        op: impl FnOnce(libc::c_int, &CString, libc::c_int, &CString) -> io::Result<()>,
    ) -> io::Result<()> {
        let (from_dir, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        let (a, b) = (self.open_dir(from_dir)?, self.open_dir(to_dir)?);
        op(
            a.as_raw_fd(),
            &cstr(from_name)?,
            b.as_raw_fd(),
            &cstr(to_name)?,
        )
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{} to {}: {e}", from.display(), to.display()),
            )
        })?;
        if durable {
            b.sync_all()?;
            if from_dir != to_dir {
                a.sync_all()?;
            }
        }
        Ok(())
    }
}

/// `renameat` between two folders; neither name is followed.
fn renameat(a: libc::c_int, na: &CString, b: libc::c_int, nb: &CString) -> io::Result<()> {
    // SAFETY: renameat between two valid dirfds and NUL-terminated names.
    cvt(unsafe { libc::renameat(a, na.as_ptr(), b, nb.as_ptr()) })
}

fn not_a_file(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is not a regular file; remove it", p.display()),
    )
}

/// The [`Planted`] an error's chain carries, if any.
pub fn planted(e: &anyhow::Error) -> Option<&Planted> {
    e.chain()
        .find_map(|c| c.downcast_ref::<io::Error>().and_then(Planted::of))
}

/// A fresh name for a temporary file beside `p` (`.NAME.xfer-<pid>-<n>`).
pub fn temp_beside(p: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let name = p.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    let mut t = std::ffi::OsString::from(".");
    t.push(name);
    t.push(format!(
        ".xfer-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    p.with_file_name(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_planted_link_fails_each_way_naming_it_and_nothing_lands_outside() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join(".xfer/oci/j/blobs/.incoming")).unwrap();
        let part = root.join(".xfer/oci/j/blobs/.incoming/x.part");
        symlink(&victim, &part).unwrap();
        for files in [Files::plain(), Files::beneath(Root::open(&root).unwrap())] {
            let e = files.len(&part).unwrap_err();
            assert_eq!(Planted::of(&e).map(|p| &p.path), Some(&part), "{e}");
            let e = files.open_append(&part).unwrap_err();
            assert!(Planted::of(&e).is_some(), "{e}");
            let e = files.open_read(&part).unwrap_err();
            assert!(Planted::of(&e).is_some(), "{e}");
        }
        // A fresh file replaces the link itself.
        let files = Files::beneath(Root::open(&root).unwrap());
        files.create_new(&part).unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(files.len(&part).unwrap(), Some(3));
        // A symlinked `.xfer/oci`: refused beneath the root.
        std::fs::remove_dir_all(root.join(".xfer/oci")).unwrap();
        symlink(outside.path(), root.join(".xfer/oci")).unwrap();
        let e = files
            .create_dir_all(&root.join(".xfer/oci/j/blobs"))
            .unwrap_err();
        assert_eq!(
            Planted::of(&e).map(|p| &p.path),
            Some(&root.join(".xfer/oci")),
            "{e}"
        );
        let e = files.remove_dir_all(&root.join(".xfer/oci/j")).unwrap_err();
        assert!(Planted::of(&e).is_some(), "{e}");
        let names: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["victim"]);
        assert!(
            files.len(Path::new("/etc/passwd")).is_err(),
            "outside the root"
        );
    }

    #[test]
    fn renames_and_links_go_between_folders_beneath_the_root() {
        let t = tempfile::tempdir().unwrap();
        let files = Files::beneath(Root::open(t.path()).unwrap());
        let (a, b) = (t.path().join("s/a"), t.path().join("s/b/c"));
        files.create_dir_all(a.parent().unwrap()).unwrap();
        files.create_dir_all(b.parent().unwrap()).unwrap();
        files.create_new(&a).unwrap().write_all(b"abc").unwrap();
        files.hard_link(&a, &t.path().join("s/l")).unwrap();
        files.rename(&a, &b).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), b"abc");
        assert_eq!(std::fs::read(t.path().join("s/l")).unwrap(), b"abc");
        assert_eq!(files.len(&a).unwrap(), None);
        let tmp = temp_beside(&b);
        assert_eq!(tmp.parent(), b.parent());
        assert_ne!(tmp, temp_beside(&b));
    }
}
