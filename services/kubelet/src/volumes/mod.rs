//! A pod's volumes, prepared on disk under the pod's directory (`<pod_dir>/volumes/<name>`), and
//! the CRI mounts each of its containers gets.
//!
//! One file per volume type or concern: [`atomic`] writes API-data volumes so that updates are
//! atomic, [`api_data`] and [`projected`] compute their content, [`empty_dir`], [`host_path`]
//! (also PersistentVolumeClaims; [`forbidden`] refuses HPK's own directories), [`mounts`]
//! (subPath), [`hosts`] (`/etc/hosts`) and [`remove`].

mod api_data;
mod atomic;
mod empty_dir;
mod error;
#[cfg(test)]
mod fake;
mod forbidden;
mod host_path;
mod hosts;
mod mounts;
mod ownership;
mod projected;
mod remove;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use tracing::{debug, warn};

use crate::downward::PodFacts;
use crate::idmap::IdMappings;
use crate::objects::ObjectSource;

pub use atomic::{FileData, Payload};
pub use error::VolumeError;
pub use forbidden::{DEFAULT_FORBIDDEN, HostPaths};
pub use hosts::{wants_etc_hosts, write_etc_hosts};
pub use mounts::SUB_PATH_ROOTS;
pub use remove::remove;

use api_data::{DEFAULT_MODE, KeySource, mode_bits, project_downward};
use projected::TokenCache;

/// What preparing and refreshing volumes needs to know beyond the pod and its objects.
#[derive(Clone, Debug, Default)]
pub struct VolumeContext {
    /// The node's and pod's facts, for downwardAPI values.
    pub facts: PodFacts,
    /// The bubble's user and group IDs: an fsGroup or user outside them is not applied
    /// (`None`: unknown, every ID is tried).
    pub ids: Option<IdMappings>,
    /// The host paths hostPath (and hostPath/local PersistentVolume) volumes may reach
    /// (`--forbidden-host-path`, `--allowed-host-path`; nothing refused by default here, the
    /// flags have the defaults).
    pub host_paths: HostPaths,
}

/// A container's CRI mounts, and the volume of each of its subPath mounts.
#[derive(Clone, Debug, Default)]
pub struct ContainerMounts {
    /// The mounts, in the order of the container's volumeMounts.
    pub mounts: Vec<cri::Mount>,
    /// For each subPath mount, by container path: the real path of its volume, for the
    /// [`SUB_PATH_ROOTS`] annotation.
    pub sub_path_roots: BTreeMap<String, PathBuf>,
}

impl ContainerMounts {
    /// The [`SUB_PATH_ROOTS`] annotation for these mounts (key and value), if any has a subPath.
    /// A mount whose host path no longer lies in its volume (connector mode ships it, and the
    /// runtime pins its own copy) is left out.
    pub fn annotation(&self) -> Option<(String, String)> {
        let roots: BTreeMap<String, PathBuf> = self
            .sub_path_roots
            .iter()
            .filter(|(dest, root)| {
                self.mounts
                    .iter()
                    .any(|m| &m.container_path == *dest && Path::new(&m.host_path).starts_with(root))
            })
            .map(|(dest, root)| (dest.clone(), root.clone()))
            .collect();
        mounts::sub_path_annotation(&roots).map(|value| (SUB_PATH_ROOTS.to_owned(), value))
    }
}

/// What a volume became on the host.
#[derive(Clone, Debug)]
enum Kind {
    /// An emptyDir under the pod's directory.
    EmptyDir,
    /// A hostPath.
    HostPath,
    /// A PersistentVolumeClaim (or generic ephemeral volume); `read_only` as the claim source says.
    Claim { read_only: bool },
    /// configMap, secret, downwardAPI or projected: written by us, mounted read-only.
    ApiData,
}

/// One prepared volume.
#[derive(Clone, Debug)]
struct Prepared {
    /// The mount source on the host.
    source: PathBuf,
    kind: Kind,
}

/// A pod's prepared volumes.
#[derive(Debug)]
pub struct PodVolumes {
    pod_dir: PathBuf,
    volumes: BTreeMap<String, Prepared>,
    tokens: TokenCache,
    unenforced: Vec<String>,
}

impl PodVolumes {
    /// Creates `pod_dir/volumes/<name>` for every volume of `pod` that lives there and fills it
    /// (hostPath and PersistentVolumeClaim volumes are checked, their source is the host path).
    /// Fails with the first volume that cannot be set up, leaving nothing half-written for it;
    /// volumes prepared before it stay and are reused when `prepare` is called again.
    pub async fn prepare(
        pod: &Pod,
        pod_dir: &Path,
        ctx: &VolumeContext,
        objects: &impl ObjectSource,
    ) -> Result<Self, VolumeError> {
        let mut this = Self {
            pod_dir: pod_dir.to_owned(),
            volumes: BTreeMap::new(),
            tokens: TokenCache::new(),
            unenforced: Vec::new(),
        };
        this.unenforced.extend(ownership::not_enforced(pod, ctx));
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let prepared = this.prepare_one(pod, volume, ctx, objects).await?;
            debug!(volume = %volume.name, source = %prepared.source.display(), "volume prepared");
            this.volumes.insert(volume.name.clone(), prepared);
        }
        Ok(this)
    }

    /// Re-reads the sources of configMap, secret, projected and downwardAPI volumes and rewrites,
    /// atomically, those whose content changed; rotates projected service-account tokens that
    /// are due. Returns whether anything changed. A volume whose source cannot be read keeps its
    /// content; the others are still refreshed and the first error is returned.
    pub async fn refresh(
        &mut self,
        pod: &Pod,
        ctx: &VolumeContext,
        objects: &impl ObjectSource,
    ) -> Result<bool, VolumeError> {
        let mut changed = false;
        let mut first_error = None;
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some(Prepared { source, kind: Kind::ApiData }) = self.volumes.get(&volume.name) else {
                continue;
            };
            let source = source.clone();
            let result = match self.api_payload(pod, volume, ctx, objects).await {
                Ok(Some(payload)) => {
                    atomic::write(&volume.name, &source, &payload, ownership::fs_group_in(pod, ctx))
                }
                Ok(None) => Ok(false),
                Err(e) => Err(e),
            };
            match result {
                Ok(written) => changed |= written,
                Err(e) => {
                    warn!(volume = %volume.name, error = %e, "volume refresh failed; keeping its content");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(changed),
        }
    }

    /// The CRI mounts for `container`'s volumeMounts, subPathExpr expanded with `env` (the
    /// container's resolved environment), with the volume of each subPath mount.
    pub fn mounts_for(
        &self,
        container: &Container,
        env: &BTreeMap<String, String>,
    ) -> Result<ContainerMounts, VolumeError> {
        let mut out = ContainerMounts::default();
        for mount in container.volume_mounts.iter().flatten() {
            let (cri_mount, root) = self.mount(container, mount, env)?;
            if let Some(root) = root {
                out.sub_path_roots.insert(cri_mount.container_path.clone(), root);
            }
            out.mounts.push(cri_mount);
        }
        Ok(out)
    }

    fn mount(
        &self,
        container: &Container,
        mount: &k8s_openapi::api::core::v1::VolumeMount,
        env: &BTreeMap<String, String>,
    ) -> Result<(cri::Mount, Option<PathBuf>), VolumeError> {
        let volume = self.volumes.get(&mount.name).ok_or_else(|| VolumeError::NoSuchVolume {
            container: container.name.clone(),
            mount_path: mount.mount_path.clone(),
            volume: mount.name.clone(),
        })?;
        let sub_path = match (&mount.sub_path_expr, &mount.sub_path) {
            (Some(expr), _) if !expr.is_empty() => mounts::expand(expr, env),
            (_, Some(path)) => path.clone(),
            _ => String::new(),
        };
        let (host_path, root) = if sub_path.is_empty() {
            (volume.source.clone(), None)
        } else {
            let resolved = mounts::resolve_sub_path(&mount.name, &volume.source, &sub_path)?;
            (resolved.path, Some(resolved.root))
        };
        let read_only = mount.read_only.unwrap_or(false)
            || match volume.kind {
                Kind::ApiData => true,
                Kind::Claim { read_only } => read_only,
                Kind::EmptyDir => false,
                // The node's own files a pod may see are never written through it.
                Kind::HostPath => forbidden::node_file(&volume.source),
            };
        let propagation = mounts::propagation(container, mount)?;
        let recursive = read_only
            && propagation == cri::MountPropagation::PropagationPrivate
            && mount.recursive_read_only.as_deref() == Some("Enabled");
        let cri_mount = cri::Mount {
            container_path: mount.mount_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: read_only,
            propagation: propagation.into(),
            recursive_read_only: recursive,
            ..cri::Mount::default()
        };
        Ok((cri_mount, root))
    }

    /// Limits the pod asked for that this node does not enforce, in words (emptyDir sizeLimit on
    /// disk, a Memory emptyDir that could not be a tmpfs, an fsGroup the bubble does not map).
    pub fn unenforced(&self) -> Vec<String> {
        self.unenforced.clone()
    }

    /// The mount source on the host of volume `name`, if the pod has it.
    pub fn source(&self, name: &str) -> Option<&Path> {
        self.volumes.get(name).map(|v| v.source.as_path())
    }

    /// Where volume `name` lives under the pod's directory.
    fn volume_dir(&self, name: &str) -> PathBuf {
        self.pod_dir.join("volumes").join(name)
    }

    async fn prepare_one(
        &mut self,
        pod: &Pod,
        volume: &Volume,
        ctx: &VolumeContext,
        objects: &impl ObjectSource,
    ) -> Result<Prepared, VolumeError> {
        let name = volume.name.as_str();
        check_volume_name(name)?;
        let dir = self.volume_dir(name);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(empty) = &volume.empty_dir {
            empty_dir::prepare(name, empty, &dir, ownership::fs_group_in(pod, ctx), &mut self.unenforced)?;
            return Ok(Prepared { source: dir, kind: Kind::EmptyDir });
        }
        if let Some(host) = &volume.host_path {
            let path = PathBuf::from(&host.path);
            host_path::check(name, &path, host.type_.as_deref(), &ctx.host_paths)?;
            return Ok(Prepared { source: path, kind: Kind::HostPath });
        }
        if let Some(claim) = &volume.persistent_volume_claim {
            let path =
                host_path::claim_path(name, namespace, &claim.claim_name, objects, &ctx.host_paths).await?;
            return Ok(Prepared {
                source: path,
                kind: Kind::Claim { read_only: claim.read_only.unwrap_or(false) },
            });
        }
        if volume.ephemeral.is_some() {
            // A generic ephemeral volume is a claim the ephemeral-volume controller names
            // `<pod>-<volume>`; the node mounts it like any other claim.
            let claim = format!("{}-{name}", pod.metadata.name.as_deref().unwrap_or_default());
            let path = host_path::claim_path(name, namespace, &claim, objects, &ctx.host_paths).await?;
            return Ok(Prepared { source: path, kind: Kind::Claim { read_only: false } });
        }
        // Everything is read before anything is written.
        let Some(payload) = self.api_payload(pod, volume, ctx, objects).await? else {
            return Err(VolumeError::Unsupported { volume: name.to_owned(), kind: kind_of(volume) });
        };
        let existed = fs::symlink_metadata(&dir).is_ok();
        if let Err(e) = atomic::write(name, &dir, &payload, ownership::fs_group_in(pod, ctx)) {
            if !existed {
                let _ = fs::remove_dir_all(&dir);
            }
            return Err(e);
        }
        Ok(Prepared { source: dir, kind: Kind::ApiData })
    }

    /// The content of an API-data volume; `None` for a volume of another type.
    async fn api_payload(
        &mut self,
        pod: &Pod,
        volume: &Volume,
        ctx: &VolumeContext,
        objects: &impl ObjectSource,
    ) -> Result<Option<Payload>, VolumeError> {
        let name = volume.name.as_str();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut payload = Payload::new();
        if let Some(map) = &volume.config_map {
            let source = KeySource {
                kind: "ConfigMap",
                namespace,
                name: &map.name,
                items: map.items.as_deref(),
                optional: map.optional.unwrap_or(false),
            };
            source.project(name, objects, mode_bits(map.default_mode, DEFAULT_MODE), &mut payload).await?;
        } else if let Some(secret) = &volume.secret {
            let source = KeySource {
                kind: "Secret",
                namespace,
                name: secret.secret_name.as_deref().unwrap_or_default(),
                items: secret.items.as_deref(),
                optional: secret.optional.unwrap_or(false),
            };
            source.project(name, objects, mode_bits(secret.default_mode, DEFAULT_MODE), &mut payload).await?;
        } else if let Some(downward) = &volume.downward_api {
            let items = downward.items.as_deref().unwrap_or_default();
            let mode = mode_bits(downward.default_mode, DEFAULT_MODE);
            project_downward(name, pod, items, ctx, mode, &mut payload)?;
        } else if let Some(projected) = &volume.projected {
            payload = projected::payload(name, pod, projected, ctx, objects, &mut self.tokens).await?;
        } else {
            return Ok(None);
        }
        Ok(Some(payload))
    }
}

/// A volume name must be one directory entry (the API server only admits DNS labels).
fn check_volume_name(name: &str) -> Result<(), VolumeError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(VolumeError::BadPath {
            volume: name.to_owned(),
            path: name.to_owned(),
            reason: "is not a valid volume name",
        });
    }
    Ok(())
}

/// The volume's type as the pod spec spells it (`nfs`, `csi`), for an unsupported one.
fn kind_of(volume: &Volume) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(volume) else {
        return "unknown".to_owned();
    };
    fields.keys().find(|k| *k != "name").cloned().unwrap_or_else(|| "source-less".to_owned())
}
