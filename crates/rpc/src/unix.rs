//! Socket-path hygiene for local gRPC servers: a private directory, a 0600 socket, and a stale
//! socket left by a crashed server removed, but never one a live server still answers on.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::{Error, Result};

/// Makes sure `dir` exists, belongs to us and is 0700. A directory we did not create is never
/// loosened or taken over: it is an error if it is open to others.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    match fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) => return Err(Error::io("create directory", dir, e)),
    }
    let meta = fs::metadata(dir).map_err(|e| Error::io("inspect directory", dir, e))?;
    let uid = nix::unistd::geteuid().as_raw();
    let mode = meta.permissions().mode() & 0o7777;
    if meta.uid() != uid || mode & 0o077 != 0 {
        return Err(Error::InsecureSocketDir { path: dir.to_owned(), mode, uid });
    }
    Ok(())
}

/// Removes a socket file at `path` that no server answers on any more. Fails if a server still
/// answers there, or if the path is something other than a socket.
pub fn remove_stale_socket(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("inspect socket", path, e)),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::io(
            "replace socket",
            path,
            std::io::Error::new(ErrorKind::AlreadyExists, "path exists and is not a socket"),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(Error::SocketInUse(path.to_owned())),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            fs::remove_file(path).map_err(|e| Error::io("remove stale socket", path, e))
        }
        Err(e) => Err(Error::io("probe socket", path, e)),
    }
}

/// Binds a listening UNIX socket at `path`: private parent directory, stale socket removed,
/// socket mode 0600.
pub fn bind(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ensure_private_dir(dir)?;
    }
    remove_stale_socket(path)?;
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| Error::io("bind socket", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io("chmod socket", path, e))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_makes_private_dir_and_socket() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("run/hpk/test.sock");
        let _listener = bind(&path).expect("bind");
        let dir_mode = fs::metadata(path.parent().expect("parent")).expect("meta").permissions().mode();
        let sock_mode = fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert_eq!(sock_mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn stale_socket_is_replaced_live_one_is_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let path = tmp.path().join("s.sock");
        let live = bind(&path).expect("first bind");
        assert!(matches!(bind(&path), Err(Error::SocketInUse(_))));
        drop(live); // the file stays behind, as after a crash
        assert!(path.exists());
        bind(&path).expect("rebind over the stale socket");
    }

    #[test]
    fn open_directory_is_refused_not_loosened() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let err = ensure_private_dir(tmp.path()).expect_err("0755 must be refused");
        assert!(err.to_string().contains("0755"), "{err}");
        let mode = fs::metadata(tmp.path()).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "the directory must not be changed");
    }

    #[test]
    fn regular_file_is_not_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("not-a-socket");
        fs::write(&path, b"data").expect("write");
        assert!(remove_stale_socket(&path).is_err());
        assert!(path.exists());
    }
}
