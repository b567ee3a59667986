//! What can go wrong preparing or mounting a pod's volumes, in words the pod's owner can act on.

use std::path::PathBuf;

use crate::downward::DownwardError;
use crate::quantity::InvalidQuantity;

/// A volume that cannot be set up or mounted. Every variant names the volume (or the container
/// and its volumeMount) so that a FailedMount event says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A volume type (or projected source) this node does not implement.
    #[error("volume {volume:?}: {kind} volumes are not supported on this node")]
    Unsupported {
        /// The volume's name.
        volume: String,
        /// The volume type, as the pod spec spells it (`nfs`, `projected clusterTrustBundle`).
        kind: String,
    },
    /// A ConfigMap or Secret the volume needs does not exist and is not optional.
    #[error(
        "volume {volume:?}: {kind} {namespace}/{name} not found (create it, or mark the source optional)"
    )]
    ObjectMissing {
        /// The volume's name.
        volume: String,
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// An item names a key the ConfigMap or Secret does not have and the source is not optional.
    #[error(
        "volume {volume:?}: {kind} {namespace}/{name} has no key {key:?} (add it, or mark the source optional)"
    )]
    KeyMissing {
        /// The volume's name.
        volume: String,
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// The API server could not be asked (or refused) for an object or token the volume needs.
    #[error("volume {volume:?}: cannot read {what}")]
    Api {
        /// The volume's name.
        volume: String,
        /// What we asked for (`ConfigMap ns/name`, `a token for service account ns/sa`).
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A downwardAPI item that cannot be resolved.
    #[error("volume {volume:?}: downwardAPI item {path:?}")]
    Downward {
        /// The volume's name.
        volume: String,
        /// The item's path.
        path: String,
        /// Why it cannot be resolved.
        #[source]
        source: DownwardError,
    },
    /// A file path in the volume (item path, subPath) that is not a plain relative path.
    #[error("volume {volume:?}: path {path:?} {reason}")]
    BadPath {
        /// The volume's name.
        volume: String,
        /// The offending path.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A hostPath (or hostPath/local PV) whose file type is not the one `type` asks for.
    #[error("hostPath {path} for volume {volume:?} is {found}, type {wanted} requires {required}")]
    HostPathType {
        /// The volume's name.
        volume: String,
        /// The host path.
        path: PathBuf,
        /// What is there (`a file`, `a directory`, `missing`).
        found: &'static str,
        /// The `type` of the volume.
        wanted: String,
        /// What that type requires (`a directory`).
        required: &'static str,
    },
    /// A hostPath (or hostPath/local PV) that reaches one of HPK's own directories: inside
    /// one, or a parent of one (review H5).
    #[error(
        "hostPath {path} for volume {volume:?} is refused: it (resolved: {resolved}) {relation} {forbidden}, which this node keeps for HPK itself (--forbidden-host-path)"
    )]
    HostPathForbidden {
        /// The volume's name.
        volume: String,
        /// The host path as given.
        path: PathBuf,
        /// It with its links resolved (as far as it exists).
        resolved: PathBuf,
        /// `lies inside` or `contains`.
        relation: &'static str,
        /// The forbidden directory it reaches.
        forbidden: PathBuf,
    },
    /// A hostPath outside every host path the bubble binds.
    #[error(
        "hostPath {path} for volume {volume:?} is refused: it (resolved: {resolved}) lies outside the host paths this cluster binds ({allowed}); add it with --bind on hpk up or hpk.slurm, or HPK_BIND"
    )]
    HostPathNotBound {
        /// The volume's name.
        volume: String,
        /// The host path as given.
        path: PathBuf,
        /// It with its links resolved (as far as it exists).
        resolved: PathBuf,
        /// The bound paths (`--allowed-host-path`), comma-separated.
        allowed: String,
    },
    /// A hostPath `type` the API does not define.
    #[error("hostPath {path} for volume {volume:?} has unknown type {kind:?}")]
    HostPathUnknownType {
        /// The volume's name.
        volume: String,
        /// The host path.
        path: PathBuf,
        /// The unknown type.
        kind: String,
    },
    /// A PersistentVolumeClaim the volume names does not exist, is not bound, or is bound to a
    /// PersistentVolume this node cannot use.
    #[error("volume {volume:?}: PersistentVolumeClaim {claim}: {problem}")]
    Claim {
        /// The volume's name.
        volume: String,
        /// `namespace/name` of the claim.
        claim: String,
        /// What is wrong, in words.
        problem: String,
    },
    /// An emptyDir `sizeLimit` that does not parse.
    #[error("volume {volume:?}: emptyDir sizeLimit")]
    SizeLimit {
        /// The volume's name.
        volume: String,
        /// The parse error.
        #[source]
        source: InvalidQuantity,
    },
    /// A tmpfs for an emptyDir `medium: Memory` could not be mounted (other than for lack of
    /// privilege, which falls back to a directory).
    #[error("volume {volume:?}: cannot mount tmpfs on {path}")]
    Tmpfs {
        /// The volume's name.
        volume: String,
        /// Where.
        path: PathBuf,
        /// The mount(2) error.
        #[source]
        source: nix::Error,
    },
    /// A file-system operation failed.
    #[error("volume {volume:?}: cannot {action} {path}")]
    Io {
        /// The volume's name (empty for the pod's own files such as /etc/hosts).
        volume: String,
        /// What we were doing (`create`, `write`, `remove`).
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A volumeMount names a volume the pod does not have.
    #[error(
        "container {container:?}: volumeMount {mount_path:?} names volume {volume:?}, which the pod does not have"
    )]
    NoSuchVolume {
        /// The container.
        container: String,
        /// The mount's path in the container.
        mount_path: String,
        /// The volume it names.
        volume: String,
    },
    /// A subPath (or expanded subPathExpr) that resolves, through a symlink, outside its volume.
    #[error("volume {volume:?}: subPath {sub_path:?} resolves to {resolved}, outside the volume")]
    SubPathEscape {
        /// The volume's name.
        volume: String,
        /// The subPath as given (after expansion).
        sub_path: String,
        /// Where it leads.
        resolved: PathBuf,
    },
    /// A volumeMount's `mountPropagation` that is unknown or not allowed for the container.
    #[error("container {container:?}: volumeMount {mount_path:?}: mountPropagation {value:?} {reason}")]
    Propagation {
        /// The container.
        container: String,
        /// The mount's path in the container.
        mount_path: String,
        /// The propagation asked for.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// [`remove`](super::remove) found something mounted under the pod's directory that it did not
    /// mount itself, and left the directory in place rather than delete through it.
    #[error("cannot remove {path}: {mount_point} is still mounted")]
    StillMounted {
        /// The pod's directory.
        path: PathBuf,
        /// The mount point found under it.
        mount_point: PathBuf,
    },
}

impl VolumeError {
    /// An [`VolumeError::Io`] for `volume`.
    pub(crate) fn io(
        volume: &str,
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let volume = volume.to_owned();
        let path = path.into();
        move |source| Self::Io { volume, action, path, source }
    }
}
