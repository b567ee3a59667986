//! Writing a cluster's files.

use std::path::Path;

use crate::error::{Error, Result};

/// Writes `contents` to `path` atomically (a file beside it, renamed over it) with `mode` from
/// its first moment.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    // A new file has the mode asked (less the umask) from its first moment; one left by a
    // killed run of this PID could have another, so it goes first.
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| Error::io("create", tmp.display(), e))?;
    file.write_all(contents).map_err(|e| Error::io("write", tmp.display(), e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename", path.display(), e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_written_file_has_its_mode_and_replaces_the_old_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key.pem");
        std::fs::write(&path, "old").expect("old");
        super::write_file(&path, b"new", 0o600).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1, "no temporary file left");
    }
}
