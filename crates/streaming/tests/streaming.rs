//! The streaming server against the real clients: client-go's SPDY and WebSocket executors and
//! its port forwarder, driven by the Go program in `tests/goclient`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hpk_streaming::{
    AttachRequest, Backend, BoxFuture, BoxStream, ExecRequest, Io, PortForwardRequest, StreamServer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

/// Runs commands on the host; container "tty" instead reports the first resize it gets.
#[derive(Default)]
struct TestBackend {
    resizes: Mutex<Vec<(u16, u16)>>,
}

async fn run(cmd: &[String], io: Io) -> Result<i32, String> {
    let (prog, args) = cmd.split_first().ok_or("empty command")?;
    let mut child = Command::new(prog)
        .args(args)
        .stdin(if io.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawn {prog}: {e}"))?;
    let mut tasks = Vec::new();
    if let (Some(mut from), Some(mut to)) = (io.stdin, child.stdin.take()) {
        tasks.push(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
        }));
    }
    if let (Some(mut from), Some(mut to)) = (child.stdout.take(), io.stdout) {
        tasks.push(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
        }));
    }
    if let (Some(mut from), Some(mut to)) = (child.stderr.take(), io.stderr) {
        tasks.push(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
        }));
    }
    let status = child.wait().await.map_err(|e| e.to_string())?;
    for t in tasks {
        let _ = t.await;
    }
    Ok(status.code().unwrap_or(128))
}

impl Backend for TestBackend {
    fn exec(&self, req: ExecRequest, mut io: Io) -> BoxFuture<'_, Result<i32, String>> {
        Box::pin(async move {
            if req.container_id == "tty" {
                let mut resize = io.resize.take().ok_or("no resize stream")?;
                let size = resize.recv().await.ok_or("resize stream ended")?;
                self.resizes.lock().expect("lock").push((size.width, size.height));
                let mut out = io.stdout.take().ok_or("no stdout")?;
                out.write_all(format!("resized {}x{}\n", size.width, size.height).as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(0);
            }
            run(&req.cmd, io).await
        })
    }

    fn attach(&self, _req: AttachRequest, io: Io) -> BoxFuture<'_, Result<i32, String>> {
        Box::pin(async move { run(&["cat".to_string()], io).await })
    }

    fn port_forward(&self, _sandbox_id: &str, port: u16) -> BoxFuture<'_, Result<BoxStream, String>> {
        Box::pin(async move {
            let s = TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
            Ok(Box::new(s) as BoxStream)
        })
    }
}

struct Fixture {
    server: StreamServer,
    backend: Arc<TestBackend>,
    client: PathBuf,
    _shutdown: tokio_util::sync::DropGuard,
}

static CLIENT: OnceCell<Option<PathBuf>> = OnceCell::const_new();

/// Builds the Go client once; `None` (after saying why) when Go is missing.
async fn goclient() -> Option<PathBuf> {
    CLIENT
        .get_or_init(|| async {
            let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goclient");
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hpk-streaming-goclient");
            let built = Command::new("go")
                .args(["build", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(&src)
                .env("GOFLAGS", "-mod=mod")
                .status()
                .await;
            match built {
                Ok(s) if s.success() => Some(out),
                other => {
                    let why = format!("cannot build tests/goclient with `go build`: {other:?}");
                    hpk_test_support::skip(why);
                    None
                }
            }
        })
        .await
        .clone()
}

async fn fixture() -> Option<Fixture> {
    let client = goclient().await?;
    let shutdown = CancellationToken::new();
    let backend = Arc::new(TestBackend::default());
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = StreamServer::start(addr, backend.clone(), shutdown.clone()).await.expect("start");
    Some(Fixture { server, backend, client, _shutdown: shutdown.drop_guard() })
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn client(f: &Fixture, args: &[&str], stdin: &[u8]) -> Ran {
    let mut child = Command::new(&f.client)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn goclient");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    tokio::spawn(async move {
        let _ = input.write_all(&data).await;
    });
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("goclient timed out")
        .expect("goclient output");
    let ran = Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("goclient {args:?} -> {}\nstdout: {}\nstderr: {}", ran.code, ran.stdout, ran.stderr);
    ran
}

fn exec(cmd: &[&str], stdin: bool) -> ExecRequest {
    ExecRequest {
        container_id: "c1".into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty: false,
        stdin,
        stdout: true,
        stderr: true,
    }
}

const SCRIPT: &[&str] = &["sh", "-c", "echo out; echo err >&2; exit 3"];

async fn check_exit_and_streams(f: &Fixture, mode: &str, extra: &[&str]) {
    let url = f.server.exec_url(exec(SCRIPT, false)).expect("url");
    let mut args = vec![mode, &url];
    args.extend_from_slice(extra);
    let ran = client(f, &args, b"").await;
    assert_eq!(ran.code, 3, "exit code 3 reaches the client");
    assert_eq!(ran.stdout, "out\n");
    assert!(ran.stderr.starts_with("err\n"), "stderr: {}", ran.stderr);
}

async fn check_stdin_round_trip(f: &Fixture, mode: &str) {
    let input: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    let url = f.server.exec_url(exec(&["cat"], true)).expect("url");
    let ran = client(f, &[mode, &url, "-stdin"], input.as_bytes()).await;
    assert_eq!(ran.code, 0);
    assert_eq!(ran.stdout, input, "stdin comes back through cat and EOF ends it");
}

async fn check_tty_resize(f: &Fixture, mode: &str) {
    let req = ExecRequest { container_id: "tty".into(), tty: true, stderr: false, ..exec(&["sh"], false) };
    let url = f.server.exec_url(req).expect("url");
    let ran = client(f, &[mode, &url, "-tty", "-resize", "100x40"], b"").await;
    assert_eq!(ran.code, 0);
    assert_eq!(ran.stdout.trim_end(), "resized 100x40");
    assert!(f.backend.resizes.lock().expect("lock").contains(&(100, 40)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spdy_exec_streams_stdin_exit_code_and_resize() {
    let Some(f) = fixture().await else { return };
    check_exit_and_streams(&f, "exec-spdy", &[]).await;
    check_stdin_round_trip(&f, "exec-spdy").await;
    check_tty_resize(&f, "exec-spdy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_v5_exec_streams_stdin_exit_code_and_resize() {
    let Some(f) = fixture().await else { return };
    check_exit_and_streams(&f, "exec-ws", &[]).await;
    check_stdin_round_trip(&f, "exec-ws").await;
    check_tty_resize(&f, "exec-ws").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_v4_exec_reports_exit_code() {
    let Some(f) = fixture().await else { return };
    check_exit_and_streams(&f, "exec-ws", &["-protocol", "v4.channel.k8s.io"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spdy_attach_round_trips_stdin() {
    let Some(f) = fixture().await else { return };
    let req =
        AttachRequest { container_id: "c1".into(), tty: false, stdin: true, stdout: true, stderr: true };
    let url = f.server.attach_url(req).expect("url");
    let ran = client(&f, &["exec-spdy", &url, "-stdin"], b"attached\n").await;
    assert_eq!(ran.code, 0);
    assert_eq!(ran.stdout, "attached\n");
}

async fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = conn.into_split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                let _ = wr.shutdown().await;
            });
        }
    });
    port
}

async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr").port()
}

fn pf_request() -> PortForwardRequest {
    PortForwardRequest { sandbox_id: "sb1".into(), ports: vec![] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spdy_port_forward_echoes_200k_both_ways() {
    let Some(f) = fixture().await else { return };
    let port = echo_server().await.to_string();
    let url = f.server.port_forward_url(pf_request()).expect("url");
    let ran = client(&f, &["portforward", &url, &port, "200000"], b"").await;
    assert_eq!((ran.code, ran.stdout.trim()), (0, "OK"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_tunnelled_port_forward_echoes() {
    let Some(f) = fixture().await else { return };
    let port = echo_server().await.to_string();
    let url = f.server.port_forward_url(pf_request()).expect("url");
    let ran = client(&f, &["portforward-ws", &url, &port, "50000"], b"").await;
    assert_eq!((ran.code, ran.stdout.trim()), (0, "OK"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_port_is_reported_on_its_error_stream_and_the_session_lives_on() {
    let Some(f) = fixture().await else { return };
    let good = echo_server().await.to_string();
    let bad = closed_port().await.to_string();
    let url = f.server.port_forward_url(pf_request()).expect("url");
    let ran = client(&f, &["portforward-refused", &url, &bad, &good], b"").await;
    assert_eq!(ran.code, 0);
    assert!(ran.stdout.contains(&format!("ERROR: error forwarding port {bad} to pod sb1")), "{}", ran.stdout);
    assert!(ran.stdout.to_lowercase().contains("connection refused"), "{}", ran.stdout);
    assert!(ran.stdout.trim_end().ends_with("OK"));
}

async fn raw_request(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n =
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await.expect("answer").expect("read");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_404_and_requests_without_upgrade_are_400() {
    let Some(f) = fixture().await else { return };
    let addr = f.server.local_addr();
    let spdy = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n";
    let res =
        raw_request(addr, &format!("POST /exec/0123456789abcdef HTTP/1.1\r\nHost: x\r\n{spdy}\r\n")).await;
    assert!(res.starts_with("HTTP/1.1 404"), "{res}");

    let url = f.server.exec_url(exec(SCRIPT, false)).expect("url");
    let path = url.split_once(&addr.to_string()).expect("url has the address").1.to_string();
    let res = raw_request(addr, &format!("POST {path} HTTP/1.1\r\nHost: x\r\n\r\n")).await;
    assert!(res.starts_with("HTTP/1.1 400"), "{res}");
    assert!(res.contains("v4.channel.k8s.io") && res.contains("v5.channel.k8s.io"), "{res}");
    // A refused upgrade does not spend the token; the real client then succeeds.
    assert_eq!(client(&f, &["exec-spdy", &url], b"").await.code, 3);
    // ... and the token is single use.
    let ran = client(&f, &["exec-spdy", &url], b"").await;
    assert_ne!(ran.code, 3);
    assert!(ran.stderr.contains("404"), "{}", ran.stderr);
}
