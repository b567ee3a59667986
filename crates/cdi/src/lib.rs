//! Container Device Interface (CDI) specs, as the CDI specification (v0.x) writes them: read
//! from the spec directories (`/etc/cdi`, then `/var/run/cdi`, whose specs win), made for the
//! NVIDIA GPUs of a node ([`nvidia`]), and resolved into what a container gets: device nodes,
//! bind mounts and environment variables ([`Registry::resolve`]).
//!
//! Hooks are read but not run (HPK's engines run no OCI hooks); resolving says which were left
//! out, so that the runtime can say so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod nvidia;

/// The kind NVIDIA GPUs are described as, and the extended resource pods request.
pub const GPU_KIND: &str = "nvidia.com/gpu";

/// The spec directories, lowest precedence first.
pub const SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// The largest spec file read.
pub const MAX_SPEC_BYTES: u64 = 4 << 20;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A spec file that could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A spec file that is no valid spec.
    #[error("{path}: {why}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A device name that is not `vendor/class=name`.
    #[error("{0:?} is no CDI device name (vendor.com/class=name)")]
    BadName(String),
    /// A device no spec describes.
    #[error("CDI device {name} is not described by any spec in {dirs}")]
    Unknown {
        /// The device.
        name: String,
        /// The directories searched.
        dirs: String,
    },
    /// A spec that could not be made.
    #[error("{0}")]
    Generate(String),
}

/// One CDI spec file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The spec version (`0.5.0` …).
    pub cdi_version: String,
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    /// The devices.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits every device of the spec brings (once per container).
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device of a spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Its name within the kind (`0`, `GPU-<uuid>`, `all`).
    pub name: String,
    /// What a container using it gets.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// What a container gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerEdits {
    /// `KEY=value`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// OCI hooks (read, never run).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty() && self.hooks.is_empty()
    }

    fn extend(&mut self, other: &ContainerEdits) {
        self.env.extend(other.env.iter().cloned());
        for node in &other.device_nodes {
            if !self.device_nodes.iter().any(|n| n.path == node.path) {
                self.device_nodes.push(node.clone());
            }
        }
        for mount in &other.mounts {
            if !self.mounts.iter().any(|m| m.container_path == mount.container_path) {
                self.mounts.push(mount.clone());
            }
        }
        self.hooks.extend(other.hooks.iter().cloned());
    }

    fn validate(&self) -> Result<(), String> {
        for env in &self.env {
            if env.split_once('=').is_none_or(|(key, _)| key.is_empty()) {
                return Err(format!("environment entry {env:?} is not KEY=value"));
            }
        }
        for node in &self.device_nodes {
            absolute(&node.path, "device node path")?;
            if let Some(host) = &node.host_path {
                absolute(host, "device node hostPath")?;
            }
            if let Some(kind) = &node.r#type
                && !matches!(kind.as_str(), "c" | "b" | "u" | "p")
            {
                return Err(format!("device node {}: type {kind:?} (c, b, u or p)", node.path));
            }
        }
        for mount in &self.mounts {
            absolute(&mount.host_path, "mount hostPath")?;
            absolute(&mount.container_path, "mount containerPath")?;
        }
        Ok(())
    }
}

/// A device node a container gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Its path in the container.
    pub path: String,
    /// Its path where the runtime runs, when not `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Cgroup access (`rwm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

impl DeviceNode {
    /// Where the runtime finds it.
    pub fn source(&self) -> &str {
        self.host_path.as_deref().unwrap_or(&self.path)
    }
}

/// A bind mount a container gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Where the runtime finds it.
    pub host_path: String,
    /// Where the container sees it.
    pub container_path: String,
    /// Mount options (`ro`, `nosuid` …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Mount {
    /// Whether it is mounted read-only.
    pub fn readonly(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// An OCI hook.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `createContainer`, `startContainer` …
    pub hook_name: String,
    /// The program.
    pub path: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

fn absolute(path: &str, what: &str) -> Result<(), String> {
    if path.starts_with('/') && !path.split('/').any(|c| c == "..") {
        Ok(())
    } else {
        Err(format!("{what} {path:?} is not an absolute path without '..'"))
    }
}

/// `vendor/class`: a vendor of lowercase letters, digits, dots and dashes, a class of letters,
/// digits, `_`, `.` and `-`.
fn valid_kind(kind: &str) -> bool {
    let Some((vendor, class)) = kind.split_once('/') else { return false };
    let vendor_ok = !vendor.is_empty()
        && vendor.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && vendor.starts_with(|c: char| c.is_ascii_alphanumeric());
    let class_ok = !class.is_empty()
        && class.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && class.starts_with(|c: char| c.is_ascii_alphanumeric());
    vendor_ok && class_ok
}

/// A device name within a kind: letters, digits, `_`, `.`, `:` and `-`, starting with a letter
/// or digit.
fn valid_device_name(name: &str) -> bool {
    !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}

/// `kind=name`.
pub fn qualified(kind: &str, name: &str) -> String {
    format!("{kind}={name}")
}

/// `(kind, name)` of a qualified device name.
pub fn parse_qualified(text: &str) -> Result<(&str, &str), Error> {
    match text.split_once('=') {
        Some((kind, name)) if valid_kind(kind) && valid_device_name(name) => Ok((kind, name)),
        _ => Err(Error::BadName(text.to_owned())),
    }
}

impl Spec {
    /// Parses a spec file's text (`yaml`: YAML, else JSON) and checks it.
    pub fn parse(text: &str, yaml: bool, path: &Path) -> Result<Self, Error> {
        let invalid = |why: String| Error::Invalid { path: path.to_owned(), why };
        let spec: Spec = if yaml {
            serde_yaml::from_str(text).map_err(|e| invalid(e.to_string()))?
        } else {
            serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?
        };
        spec.validate().map_err(invalid)?;
        Ok(spec)
    }

    /// Checks the kind, the device names (unique), every path and environment entry.
    pub fn validate(&self) -> Result<(), String> {
        if self.cdi_version.is_empty() {
            return Err("no cdiVersion".into());
        }
        if !valid_kind(&self.kind) {
            return Err(format!("kind {:?} is not vendor/class", self.kind));
        }
        self.container_edits.validate()?;
        let mut seen = std::collections::BTreeSet::new();
        for device in &self.devices {
            if !valid_device_name(&device.name) {
                return Err(format!("device name {:?} is not valid", device.name));
            }
            if !seen.insert(device.name.as_str()) {
                return Err(format!("device {} is described twice", device.name));
            }
            device.container_edits.validate().map_err(|e| format!("device {}: {e}", device.name))?;
        }
        Ok(())
    }

    /// The spec as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Every device of the specs in a set of directories.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    specs: Vec<Spec>,
    /// Qualified name → (spec index, device index).
    devices: BTreeMap<String, (usize, usize)>,
    dirs: Vec<PathBuf>,
}

/// What resolving a container's devices gave.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The edits, each spec's own once, then each device's.
    pub edits: ContainerEdits,
    /// What was left out, in words (hooks).
    pub not_applied: Vec<String>,
}

impl Registry {
    /// Reads every `*.json`, `*.yaml` and `*.yml` file of `dirs` (a missing directory is empty),
    /// in name order; a device of a later directory replaces one of the same name of an earlier
    /// one. A file that cannot be read or is no valid spec is left out and returned with why;
    /// so is a device a file of the same directory described already.
    pub fn load(dirs: &[PathBuf]) -> (Self, Vec<Error>) {
        let mut registry = Registry { dirs: dirs.to_vec(), ..Registry::default() };
        let mut errors = Vec::new();
        for dir in dirs {
            let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
                Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    errors.push(Error::Io { path: dir.clone(), source });
                    continue;
                }
            };
            files.sort();
            let mut in_dir = std::collections::BTreeSet::new();
            for path in files {
                let yaml = match path.extension().and_then(|e| e.to_str()) {
                    Some("yaml" | "yml") => true,
                    Some("json") => false,
                    _ => continue,
                };
                let spec = match read_spec(&path, yaml) {
                    Ok(spec) => spec,
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                };
                let index = registry.specs.len();
                for (i, device) in spec.devices.iter().enumerate() {
                    let name = qualified(&spec.kind, &device.name);
                    if !in_dir.insert(name.clone()) {
                        errors.push(Error::Invalid {
                            path: path.clone(),
                            why: format!("{name} is described by another spec in {} too", dir.display()),
                        });
                        continue;
                    }
                    registry.devices.insert(name, (index, i));
                }
                registry.specs.push(spec);
            }
        }
        (registry, errors)
    }

    /// The names (within `kind`) of its devices, numbers in numeric order first.
    pub fn device_names(&self, kind: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .devices
            .keys()
            .filter_map(|q| q.strip_prefix(kind).and_then(|r| r.strip_prefix('=')))
            .map(str::to_owned)
            .collect();
        names.sort_by(|a, b| match (a.parse::<u64>(), b.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            (Ok(_), Err(_)) => std::cmp::Ordering::Less,
            (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
            _ => a.cmp(b),
        });
        names
    }

    /// A spec of kind `kind` with just its devices `names` (unqualified), each spec's own
    /// edits merged, as the specs they come from describe them; a name no spec describes is an
    /// error.
    pub fn subset(&self, kind: &str, names: &[String]) -> Result<Spec, Error> {
        let mut spec = Spec { kind: kind.to_owned(), ..Spec::default() };
        let mut specs_applied = std::collections::BTreeSet::new();
        for name in names {
            let qualified = qualified(kind, name);
            let &(index, device) = self.devices.get(&qualified).ok_or_else(|| Error::Unknown {
                name: qualified.clone(),
                dirs: self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            })?;
            let from = &self.specs[index];
            if specs_applied.insert(index) {
                spec.container_edits.extend(&from.container_edits);
                if spec.cdi_version.is_empty() {
                    spec.cdi_version = from.cdi_version.clone();
                }
            }
            spec.devices.push(from.devices[device].clone());
        }
        Ok(spec)
    }

    /// What a container with the devices `names` (qualified) gets; an unknown or malformed
    /// name is an error.
    pub fn resolve(&self, names: &[String]) -> Result<Resolved, Error> {
        let mut resolved = Resolved::default();
        let mut specs_applied = std::collections::BTreeSet::new();
        for name in names {
            parse_qualified(name)?;
            let &(index, device) = self.devices.get(name).ok_or_else(|| Error::Unknown {
                name: name.clone(),
                dirs: self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            })?;
            let spec = &self.specs[index];
            if specs_applied.insert(index) {
                resolved.edits.extend(&spec.container_edits);
            }
            resolved.edits.extend(&spec.devices[device].container_edits);
        }
        for hook in std::mem::take(&mut resolved.edits.hooks) {
            resolved
                .not_applied
                .push(format!("the {} hook {} (HPK runs no OCI hooks)", hook.hook_name, hook.path));
        }
        Ok(resolved)
    }
}

fn read_spec(path: &Path, yaml: bool) -> Result<Spec, Error> {
    use std::io::Read;
    let io = |source| Error::Io { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(MAX_SPEC_BYTES + 1).read_to_string(&mut text).map_err(io)?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(Error::Invalid {
            path: path.to_owned(),
            why: format!("larger than {MAX_SPEC_BYTES} bytes"),
        });
    }
    Spec::parse(&text, yaml, path)
}

#[cfg(test)]
mod tests;
