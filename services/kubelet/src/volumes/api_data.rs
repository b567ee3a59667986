//! The content of the API-data volumes (configMap, secret, downwardAPI) and of the same sources
//! inside a projected volume: which files, with which bytes and modes. Everything is read before
//! anything is written, so a source that cannot be read leaves the volume as it was.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod};

use super::atomic::{FileData, Payload, check_path};
use super::{VolumeContext, VolumeError};
use crate::objects::ObjectSource;

/// The mode of files whose volume sets no `defaultMode`.
pub const DEFAULT_MODE: u32 = 0o644;

/// Permission bits from an API `mode` (an int32 the API server validated to 0..=0777).
pub fn mode_bits(mode: Option<i32>, default: u32) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok()).map_or(default, |m| m & 0o777)
}

/// A ConfigMap or Secret as a volume (or a projected source) refers to it.
pub struct KeySource<'a> {
    /// `ConfigMap` or `Secret`.
    pub kind: &'static str,
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The object's name.
    pub name: &'a str,
    /// `items`: which keys, to which paths; every key to its own name when `None`.
    pub items: Option<&'a [KeyToPath]>,
    /// `optional`.
    pub optional: bool,
}

impl KeySource<'_> {
    /// The object's data (`None` when it does not exist), as bytes by key.
    async fn fetch(
        &self,
        volume: &str,
        objects: &impl ObjectSource,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, VolumeError> {
        let api = |source| VolumeError::Api {
            volume: volume.to_owned(),
            what: format!("{} {}/{}", self.kind, self.namespace, self.name),
            source,
        };
        if self.kind == "Secret" {
            let secret = objects.secret(self.namespace, self.name).await.map_err(api)?;
            return Ok(
                secret.map(|s| s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect())
            );
        }
        let Some(map) = objects.config_map(self.namespace, self.name).await.map_err(api)? else {
            return Ok(None);
        };
        let mut data: BTreeMap<String, Vec<u8>> =
            map.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
        data.extend(map.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)));
        Ok(Some(data))
    }

    /// Adds this source's files to `payload`, each with its item's mode or `default_mode`.
    pub async fn project(
        &self,
        volume: &str,
        objects: &impl ObjectSource,
        default_mode: u32,
        payload: &mut Payload,
    ) -> Result<(), VolumeError> {
        let Some(data) = self.fetch(volume, objects).await? else {
            if self.optional {
                return Ok(());
            }
            return Err(VolumeError::ObjectMissing {
                volume: volume.to_owned(),
                kind: self.kind,
                namespace: self.namespace.to_owned(),
                name: self.name.to_owned(),
            });
        };
        let Some(items) = self.items else {
            for (key, bytes) in data {
                check_path(volume, &key)?;
                payload.insert(key, FileData { data: bytes, mode: default_mode, owner: None });
            }
            return Ok(());
        };
        for item in items {
            check_path(volume, &item.path)?;
            let Some(bytes) = data.get(&item.key).cloned() else {
                if self.optional {
                    continue;
                }
                return Err(VolumeError::KeyMissing {
                    volume: volume.to_owned(),
                    kind: self.kind,
                    namespace: self.namespace.to_owned(),
                    name: self.name.to_owned(),
                    key: item.key.clone(),
                });
            };
            payload.insert(
                item.path.clone(),
                FileData { data: bytes, mode: mode_bits(item.mode, default_mode), owner: None },
            );
        }
        Ok(())
    }
}

/// Adds the downwardAPI `items` of `pod` to `payload`.
pub fn project_downward(
    volume: &str,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    ctx: &VolumeContext,
    default_mode: u32,
    payload: &mut Payload,
) -> Result<(), VolumeError> {
    for item in items {
        check_path(volume, &item.path)?;
        let failed =
            |source| VolumeError::Downward { volume: volume.to_owned(), path: item.path.clone(), source };
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(field), _) => crate::downward::field_value(pod, field, &ctx.facts).map_err(failed)?,
            (None, Some(resource)) => {
                crate::downward::resource_value(pod, None, resource, &ctx.facts).map_err(failed)?
            }
            (None, None) => {
                return Err(VolumeError::BadPath {
                    volume: volume.to_owned(),
                    path: item.path.clone(),
                    reason: "has neither fieldRef nor resourceFieldRef",
                });
            }
        };
        payload.insert(
            item.path.clone(),
            FileData { data: value.into_bytes(), mode: mode_bits(item.mode, default_mode), owner: None },
        );
    }
    Ok(())
}
