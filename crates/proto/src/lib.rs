//! HPK's own gRPC contracts, one module per `hpk.<service>.v1` package.
//!
//! The pod-runtime speaks CRI v1 through the `k8s-cri` crate; everything else HPK's services say
//! to each other is defined under `crates/proto/hpk` and generated here at build time.

/// `hpk.certsigner.v1`: the controller's kubelet certificate signer.
pub mod certsigner {
    /// Version 1 of the certificate signer contract.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("hpk.certsigner.v1");
    }
}

/// `hpk.kubelet.v1`: the kubelet's diagnostics.
pub mod kubelet {
    /// Version 1 of the kubelet diagnostics contract.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("hpk.kubelet.v1");
    }
}

/// `hpk.netforwarder.v1`: the node's pod network (veth attachment and IPAM).
pub mod netforwarder {
    /// Version 1 of the net-forwarder contract.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("hpk.netforwarder.v1");
    }
}

/// `hpk.podruntime.v1`: what a kubelet on another machine needs of a pod-runtime besides CRI.
pub mod podruntime {
    /// Version 1 of the pod-runtime's remote contract (files, logs, allocation).
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("hpk.podruntime.v1");
    }
}

/// Encoded `FileDescriptorSet` of every HPK contract, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hpk_descriptor.bin"));
