//! Writing files so that readers see the old content or the new, never a torn one.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{Error, Result};

/// Writes `contents` to `path` with `mode` through a temporary file in the same directory and a
/// rename, then syncs the directory so the rename survives a crash.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        Error::file("write", path, std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))
    })?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::file("write", path, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn replaces_content_with_the_given_mode_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("node.key");
        write_atomic(&path, b"old", 0o600).expect("first write");
        write_atomic(&path, b"new", 0o600).expect("second write");
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
        let entries: Vec<_> = std::fs::read_dir(tmp.path()).expect("ls").collect();
        assert_eq!(entries.len(), 1, "only the target file remains");
    }
}
