//! The test cluster's certificates: the same PKI the controller bubble makes (`hpk::pki`), so
//! the harness and the product cannot drift apart.

pub use hpk::pki::{
    CertFiles, ClusterPki, Validity, write_embedded_kubeconfig, write_kubeconfig, write_secret,
};
