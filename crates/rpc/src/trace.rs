//! A tracing span on every RPC a server built by [`crate::serve`] answers (UNIX socket, TLS and
//! mutual TLS alike).
//!
//! For each request, [`TraceLayer`] opens a DEBUG span `rpc` with
//! - `method`: the gRPC path, `/package.Service/Method`;
//! - `peer`: `unix` on a UNIX socket; on TCP the remote address, preceded by the client
//!   certificate's common name and `@` where the client presented one (`system:node:n1@10.0.0.7:51234`);
//!
//! enters it while the service handles the request and while the response body is polled (so
//! what a handler logs carries it), and when the call ends records on it
//! - `code`: the gRPC status code's name (`Ok`, `NotFound`, …), from the `grpc-status` trailer
//!   after the last message, or from the headers of a trailers-only response (an error before
//!   any message); `HTTP <status>` for an HTTP error without a gRPC status; `dropped` when the
//!   response was abandoned before its end (the client cancelled or went away, shutdown cut
//!   a stream); `missing` when it ended without a status; `error` when the service or the body
//!   failed;
//! - `latency_ms`: from the request's arrival to the end of its response (a streaming call's
//!   whole stream);
//!
//! and logs one DEBUG event `rpc completed` with the four fields. Response bodies pass through
//! frame by frame, never buffered; request bodies are not touched. Below DEBUG (the default
//! `info`) nothing is recorded: the layer passes requests on and looks at nothing;
//! `RUST_LOG=info,hpk_rpc::trace=debug` turns it on.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{HeaderMap, StatusCode};
use hyper::body::{Body, Frame, SizeHint};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tracing::{Instrument, Level, Span, field};

/// Adds [`Trace`] to a service: [`crate::serve`] puts it around every server's routes.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLayer;

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Trace<S> {
        Trace { inner }
    }
}

/// The `rpc` span around each call of `inner` (see the [module](self)).
#[derive(Clone, Debug)]
pub struct Trace<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Trace<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body + Unpin,
{
    type Response = http::Response<TracedBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        if !tracing::enabled!(Level::DEBUG) {
            let call = self.inner.call(request);
            return Box::pin(async move { Ok(call.await?.map(|inner| TracedBody { inner, call: None })) });
        }
        let started = Instant::now();
        let method = request.uri().path().to_owned();
        let peer = peer(&request);
        let span = tracing::debug_span!(
            "rpc",
            method = %method,
            peer = %peer,
            code = field::Empty,
            latency_ms = field::Empty,
        );
        let call = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        let record = Call { span: span.clone(), method, peer, started, code: None };
        Box::pin(
            async move {
                match call.await {
                    Ok(response) => {
                        let code = code_of_headers(response.status(), response.headers());
                        let call = Some(Call { code, ..record });
                        Ok(response.map(|inner| TracedBody { inner, call }))
                    }
                    Err(error) => {
                        record.end("error".into());
                        Err(error)
                    }
                }
            }
            .instrument(span),
        )
    }
}

/// What is known of a call in flight, until it ends.
struct Call {
    span: Span,
    method: String,
    peer: String,
    started: Instant,
    /// The code the response headers gave (trailers-only response, HTTP error), if any.
    code: Option<String>,
}

impl Call {
    /// Records `code` and the latency on the span and logs the call's one event.
    fn end(self, code: String) {
        let latency_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.span.record("code", code.as_str());
        self.span.record("latency_ms", latency_ms);
        tracing::debug!(
            parent: &self.span,
            method = %self.method,
            peer = %self.peer,
            code = %code,
            latency_ms,
            "rpc completed"
        );
    }
}

/// A response body passed through frame by frame, ending its call's span at its end: the
/// trailers, the end of the stream, an error, or being dropped before any of those.
#[derive(Debug)]
pub struct TracedBody<B> {
    inner: B,
    /// `None` once ended, or when tracing is off.
    call: Option<Call>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call").field("method", &self.method).field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl<B: Body + Unpin> Body for TracedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let Some(span) = this.call.as_ref().map(|call| call.span.clone()) else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        let _entered = span.enter();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        // Some(code) once the response has ended: the trailers' status, else (None) the one
        // the headers gave, else `missing`.
        let ended = match &polled {
            Poll::Pending => None,
            Poll::Ready(Some(Ok(frame))) => frame.trailers_ref().map(grpc_code),
            Poll::Ready(Some(Err(_))) => Some(Some("error".to_owned())),
            Poll::Ready(None) => Some(None),
        };
        if let Some(code) = ended
            && let Some(call) = this.call.take()
        {
            let code = code.or_else(|| call.code.clone()).unwrap_or_else(|| "missing".to_owned());
            call.end(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for TracedBody<B> {
    fn drop(&mut self) {
        // A trailers-only response (its status in the headers) may be dropped unpolled: it
        // ended. Any other response was abandoned.
        if let Some(mut call) = self.call.take() {
            let code = call.code.take().unwrap_or_else(|| "dropped".to_owned());
            call.end(code);
        }
    }
}

/// The gRPC code a header map carries (`grpc-status`), by name.
fn grpc_code(headers: &HeaderMap) -> Option<String> {
    let status = headers.get("grpc-status")?;
    Some(format!("{:?}", tonic::Code::from_bytes(status.as_bytes())))
}

/// The code response headers already tell: a trailers-only response's status, or an HTTP
/// error's.
fn code_of_headers(status: StatusCode, headers: &HeaderMap) -> Option<String> {
    grpc_code(headers).or_else(|| (status != StatusCode::OK).then(|| format!("HTTP {}", status.as_u16())))
}

/// Who sent `request`: `unix`, or the TCP peer's address, after its certificate's common name.
fn peer<B>(request: &http::Request<B>) -> String {
    let extensions = request.extensions();
    let address =
        |tcp: &TcpConnectInfo| tcp.remote_addr().map_or_else(|| "tcp".to_owned(), |a| a.to_string());
    if let Some(tls) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() {
        let addr = address(tls.get_ref());
        let name =
            tls.peer_certs().and_then(|certs| certs.first().and_then(|leaf| crate::mtls::common_name(leaf)));
        return match name {
            Some(name) => format!("{name}@{addr}"),
            None => addr,
        };
    }
    if let Some(tcp) = extensions.get::<TcpConnectInfo>() {
        return address(tcp);
    }
    if extensions.get::<UdsConnectInfo>().is_some() {
        return "unix".to_owned();
    }
    "unknown".to_owned()
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
