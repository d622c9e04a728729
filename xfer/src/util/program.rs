//! Programs by absolute path. A name (`vllm`) is resolved once, against
//! this process's own `PATH`, never a child's: a child's environment may
//! set `PATH`, and `Command::new("vllm").env("PATH", ..)` looks the name
//! up in the child's. The caller checks the name, then starts the path it
//! got, so what runs is what was checked.
//!
//! As `execvp` does, the first folder of `PATH` holding an executable
//! file of that name wins; unlike it, folders that are not absolute (an
//! empty entry or `.`, which name the working directory) are skipped.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Why a program could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Nothing executable of that name in any folder of `PATH`.
    #[error("`{name}` is not on the PATH of the xfer agent ({path}); install it there, or start the agent with a PATH that holds it")]
    NotFound {
        /// The program's name.
        name: String,
        /// The agent's PATH.
        path: String,
    },
    /// A path that is not absolute (it would depend on the working folder).
    #[error("`{name}` is a relative path; name the program alone (it is looked up on the agent's PATH) or by its absolute path")]
    Relative {
        /// The path given.
        name: String,
    },
    /// An absolute path that is not an executable file.
    #[error("{name} is not an executable file; fix the path, or install the program there")]
    NotExecutable {
        /// The path given.
        name: String,
    },
}

/// `name` as an absolute path: itself if absolute, else looked up on this
/// process's `PATH`.
pub fn resolve(name: &str) -> Result<PathBuf, ResolveError> {
    resolve_in(name, std::env::var_os("PATH").as_deref())
}

/// [`resolve`] against the `PATH` value `path`.
pub fn resolve_in(name: &str, path: Option<&OsStr>) -> Result<PathBuf, ResolveError> {
    if name.contains('/') {
        let p = Path::new(name);
        if !p.is_absolute() {
            return Err(ResolveError::Relative {
                name: name.to_string(),
            });
        }
        return if executable(p) {
            Ok(p.to_path_buf())
        } else {
            Err(ResolveError::NotExecutable {
                name: name.to_string(),
            })
        };
    }
    let found = (!name.is_empty())
        .then_some(path)
        .flatten()
        .into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|p| executable(p));
    found.ok_or_else(|| ResolveError::NotFound {
        name: name.to_string(),
        path: path.map_or("unset".into(), |p| p.to_string_lossy().into_owned()),
    })
}

/// Whether `p` is a file (through symlinks) someone may execute.
fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tool(dir: &Path, name: &str, mode: u32) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_name_is_the_first_executable_on_the_given_path_only() {
        let t = tempfile::tempdir().unwrap();
        let (a, b, c) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
        tool(&a, "eng", 0o644);
        let want = tool(&b, "eng", 0o755);
        tool(&c, "eng", 0o755);
        std::fs::create_dir_all(a.join("dir")).unwrap();
        let path = std::env::join_paths([&a, &b, &c]).unwrap();
        assert_eq!(resolve_in("eng", Some(&path)), Ok(want));
        // A folder is not a program; a missing name names the PATH.
        let e = resolve_in("dir", Some(&path)).unwrap_err();
        assert!(matches!(e, ResolveError::NotFound { .. }), "{e}");
        assert!(e.to_string().contains(&*a.to_string_lossy()), "{e}");
        assert!(resolve_in("eng", None).is_err());
        assert!(resolve_in("", Some(&path)).is_err());
    }

    #[test]
    fn relative_folders_on_the_path_and_relative_names_are_never_used() {
        let t = tempfile::tempdir().unwrap();
        tool(t.path(), "eng", 0o755);
        let cwd = std::env::current_dir().unwrap();
        // `.` and an empty entry name the working folder: skipped.
        for path in [".", "", "rel"] {
            let e = resolve_in("eng", Some(OsStr::new(path)));
            assert!(matches!(e, Err(ResolveError::NotFound { .. })), "{path}");
        }
        assert!(matches!(
            resolve_in("./eng", Some(OsStr::new("/bin"))),
            Err(ResolveError::Relative { .. })
        ));
        assert_eq!(std::env::current_dir().unwrap(), cwd);
    }

    #[test]
    fn an_absolute_name_is_itself_when_executable() {
        let t = tempfile::tempdir().unwrap();
        let x = tool(t.path(), "x", 0o755);
        let n = tool(t.path(), "n", 0o600);
        assert_eq!(resolve_in(x.to_str().unwrap(), None), Ok(x.clone()));
        assert!(matches!(
            resolve_in(n.to_str().unwrap(), None),
            Err(ResolveError::NotExecutable { .. })
        ));
        assert!(resolve("sh").unwrap().is_absolute());
    }
}
