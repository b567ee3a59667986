//! Checks on secret files before they are used: private mode, and CA keys off the shared
//! filesystem.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Reads a secret file after checking it is not accessible to group or others.
pub fn read_private(path: &Path) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::file("inspect", path, e))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(Error::InsecureSecret { path: path.to_owned(), mode });
    }
    std::fs::read(path).map_err(|e| Error::file("read", path, e))
}

/// Fails if `key` (existing or about to be written) lies under `shared` (both resolved through symlinks, so a link into the
/// shared tree is caught too).
pub fn ensure_not_shared(key: &Path, shared: &Path) -> Result<()> {
    let key_real = resolve(key)?;
    // The shared directory may not exist on this host (a controller without a home mount);
    // then nothing can lie under it.
    let Ok(shared_real) = std::fs::canonicalize(shared) else {
        return Ok(());
    };
    if key_real.starts_with(&shared_real) {
        return Err(Error::KeyOnSharedFilesystem { path: key.to_owned(), shared: shared.to_owned() });
    }
    Ok(())
}

/// Resolves `path` through symlinks; a file not written yet is resolved through its directory.
fn resolve(path: &Path) -> Result<PathBuf> {
    match std::fs::canonicalize(path) {
        Ok(real) => Ok(real),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let name = path.file_name().ok_or_else(|| Error::file("resolve", path, e))?;
            let dir = std::fs::canonicalize(parent).map_err(|e| Error::file("resolve", parent, e))?;
            Ok(dir.join(name))
        }
        Err(e) => Err(Error::file("resolve", path, e)),
    }
}

/// The default shared directory: `$HOME/.hpk`.
pub fn default_shared_dir() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/")).join(".hpk")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_with_mode(path: &Path, mode: u32) {
        std::fs::write(path, b"secret").expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn group_readable_secret_is_refused_with_the_fix() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("ca.key");
        write_with_mode(&path, 0o640);
        let err = read_private(&path).expect_err("0640 must be refused");
        assert!(err.to_string().contains("chmod 600"), "{err}");
        write_with_mode(&path, 0o600);
        assert_eq!(read_private(&path).expect("0600 is fine"), b"secret");
    }

    #[test]
    fn key_under_shared_dir_is_refused_also_through_a_symlink() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let shared = tmp.path().join("home/.hpk");
        std::fs::create_dir_all(&shared).expect("mkdir");
        let key = shared.join("ca.key");
        write_with_mode(&key, 0o600);
        assert!(matches!(ensure_not_shared(&key, &shared), Err(Error::KeyOnSharedFilesystem { .. })));
        let link = tmp.path().join("local.key");
        std::os::unix::fs::symlink(&key, &link).expect("symlink");
        assert!(ensure_not_shared(&link, &shared).is_err());
        let local = tmp.path().join("node-local.key");
        write_with_mode(&local, 0o600);
        ensure_not_shared(&local, &shared).expect("a local key is fine");
    }
}
