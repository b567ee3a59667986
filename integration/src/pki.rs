//! The test cluster's certificates: the same PKI the controller bubble makes (`hpk_cluster::pki`), so
//! the harness and the product cannot drift apart.

pub use hpk_cluster::pki::{
    CertFiles, ClusterPki, Validity, write_embedded_kubeconfig, write_kubeconfig, write_secret,
};
