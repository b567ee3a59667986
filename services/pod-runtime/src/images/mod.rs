//! The OCI image store of the crun engine.
//!
//! [`ImageStore::pull`] fetches an image over the OCI distribution API, checks every manifest
//! and blob against its digest and size, and unpacks each layer once into its own directory,
//! shared between images, in the form overlayfs (mounted with `userxattr`) reads: whiteouts
//! as 0/0 character devices, opaque directories as `user.overlay.opaque=y`.
//! [`ImageStore::layers`] gives the engine its `lowerdir=` list.
//!
//! Where things live on disk is described in `layout.rs`; why concurrent pulls and removals
//! cannot delete each other's content, in `gc.rs`.
//!
//! | module | concern |
//! |---|---|
//! | `store` | [`ImageStore`]: open, pull (coalesced), list, status, remove, layers |
//! | `pull` | one pull: manifest → config → layers → index |
//! | `registry` | the distribution client, digest and size checks, error sorting |
//! | `manifest` | manifests and indexes, this machine's platform chosen from an index |
//! | `unpack`, `extract`, `whiteout` | a layer blob to a verified directory, safely |
//! | `owners` | owners this bubble does not map (kept ours, recorded in an xattr), devices skipped |
//! | `index`, `record` | `index.json` and what it holds |
//! | `gc`, `layout`, `fsinfo` | leases and collection, paths, disk usage |

mod error;
mod extract;
mod fsinfo;
mod gc;
mod index;
mod layout;
mod manifest;
mod owners;
mod pull;
mod record;
mod reference;
mod registry;
mod store;
mod unpack;
mod whiteout;

pub use error::{Cause, Error, Result};
pub use fsinfo::FsInfo;
pub use owners::OVERRIDE_XATTR;
pub use record::{ImageConfig, ImageRecord};
pub use reference::{Credentials, ImageRef};
pub use store::{ImageStore, PullStats, StoreOptions};
pub use whiteout::OPAQUE_XATTR;
