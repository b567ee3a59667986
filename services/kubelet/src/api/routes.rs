//! One request: authenticate, authorize, route, count.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use hpk_cri_logs as logs;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use k8s_cri::v1 as cri;

use super::auth::{self, Authenticator, Authorizer, Decision, User};
use super::metrics::Metrics;
use super::{ApiError, Body, Peer, full, lookup, proxy, stats};
use crate::pods::{Context, lock};

/// The kubelet API's state.
pub struct KubeletApi {
    ctx: Arc<Context>,
    authn: Authenticator,
    authz: Authorizer,
    stats: stats::Collector,
    metrics: Metrics,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Healthz,
    Pods,
    StatsSummary,
    MetricsResource,
    Metrics,
    ContainerLogs { namespace: String, pod: String, container: String },
    Exec { namespace: String, pod: String, uid: Option<String>, container: String },
    Attach { namespace: String, pod: String, uid: Option<String>, container: String },
    PortForward { namespace: String, pod: String, uid: Option<String> },
}

impl Route {
    /// The route of `path`, or `None` (404).
    fn parse(path: &str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return None;
        }
        let s = |i: usize| parts[i].to_owned();
        Some(match parts.as_slice() {
            ["healthz"] => Self::Healthz,
            ["pods"] => Self::Pods,
            ["stats", "summary"] => Self::StatsSummary,
            ["metrics", "resource"] => Self::MetricsResource,
            ["metrics"] => Self::Metrics,
            ["containerLogs", _, _, _] => Self::ContainerLogs { namespace: s(1), pod: s(2), container: s(3) },
            ["exec", _, _, _] => Self::Exec { namespace: s(1), pod: s(2), uid: None, container: s(3) },
            ["exec", _, _, _, _] => {
                Self::Exec { namespace: s(1), pod: s(2), uid: Some(s(3)), container: s(4) }
            }
            ["attach", _, _, _] => Self::Attach { namespace: s(1), pod: s(2), uid: None, container: s(3) },
            ["attach", _, _, _, _] => {
                Self::Attach { namespace: s(1), pod: s(2), uid: Some(s(3)), container: s(4) }
            }
            ["portForward", _, _] => Self::PortForward { namespace: s(1), pod: s(2), uid: None },
            ["portForward", _, _, _] => Self::PortForward { namespace: s(1), pod: s(2), uid: Some(s(3)) },
            _ => return None,
        })
    }

    /// A low-cardinality name for metrics.
    fn name(&self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Pods => "pods",
            Self::StatsSummary => "stats",
            Self::MetricsResource => "metrics/resource",
            Self::Metrics => "metrics",
            Self::ContainerLogs { .. } => "containerLogs",
            Self::Exec { .. } => "exec",
            Self::Attach { .. } => "attach",
            Self::PortForward { .. } => "portForward",
        }
    }

    /// Streaming routes take GET and POST (the API server sends POST, kubectl's WebSocket
    /// client GET); the rest GET only.
    fn allows(&self, method: &Method) -> bool {
        match self {
            Self::Exec { .. } | Self::Attach { .. } | Self::PortForward { .. } => {
                method == Method::GET || method == Method::POST
            }
            _ => method == Method::GET || method == Method::HEAD,
        }
    }
}

/// The exec/attach query: which streams, a terminal, the command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct StreamQuery {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl StreamQuery {
    /// Parses `input`, `output`, `error`, `tty` (`1` or `true`) and `command` (repeated), as
    /// the API server sends them.
    fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut q = Self::default();
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let flag = || -> Result<bool, ApiError> {
                match value.as_ref() {
                    "1" | "true" => Ok(true),
                    "0" | "false" | "" => Ok(false),
                    other => {
                        Err(ApiError::bad_request(format!("{key}={other:?}: expected 1, 0, true or false")))
                    }
                }
            };
            match key.as_ref() {
                "command" => q.command.push(value.into_owned()),
                "input" | "stdin" => q.stdin = flag()?,
                "output" | "stdout" => q.stdout = flag()?,
                "error" | "stderr" => q.stderr = flag()?,
                "tty" => q.tty = flag()?,
                _ => {}
            }
        }
        if !(q.stdin || q.stdout || q.stderr) {
            return Err(ApiError::bad_request("you must specify at least 1 of stdin, stdout, stderr"));
        }
        // With a terminal, stderr is merged into stdout.
        if q.tty {
            q.stderr = false;
        }
        Ok(q)
    }
}

impl KubeletApi {
    /// The API over the pods' shared context; reviews go to the API server as the node.
    pub fn new(ctx: Arc<Context>, authn: Authenticator, authz: Authorizer, stats: stats::Collector) -> Self {
        Self { ctx, authn, authz, stats, metrics: Metrics::default() }
    }

    /// The stats collector (sampled in the background too, so rates are ready).
    pub fn stats(&self) -> &stats::Collector {
        &self.stats
    }

    /// The pods' context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Answers one request from `peer`.
    pub async fn handle(&self, peer: &Peer, req: Request<Incoming>) -> Response<Body> {
        let started = Instant::now();
        let method = req.method().clone();
        let route = Route::parse(req.uri().path());
        let _inflight = self.metrics.inflight();
        let response = match self.authenticate(peer, &req).await {
            Err(e) => e.response(),
            Ok(user) => match self.authorize(&user, &method, req.uri().path()).await {
                Err(e) => e.response(),
                Ok(()) => match &route {
                    None => ApiError::not_found("404 page not found").response(),
                    Some(r) if !r.allows(&method) => {
                        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{method} is not allowed here"))
                            .response()
                    }
                    Some(r) => {
                        let r = r.clone();
                        self.route(r, req).await.unwrap_or_else(|e| e.response())
                    }
                },
            },
        };
        let name = route.as_ref().map_or("other", Route::name);
        self.metrics.observe(method.as_str(), name, response.status().as_u16(), started.elapsed());
        response
    }

    async fn authenticate(&self, peer: &Peer, req: &Request<Incoming>) -> Result<User, ApiError> {
        let unauthorized = |why: &str| {
            tracing::debug!(why, "kubelet API: unauthenticated request");
            ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized")
        };
        match peer {
            Peer::Certificate(user) => return Ok(user.clone()),
            Peer::Unreadable(e) => return Err(unauthorized(e)),
            Peer::Anonymous => {}
        }
        let Some(value) = req.headers().get(header::AUTHORIZATION) else {
            return Err(unauthorized("no client certificate and no bearer token"));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("an Authorization header that is not a bearer token"))?;
        match self.authn.token(token).await {
            Ok(Some(user)) => Ok(user),
            Ok(None) => Err(unauthorized("the token review refused the token")),
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: token review failed");
                Err(unauthorized(&e.to_string()))
            }
        }
    }

    async fn authorize(&self, user: &User, method: &Method, path: &str) -> Result<(), ApiError> {
        let attrs = auth::attributes(method, path);
        match self.authz.decide(user, &attrs).await {
            Ok(Decision::Allow) => Ok(()),
            Ok(Decision::Deny(message)) => {
                tracing::info!(user = %user.name, path, %message, "kubelet API: request denied");
                Err(ApiError::new(StatusCode::FORBIDDEN, message))
            }
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: authorization failed");
                Err(ApiError::internal(format!("Authorization error (user={}): {e}", user.name)))
            }
        }
    }

    async fn route(&self, route: Route, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
        let ctx = &self.ctx;
        match route {
            Route::Healthz => Ok(text("ok")),
            Route::Pods => self.pods(),
            Route::StatsSummary => {
                let summary = self.stats.summary(&ctx.cri).await.map_err(status_error)?;
                let body = serde_json::to_vec(&summary).map_err(|e| ApiError::internal(e.to_string()))?;
                Ok(json(body))
            }
            Route::MetricsResource => {
                // A failed scrape is reported in the text, as upstream does.
                Ok(prometheus(match self.stats.summary(&ctx.cri).await {
                    Ok(summary) => stats::resource_metrics(&summary),
                    Err(status) => {
                        tracing::warn!(error = %status.message(), "resource metrics: stats unavailable");
                        stats::resource_scrape_failed()
                    }
                }))
            }
            Route::Metrics => Ok(prometheus(self.metrics.render(ctx))),
            Route::ContainerLogs { namespace, pod, container } => {
                self.container_logs(&namespace, &pod, &container, req.uri().query()).await
            }
            Route::Exec { namespace, pod, uid, container } => {
                let q = StreamQuery::parse(req.uri().query())?;
                if q.command.is_empty() {
                    return Err(ApiError::bad_request(
                        "you must specify at least one command for the container",
                    ));
                }
                let pod = lookup::pod(ctx, &namespace, &pod, uid.as_deref())?;
                let id = lookup::running_container(ctx, &pod, &container).await?;
                // After the lookups (unknown pod → 404, as upstream), before a token is spent.
                proxy::require_upgrade(&req)?;
                let request = cri::ExecRequest {
                    container_id: id,
                    cmd: q.command,
                    tty: q.tty,
                    stdin: q.stdin,
                    stdout: q.stdout,
                    stderr: q.stderr,
                };
                let url = ctx.cri.runtime.clone().exec(request).await.map_err(status_error)?.into_inner().url;
                proxy::upgrade(req, &url, ctx.cri.remote.as_ref().map(|r| &r.stream), self.metrics.session())
                    .await
            }
            Route::Attach { namespace, pod, uid, container } => {
                let q = StreamQuery::parse(req.uri().query())?;
                let pod = lookup::pod(ctx, &namespace, &pod, uid.as_deref())?;
                let id = lookup::running_container(ctx, &pod, &container).await?;
                // After the lookups (unknown pod → 404, as upstream), before a token is spent.
                proxy::require_upgrade(&req)?;
                let request = cri::AttachRequest {
                    container_id: id,
                    tty: q.tty,
                    stdin: q.stdin,
                    stdout: q.stdout,
                    stderr: q.stderr,
                };
                let url =
                    ctx.cri.runtime.clone().attach(request).await.map_err(status_error)?.into_inner().url;
                proxy::upgrade(req, &url, ctx.cri.remote.as_ref().map(|r| &r.stream), self.metrics.session())
                    .await
            }
            Route::PortForward { namespace, pod, uid } => {
                let pod = lookup::pod(ctx, &namespace, &pod, uid.as_deref())?;
                let sandbox = lookup::ready_sandbox(ctx, &pod).await?;
                // After the lookups (unknown pod → 404, as upstream), before a token is spent.
                proxy::require_upgrade(&req)?;
                let request = cri::PortForwardRequest { pod_sandbox_id: sandbox, port: Vec::new() };
                let url = ctx
                    .cri
                    .runtime
                    .clone()
                    .port_forward(request)
                    .await
                    .map_err(status_error)?
                    .into_inner()
                    .url;
                proxy::upgrade(req, &url, ctx.cri.remote.as_ref().map(|r| &r.stream), self.metrics.session())
                    .await
            }
        }
    }

    fn pods(&self) -> Result<Response<Body>, ApiError> {
        let items: Vec<serde_json::Value> = lock(&self.ctx.pods)
            .values()
            .map(|p| {
                let mut v = serde_json::to_value(p.as_ref()).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("kind".into(), "Pod".into());
                    o.insert("apiVersion".into(), "v1".into());
                }
                v
            })
            .collect();
        let list = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items});
        Ok(json(serde_json::to_vec(&list).map_err(|e| ApiError::internal(e.to_string()))?))
    }

    async fn container_logs(
        &self,
        namespace: &str,
        pod_name: &str,
        container: &str,
        query: Option<&str>,
    ) -> Result<Response<Body>, ApiError> {
        let ctx = &self.ctx;
        let options =
            logs::LogOptions::from_query(query, SystemTime::now()).map_err(ApiError::bad_request)?;
        let pod = lookup::pod(ctx, namespace, pod_name, None)?;
        lookup::check_container(&pod, container)?;
        let found = lookup::containers(ctx, &lookup::uid(&pod), container).await?;
        let chosen = if options.previous {
            found.get(1).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "previous terminated container \"{container}\" in pod \"{pod_name}\" not found"
                ))
            })?
        } else {
            found.first().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "container \"{container}\" in pod \"{pod_name}\" is waiting to start"
                ))
            })?
        };
        let mut runtime = ctx.cri.runtime.clone();
        let status = runtime
            .container_status(cri::ContainerStatusRequest { container_id: chosen.id.clone(), verbose: false })
            .await
            .map_err(status_error)?
            .into_inner()
            .status
            .ok_or_else(|| ApiError::internal("the runtime gave no container status"))?;
        if status.log_path.is_empty() {
            return Err(ApiError::not_found(format!(
                "container \"{container}\" in pod \"{pod_name}\" has no log"
            )));
        }
        if let Some(remote) = &ctx.cri.remote {
            return remote_logs(remote, &chosen.id, &options, container, pod_name).await;
        }
        let id = chosen.id.clone();
        let watcher = ctx.cri.runtime.clone();
        let running: logs::Running = Arc::new(move || {
            let (mut runtime, id) = (watcher.clone(), id.clone());
            Box::pin(async move {
                runtime
                    .container_status(cri::ContainerStatusRequest { container_id: id, verbose: false })
                    .await
                    .ok()
                    .and_then(|r| r.into_inner().status)
                    .is_some_and(|s| s.state() == cri::ContainerState::ContainerRunning)
            })
        });
        let path = std::path::PathBuf::from(&status.log_path);
        let stream = logs::open(path, options, running).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ApiError::not_found(format!(
                "the log of container \"{container}\" in pod \"{pod_name}\" is gone"
            )),
            _ => ApiError::internal(format!("reading the log of container \"{container}\": {e}")),
        })?;
        let body = stream.map(|chunk| chunk.map(Frame::data));
        Ok(log_response(BodyExt::boxed_unsync(http_body_util::StreamBody::new(body))))
    }
}

/// A container log's response: its body ends when the connection closes (HTTP/1.0 framing),
/// neither chunked nor of a stated length.
///
/// The API server reads a log it sends over a websocket (`kubectl logs` through a websocket
/// client, the conformance suite's "retrieving logs … over websockets") with a loop that stops
/// at the first read that returns `io.EOF` and drops the bytes that read returned with it
/// (apimachinery's `wsstream.messageCopy`). Go's HTTP client returns the last bytes of a body
/// together with `io.EOF` whenever it can: at the end of a stated length always, and for a
/// chunked body whenever the final empty chunk is already buffered behind the last data, as it
/// is when the whole answer arrived before the API server began reading it (after its
/// websocket handshake). Measured on the Slurm lab: 15 to 35 % of such reads came back empty.
/// A body delimited by the connection's end never comes with `io.EOF` in the same read: the
/// bytes first, the end on the next read. The costs: one connection per log request, and a
/// file that fails to read midway ends the body as its end would (a chunked body could say it
/// was cut); upstream's kubelet flushes line by line instead, which only makes the loss rare.
fn log_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.version_mut() = hyper::Version::HTTP_10;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// A container's log read by the remote runtime (connector mode): it renders the records as
/// [`logs::open`] would here, and streams them.
async fn remote_logs(
    remote: &crate::cri::Remote,
    container_id: &str,
    options: &logs::LogOptions,
    container: &str,
    pod_name: &str,
) -> Result<Response<Body>, ApiError> {
    use hpk_proto::podruntime::v1::ReadLogRequest;
    let request = ReadLogRequest {
        container_id: container_id.to_owned(),
        follow: options.follow,
        tail_lines: options.tail_lines,
        since_unix_nanos: options.since.map(|t| i64::try_from(t.unix_timestamp_nanos()).unwrap_or(i64::MAX)),
        timestamps: options.timestamps,
        limit_bytes: options.limit_bytes,
        stream: options.stream.as_str().to_owned(),
    };
    let chunks = remote.api.clone().read_log(request).await.map_err(|status| match status.code() {
        tonic::Code::NotFound => ApiError::not_found(format!(
            "the log of container \"{container}\" in pod \"{pod_name}\" is gone: {}",
            status.message()
        )),
        _ => status_error(status),
    })?;
    let body = chunks.into_inner().map(|chunk| match chunk {
        Ok(chunk) => Ok(Frame::data(Bytes::from(chunk.data))),
        Err(status) => Err(std::io::Error::other(format!("the remote runtime: {}", status.message()))),
    });
    Ok(log_response(BodyExt::boxed_unsync(http_body_util::StreamBody::new(body))))
}

fn status_error(status: tonic::Status) -> ApiError {
    let message = format!("the runtime: {}", status.message());
    match status.code() {
        tonic::Code::NotFound => ApiError::not_found(message),
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => ApiError::bad_request(message),
        tonic::Code::Unavailable => ApiError::unavailable(message),
        _ => ApiError::internal(message),
    }
}

fn text(body: &'static str) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from_static(body.as_bytes())));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

fn json(body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(full(body));
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

fn prometheus(body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_like_the_kubelets() {
        assert_eq!(Route::parse("/healthz"), Some(Route::Healthz));
        assert_eq!(Route::parse("/stats/summary"), Some(Route::StatsSummary));
        assert_eq!(
            Route::parse("/exec/ns/web/uid-1/app"),
            Some(Route::Exec {
                namespace: "ns".into(),
                pod: "web".into(),
                uid: Some("uid-1".into()),
                container: "app".into()
            })
        );
        assert_eq!(
            Route::parse("/portForward/ns/web"),
            Some(Route::PortForward { namespace: "ns".into(), pod: "web".into(), uid: None })
        );
        for bad in
            ["/", "/exec/ns/web", "/containerLogs/ns//app", "/containerLogs/ns/web/app/x", "/nope", "/pods/"]
        {
            assert_eq!(Route::parse(bad), None, "{bad}");
        }
        assert!(
            Route::Exec { namespace: String::new(), pod: String::new(), uid: None, container: String::new() }
                .allows(&Method::POST)
        );
        assert!(!Route::Pods.allows(&Method::POST));
    }

    #[test]
    fn exec_queries_parse_as_the_api_server_sends_them() {
        let q =
            StreamQuery::parse(Some("command=sh&command=-c&command=exit+3&input=1&output=1&tty=1&error=1"))
                .expect("query");
        assert_eq!(q.command, ["sh", "-c", "exit 3"]);
        assert!(q.stdin && q.stdout && q.tty);
        assert!(!q.stderr, "a terminal merges stderr into stdout");
        let err = StreamQuery::parse(Some("command=ls")).expect_err("no streams");
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        let err = StreamQuery::parse(Some("command=ls&output=maybe")).expect_err("bad flag");
        assert!(err.message.contains("output"), "{}", err.message);
    }
}
