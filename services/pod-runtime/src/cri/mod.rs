//! The CRI v1 gRPC services over the [`Runtime`](crate::runtime::Runtime): thin adapters that
//! unpack requests, call the runtime, and map errors to gRPC codes.

mod image_service;
mod runtime_service;
mod status;

pub use image_service::{Images, grpc_code as image_grpc_code};
pub use runtime_service::Runtime as RuntimeApi;

/// The runtime's name in `Version`.
pub const RUNTIME_NAME: &str = "hpk-pod-runtime";
/// The CRI API version served.
pub const CRI_VERSION: &str = "v1";

fn unimplemented<T>(what: &str) -> Result<tonic::Response<T>, tonic::Status> {
    Err(tonic::Status::unimplemented(format!("{what} is not implemented yet by hpk-pod-runtime")))
}
