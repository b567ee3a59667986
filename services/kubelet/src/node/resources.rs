//! The node's capacity (`hpk-node-resources`), as the Node's status wants it.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub use hpk_node_resources::{GPU_RESOURCE, Machine, Resources, capacity, meminfo_bytes};

use super::NodeError;

/// [`Resources`] as `status.capacity` / `status.allocatable` want them.
pub trait ToQuantities {
    /// Each resource's quantity by name; `nvidia.com/gpu` left out when there are none.
    fn to_quantities(&self) -> BTreeMap<String, Quantity>;
}

impl ToQuantities for Resources {
    fn to_quantities(&self) -> BTreeMap<String, Quantity> {
        self.to_strings().into_iter().map(|(name, value)| (name, Quantity(value))).collect()
    }
}

/// A whole file as text.
pub(crate) fn read_text(path: &Path) -> Result<String, NodeError> {
    Ok(hpk_node_resources::read_text(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_the_crate_s_strings() {
        let r = Resources { millicpu: 1500, memory: 2 << 30, ephemeral_storage: 12345, gpus: 2, pods: 110 };
        let q = r.to_quantities();
        let get = |k: &str| q.get(k).map(|q| q.0.as_str());
        assert_eq!(get("cpu"), Some("1500m"));
        assert_eq!(get("memory"), Some("2Gi"));
        assert_eq!(get(GPU_RESOURCE), Some("2"));
        assert_eq!(q.len(), r.to_strings().len());
    }

    #[test]
    fn read_errors_keep_what_and_where() {
        let error = NodeError::from(Machine::read(Path::new("/nonexistent/hpk")).unwrap_err());
        let read = |e: &NodeError, want: &str| matches!(e, NodeError::System(hpk_node_resources::Error::Read { what, .. }) if *what == want);
        assert!(read(&error, "filesystem size"), "{error:?}");
        let error = read_text(Path::new("/nonexistent/f")).expect_err("missing");
        assert!(matches!(error, NodeError::System(hpk_node_resources::Error::Read { .. })), "{error:?}");
    }
}
