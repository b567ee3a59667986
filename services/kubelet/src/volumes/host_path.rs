//! hostPath volumes, and PersistentVolumeClaims bound to hostPath or local PersistentVolumes:
//! the mount source is the host path itself, checked (or created) as its `type` says.

use std::fs::{self, DirBuilder, Metadata, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolume;

use super::VolumeError;
use super::forbidden::HostPaths;
use crate::objects::ObjectSource;

/// What a hostPath `type` requires to find at the path.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Directory,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Want {
    fn words(self) -> &'static str {
        match self {
            Self::Directory => "a directory",
            Self::File => "a file",
            Self::Socket => "a socket",
            Self::CharDevice => "a character device",
            Self::BlockDevice => "a block device",
        }
    }

    fn holds(self, meta: &Metadata) -> bool {
        let kind = meta.file_type();
        match self {
            Self::Directory => kind.is_dir(),
            Self::File => kind.is_file(),
            Self::Socket => kind.is_socket(),
            Self::CharDevice => kind.is_char_device(),
            Self::BlockDevice => kind.is_block_device(),
        }
    }
}

/// What is at a path, in words.
fn describe(meta: &Metadata) -> &'static str {
    let kind = meta.file_type();
    if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a file"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a FIFO"
    } else {
        "something else"
    }
}

/// Checks `path` against hostPath `kind` (`None` or "" checks nothing), creating it for the
/// `…OrCreate` types, and refuses it if `allowed` refuses it (before anything
/// is created, and again once it exists). Symlinks at `path` are followed, as the kubelet
/// follows them.
pub fn check(volume: &str, path: &Path, kind: Option<&str>, allowed: &HostPaths) -> Result<(), VolumeError> {
    if !path.is_absolute() {
        return Err(VolumeError::BadPath {
            volume: volume.to_owned(),
            path: path.display().to_string(),
            reason: "must be an absolute host path",
        });
    }
    super::forbidden::check(volume, path, allowed)?;
    check_type(volume, path, kind)?;
    super::forbidden::check(volume, path, allowed)
}

fn check_type(volume: &str, path: &Path, kind: Option<&str>) -> Result<(), VolumeError> {
    let kind = kind.unwrap_or_default();
    let (want, create) = match kind {
        "" => return Ok(()),
        "DirectoryOrCreate" => (Want::Directory, true),
        "Directory" => (Want::Directory, false),
        "FileOrCreate" => (Want::File, true),
        "File" => (Want::File, false),
        "Socket" => (Want::Socket, false),
        "CharDevice" => (Want::CharDevice, false),
        "BlockDevice" => (Want::BlockDevice, false),
        other => {
            return Err(VolumeError::HostPathUnknownType {
                volume: volume.to_owned(),
                path: path.to_owned(),
                kind: other.to_owned(),
            });
        }
    };
    let wrong = |found| VolumeError::HostPathType {
        volume: volume.to_owned(),
        path: path.to_owned(),
        found,
        wanted: kind.to_owned(),
        required: want.words(),
    };
    match fs::metadata(path) {
        Ok(meta) if want.holds(&meta) => Ok(()),
        Ok(meta) => Err(wrong(describe(&meta))),
        Err(e) if e.kind() == ErrorKind::NotFound && create => make(volume, path, want),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(wrong("missing")),
        Err(e) => Err(VolumeError::io(volume, "inspect", path)(e)),
    }
}

/// Creates a missing `DirectoryOrCreate` (0755, with parents) or `FileOrCreate` (empty, 0644;
/// its directory must exist).
fn make(volume: &str, path: &Path, want: Want) -> Result<(), VolumeError> {
    let result = if want == Want::Directory {
        DirBuilder::new().recursive(true).mode(0o755).create(path)
    } else {
        match OpenOptions::new().write(true).create_new(true).mode(0o644).open(path) {
            Ok(_) => Ok(()),
            // Someone created it meanwhile; whatever it is, check it as if it had been there.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return check_type(volume, path, Some("File")),
            Err(e) => Err(e),
        }
    };
    result.map_err(VolumeError::io(volume, "create", path))
}

/// The host path of PersistentVolumeClaim `claim` in `namespace`: the claim must be Bound to a
/// hostPath or local PersistentVolume that is bound back to it.
pub async fn claim_path(
    volume: &str,
    namespace: &str,
    claim: &str,
    objects: &impl ObjectSource,
    allowed: &HostPaths,
) -> Result<PathBuf, VolumeError> {
    let problem = |problem: String| VolumeError::Claim {
        volume: volume.to_owned(),
        claim: format!("{namespace}/{claim}"),
        problem,
    };
    let api = |what: String| {
        let volume = volume.to_owned();
        move |source| VolumeError::Api { volume, what, source }
    };
    let pvc = objects
        .persistent_volume_claim(namespace, claim)
        .await
        .map_err(api(format!("PersistentVolumeClaim {namespace}/{claim}")))?
        .ok_or_else(|| problem("not found".into()))?;
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty());
    let (Some(pv_name), "Bound") = (pv_name, phase) else {
        return Err(problem(format!("is {phase}, not Bound to a PersistentVolume yet")));
    };
    let pv = objects
        .persistent_volume(pv_name)
        .await
        .map_err(api(format!("PersistentVolume {pv_name}")))?
        .ok_or_else(|| problem(format!("is bound to PersistentVolume {pv_name}, which does not exist")))?;
    let bound_back = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none_or(|r| {
        r.name.as_deref() == Some(claim) && r.namespace.as_deref().is_none_or(|ns| ns == namespace)
    });
    if !bound_back {
        return Err(problem(format!("PersistentVolume {pv_name} is bound to another claim")));
    }
    let (path, kind) = pv_source(&pv).ok_or_else(|| {
        problem(format!(
            "PersistentVolume {pv_name} is not a hostPath or local volume, the only kinds this node can mount"
        ))
    })?;
    check(volume, &path, kind.as_deref(), allowed)?;
    Ok(path)
}

/// The path (and hostPath type) of a hostPath or local PersistentVolume.
fn pv_source(pv: &PersistentVolume) -> Option<(PathBuf, Option<String>)> {
    let spec = pv.spec.as_ref()?;
    if spec.volume_mode.as_deref() == Some("Block") {
        return None;
    }
    if let Some(host) = &spec.host_path {
        return Some((PathBuf::from(&host.path), host.type_.clone()));
    }
    // A local volume is a directory (or a mounted device) the administrator prepared.
    spec.local.as_ref().map(|local| (PathBuf::from(&local.path), Some("Directory".to_owned())))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn check_type(path: &Path, kind: &str) -> Result<(), VolumeError> {
        check("v", path, Some(kind), &HostPaths::default())
    }

    #[test]
    fn every_type_accepts_its_kind_and_refuses_others() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let file = dir.join("file");
        fs::write(&file, b"x").expect("write");
        let socket = dir.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let null = Path::new("/dev/null");
        assert!(check_type(dir, "Directory").is_ok());
        assert!(check_type(&file, "File").is_ok());
        assert!(check_type(&socket, "Socket").is_ok());
        assert!(check_type(null, "CharDevice").is_ok());
        assert!(check_type(&file, "").is_ok());
        assert!(check_type(&dir.join("missing"), "").is_ok(), "no type, no check");

        let err = check_type(&file, "Directory").expect_err("a file is no directory");
        assert_eq!(
            err.to_string(),
            format!(
                "hostPath {} for volume \"v\" is a file, type Directory requires a directory",
                file.display()
            )
        );
        let err = check_type(dir, "File").expect_err("dir");
        assert!(err.to_string().contains("is a directory, type File requires a file"), "{err}");
        let err = check_type(&file, "Socket").expect_err("file");
        assert!(err.to_string().contains("is a file, type Socket requires a socket"), "{err}");
        let err = check_type(&file, "CharDevice").expect_err("file");
        assert!(err.to_string().contains("requires a character device"), "{err}");
        let err = check_type(null, "BlockDevice").expect_err("char device");
        assert!(
            err.to_string().contains("is a character device, type BlockDevice requires a block device"),
            "{err}"
        );
        let err = check_type(&dir.join("missing"), "Directory").expect_err("missing");
        assert!(err.to_string().contains("is missing, type Directory requires a directory"), "{err}");
        let err = check_type(&dir.join("missing"), "File").expect_err("missing");
        assert!(err.to_string().contains("is missing"), "{err}");
        assert!(matches!(check_type(dir, "Folder"), Err(VolumeError::HostPathUnknownType { .. })));
        assert!(matches!(
            check("v", Path::new("rel"), None, &HostPaths::default()),
            Err(VolumeError::BadPath { .. })
        ));

        // A block device, where the machine has one.
        let block = fs::read_dir("/dev")
            .expect("/dev")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()));
        match block {
            Some(block) => {
                assert!(check_type(&block, "BlockDevice").is_ok());
                assert!(check_type(&block, "CharDevice").is_err());
            }
            None => eprintln!("no block device in /dev; BlockDevice acceptance not checked"),
        }
    }

    #[test]
    fn or_create_types_create_what_is_missing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/b");
        check("v", &dir, Some("DirectoryOrCreate"), &HostPaths::default()).expect("created");
        assert!(dir.is_dir());
        assert_eq!(fs::metadata(&dir).expect("meta").permissions().mode() & 0o777, 0o755);
        check("v", &dir, Some("DirectoryOrCreate"), &HostPaths::default()).expect("exists");
        let file = dir.join("f");
        check("v", &file, Some("FileOrCreate"), &HostPaths::default()).expect("created");
        assert_eq!(fs::metadata(&file).expect("meta").len(), 0);
        assert_eq!(fs::metadata(&file).expect("meta").permissions().mode() & 0o777, 0o644);
        fs::write(&file, b"data").expect("write");
        check("v", &file, Some("FileOrCreate"), &HostPaths::default()).expect("kept");
        assert_eq!(fs::read(&file).expect("read"), b"data", "an existing file is left alone");
        let err =
            check("v", &file, Some("DirectoryOrCreate"), &HostPaths::default()).expect_err("file in the way");
        assert!(err.to_string().contains("is a file, type DirectoryOrCreate requires a directory"), "{err}");
        // Nothing is created under a forbidden directory.
        let reserved = tmp.path().join("hpk");
        let err = check(
            "v",
            &reserved.join("new"),
            Some("DirectoryOrCreate"),
            &HostPaths { forbidden: vec![reserved.clone()], ..HostPaths::default() },
        )
        .expect_err("forbidden");
        assert!(matches!(err, VolumeError::HostPathForbidden { .. }), "{err}");
        assert!(!reserved.exists(), "refused before anything was made");
        let err = check("v", &tmp.path().join("no/parent"), Some("FileOrCreate"), &HostPaths::default())
            .expect_err("no parent");
        assert!(matches!(err, VolumeError::Io { .. }), "{err:?}");
    }
}
