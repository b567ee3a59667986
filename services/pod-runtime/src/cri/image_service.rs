use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_server::ImageService;
use tonic::{Request, Response, Status};

use crate::images::{Credentials, Error, ImageRecord};

/// `runtime.v1.ImageService`.
#[derive(Clone)]
pub struct Images(pub Arc<crate::runtime::Runtime>);

type Reply<T> = Result<Response<T>, Status>;

/// The gRPC code for an image store error: the caller's fault, absent, or the registry's.
pub fn grpc_code(err: &Error) -> tonic::Code {
    use tonic::Code;
    match err {
        Error::BadReference { .. } | Error::BadCredentials { .. } => Code::InvalidArgument,
        Error::NotFound { .. } | Error::NoPlatform { .. } => Code::NotFound,
        Error::Unauthorized { .. } => Code::PermissionDenied,
        Error::Unreachable { .. } | Error::Registry { .. } | Error::Locked { .. } => Code::Unavailable,
        Error::DigestMismatch { .. }
        | Error::SizeMismatch { .. }
        | Error::BadManifest { .. }
        | Error::UnsupportedLayer { .. }
        | Error::UnsafePath { .. } => Code::FailedPrecondition,
        Error::Unpack { .. }
        | Error::WhiteoutNotPermitted { .. }
        | Error::Io { .. }
        | Error::Index { .. }
        | Error::Task { .. } => Code::Internal,
    }
}

fn status(err: Error) -> Status {
    Status::new(grpc_code(&err), err.to_string())
}

/// CRI's AuthConfig as store credentials: username/password, the base64 `auth` form of them,
/// or a registry token.
fn credentials(auth: Option<cri::AuthConfig>) -> Result<Option<Credentials>, Status> {
    let Some(auth) = auth else { return Ok(None) };
    if !auth.registry_token.is_empty() {
        return Ok(Some(Credentials::RegistryToken(auth.registry_token)));
    }
    if !auth.identity_token.is_empty() {
        return Ok(Some(Credentials::IdentityToken(auth.identity_token)));
    }
    if !auth.username.is_empty() {
        return Ok(Some(Credentials::Basic { username: auth.username, password: auth.password }));
    }
    if !auth.auth.is_empty() {
        let decoded =
            decode_base64(&auth.auth).ok_or_else(|| Status::invalid_argument("auth is not base64"))?;
        let (user, pass) =
            decoded.split_once(':').ok_or_else(|| Status::invalid_argument("auth is not user:password"))?;
        return Ok(Some(Credentials::Basic { username: user.into(), password: pass.into() }));
    }
    Ok(None)
}

fn decode_base64(text: &str) -> Option<String> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for byte in text.trim_end_matches('=').bytes() {
        let value = u32::try_from(ALPHABET.iter().position(|&c| c == byte)?).ok()?;
        bits = (bits << 6) | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push(u8::try_from((bits >> count) & 0xff).ok()?);
        }
    }
    String::from_utf8(out).ok()
}

fn to_cri(image: &ImageRecord) -> cri::Image {
    let user = image.config.user.clone().unwrap_or_default();
    // `user[:group]`: the CRI reports the user part only, as a UID or a name.
    let name = user.split(':').next().unwrap_or("").to_owned();
    let (uid, username) = match name.parse::<i64>() {
        Ok(uid) => (Some(cri::Int64Value { value: uid }), String::new()),
        Err(_) => (None, name),
    };
    cri::Image {
        id: image.id.clone(),
        repo_tags: image.repo_tags.clone(),
        repo_digests: image.repo_digests.clone(),
        size: image.size,
        uid,
        username,
        spec: None,
        pinned: false,
    }
}

#[tonic::async_trait]
impl ImageService for Images {
    async fn list_images(&self, _: Request<cri::ListImagesRequest>) -> Reply<cri::ListImagesResponse> {
        let images = self.0.list_images().iter().map(to_cri).collect();
        Ok(Response::new(cri::ListImagesResponse { images }))
    }

    async fn image_status(&self, r: Request<cri::ImageStatusRequest>) -> Reply<cri::ImageStatusResponse> {
        let wanted = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        // An image that is not present is not an error: the answer has no image.
        let image = self.0.image_status(&wanted).as_ref().map(to_cri);
        Ok(Response::new(cri::ImageStatusResponse { image, info: Default::default() }))
    }

    async fn pull_image(&self, r: Request<cri::PullImageRequest>) -> Reply<cri::PullImageResponse> {
        let r = r.into_inner();
        let reference = r.image.map(|i| i.image).unwrap_or_default();
        let image = self.0.pull_image(&reference, credentials(r.auth)?).await?;
        Ok(Response::new(cri::PullImageResponse { image_ref: image.id }))
    }

    async fn remove_image(&self, r: Request<cri::RemoveImageRequest>) -> Reply<cri::RemoveImageResponse> {
        let wanted = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        self.0.remove_image(&wanted).await?;
        Ok(Response::new(cri::RemoveImageResponse {}))
    }

    async fn image_fs_info(&self, _: Request<cri::ImageFsInfoRequest>) -> Reply<cri::ImageFsInfoResponse> {
        let info = self.0.images().fs_info().await.map_err(status)?;
        let usage = cri::FilesystemUsage {
            timestamp: info.timestamp_ns,
            fs_id: Some(cri::FilesystemIdentifier { mountpoint: info.mountpoint.display().to_string() }),
            used_bytes: Some(cri::UInt64Value { value: info.used_bytes }),
            inodes_used: Some(cri::UInt64Value { value: info.inodes_used }),
        };
        Ok(Response::new(cri::ImageFsInfoResponse {
            image_filesystems: vec![usage],
            container_filesystems: vec![],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_field_is_base64_user_and_password() {
        assert_eq!(decode_base64("dXNlcjpwYXNz").as_deref(), Some("user:pass"));
        let creds = credentials(Some(cri::AuthConfig { auth: "dXNlcjpwYXNz".into(), ..Default::default() }))
            .expect("ok");
        assert!(
            matches!(creds, Some(Credentials::Basic { ref username, ref password }) if username == "user" && password == "pass")
        );
        assert!(credentials(Some(cri::AuthConfig { auth: "!!".into(), ..Default::default() })).is_err());
    }
}
