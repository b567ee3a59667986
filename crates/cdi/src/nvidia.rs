//! A CDI spec for NVIDIA GPUs made from what a host has, for hosts without one of their own
//! (`nvidia-ctk cdi generate` writes one to `/etc/cdi` or `/var/run/cdi`; most HPC nodes have
//! none): each GPU's device node `/dev/nvidia<ID>`, and for every GPU the control devices and
//! the driver's user-space files, its compute libraries and tools, each at its own path in the
//! container as on the host (so an image's loader finds them where its distribution looks, as
//! with NVIDIA's own specs).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::{ContainerEdits, Device, DeviceNode, Error, GPU_KIND, Mount, Spec};

/// The control devices every GPU user needs, where present.
pub const CONTROL_DEVICES: [&str; 4] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];

/// The driver's compute libraries, by file-name stem (`libcuda.so`, `libcuda.so.1`,
/// `libcuda.so.550.54.15` all match `libcuda.so`).
pub const LIBRARIES: [&str; 10] = [
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-pkcs11.so",
];

/// Where distributions put those, relative to the driver's root.
pub const LIBRARY_DIRS: [&str; 5] =
    ["usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib"];

/// The driver's tools.
pub const BINARIES: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Where the tools are, relative to the driver's root.
pub const BINARY_DIRS: [&str; 2] = ["usr/bin", "bin"];

/// Where a host keeps its GPUs and its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The device nodes' directory (`/dev`).
    pub dev_dir: PathBuf,
    /// The root the driver's files are found under (`/`; a driver container's root elsewhere).
    pub driver_root: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Self { dev_dir: PathBuf::from("/dev"), driver_root: PathBuf::from("/") }
    }
}

/// What [`generate`] found besides the spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// The spec: device `<ID>` for each GPU.
    pub spec: Spec,
    /// How many driver files (libraries and tools) it mounts.
    pub driver_files: usize,
}

/// The spec for GPUs `ids` of `host` (each `dev_dir/nvidia<ID>`, which must be a character
/// device).
pub fn generate(host: &Host, ids: &[u32]) -> Result<Found, Error> {
    let mut devices = Vec::new();
    for id in ids {
        let path = host.dev_dir.join(format!("nvidia{id}"));
        let node = device_node(&path, &format!("/dev/nvidia{id}"))?.ok_or_else(|| {
            Error::Generate(format!("GPU {id}: {} is missing or not a character device", path.display()))
        })?;
        devices.push(Device {
            name: id.to_string(),
            container_edits: ContainerEdits { device_nodes: vec![node], ..ContainerEdits::default() },
        });
    }
    let mut edits = ContainerEdits::default();
    for name in CONTROL_DEVICES {
        if let Some(node) = device_node(&host.dev_dir.join(name), &format!("/dev/{name}"))? {
            edits.device_nodes.push(node);
        }
    }
    for dir in LIBRARY_DIRS {
        add_files(&mut edits, &host.driver_root, dir, dir, |name| {
            LIBRARIES
                .iter()
                .any(|stem| name == *stem || name.strip_prefix(stem).is_some_and(|r| r.starts_with('.')))
        })?;
    }
    for dir in BINARY_DIRS {
        add_files(&mut edits, &host.driver_root, dir, "usr/bin", |name| BINARIES.contains(&name))?;
    }
    let driver_files = edits.mounts.len();
    let spec = Spec { cdi_version: "0.5.0".into(), kind: GPU_KIND.into(), devices, container_edits: edits };
    spec.validate().map_err(Error::Generate)?;
    Ok(Found { spec, driver_files })
}

/// The device node at `path` (links followed), as `container` in the container; `None` when
/// there is none or it is no character device.
fn device_node(path: &Path, container: &str) -> Result<Option<DeviceNode>, Error> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path: path.to_owned(), source }),
    };
    if !meta.file_type().is_char_device() {
        return Ok(None);
    }
    let rdev = meta.rdev();
    let real = std::fs::canonicalize(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    Ok(Some(DeviceNode {
        path: container.to_owned(),
        host_path: Some(real.display().to_string()),
        r#type: Some("c".into()),
        major: Some(i64::from(nix_major(rdev))),
        minor: Some(i64::from(nix_minor(rdev))),
        permissions: Some("rw".into()),
    }))
}

/// Linux's `major()` and `minor()` of a `dev_t`.
fn nix_major(dev: u64) -> u32 {
    (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as u32
}

fn nix_minor(dev: u64) -> u32 {
    (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as u32
}

/// Mounts, read-only, each entry of `root/dir` whose name `wanted` accepts (links resolved,
/// dangling ones left out) at `/in_container/<name>`, unless mounted there already.
fn add_files(
    edits: &mut ContainerEdits,
    root: &Path,
    dir: &str,
    in_container: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<(), Error> {
    let at = root.join(dir);
    let mut entries: Vec<(String, PathBuf)> = match std::fs::read_dir(&at) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
            .filter(|(name, _)| wanted(name))
            .collect(),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
            return Ok(());
        }
        Err(source) => return Err(Error::Io { path: at, source }),
    };
    entries.sort();
    for (name, path) in entries {
        let Ok(real) = std::fs::canonicalize(&path) else { continue };
        if !real.is_file() {
            continue;
        }
        let container_path = format!("/{in_container}/{name}");
        if edits.mounts.iter().any(|m| m.container_path == container_path) {
            continue;
        }
        edits.mounts.push(Mount {
            host_path: real.display().to_string(),
            container_path,
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        });
    }
    Ok(())
}
