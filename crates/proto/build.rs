//! Compiles the contracts under `crates/proto/hpk` with protox (pure Rust), so no system `protoc` is
//! needed, and writes the file descriptor set that server reflection serves.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "hpk/certsigner/v1/certsigner.proto",
    "hpk/kubelet/v1/kubelet.proto",
    "hpk/netforwarder/v1/netforwarder.proto",
    "hpk/podruntime/v1/remote.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("hpk_descriptor.bin"), prost::Message::encode_to_vec(&descriptors))?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
