//! Files and folders only their owner may read: the agent's rank records
//! and the launcher's run records hold the `[launch.env]` values, which
//! may be tokens. A private file is written whole to a fresh temporary
//! (created exclusively, mode 0600, never through a symlink), fsynced,
//! renamed over the old one, and its folder fsynced, so that the new
//! contents survive a power cut (as [`super::beneath::Root::write_durable`]
//! does, which writes mode 0644); a private folder is mode 0700.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Writes `body` to `path` (mode 0600) through `path` + `.tmp`, durably. A
/// leftover temporary is removed first (unlinking removes a symlink, not
/// what it points to), and the new one is created exclusively and without
/// following a symlink, so a file planted there is never written through.
pub fn write_atomic(path: &Path, body: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    match fs::remove_file(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)?;
    // The mode above is filtered by the umask; 0600 is what is meant.
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(body)?;
    f.sync_all()?;
    drop(f);
    fs::rename(tmp, path)?;
    sync_parent(path)
}

/// Fsyncs the folder holding `path`, so that a rename into it is durable.
fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::File::open(dir)?.sync_all()
}

/// Creates `dir` (and its parents) with the last folder mode 0700, and
/// makes an existing one 0700. Refuses a symlink in its place.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} is not a folder", dir.display()),
        ));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn writes_0600_and_never_through_a_planted_tmp() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("r.json");
        let victim = d.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("r.json.tmp")).unwrap();
        write_atomic(&path, b"one").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        // A world-readable file already there is replaced by a private one.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert!(!d.path().join("r.json.tmp").exists());
    }

    #[test]
    fn folders_are_0700_even_when_they_existed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/b");
        create_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        create_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(create_dir(&link).is_err());
    }
}
