//! The gRPC code of each runtime error, chosen here at the edge: the runtime's errors say what
//! went wrong, by cause, and know nothing of gRPC.

use super::image_grpc_code;
use crate::engine;
use crate::runtime::Error;

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        use tonic::Code;
        let code = match &err {
            Error::Invalid(_)
            | Error::Engine(
                engine::Error::PathEscapes { .. }
                | engine::Error::SubPathLink { .. }
                | engine::Error::BadId(_)
                | engine::Error::Unsupported(_),
            ) => Code::InvalidArgument,
            Error::NotFound { .. } | Error::Engine(engine::Error::NotFound { .. }) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) | Error::Engine(engine::Error::FailedPrecondition(_)) => {
                Code::FailedPrecondition
            }
            Error::Images(e) => image_grpc_code(e),
            Error::Timeout(_) => Code::DeadlineExceeded,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Engine(_) | Error::Io { .. } => Code::Internal,
        };
        tonic::Status::new(code, err.to_string())
    }
}
