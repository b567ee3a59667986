//! A pod's volumes, prepared on disk under the pod's directory (`<pod_dir>/volumes/<name>`), and
//! the CRI mounts each of its containers gets.

mod atomic;
mod error;
mod hosts;
mod remove;

pub use atomic::{FileData, Payload};
pub use error::VolumeError;
pub use hosts::{wants_etc_hosts, write_etc_hosts};
pub use remove::remove;
