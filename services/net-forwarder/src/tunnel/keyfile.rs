//! A tunnel private key on disk, for static set-ups (benches, tests, `--peer` flags): 64
//! hexadecimal digits, mode 0600, owned by the user. A net-forwarder given none makes its key
//! pair in memory at start, which is what a cluster does: no secret on any filesystem.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::identity::{Identity, KEY_LEN};
use crate::{Error, Result};

/// Reads the key; refuses a file that others could read or that another user owns.
pub fn load(path: &Path) -> Result<Identity> {
    let what = || format!("read the tunnel private key {}", path.display());
    let meta = std::fs::metadata(path).map_err(|e| Error::io(what(), e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::Config(format!(
            "the tunnel private key {} is mode {mode:04o}: it must be readable by its owner only (chmod 0600)",
            path.display()
        )));
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(Error::Config(format!(
            "the tunnel private key {} belongs to uid {}, not to this user ({uid})",
            path.display(),
            meta.uid()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(what(), e))?;
    parse(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

/// The key file's text: 64 hexadecimal digits, surrounding whitespace ignored.
pub fn parse(text: &str) -> Result<Identity> {
    let bytes =
        hex::decode(text.trim()).ok().and_then(|b| <[u8; KEY_LEN]>::try_from(b).ok()).ok_or_else(|| {
            Error::Config(format!("a tunnel private key is {} hexadecimal digits", KEY_LEN * 2))
        })?;
    Ok(Identity::from_secret(bytes))
}

/// Writes a new random private key, created with mode 0600; refuses to overwrite an existing
/// file. Returns the key pair, whose public half goes into the other nodes' `--peer` flags.
pub fn generate(path: &Path) -> Result<Identity> {
    let identity = Identity::generate()?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("create the tunnel private key {}", path.display()), e))?;
    file.write_all(format!("{}\n", hex::encode(identity.secret_bytes())).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(format!("write the tunnel private key {}", path.display()), e))?;
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_load_and_differ() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let ka = generate(&a).unwrap().public();
        let kb = generate(&b).unwrap().public();
        assert_eq!(std::fs::metadata(&a).unwrap().permissions().mode() & 0o777, 0o600);
        assert_ne!(ka, kb);
        assert_eq!(load(&a).unwrap().public(), ka);
        let e = generate(&a).unwrap_err().to_string();
        assert!(e.contains("exists"), "never overwritten: {e}");
        assert_eq!(load(&a).unwrap().public(), ka);
    }

    #[test]
    fn refuses_readable_or_malformed_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        generate(&path).unwrap();
        for mode in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = load(&path).unwrap_err().to_string();
            assert!(e.contains(&format!("mode {mode:04o}")) && e.contains("chmod 0600"), "{e}");
        }
        std::fs::write(&path, "not a key").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("hexadecimal"));
        for bad in ["", "abc", &"ab".repeat(31), &"zz".repeat(32), &"ab".repeat(33)] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(load(&dir.path().join("absent")).is_err());
    }
}
