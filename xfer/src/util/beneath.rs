//! Files beneath a root directory that no planted symlink can redirect, and
//! replacements that survive a power cut.
//!
//! An agent keeps its state under `<root>/.xfer`, and whoever can write the
//! root could plant a symlink there (`.xfer/models/m.json.tmp -> ~/.bashrc`,
//! or `.xfer/models -> /elsewhere`) so that the agent's next write lands
//! outside. Every path here is relative to a [`Root`], an open descriptor of
//! the root directory (the root itself may be a symlink: the operator chose
//! it), and is resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`,
//! or, on kernels without `openat2` (before 5.6), one component at a time with
//! `O_NOFOLLOW`. A symlink anywhere below the root fails the call with a
//! [`Planted`] error that names it and the fix; its target is never opened.
//!
//! Temporary files are created exclusively (`O_CREAT | O_EXCL`, which never
//! follows a symlink); a stale one (a crash, or a planted link) is unlinked
//! (which removes a link itself, never its target) and created anew.
//! [`Root::write_durable`] writes the temporary file, fsyncs it, renames it
//! over the final name and fsyncs the directory, so after it returns the new
//! contents survive a power cut; [`Root::create_dir_all`] fsyncs the parent
//! of every directory it creates, for the same reason.
//!
//! Folders the operator names (an image cache, the CA folder, the Hub cache,
//! the hash cache) are not agent state under a root; for them the same
//! durability comes from plain-path helpers: [`sync_dir`],
//! [`create_dir_all_durable`] (returns the folders it made, each fsynced
//! into its parent), [`rename_durable`] (a rename, then its folders'
//! fsync) and [`write_file_durable`] (temporary, fsync, rename, fsync).

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A symlink found where xfer was about to write (or read its own state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planted {
    /// The symlink itself.
    pub path: PathBuf,
    /// The root it was found under.
    pub root: PathBuf,
}

impl Planted {
    /// Why the write was refused and what to do, without the path.
    pub fn reason(&self) -> String {
        format!(
            "it is a symlink; xfer never writes through one. Remove it (someone who can write {} planted it)",
            self.root.display()
        )
    }

    /// The [`Planted`] an error carries, if it is one.
    pub fn of(e: &io::Error) -> Option<&Planted> {
        e.get_ref()?.downcast_ref::<Planted>()
    }
}

impl std::fmt::Display for Planted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is a symlink; xfer never writes through one. Remove it (someone who can write {} planted it)", self.path.display(), self.root.display())
    }
}

impl std::error::Error for Planted {}

/// Whether `openat2` exists on this kernel; cleared at the first ENOSYS.
static HAVE_OPENAT2: AtomicBool = AtomicBool::new(true);

/// Serialises [`Root::write_durable`] within the process: its temporary
/// name is fixed, so two writers of the same file must not interleave.
static REPLACING: Mutex<()> = Mutex::new(());

/// `struct open_how` of `linux/openat2.h`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// A directory under which paths are resolved without following symlinks.
#[derive(Debug, Clone)]
pub struct Root {
    fd: Arc<OwnedFd>,
    path: PathBuf,
    openat2: bool,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cstr(s: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// Checks that `rel` is a plain relative path (no `..`, `.` or `/`).
fn plain(rel: &Path) -> io::Result<()> {
    if rel.components().all(|c| matches!(c, Component::Normal(_))) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a plain relative path", rel.display()),
        ))
    }
}

/// `rel`'s parent (possibly empty) and last component.
fn split(rel: &Path) -> io::Result<(&Path, CString)> {
    plain(rel)?;
    let name = rel
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty path"))?;
    Ok((rel.parent().unwrap_or(Path::new("")), cstr(name)?))
}

/// Opens `name` in the directory `dir`, never following a symlink there.
fn openat(dir: &File, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
    openat_fd(dir.as_raw_fd(), name, flags, mode)
}

fn openat_fd(dir: RawFd, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
    // SAFETY: a valid directory fd and NUL-terminated name; the returned fd
    // is ours.
    let fd = cvt(unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

const DIR_FLAGS: libc::c_int = libc::O_DIRECTORY | libc::O_RDONLY;

impl Root {
    /// Opens the root directory `path` (following a symlink at `path`
    /// itself: that is the operator's choice, not something planted below).
    pub fn open(path: &Path) -> io::Result<Root> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: a NUL-terminated path; the fd is ours.
        let fd = cvt(unsafe { libc::open(c.as_ptr(), DIR_FLAGS | libc::O_CLOEXEC) })?;
        Ok(Root {
            // SAFETY: just opened, owned by nobody else.
            fd: Arc::new(unsafe { OwnedFd::from_raw_fd(fd) }),
            path: path.to_path_buf(),
            openat2: HAVE_OPENAT2.load(Ordering::Relaxed),
        })
    }

    /// The root's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel`'s full path, for messages.
    pub fn show(&self, rel: &Path) -> PathBuf {
        self.path.join(rel)
    }

    /// The error for a failed resolution of `rel`: [`Planted`] naming the
    /// first symlink on the way, if there is one, or `e` itself.
    fn explain(&self, rel: &Path, e: io::Error) -> io::Error {
        let maybe_link = matches!(
            e.raw_os_error(),
            Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR | libc::EEXIST)
        );
        if maybe_link {
            let mut p = self.path.clone();
            for c in rel.components() {
                p.push(c);
                match std::fs::symlink_metadata(&p) {
                    Ok(m) if m.file_type().is_symlink() => {
                        return io::Error::other(Planted {
                            path: p,
                            root: self.path.clone(),
                        })
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        io::Error::new(e.kind(), format!("{}: {e}", self.show(rel).display()))
    }

    /// A fresh descriptor of the root directory itself.
    fn top(&self) -> io::Result<File> {
        openat_fd(self.fd.as_raw_fd(), c".", DIR_FLAGS, 0)
    }

    /// Opens `rel` with `flags`, refusing a symlink at any component.
    fn open_at(&self, rel: &Path, flags: libc::c_int, mode: u32) -> io::Result<File> {
        plain(rel)?;
        if rel.as_os_str().is_empty() {
            return self.top();
        }
        let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if self.openat2 && HAVE_OPENAT2.load(Ordering::Relaxed) {
            let c = cstr(rel.as_os_str())?;
            let how = OpenHow {
                flags: flags as u64,
                mode: if flags & libc::O_CREAT != 0 {
                    mode as u64
                } else {
                    0
                },
                resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS,
            };
            // SAFETY: openat2 with a valid dirfd, path and open_how of the
            // size passed; the returned fd is ours.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            if r >= 0 {
                // SAFETY: just opened, owned by nobody else.
                return Ok(unsafe { File::from_raw_fd(r as libc::c_int) });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOSYS) {
                return Err(self.explain(rel, e));
            }
            HAVE_OPENAT2.store(false, Ordering::Relaxed);
        }
        // No openat2: walk the parents one by one, then open the last.
        let (parent, name) = split(rel)?;
        let dir = self.walk(parent)?;
        openat(&dir, &name, flags, mode).map_err(|e| self.explain(rel, e))
    }

    /// The directory `rel`, opened component by component with `O_NOFOLLOW`.
    fn walk(&self, rel: &Path) -> io::Result<File> {
        let mut cur = self.top()?;
        for c in rel.components() {
            let name = cstr(c.as_os_str())?;
            cur = openat(&cur, &name, DIR_FLAGS, 0).map_err(|e| self.explain(rel, e))?;
        }
        Ok(cur)
    }

    /// Opens the existing directory `rel` (for fsync, or as a parent).
    pub fn dir(&self, rel: &Path) -> io::Result<File> {
        self.open_at(rel, DIR_FLAGS, 0)
    }

    /// Makes sure the directory `rel` exists, creating what is missing (and
    /// fsyncing the parent of each directory created), and opens it.
    pub fn create_dir_all(&self, rel: &Path) -> io::Result<File> {
        match self.dir(rel) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            r => return r,
        }
        let mut cur = self.top()?;
        let mut so_far = PathBuf::new();
        for c in rel.components() {
            so_far.push(c);
            let name = cstr(c.as_os_str())?;
            cur = match openat(&cur, &name, DIR_FLAGS, 0) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // SAFETY: mkdirat with a valid dirfd and name.
                    let made = cvt(unsafe { libc::mkdirat(cur.as_raw_fd(), name.as_ptr(), 0o777) });
                    match made {
                        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                            return Err(self.explain(&so_far, e))
                        }
                        _ => {}
                    }
                    cur.sync_all()?;
                    openat(&cur, &name, DIR_FLAGS, 0).map_err(|e| self.explain(&so_far, e))?
                }
                Err(e) => return Err(self.explain(&so_far, e)),
            };
        }
        Ok(cur)
    }

    /// Opens the existing file `rel` for reading.
    pub fn open_read(&self, rel: &Path) -> io::Result<File> {
        self.open_at(rel, libc::O_RDONLY, 0)
    }

    /// Opens `rel` for reading and writing, creating it (empty) if missing;
    /// never truncates.
    pub fn open_rw(&self, rel: &Path) -> io::Result<File> {
        self.open_at(rel, libc::O_RDWR | libc::O_CREAT, 0o644)
    }

    /// Opens `rel` for appending, creating it (empty) if missing.
    pub fn open_append(&self, rel: &Path) -> io::Result<File> {
        self.open_at(rel, libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT, 0o644)
    }

    /// Opens the existing file `rel` for writing with `O_DIRECT` (fails on
    /// filesystems without it, such as tmpfs).
    pub fn open_direct(&self, rel: &Path) -> io::Result<File> {
        self.open_at(rel, libc::O_WRONLY | libc::O_DIRECT, 0)
    }

    /// Creates `name` in `dir` (the directory `parent`) exclusively; a stale
    /// file or symlink of that name is unlinked first.
    fn create_new_in(&self, dir: &File, parent: &Path, name: &CString) -> io::Result<File> {
        self.create_new_in_mode(dir, parent, name, 0o644)
    }

    /// [`Self::create_new_in`] with the new file's `mode`.
    fn create_new_in_mode(
        &self,
        dir: &File,
        parent: &Path,
        name: &CString,
        mode: u32,
    ) -> io::Result<File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        match openat(dir, name, flags, mode) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let rel = parent.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
                tracing::debug!("replacing the stale {}", self.show(&rel).display());
                // SAFETY: unlinkat with a valid dirfd and name; removes a
                // symlink itself, never its target.
                cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
                    .map_err(|e| self.explain(&rel, e))?;
                openat(dir, name, flags, mode).map_err(|e| self.explain(&rel, e))
            }
            r => r,
        }
    }

    /// Gives the open `file` the new name `rel` beneath the root (a hard
    /// link to that very inode, through `/proc/self/fd`, so no path is
    /// looked up twice); a stale file or symlink at `rel` is replaced. Its
    /// directory must exist. Fails where the two are on different
    /// filesystems (`EXDEV`) or the filesystem has no hard links.
    pub fn link_open_file(&self, file: &File, rel: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.dir(parent)?;
        let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .expect("no NUL in a number");
        let link = || {
            // SAFETY: linkat with valid C strings and a valid dirfd.
            cvt(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })
        };
        match link() {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // SAFETY: unlinkat with a valid dirfd and name; removes a
                // symlink itself, never its target.
                cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
                    .map_err(|e| self.explain(rel, e))?;
                link()
            }
            r => r,
        }
        .map(|_| ())
        .map_err(|e| self.explain(rel, e))
    }

    /// Creates the file `rel` exclusively, for writing: a stale file or
    /// symlink there is unlinked and replaced. Its directory must exist.
    pub fn create_temp(&self, rel: &Path) -> io::Result<File> {
        let (parent, name) = split(rel)?;
        let dir = self.dir(parent)?;
        self.create_new_in(&dir, parent, &name)
    }

    /// Replaces `rel` with `bytes`, durably: writes `<rel>.tmp` (created
    /// exclusively), fsyncs it, renames it over `rel` (a symlink there is
    /// replaced, not followed) and fsyncs the directory. Missing parent
    /// directories are created.
    pub fn write_durable(&self, rel: &Path, bytes: &[u8]) -> io::Result<()> {
        self.write_durable_via(rel, bytes, ".tmp")
    }

    /// [`Self::write_durable`] for a file other processes may replace at
    /// the same moment (an HF cache ref, written by every `xfer pull` and
    /// `huggingface_hub` of the repo): the temporary name carries this
    /// process's id, so two writers never take each other's.
    pub fn write_durable_shared(&self, rel: &Path, bytes: &[u8]) -> io::Result<()> {
        self.write_durable_via(rel, bytes, &format!(".{}.tmp", std::process::id()))
    }

    /// [`Self::write_durable`] for a file only its owner may read (mode
    /// 0600 from its creation on, so no other user ever opens it): a
    /// secret, such as a job's Hub token.
    pub fn write_private(&self, rel: &Path, bytes: &[u8]) -> io::Result<()> {
        self.write_durable_mode(rel, bytes, ".tmp", 0o600)
    }

    fn write_durable_via(&self, rel: &Path, bytes: &[u8], suffix: &str) -> io::Result<()> {
        self.write_durable_mode(rel, bytes, suffix, 0o644)
    }

    fn write_durable_mode(
        &self,
        rel: &Path,
        bytes: &[u8],
        suffix: &str,
        mode: u32,
    ) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let tmp = cstr(&{
            let mut t = std::ffi::OsString::from(std::ffi::OsStr::from_bytes(name.as_bytes()));
            t.push(suffix);
            t
        })?;
        let _one_writer = REPLACING.lock().unwrap_or_else(|p| p.into_inner());
        let dir = self.create_dir_all(parent)?;
        let mut f = self.create_new_in_mode(&dir, parent, &tmp, mode)?;
        if mode & 0o077 == 0 {
            // As `util::private` does: exactly the mode meant, whatever
            // the umask or a default ACL of the folder made of it.
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        self.rename_in(&dir, parent, &tmp, &name)?;
        dir.sync_all()
    }

    /// Renames `from` to `to` within `dir` (the directory `parent`).
    fn rename_in(&self, dir: &File, parent: &Path, from: &CString, to: &CString) -> io::Result<()> {
        // SAFETY: renameat within one valid dirfd; neither name is followed.
        cvt(unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) })
            .map(|_| ())
            .map_err(|e| {
                let rel = parent.join(std::ffi::OsStr::from_bytes(to.as_bytes()));
                self.explain(&rel, e)
            })
    }

    /// Makes `rel` a symlink to `target`, durably: a fresh link under a
    /// temporary name is renamed over `rel` and the directory fsynced.
    /// Missing parent directories are created.
    pub fn symlink_durable(&self, rel: &Path, target: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let tmp = cstr(&{
            let mut t = std::ffi::OsString::from(".");
            t.push(std::ffi::OsStr::from_bytes(name.as_bytes()));
            t.push(format!(".xfer-link-{}", std::process::id()));
            t
        })?;
        let dir = self.create_dir_all(parent)?;
        // SAFETY: unlinkat with a valid dirfd and name (a missing one is fine).
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        let t = cstr(target.as_os_str())?;
        // SAFETY: symlinkat with valid strings and dirfd.
        cvt(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), tmp.as_ptr()) })
            .map_err(|e| self.explain(rel, e))?;
        self.rename_in(&dir, parent, &tmp, &name)?;
        dir.sync_all()
    }

    /// Renames the file `rel` to `to`, a path outside the root's state that
    /// the caller has checked (the source is reached without symlinks).
    pub fn rename_to(&self, rel: &Path, to: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.dir(parent)?;
        let to_c = cstr(to.as_os_str())?;
        // SAFETY: renameat with a valid dirfd and NUL-terminated names.
        cvt(unsafe {
            libc::renameat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_FDCWD,
                to_c.as_ptr(),
            )
        })
        .map(|_| ())
        .map_err(|e| self.explain(rel, e))
    }

    /// Renames the file `from` over `to`, both in one folder beneath the
    /// root (a symlink at `to` is replaced, not followed), and fsyncs the
    /// folder.
    pub fn rename_within(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (parent, from_name) = split(from)?;
        let (to_parent, to_name) = split(to)?;
        if parent != to_parent {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} and {} are in different folders",
                    from.display(),
                    to.display()
                ),
            ));
        }
        let dir = self.dir(parent)?;
        self.rename_in(&dir, parent, &from_name, &to_name)?;
        dir.sync_all()
    }

    /// Removes the file (or symlink) `rel`.
    pub fn remove_file(&self, rel: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.dir(parent)?;
        // SAFETY: unlinkat with a valid dirfd and name.
        cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
            .map(|_| ())
            .map_err(|e| self.explain(rel, e))
    }

    /// Removes the tree `rel` (a symlink there is removed, not followed),
    /// reached through a descriptor of its parent so that no symlink on the
    /// way can point the removal elsewhere.
    pub fn remove_dir_all(&self, rel: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.dir(parent)?;
        let via = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        let name = std::ffi::OsStr::from_bytes(name.as_bytes());
        if via.is_dir() {
            std::fs::remove_dir_all(via.join(name))
        } else {
            // No /proc: the parent was just checked to be reached without
            // symlinks; std's removal itself never follows one.
            std::fs::remove_dir_all(self.show(rel))
        }
    }

    #[cfg(test)]
    fn without_openat2(mut self) -> Root {
        self.openat2 = false;
        self
    }
}

#[cfg(test)]
thread_local! {
    /// Folders [`sync_dir`] fsynced on this thread, for tests.
    static DIR_SYNCS: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Fsyncs the folder `dir`, so that its entries (a rename into it, a file
/// or folder created in it) survive a power cut.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io::Error::new(e.kind(), format!("cannot sync {}: {e}", dir.display())))?;
    #[cfg(test)]
    DIR_SYNCS.with(|s| s.borrow_mut().push(dir.to_path_buf()));
    Ok(())
}

/// Creates `dir` and whatever parents are missing, fsyncing the parent of
/// each folder it creates (a new folder is only durable once its parent
/// is). Returns the folders it created, outermost first; none if `dir`
/// was there.
pub fn create_dir_all_durable(dir: &Path) -> io::Result<Vec<PathBuf>> {
    create_dir_all_durable_mode(dir, 0o777)
}

/// [`create_dir_all_durable`] with `mode` (before the umask) for the
/// folders it creates.
pub fn create_dir_all_durable_mode(dir: &Path, mode: u32) -> io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::DirBuilderExt;
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur.filter(|d| !d.as_os_str().is_empty()) {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is not a folder; move it away", d.display()),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(d.to_path_buf()),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", d.display()))),
        }
        cur = d.parent();
    }
    let mut made = Vec::new();
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(&d) {
            Ok(()) => made.push(d.clone()),
            // Another process made it meanwhile: theirs to sync.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => continue,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot create {}: {e}", d.display()),
                ))
            }
        }
        sync_dir(d.parent().unwrap_or(Path::new(".")))?;
    }
    Ok(made)
}

/// Renames `from` to `to` and fsyncs `to`'s folder (and `from`'s, when it
/// is another), so the rename survives a power cut.
pub fn rename_durable(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot rename {} to {}: {e}", from.display(), to.display()),
        )
    })?;
    let to_dir = to.parent().unwrap_or(Path::new(""));
    sync_dir(to_dir)?;
    let from_dir = from.parent().unwrap_or(Path::new(""));
    if from_dir != to_dir {
        sync_dir(from_dir)?;
    }
    Ok(())
}

/// Replaces `path` with `bytes` (file mode `mode`), durably: a fresh
/// temporary beside it (created exclusively, so never through a symlink)
/// is written and fsynced, renamed over `path`, and the folder fsynced.
/// Missing folders are created durably. Concurrent writers each use their
/// own temporary; the last rename wins.
pub fn write_file_durable(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new(""));
    create_dir_all_durable(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a file name is needed"))?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .tempfile_in(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| {
        io::Error::new(
            e.error.kind(),
            format!("cannot replace {}: {}", path.display(), e.error),
        )
    })?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// The folders [`sync_dir`] fsynced since the last call, on this thread.
    fn synced() -> Vec<PathBuf> {
        DIR_SYNCS.with(|s| std::mem::take(&mut *s.borrow_mut()))
    }

    #[test]
    fn new_folders_are_made_and_each_synced_into_its_parent() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().to_path_buf();
        synced();
        let made = create_dir_all_durable(&base.join("a/b/c")).unwrap();
        assert_eq!(made, [base.join("a"), base.join("a/b"), base.join("a/b/c")]);
        assert!(base.join("a/b/c").is_dir());
        assert_eq!(synced(), [base.clone(), base.join("a"), base.join("a/b")]);
        // Again: nothing made, nothing synced.
        assert!(create_dir_all_durable(&base.join("a/b/c"))
            .unwrap()
            .is_empty());
        assert!(synced().is_empty());
        // Only the missing tail is made.
        let made = create_dir_all_durable(&base.join("a/x/y")).unwrap();
        assert_eq!(made, [base.join("a/x"), base.join("a/x/y")]);
        assert_eq!(synced(), [base.join("a"), base.join("a/x")]);
        // A file in the way is an error that names it.
        fs::write(base.join("f"), b"").unwrap();
        let e = create_dir_all_durable(&base.join("f/g")).unwrap_err();
        assert!(e.to_string().contains("f/g"), "{e}");
        let e = create_dir_all_durable(&base.join("f")).unwrap_err();
        assert!(e.to_string().contains("f is not a folder"), "{e}");
    }

    #[test]
    fn durable_writes_and_renames_sync_their_folders() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().to_path_buf();
        synced();
        let p = base.join("d/state.json");
        write_file_durable(&p, b"one", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        // The new folder into its parent, then the rename into the folder.
        assert_eq!(synced(), [base.clone(), base.join("d")]);
        write_file_durable(&p, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(synced(), [base.join("d")]);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let left: Vec<_> = fs::read_dir(base.join("d")).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary left behind");
        // A symlink at the name is replaced, its target untouched.
        fs::write(base.join("victim"), b"keep").unwrap();
        fs::remove_file(&p).unwrap();
        symlink(base.join("victim"), &p).unwrap();
        write_file_durable(&p, b"three", 0o644).unwrap();
        assert!(fs::symlink_metadata(&p).unwrap().is_file());
        assert_eq!(fs::read(base.join("victim")).unwrap(), b"keep");
        synced();
        // A rename across folders syncs both.
        create_dir_all_durable(&base.join("e")).unwrap();
        synced();
        rename_durable(&p, &base.join("e/moved")).unwrap();
        assert_eq!(synced(), [base.join("e"), base.join("d")]);
        rename_durable(&base.join("e/moved"), &base.join("e/again")).unwrap();
        assert_eq!(synced(), [base.join("e")]);
    }

    /// A root, and an outside folder holding `victim` with known bytes.
    fn setup() -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::write(&victim, b"keep me").unwrap();
        (root, outside, victim)
    }

    fn roots(path: &Path) -> [Root; 2] {
        let r = Root::open(path).unwrap();
        [r.clone(), r.without_openat2()]
    }

    #[test]
    fn temp_files_are_created_exclusively_and_a_stale_link_is_replaced() {
        let (root, _outside, victim) = setup();
        for r in roots(root.path()) {
            r.create_dir_all(Path::new(".xfer/models")).unwrap();
            let tmp = Path::new(".xfer/models/m.json.tmp");
            let _ = r.remove_file(tmp);
            symlink(&victim, root.path().join(tmp)).unwrap();
            let mut f = r.create_temp(tmp).unwrap();
            f.write_all(b"new").unwrap();
            assert_eq!(fs::read(&victim).unwrap(), b"keep me");
            let m = fs::symlink_metadata(root.path().join(tmp)).unwrap();
            assert!(m.is_file(), "a real file replaced the link");
            // A stale regular file is replaced too, not appended to.
            let mut f = r.create_temp(tmp).unwrap();
            f.write_all(b"x").unwrap();
            assert_eq!(fs::read(root.path().join(tmp)).unwrap(), b"x");
        }
    }

    #[test]
    fn a_symlink_at_the_last_component_is_refused() {
        let (root, _outside, victim) = setup();
        symlink(&victim, root.path().join("f")).unwrap();
        for r in roots(root.path()) {
            for e in [
                r.open_rw(Path::new("f")).unwrap_err(),
                r.open_read(Path::new("f")).unwrap_err(),
                r.open_append(Path::new("f")).unwrap_err(),
            ] {
                let p = Planted::of(&e).unwrap_or_else(|| panic!("{e}"));
                assert_eq!(p.path, root.path().join("f"));
                let text = e.to_string();
                assert!(
                    text.contains("is a symlink; xfer never writes through one. Remove it"),
                    "{text}"
                );
            }
        }
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
    }

    #[test]
    fn a_symlinked_parent_is_refused_and_nothing_lands_outside() {
        let (root, outside, victim) = setup();
        fs::create_dir(root.path().join(".xfer")).unwrap();
        symlink(outside.path(), root.path().join(".xfer/models")).unwrap();
        for r in roots(root.path()) {
            let e = r
                .write_durable(Path::new(".xfer/models/m.json"), b"{}")
                .unwrap_err();
            assert_eq!(
                Planted::of(&e).unwrap().path,
                root.path().join(".xfer/models"),
                "{e}"
            );
            let e = r.create_dir_all(Path::new(".xfer/models/sub")).unwrap_err();
            assert!(Planted::of(&e).is_some(), "{e}");
            let e = r.open_rw(Path::new(".xfer/models/victim")).unwrap_err();
            assert!(Planted::of(&e).is_some(), "{e}");
            let e = r.remove_file(Path::new(".xfer/models/victim")).unwrap_err();
            assert!(Planted::of(&e).is_some(), "{e}");
            let e = r.remove_dir_all(Path::new(".xfer/models/x")).unwrap_err();
            assert!(Planted::of(&e).is_some(), "{e}");
            assert!(r.write_durable(Path::new("../escape"), b"x").is_err());
        }
        let names: Vec<_> = fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["victim"]);
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
    }

    #[test]
    fn a_shared_write_leaves_other_writers_temporaries_alone() {
        let (root, _outside, _victim) = setup();
        for r in roots(root.path()) {
            let refs = root.path().join("refs");
            fs::create_dir_all(&refs).unwrap();
            // Another process's write in flight, under either naming.
            fs::write(refs.join("main.tmp"), b"theirs").unwrap();
            fs::write(refs.join("main.1.tmp"), b"theirs too").unwrap();
            r.write_durable_shared(Path::new("refs/main"), b"ours")
                .unwrap();
            assert_eq!(fs::read(refs.join("main")).unwrap(), b"ours");
            assert_eq!(fs::read(refs.join("main.tmp")).unwrap(), b"theirs");
            assert_eq!(fs::read(refs.join("main.1.tmp")).unwrap(), b"theirs too");
            let own = refs.join(format!("main.{}.tmp", std::process::id()));
            assert!(!own.exists(), "our temporary was left behind");
            fs::remove_dir_all(&refs).unwrap();
        }
    }

    #[test]
    fn write_durable_renames_over_the_old_file_or_a_link_and_leaves_no_temp() {
        let (root, _outside, victim) = setup();
        for r in roots(root.path()) {
            let rel = Path::new(".xfer/jobs/j.json");
            r.write_durable(rel, b"one").unwrap();
            r.write_durable(rel, b"two").unwrap();
            assert_eq!(fs::read(root.path().join(rel)).unwrap(), b"two");
            // A symlink at the final name is replaced by the rename, its
            // target untouched.
            r.remove_file(rel).unwrap();
            symlink(&victim, root.path().join(rel)).unwrap();
            r.write_durable(rel, b"three").unwrap();
            assert!(fs::symlink_metadata(root.path().join(rel))
                .unwrap()
                .is_file());
            assert_eq!(fs::read(root.path().join(rel)).unwrap(), b"three");
            let left: Vec<_> = fs::read_dir(root.path().join(".xfer/jobs"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, ["j.json"]);
            // Durable symlinks the same way.
            r.symlink_durable(Path::new("snap/a/l"), Path::new("../t"))
                .unwrap();
            r.symlink_durable(Path::new("snap/a/l"), Path::new("../u"))
                .unwrap();
            assert_eq!(
                fs::read_link(root.path().join("snap/a/l")).unwrap(),
                Path::new("../u")
            );
            r.remove_dir_all(Path::new("snap")).unwrap();
            assert!(!root.path().join("snap").exists());
        }
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
    }
}
