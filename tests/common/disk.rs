//! Small disks: tmpfs and loop-mounted ext4 of a given size, and filling them.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// A tmpfs mounted for one test, unmounted on drop.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }

    pub fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "remount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        unmount(&self.dir);
    }
}

/// A small filesystem for one test: a loop-mounted ext4 image (a real block
/// allocator, journal and reserved blocks) where `mkfs.ext4` and loop
/// devices work, else a tmpfs. Unmounted on drop.
pub struct SmallDisk {
    pub dir: PathBuf,
    /// `loop-ext4` or `tmpfs`.
    pub kind: &'static str,
    _tmpfs: Option<Tmpfs>,
}

impl SmallDisk {
    /// Mounts `size_mib` MiB at `dir`; the ext4 image lives next to `dir`.
    pub fn mount(dir: &Path, size_mib: u64) -> Result<SmallDisk, String> {
        match Self::loop_ext4(dir, size_mib) {
            Ok(d) => Ok(d),
            Err(why) => {
                eprintln!("note: no loop-mounted ext4 here ({why}); using a tmpfs");
                let fs = Tmpfs::mount(dir, &format!("{size_mib}m"))?;
                Ok(SmallDisk {
                    dir: dir.to_path_buf(),
                    kind: "tmpfs",
                    _tmpfs: Some(fs),
                })
            }
        }
    }

    fn loop_ext4(dir: &Path, size_mib: u64) -> Result<SmallDisk, String> {
        let image = dir.with_extension("ext4");
        let sh = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                return Ok(());
            }
            Err(format!(
                "{cmd:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        };
        fs::File::create(&image)
            .and_then(|f| f.set_len(size_mib * MIB))
            .map_err(|e| format!("cannot create {}: {e}", image.display()))?;
        sh(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        sh(Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&image)
            .arg(dir))?;
        Ok(SmallDisk {
            dir: dir.to_path_buf(),
            kind: "loop-ext4",
            _tmpfs: None,
        })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if self._tmpfs.is_some() {
            return; // Tmpfs unmounts itself.
        }
        unmount(&self.dir);
    }
}

/// Another writer takes every free byte of the filesystem holding `path`:
/// appends to `path` until the disk is full. Returns the bytes written.
pub fn fill_disk(path: &Path) -> u64 {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let block = vec![0xa5u8; 64 * 1024];
    let mut written = 0;
    while f.write_all(&block).is_ok() {
        written += block.len() as u64;
    }
    let _ = f.sync_all();
    written
}

/// `umount DIR`, lazily if it is busy.
fn unmount(dir: &Path) {
    let ok = Command::new("umount")
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let _ = Command::new("umount").arg("-l").arg(dir).status();
    }
}

/// Mounts a tmpfs or explains why the test cannot run here.
pub fn tmpfs_or_skip(dir: &Path, size: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(dir, size) {
        Ok(fs) => Some(fs),
        Err(why) => {
            eprintln!("SKIPPED: this test needs a tmpfs mount (run as root): {why}");
            None
        }
    }
}
