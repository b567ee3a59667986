//! Exec, Attach and PortForward through the streaming server, driven by the real crictl over
//! both of its transports (SPDY/3.1 and WebSocket): output, stdin, exit codes (crictl exits 1
//! and names the command's code), a terminal with
//! its size, attach to a running container, and port-forward to a busybox httpd.

mod support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hpk_integration::image::{HTTPD_INDEX, HTTPD_PORT};
use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present};

const TRANSPORTS: [&str; 2] = ["spdy", "websocket"];

fn crictl(rt: &Runtime) -> Command {
    rt.crictl_command()
}

fn run_with_input(mut cmd: Command, input: &[u8]) -> std::process::Output {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run crictl");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input).expect("write stdin");
    drop(stdin);
    child.wait_with_output().expect("crictl output")
}

/// A pod running `command` in the shell image; returns (pod ID, container ID).
fn pod(rt: &Runtime, dir: &std::path::Path, name: &str, image: &str, command: &[&str]) -> (String, String) {
    rt.run_pod(dir, name, image, command, false, false)
}

/// Waits until the container has exited with `code`.
fn wait_exited(rt: &Runtime, id: &str, code: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inspect: serde_json::Value = serde_json::from_str(&rt.ok(&["inspect", id])).expect("inspect");
        if inspect["status"]["state"] == "CONTAINER_EXITED" {
            assert_eq!(inspect["status"]["exitCode"], code, "{inspect}");
            return;
        }
        assert!(Instant::now() < deadline, "{id} still running: {inspect}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_exec_attach_and_port_forward() {
    if !tools_present(&[CRICTL_TOOLS, &["script"]].concat()) {
        return;
    }
    let (registry, shell, _) = registry_with_shell_image().await;
    let httpd = support::push_httpd_image(&registry).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    tokio::task::block_in_place(|| {
        let rt = Runtime::start(tmp.path(), &registry.host_port());
        rt.ok(&["pull", &shell]);
        rt.ok(&["pull", &httpd]);
        let (sleeper_pod, sleeper) = pod(&rt, tmp.path(), "sleeper", &shell, &["sleep", "300"]);

        for transport in TRANSPORTS {
            // Output on both streams, and the command's exit code as crictl's.
            let out = crictl(&rt)
                .args(["exec", "-r", transport, &sleeper, "sh", "-c", "echo out; echo err >&2; exit 3"])
                .output()
                .expect("crictl exec");
            assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n", "{transport}: {out:?}\n{}", rt.log());
            assert!(String::from_utf8_lossy(&out.stderr).contains("err\n"), "{transport}: {out:?}");
            // crictl exits 1 and names the command's code.
            assert!(!out.status.success(), "{transport}: {out:?}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("command terminated with exit code 3"),
                "{transport}: {out:?}"
            );

            // stdin reaches the command, and its end is the command's end of input.
            let mut cmd = crictl(&rt);
            cmd.args(["exec", "-i", "-r", transport, &sleeper, "sh", "-c", "tr a-z A-Z; echo done"]);
            let out = run_with_input(cmd, b"hello from stdin\n");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "HELLO FROM STDIN\ndone\n",
                "{transport}: {out:?}"
            );
            assert!(out.status.success(), "{transport}: {out:?}");

            // A terminal: crictl runs in a pseudo-terminal of `script` sized 45x123; the size
            // reaches the command's terminal, and its exit code comes back.
            let endpoint = format!("unix://{}", rt.socket().display());
            let inner = format!(
                "stty cols 123 rows 45; crictl --runtime-endpoint {endpoint} exec -it -r {transport} {sleeper} sh -c 'sleep 0.5; stty size; tty; exit 4'"
            );
            let mut cmd = Command::new("script");
            cmd.args(["-q", "-e", "-c", &inner, "/dev/null"]);
            let out = run_with_input(cmd, b"");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("45 123"),
                "{transport}: the terminal's size: {text:?} {out:?}\n{}",
                rt.log()
            );
            assert!(text.contains("/dev/pts/"), "{transport}: a terminal: {text:?}");
            assert!(text.contains("command terminated with exit code 4"), "{transport}: {text:?}");
        }

        // A command that is not in the image: 127 as a shell says, not a broken session.
        let out = crictl(&rt).args(["exec", &sleeper, "no-such-command"]).output().expect("crictl exec");
        assert!(String::from_utf8_lossy(&out.stderr).contains("exit code 127"), "{out:?}");

        // Attach follows a running container's output until it exits.
        let (talker_pod, talker) = pod(
            &rt,
            tmp.path(),
            "talker",
            &shell,
            &["sh", "-c", "sleep 1; echo attached line; sleep 0.5; exit 2"],
        );
        let out = crictl(&rt).args(["attach", &talker]).output().expect("crictl attach");
        assert!(String::from_utf8_lossy(&out.stdout).contains("attached line"), "{out:?}\n{}", rt.log());

        // A container with stdin (once): attach -i feeds it, and the end of the client's
        // stdin is the container's.
        let (cat_pod, cat) =
            rt.run_pod(tmp.path(), "cat", &shell, &["sh", "-c", "tr a-z A-Z; exit 6"], true, false);
        let mut cmd = crictl(&rt);
        cmd.args(["attach", "-i", &cat]);
        let out = run_with_input(cmd, b"typed into attach\n");
        assert!(String::from_utf8_lossy(&out.stdout).contains("TYPED INTO ATTACH"), "{out:?}\n{}", rt.log());
        wait_exited(&rt, &cat, 6);
        // stdin only where the container was created with it.
        assert!(rt.fails(&["attach", "-i", &sleeper]).contains("not created with stdin"));

        // A container with a terminal: attach -it from a pseudo-terminal; input is echoed by
        // the terminal, the size reaches it, and the shell's output and exit come back.
        let (tty_pod, tty) = rt.run_pod(tmp.path(), "tty", &shell, &["sh"], true, true);
        let endpoint = format!("unix://{}", rt.socket().display());
        let inner = format!("stty cols 99 rows 33; crictl --runtime-endpoint {endpoint} attach -i -t {tty}");
        let mut cmd = Command::new("script");
        cmd.args(["-q", "-e", "-c", &inner, "/dev/null"]);
        let out = run_with_input(cmd, b"sleep 0.5; stty size; echo $((6*7)); exit 9\n");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("33 99"), "the terminal's size: {text:?}\n{}", rt.log());
        assert!(text.contains("42"), "{text:?}");
        wait_exited(&rt, &tty, 9);
        let log = std::fs::read_to_string(tmp.path().join("logs/tty/main/0.log")).expect("tty log");
        assert!(log.lines().any(|l| l.ends_with(" stdout F 42")), "terminal output is logged: {log:?}");

        // Port-forward to busybox httpd listening on the pod's loopback only.
        let (web_pod, _) = pod(&rt, tmp.path(), "web", &httpd, &[]);
        for transport in TRANSPORTS {
            let mut forward = crictl(&rt)
                .args(["port-forward", "-r", transport, &web_pod, &format!(":{HTTPD_PORT}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("crictl port-forward");
            let local = local_port(&mut forward);
            let body = http_get(local);
            assert!(body.ends_with(HTTPD_INDEX), "{transport}: {body:?}");
            // Several connections over one session.
            assert!(http_get(local).ends_with(HTTPD_INDEX), "{transport}: second request");
            let _ = forward.kill();
            let _ = forward.wait();
        }
        // Nothing listens on this port in the pod: the connection is closed without data.
        let mut forward = crictl(&rt)
            .args(["port-forward", &web_pod, ":9"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("crictl port-forward");
        let local = local_port(&mut forward);
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", local)).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut buf = Vec::new();
        let _ = conn.read_to_end(&mut buf);
        assert!(buf.is_empty(), "{buf:?}");
        let _ = forward.kill();
        let _ = forward.wait();

        // Bad requests: no such container, a stopped container, a bad port.
        assert!(rt.fails(&["exec", "nosuchcontainer", "true"]).contains("not found"));
        rt.ok(&["stop", "--timeout", "1", &sleeper]);
        assert!(rt.fails(&["exec", &sleeper, "true"]).contains("not running"));
        assert!(rt.fails(&["port-forward", &web_pod, ":70000"]).to_lowercase().contains("port"));
        for pod in [sleeper_pod, talker_pod, web_pod, cat_pod, tty_pod] {
            rt.ok(&["rmp", "-f", &pod]);
        }
    });
}

/// Reads crictl port-forward's "Forwarding from 127.0.0.1:PORT -> ..." line.
fn local_port(child: &mut std::process::Child) -> u16 {
    let stdout = child.stdout.take().expect("stdout");
    let mut reader = std::io::BufReader::new(stdout);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut reader, &mut line).expect("read");
        assert!(n > 0 && Instant::now() < deadline, "port-forward did not start: {line:?}");
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            let port = rest.split_whitespace().next().and_then(|p| p.parse().ok()).expect("a port");
            // Keep draining its output so it never blocks.
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut reader, &mut std::io::sink());
            });
            return port;
        }
    }
}

fn http_get(port: u16) -> String {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    conn.write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
    let mut body = String::new();
    conn.read_to_string(&mut body).expect("response");
    body
}
