//! ReadLog: a container's CRI log rendered by `hpk-cri-logs`, as the kubelet's containerLogs
//! endpoint renders it.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use hpk_cri_logs::{LogOptions, LogStream, Running};
use hpk_proto::podruntime::v1::{LogChunk, ReadLogRequest};
use k8s_cri::v1 as cri;
use time::OffsetDateTime;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::{Error, Result};
use crate::runtime::Runtime;

/// The chunks of one ReadLog; dropping it (the client went away) ends the read.
pub type Chunks = Pin<Box<dyn Stream<Item = Result<LogChunk, Status>> + Send + 'static>>;

/// The request's options as `hpk-cri-logs` takes them. `previous` is not asked of a runtime:
/// the kubelet names the previous instance's container ID instead.
pub fn options(request: &ReadLogRequest) -> Result<LogOptions> {
    let stream = match request.stream.as_str() {
        "" => LogStream::All,
        name => LogStream::from_name(name).ok_or_else(|| {
            Error::Invalid(format!("stream must be All (or empty), Stdout or Stderr, not {name:?}"))
        })?,
    };
    let since = request
        .since_unix_nanos
        .map(|nanos| {
            OffsetDateTime::from_unix_timestamp_nanos(i128::from(nanos))
                .map_err(|e| Error::Invalid(format!("since_unix_nanos {nanos}: {e}")))
        })
        .transpose()?;
    Ok(LogOptions {
        follow: request.follow,
        tail_lines: request.tail_lines,
        since,
        timestamps: request.timestamps,
        limit_bytes: request.limit_bytes,
        previous: false,
        stream,
    })
}

/// Opens the log of the container `request` names. NOT_FOUND for an unknown container, one
/// without a log, or a log file that is gone.
pub async fn read(runtime: Arc<Runtime>, request: ReadLogRequest) -> Result<Chunks> {
    let options = options(&request)?;
    let status = runtime.container_status(&request.container_id).await?;
    if status.log_path.is_empty() {
        return Err(Error::NotFound(format!("container {} has no log file", status.id)));
    }
    let path = PathBuf::from(&status.log_path);
    let id = status.id;
    let running: Running = Arc::new(move || {
        let (runtime, id) = (Arc::clone(&runtime), id.clone());
        Box::pin(async move {
            runtime
                .container_status(&id)
                .await
                .is_ok_and(|s| s.state == cri::ContainerState::ContainerRunning as i32)
        })
    });
    let chunks = hpk_cri_logs::open(path.clone(), options, running).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound(format!("the log file {} is gone", path.display()))
        } else {
            Error::io("open the log", &path, e)
        }
    })?;
    let chunks = chunks.map(move |item| {
        item.map(|data| LogChunk { data: data.into() })
            .map_err(|e| Status::internal(format!("reading the log {}: {e}", path.display())))
    });
    Ok(Box::pin(chunks))
}

#[cfg(test)]
mod tests {
    use time::format_description::well_known::Rfc3339;

    use super::*;

    #[test]
    fn every_field_carried_over() {
        let request = ReadLogRequest {
            container_id: "c".into(),
            follow: true,
            tail_lines: Some(10),
            since_unix_nanos: Some(1_796_018_485_500_000_000),
            timestamps: true,
            limit_bytes: Some(500),
            stream: "All".into(),
        };
        let expected = LogOptions {
            follow: true,
            tail_lines: Some(10),
            since: Some(OffsetDateTime::parse("2026-11-30T06:01:25.5Z", &Rfc3339).unwrap()),
            timestamps: true,
            limit_bytes: Some(500),
            previous: false,
            stream: LogStream::All,
        };
        assert_eq!(options(&request).unwrap(), expected);
    }

    #[test]
    fn absent_fields_are_the_whole_log_once() {
        assert_eq!(options(&ReadLogRequest::default()).unwrap(), LogOptions::default());
        let before_the_epoch = ReadLogRequest { since_unix_nanos: Some(i64::MIN), ..Default::default() };
        assert!(options(&before_the_epoch).unwrap().since.is_some_and(|t| t.year() == 1677));
    }

    #[test]
    fn streams_by_their_kubernetes_names() {
        let stream = |name: &str| options(&ReadLogRequest { stream: name.into(), ..Default::default() });
        assert_eq!(stream("").unwrap().stream, LogStream::All);
        assert_eq!(stream("Stdout").unwrap().stream, LogStream::Stdout);
        assert_eq!(stream("Stderr").unwrap().stream, LogStream::Stderr);
        for bad in ["stdout", "both", "All "] {
            let error = stream(bad).unwrap_err();
            assert!(matches!(&error, Error::Invalid(m) if m.contains(&format!("{bad:?}"))), "{error:?}");
        }
    }
}
