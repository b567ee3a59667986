//! The cluster's tunnel key on disk: 64 hexadecimal digits, mode 0600, owned by the user.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use ring::rand::SecureRandom;

use super::wire::{ClusterKey, KEY_LEN};
use crate::{Error, Result};

/// Reads the key; refuses a file that others could read or that another user owns.
pub fn load(path: &Path) -> Result<ClusterKey> {
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::io(format!("read the tunnel key {}", path.display()), e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::Config(format!(
            "the tunnel key {} is mode {mode:04o}: it must be readable by its owner only (chmod 0600)",
            path.display()
        )));
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(Error::Config(format!(
            "the tunnel key {} belongs to uid {}, not to this user ({uid})",
            path.display(),
            meta.uid()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("read the tunnel key {}", path.display()), e))?;
    ClusterKey::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

/// Writes a new random key, mode 0600; refuses to overwrite an existing file.
pub fn generate(path: &Path) -> Result<()> {
    let mut bytes = [0u8; KEY_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| Error::Config("the system's random number generator failed".into()))?;
    let key = ClusterKey::new(bytes);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("create the tunnel key {}", path.display()), e))?;
    file.write_all(key.to_text().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(format!("write the tunnel key {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_load_and_differ() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        generate(&a).unwrap();
        generate(&b).unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().permissions().mode() & 0o777, 0o600);
        let (ka, kb) = (load(&a).unwrap(), load(&b).unwrap());
        assert_ne!(ka.to_text(), kb.to_text());
        let e = generate(&a).unwrap_err().to_string();
        assert!(e.contains("exists"), "never overwritten: {e}");
        assert_eq!(load(&a).unwrap().to_text(), ka.to_text());
    }

    #[test]
    fn refuses_readable_or_malformed_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        generate(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 0600"), "{e}");
        std::fs::write(&path, "not a key").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("hexadecimal"));
        assert!(load(&dir.path().join("absent")).is_err());
    }
}
