//! `hpk up` / `hpk down` / `hpk status` on a test host: real bubbles (crun, rootless user
//! namespaces, slirp4netns), the upstream control plane inside the controller bubble, our
//! services in every bubble, checked with the real kubectl.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use hpk_integration::image::HTTPD_PORT;
use support::{Env, eventually, eventually_or, prerequisites, text};

fn pods_on_nodes(env: &Env, cluster: &str, selector: &str) -> Vec<(String, String, String, String)> {
    let out = env.kubectl_ok(cluster, &[
        "get", "pods", "-l", selector, "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase} {.status.podIP}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.into(), w.next()?.into(), w.next()?.into(), w.next().unwrap_or("").into()))
        })
        .collect()
}

/// `kubectl top` through the metrics-server `hpk up` deployed: both nodes and the ticker pods
/// with figures, within 90 s of `hpk up` returning, and an idle pod too (`sleep`, which has used
/// less than a clock tick of CPU: the runtime counts run time in nanoseconds, so it is not a
/// zero, which metrics-server would leave out).
fn kubectl_top_shows_both_nodes(env: &Env, up_at: std::time::Instant) {
    let figures = |args: &[&str]| -> Option<Vec<(String, String, String)>> {
        let out = env.kubectl("demo", args);
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let mut w = l.split_whitespace();
                    Some((w.next()?.to_owned(), w.next()?.to_owned(), w.next()?.to_owned()))
                })
                .collect()
        })
    };
    // NAME CPU(cores) CPU% MEMORY(bytes) … and NAME CPU(cores) MEMORY(bytes)
    let millicores = |cpu: &str| cpu.strip_suffix('m').and_then(|m| m.parse::<u64>().ok());
    let nodes = eventually_or(
        "kubectl top nodes: both nodes",
        Duration::from_secs(90).saturating_sub(up_at.elapsed()),
        || figures(&["top", "nodes", "--no-headers"]).filter(|rows| rows.len() == 2),
        || {
            env.diagnose("demo")
                + &env.kubectl_ok("demo", &["get", "apiservice", "v1beta1.metrics.k8s.io", "-o", "yaml"])
        },
    );
    eprintln!(
        "kubectl top nodes answered {:.1} s after hpk up returned: {nodes:?}",
        up_at.elapsed().as_secs_f64()
    );
    for (node, cpu, _) in &nodes {
        assert!(node.starts_with("demo-") && millicores(cpu).is_some_and(|m| m > 0), "{nodes:?}");
    }
    let pods = eventually("kubectl top pods: the tickers", Duration::from_secs(60), || {
        figures(&["top", "pods", "-l", "app=ticker", "--no-headers"]).filter(|rows| rows.len() == 2)
    });
    for (pod, cpu, memory) in &pods {
        assert!(
            pod.starts_with("ticker-") && millicores(cpu).is_some() && memory.ends_with("Mi"),
            "{pods:?}"
        );
    }
    let idle = eventually("kubectl top pods: the idle pod", Duration::from_secs(60), || {
        figures(&["top", "pods", "-l", "app=idle", "--no-headers"]).filter(|rows| rows.len() == 1)
    });
    assert!(idle.iter().all(|(pod, cpu, _)| pod == "idle" && millicores(cpu).is_some()), "{idle:?}");
}

/// Every bubble's slirp4netns (the image's, which parses all pod egress) runs confined: a
/// seccomp filter, and a mount namespace of its own apart from its launcher's (review L14).
fn slirp4netns_is_sandboxed(env: &Env) {
    let state = env.state.path().display().to_string();
    let slirps: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains("--argv0 slirp4netns") && cmdline.contains(&state)
        })
        .collect();
    assert_eq!(slirps.len(), 2, "one slirp4netns per bubble, from the image");
    for pid in slirps {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        assert!(status.lines().any(|l| l == "Seccomp:\t2"), "slirp4netns {pid} has no seccomp filter");
        let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:")).expect("PPid").trim().to_owned();
        let mnt = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).expect("mnt ns");
        assert_ne!(mnt(&pid.to_string()), mnt(&ppid), "slirp4netns {pid} shares its launcher's mounts");
    }
}

/// Issue 25: a NodePort Service, a LoadBalancer Service and a pod's hostPort answer on the
/// cluster's host address from another machine of the network, over TCP and over UDP; the LoadBalancer shows that
/// address; a port below 1024 is refused with a Warning event; a deleted Service's port closes.
fn published_ports_answer_from_outside(env: &Env, web_nodes: &std::collections::BTreeSet<&str>) {
    let address = env.host.ip.to_string();
    let container = httpd_who_answers_with_host_port(&env.httpd, 18081);
    env.apply(
        "demo",
        &format!(
            "apiVersion: v1
kind: Service
metadata: {{name: web-np}}
spec:
  type: NodePort
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: {HTTPD_PORT}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-lb}}
spec:
  type: LoadBalancer
  selector: {{app: web}}
  ports: [{{port: 18080, targetPort: {HTTPD_PORT}}}]
---
# Pod Security's baseline (HPK's default, as upstream's) forbids host ports: a namespace that
# allows them.
apiVersion: v1
kind: Namespace
metadata:
  name: edge
  labels: {{pod-security.kubernetes.io/enforce: privileged}}
---
apiVersion: v1
kind: Pod
metadata: {{name: host-port, namespace: edge}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
{container}---
# UDP: the cluster's DNS on a node port, and a DNS server of a pod's own on a host port.
apiVersion: v1
kind: Service
metadata: {{name: dns-np, namespace: kube-system}}
spec:
  type: NodePort
  selector: {{k8s-app: kube-dns}}
  ports: [{{name: dns, port: 53, protocol: UDP}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: udp-zone, namespace: edge}}
data:
  Corefile: |
    .:1053 {{
        hosts {{
            192.0.2.53 udp.host.port
        }}
    }}
---
apiVersion: v1
kind: Pod
metadata: {{name: udp-host-port, namespace: edge}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: dns
    image: {coredns}
    args: [-conf, /etc/coredns/Corefile]
    ports: [{{containerPort: 1053, hostPort: 18053, protocol: UDP}}]
    volumeMounts: [{{name: zone, mountPath: /etc/coredns}}]
  volumes: [{{name: zone, configMap: {{name: udp-zone}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: same-port-1, namespace: edge}}
spec:
  nodeName: demo-1
  terminationGracePeriodSeconds: 1
  containers:
{same}---
apiVersion: v1
kind: Pod
metadata: {{name: same-port-2, namespace: edge}}
spec:
  nodeName: demo-2
  terminationGracePeriodSeconds: 1
  containers:
{same}",
            same = httpd_who_answers_with_host_port(&env.httpd, 18082),
            coredns = env.coredns,
        ),
    );
    let node_port =
        env.kubectl_ok("demo", &["get", "service", "web-np", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let from_outside = |port: &str| -> Option<String> {
        let out = env
            .attacker()
            .command("curl")
            .args(["-sS", "--max-time", "3", &format!("http://{address}:{port}/")])
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // NodePort: balanced over the pods on both nodes, as from inside.
    let mut seen = std::collections::BTreeSet::new();
    eventually_or(
        &format!("answers from both nodes on {address}:{node_port} (NodePort)"),
        Duration::from_secs(60),
        || {
            if let Some(body) = from_outside(node_port.trim()) {
                seen.extend(
                    web_nodes.iter().filter(|n| body.contains(&format!("node={n}"))).map(|n| (*n).to_owned()),
                );
            }
            (seen.len() == web_nodes.len()).then_some(())
        },
        || env.diagnose("demo"),
    );
    // LoadBalancer: the cluster's address in its status, and the port answers there.
    let ingress = eventually("web-lb's ingress", Duration::from_secs(60), || {
        let ip = env.kubectl_ok(
            "demo",
            &["get", "service", "web-lb", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}"],
        );
        (!ip.trim().is_empty()).then(|| ip.trim().to_owned())
    });
    assert_eq!(ingress, address, "the LoadBalancer's address is the nodes' (both on this host)");
    let lb = eventually("web-lb answers on 18080", Duration::from_secs(60), || from_outside("18080"));
    assert!(lb.contains("pod=web-"), "{lb}");
    // hostPort: that pod, on its node's address.
    let pod = eventually("host-port answers on 18081", Duration::from_secs(90), || from_outside("18081"));
    assert!(pod.contains("pod=host-port "), "{pod}");
    // UDP: a DNS query from outside to each, answered from the port it was sent to (busybox's
    // nslookup takes only answers from the server it asked).
    let lookup = |name: &str, port: &str| -> Option<String> {
        let out = env
            .attacker()
            .command("timeout")
            .args(["5", "busybox", "nslookup", name, &format!("{address}:{port}")])
            .output()
            .ok()?;
        // An answer has the name; a timeout says "no servers could be reached".
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("Name:").then_some(text)
    };
    let dns_port = env.kubectl_ok(
        "demo",
        &["get", "service", "-n", "kube-system", "dns-np", "-o", "jsonpath={.spec.ports[0].nodePort}"],
    );
    let api_ip =
        env.kubectl_ok("demo", &["get", "service", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"]);
    let answer = eventually(
        &format!("the cluster DNS on {address}:{} (UDP NodePort)", dns_port.trim()),
        Duration::from_secs(60),
        || lookup("kubernetes.default.svc.cluster.local", dns_port.trim()),
    );
    assert!(answer.contains(api_ip.trim()), "{answer}");
    let answer = eventually("the pod's DNS on 18053 (UDP hostPort)", Duration::from_secs(90), || {
        lookup("udp.host.port", "18053")
    });
    assert!(answer.contains("192.0.2.53"), "{answer}");
    // Both nodes share this host: of two pods with the same hostPort on the two nodes, one
    // has the port, the other runs and says why it has not (a Warning event).
    let supervisors = || {
        ["demo-1", "demo-2"]
            .map(|n| {
                let log = std::fs::read_to_string(env.state.path().join(format!("demo/{n}/logs/bubble.log")));
                let lines: Vec<String> = log
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("port") || l.contains("event"))
                    .map(str::to_owned)
                    .collect();
                format!("{n}'s supervisor:\n{}\n", lines.join("\n"))
            })
            .concat()
    };
    let events = eventually_or(
        "a PortNotPublished event on one of the same-port pods",
        Duration::from_secs(90),
        || {
            let events = env.kubectl_ok(
                "demo",
                &[
                    "get",
                    "events",
                    "-n",
                    "edge",
                    "--field-selector=reason=PortNotPublished",
                    "-o",
                    "jsonpath={range .items[*]}{.involvedObject.name}: {.message}{\"\\n\"}{end}",
                ],
            );
            (!events.trim().is_empty()).then_some(events)
        },
        supervisors,
    );
    assert_eq!(events.trim().lines().count(), 1, "{events}");
    let refused = events.split(':').next().unwrap_or_default().to_owned();
    assert!(
        refused.starts_with("same-port-") && events.contains("host port 18082") && events.contains("in use"),
        "{events}"
    );
    let holder = eventually("the same-port pod that has it answers", Duration::from_secs(60), || {
        from_outside("18082")
    });
    assert!(
        holder.contains("pod=same-port-") && !holder.contains(&format!("pod={refused} ")),
        "{holder} / {events}"
    );
    // A deleted Service's port is closed on the host.
    env.kubectl_ok("demo", &["delete", "service", "web-np"]);
    eventually("web-np's node port closed", Duration::from_secs(30), || {
        from_outside(node_port.trim()).is_none().then_some(())
    });
    env.kubectl_ok("demo", &["delete", "namespace", "edge", "--wait=false"]);
}

/// The who-answers httpd container with `hostPort` for its port.
fn httpd_who_answers_with_host_port(image: &str, host_port: u16) -> String {
    let container = hpk_test_support::manifest::httpd_who_answers(image).replace(
        "ports: [{containerPort: 8080}]",
        &format!("ports: [{{containerPort: 8080, hostPort: {host_port}}}]"),
    );
    // Indented under `containers:`.
    container.lines().map(|l| format!("  {l}\n")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_run_workloads_and_down_leaves_nothing() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let up = env.up("demo", 2);
    let up_at = std::time::Instant::now();
    let output = text(&up);
    assert!(up.status.success(), "hpk up failed:\n{output}");
    assert!(output.contains(&format!("export KUBECONFIG={}", env.kubeconfig("demo").display())), "{output}");
    assert!(output.contains("2 node(s) Ready"), "{output}");
    assert!(output.contains("cluster DNS ready"), "{output}");
    let nodes = env.kubectl_ok("demo", &["get", "nodes", "--no-headers"]);
    assert_eq!(nodes.lines().filter(|l| l.split_whitespace().nth(1) == Some("Ready")).count(), 2, "{nodes}");
    slirp4netns_is_sandboxed(&env);

    // Each web replica serves its pod and node name, so a client sees which one answered.
    use hpk_test_support::manifest::{httpd_who_answers, service, spread_deployment};
    let web = spread_deployment("web", 4, "DoNotSchedule", None, &httpd_who_answers(&env.httpd));
    env.apply(
        "demo",
        &format!(
            "{web}---
{service}---
apiVersion: v1
kind: Pod
metadata: {{name: idle, labels: {{app: idle}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: idle, image: {shell}, command: [sleep, '3600']}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: ticker}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: ticker}}}}
  template:
    metadata: {{labels: {{app: ticker}}}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: ticker}}}}}}
      containers:
      - name: tick
        image: {shell}
        command: [sh, -c, 'i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done']
",
            service = service("web", "web", 8080),
            shell = env.shell
        ),
    );
    let running = |selector: &str, n: usize| {
        eventually_or(
            &format!("{n} Running pods {selector}"),
            Duration::from_secs(180),
            || {
                let pods = pods_on_nodes(&env, "demo", selector);
                (pods.len() == n && pods.iter().all(|p| p.2 == "Running")).then_some(pods)
            },
            || env.diagnose("demo"),
        )
    };
    let web = running("app=web", 4);
    let ticker = running("app=ticker", 2);
    running("app=idle", 1);
    let web_nodes: std::collections::BTreeSet<&str> = web.iter().map(|p| p.1.as_str()).collect();
    assert_eq!(web_nodes.len(), 2, "the Deployment spreads over both nodes: {web:?}");
    kubectl_top_shows_both_nodes(&env, up_at);
    support::an_hpa_scales_up_under_load_and_back_down(
        &|manifest| env.apply("demo", manifest),
        &|args| env.kubectl_ok("demo", args),
        &env.shell,
        Duration::from_secs(100),
    );

    for (pod, node, _, _) in &ticker {
        // logs -f streams new lines as they are written.
        let out = Command::new("timeout")
            .arg("4")
            .arg(&env.kubectl)
            .arg(format!("--kubeconfig={}", env.kubeconfig("demo").display()))
            .args(["logs", "-f", "--tail=1", pod])
            .output()
            .expect("kubectl logs -f");
        let ticks = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("tick ")).count();
        assert!(ticks >= 5, "logs -f on {node} gave {ticks} lines in 4 s: {}", text(&out));
        // exec, with the command's output and exit code.
        assert_eq!(env.kubectl_ok("demo", &["exec", pod, "--", "cat", "/etc/hostname"]).trim(), pod);
        let failed = env.kubectl("demo", &["exec", pod, "--", "sh", "-c", "exit 3"]);
        assert_eq!(failed.status.code(), Some(3), "exec on {node}: {}", text(&failed));
    }

    // port-forward to a web pod on each node.
    for node in &web_nodes {
        let (pod, ..) = web.iter().find(|p| p.1 == *node).expect("a pod there");
        let mut pf = Command::new(&env.kubectl)
            .arg(format!("--kubeconfig={}", env.kubeconfig("demo").display()))
            .args(["port-forward", pod, &format!(":{HTTPD_PORT}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl port-forward");
        let mut line = String::new();
        // Kept open until curl is done: kubectl writes a second line, and dies of SIGPIPE if
        // nobody reads.
        let mut stdout = BufReader::new(pf.stdout.take().expect("stdout"));
        stdout.read_line(&mut line).expect("read");
        let port = line
            .split("127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no local port in {line:?}"))
            .to_owned();
        let curl = Command::new("curl")
            .args(["-sS", "--max-time", "10", &format!("http://127.0.0.1:{port}/")])
            .output()
            .expect("curl");
        let _ = pf.kill();
        let _ = pf.wait();
        drop(stdout);
        assert!(
            String::from_utf8_lossy(&curl.stdout).contains(&format!("pod={pod} node={node}")),
            "port-forward to {pod} on {node}: {}",
            text(&curl)
        );
    }

    // Pod to pod across the nodes, through the net-forwarders' tunnel between the bubbles.
    for (pod, node, _, _) in &ticker {
        let (_, other, _, ip) = web.iter().find(|p| p.1 != *node).expect("a web pod on the other node");
        let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} {HTTPD_PORT}");
        let got = env.kubectl_ok("demo", &["exec", pod, "--", "sh", "-c", &script]);
        assert!(got.contains(&format!("node={other}")), "{pod} on {node} → {ip} on {other}: {got}");
    }

    // Inside a bubble by hand: `hpk shell`, and `hpktainer run` there with a pod address that
    // reaches a pod on the other node, released when it exits.
    let shell =
        env.hpk(&["shell", "--name", "demo", "demo-1", "--", "hostname"]).output().expect("hpk shell");
    assert_eq!(String::from_utf8_lossy(&shell.stdout).trim(), "demo-1", "{}", text(&shell));
    let (_, _, _, remote_ip) = web.iter().find(|p| p.1 == "demo-2").expect("a web pod on demo-2");
    let script = format!("ip -4 addr show eth0; ping -c 1 -W 5 {remote_ip}");
    let tainer = env
        .hpk(&[
            "shell",
            "--name",
            "demo",
            "demo-1",
            "--",
            "hpktainer",
            "run",
            &env.shell,
            "sh",
            "-c",
            &script,
        ])
        .output()
        .expect("hpktainer run");
    let tainer_text = text(&tainer);
    assert!(tainer.status.success(), "hpktainer run: {tainer_text}");
    let address = tainer_text
        .split("with address ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {tainer_text}"))
        .to_owned();
    assert!(address.starts_with("10.244."), "{tainer_text}");
    assert!(tainer_text.contains(&format!("inet {address}/")), "ip addr inside shows it: {tainer_text}");
    assert!(tainer_text.contains("1 packets received"), "the ping across nodes: {tainer_text}");
    let allocations = env.state.path().join("demo/demo-1/net-forwarder/allocations.json");
    let allocated = std::fs::read_to_string(&allocations).expect("the net-forwarder's allocations");
    assert!(!allocated.contains(&format!("\"{address}\"")), "{address} released: {allocated}");
    let sandboxes = env
        .hpk(&["shell", "--name", "demo", "demo-1", "--", "ls", "/var/lib/hpk/hpktainer"])
        .output()
        .expect("ls");
    assert!(String::from_utf8_lossy(&sandboxes.stdout).trim().is_empty(), "{}", text(&sandboxes));

    // The ClusterIP Service by its DNS name, from a pod on each node: CoreDNS (a Deployment on
    // these nodes) resolves it, kube-proxy in the bubble balances it over pods on both nodes.
    for (pod, node, _, _) in &ticker {
        let resolv = env.kubectl_ok("demo", &["exec", pod, "--", "cat", "/etc/resolv.conf"]);
        assert!(resolv.contains("nameserver 10.96.0.10"), "{pod}: {resolv}");
        let script = "for i in $(seq 1 30); do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 web.default.svc.cluster.local 80 | grep node=; done";
        let got = env.kubectl_ok("demo", &["exec", pod, "--", "sh", "-c", script]);
        for other in &web_nodes {
            assert!(
                got.contains(&format!("node={other}")),
                "from {pod} on {node}, no answer from {other}: {got}"
            );
        }
        let script = "nslookup kubernetes.default.svc.cluster.local && printf '' | nc -w 3 kubernetes.default.svc.cluster.local 443 && echo connected";
        let got = env.kubectl("demo", &["exec", pod, "--", "sh", "-c", script]);
        let got_text = text(&got);
        assert!(
            got_text.contains("10.96.0.1") && got_text.contains("connected"),
            "{pod}: kubernetes:443: {got_text}"
        );
    }

    published_ports_answer_from_outside(&env, &web_nodes);

    let status = env.hpk(&["status", "--name", "demo"]).output().expect("hpk status");
    let status_text = text(&status);
    assert!(status.status.success(), "{status_text}");
    for node in ["demo-1", "demo-2"] {
        assert!(status_text.lines().any(|l| l.starts_with(node) && l.contains("Ready")), "{status_text}");
    }

    let before = env.footprint("demo");
    assert!(before.pids.len() >= 10, "the footprint sees the bubbles' processes: {before:?}");
    assert!(before.ports.len() >= 6, "and their published ports: {before:?}");
    let down = env.down("demo");
    assert!(down.status.success(), "hpk down: {}", text(&down));
    let left = env.leftovers(&before);
    assert!(left.is_empty(), "hpk down left: {left:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_clusters_side_by_side() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    for name in ["left", "right"] {
        let up = env.up(name, 1);
        assert!(up.status.success(), "hpk up {name}: {}", text(&up));
        env.apply(name, &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n  - {{name: c, image: {}, command: [sleep, '3600']}}\n",
            env.shell
        ));
    }
    for name in ["left", "right"] {
        eventually_or(
            &format!("pod p Running in {name}"),
            Duration::from_secs(120),
            || {
                let phase = env.kubectl(name, &["get", "pod", "p", "-o", "jsonpath={.status.phase}"]);
                (String::from_utf8_lossy(&phase.stdout) == "Running").then_some(())
            },
            || env.diagnose(name),
        );
    }
    let left = env.footprint("left");
    let right = env.footprint("right");
    assert!(
        left.ports.iter().all(|p| !right.ports.contains(p)),
        "each cluster its own ports: {left:?} {right:?}"
    );
    let down = env.down("left");
    assert!(down.status.success(), "{}", text(&down));
    assert!(env.leftovers(&left).is_empty(), "{:#?}", env.leftovers(&left));
    // The other cluster is untouched.
    let phase = env.kubectl_ok("right", &["get", "pod", "p", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase, "Running");
    let nodes = env.kubectl_ok("right", &["get", "nodes", "--no-headers"]);
    assert!(nodes.contains(" Ready "), "{nodes}");
    let down = env.down("right");
    assert!(down.status.success(), "{}", text(&down));
    assert!(env.leftovers(&right).is_empty(), "{:#?}", env.leftovers(&right));
}

/// Each refusal stops `hpk up` early with exit 78 (or 69 for the port a launcher could not
/// bind), names its fix, and leaves no cluster files or processes.
#[tokio::test(flavor = "multi_thread")]
async fn up_refuses_a_machine_it_cannot_use_and_cleans_up() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image.clone()).await;
    let nothing_left = |name: &str| {
        let f = env.footprint(name);
        assert!(f.pids.is_empty(), "processes of {name}: {:?}", f.pids);
        assert!(!f.home.exists() && !f.state.exists(), "files of {name}: {f:?}");
    };

    // A corrupt image: one flipped byte in a layer.
    let scratch = tempfile::tempdir().expect("tempdir");
    let corrupt = scratch.path().join("corrupt");
    let cp = Command::new("cp").arg("-r").arg(&image).arg(&corrupt).status().expect("cp");
    assert!(cp.success());
    let blobs = corrupt.join("blobs/sha256");
    let largest = std::fs::read_dir(&blobs)
        .expect("blobs")
        .flatten()
        .max_by_key(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .expect("a blob")
        .path();
    let mut bytes = std::fs::read(&largest).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&largest, bytes).expect("write");
    let out = env.hpk(&["up", "--name", "bad", "--image"]).arg(&corrupt).output().expect("hpk up");
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(text(&out).contains("corrupt"), "{}", text(&out));
    nothing_left("bad");

    // A corrupt oci-archive (what `make images` also writes, for Apptainer): one flipped byte.
    let archive = image.with_extension("oci.tar");
    if archive.is_file() {
        let mut bytes = std::fs::read(&archive).expect("read the archive");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x55;
        let corrupt_archive = scratch.path().join("corrupt.oci.tar");
        std::fs::write(&corrupt_archive, bytes).expect("write");
        let out =
            env.hpk(&["up", "--name", "bad", "--image"]).arg(&corrupt_archive).output().expect("hpk up");
        assert_eq!(out.status.code(), Some(78), "{}", text(&out));
        assert!(text(&out).contains("corrupt"), "{}", text(&out));
        nothing_left("bad");
    } else {
        hpk_test_support::skip(format!("the corrupt-archive case: no {} (make images)", archive.display()));
    }

    // /dev/net/tun not accessible: a root-only TUN device, and the user is not root.
    let tun = scratch.path().join("tun");
    let mknod = Command::new("mknod").arg(&tun).args(["c", "10", "200"]).status().expect("mknod");
    assert!(mknod.success());
    std::fs::set_permissions(&tun, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_hpk"))
        .args(["up", "--name", "bad"])
        .env("HPK_TUN_DEVICE", &tun)
        .env("HPK_HOME", scratch.path().join("nobody-home"))
        .env("HPK_STATE_DIR", scratch.path().join("nobody-state"))
        .env("HPK_IMAGE", &image)
        .output()
        .expect("hpk up as nobody");
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(text(&out).contains("chmod 0666"), "the message names the fix: {}", text(&out));
    assert!(!scratch.path().join("nobody-home/bad").exists());

    // User namespaces disabled (in a user namespace of the test's own, where the limit is 0).
    let script = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces && exec {} up --name bad",
        env!("CARGO_BIN_EXE_hpk")
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c", &script])
        .env("HPK_HOME", env.home.path())
        .env("HPK_STATE_DIR", env.state.path())
        .env("HPK_IMAGE", &image)
        .output()
        .expect("hpk up without user namespaces");
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(text(&out).contains("max_user_namespaces"), "{}", text(&out));
    nothing_left("bad");

    // No free port: the test host's local port range is two ports, both taken.
    let sysctl = Command::new("ip")
        .args(["netns", "exec", &env.host.netns, "sysctl", "-qw", "net.ipv4.ip_local_port_range=45000 45001"])
        .status()
        .expect("sysctl");
    assert!(sysctl.success());
    let mut holders = Vec::new();
    for port in ["45000", "45001"] {
        holders.push(
            Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", env.host.netns))
                .args(["--", "busybox", "nc", "-l", "-p", port])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("hold a port"),
        );
    }
    eventually("both ports held", Duration::from_secs(10), || {
        let ss = Command::new("ip").args(["netns", "exec", &env.host.netns, "ss", "-Hltn"]).output().ok()?;
        let s = String::from_utf8_lossy(&ss.stdout).into_owned();
        (s.contains(":45000") && s.contains(":45001")).then_some(())
    });
    let out = env.hpk(&["up", "--name", "bad"]).output().expect("hpk up");
    // The launcher alone (as hpk.slurm runs it) refuses the same way and leaves no node files.
    let address = env.host.ip.to_string();
    let bubble = env
        .hpk(&["bubble", "--cluster", "bad", "--node", "bad-9", "--role", "worker", "--address", &address])
        .env("HPK_NODE_TOKEN_KEY", "0".repeat(64))
        .output()
        .expect("hpk bubble");
    for mut h in holders {
        let _ = h.kill();
        let _ = h.wait();
    }
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(text(&out).contains("ip_local_port_range"), "{}", text(&out));
    assert_eq!(bubble.status.code(), Some(78), "{}", text(&bubble));
    assert!(text(&bubble).contains("ip_local_port_range"), "{}", text(&bubble));
    assert!(!env.state.path().join("bad/bad-9").exists(), "the launcher left its node directory");
    assert!(!env.home.path().join("bad/nodes/bad-9.json").exists(), "the launcher left a node record");
    // The cluster's shared directory is the cluster's (other bubbles may be joining it), not
    // the launcher's: it stays for `hpk down`, which this test has no cluster for.
    let _ = std::fs::remove_dir_all(env.home.path().join("bad"));
    let _ = std::fs::remove_dir_all(env.state.path().join("bad"));
    nothing_left("bad");
}

/// The whole cluster as an unprivileged user (`nobody`): every process of it runs under that
/// user's ID on the host, pods pull and run, and `down` removes everything.
#[tokio::test(flavor = "multi_thread")]
async fn rootless_as_an_unprivileged_user() {
    use std::os::unix::fs::MetadataExt;
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image.clone()).await;
    const NOBODY: u32 = 65534;
    // Directories the user owns (the Env's are root's, 0700).
    let base = tempfile::Builder::new().prefix("hpk-nobody-").tempdir().expect("tempdir");
    std::fs::set_permissions(base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let (home, state) = (base.path().join("home"), base.path().join("state"));
    for dir in [&home, &state] {
        std::fs::create_dir(dir).expect("mkdir");
        nix::unistd::chown(
            dir,
            Some(nix::unistd::Uid::from_raw(NOBODY)),
            Some(nix::unistd::Gid::from_raw(NOBODY)),
        )
        .expect("chown");
    }
    let hpk = |args: &[&str]| {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", env.host.netns))
            .args(["--", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_hpk"))
            .args(args)
            .env("HOME", &home)
            .env("HPK_HOME", &home)
            .env("HPK_STATE_DIR", &state)
            .env("HPK_IMAGE", &image);
        cmd.output().expect("hpk as nobody")
    };
    let registry = format!("--insecure-registry={}", env.registry.host_port());
    let coredns = format!("--coredns-image={}", env.coredns);
    let up = hpk(&["up", "--name", "solo", &registry, &coredns, "--kubelet-arg=--disk-pressure-percent=1"]);
    let kubeconfig = home.join("solo/kubeconfig");
    let kubectl = |args: &[&str]| {
        Command::new(&env.kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .output()
            .expect("kubectl")
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(up.status.success(), "hpk up as nobody: {}", text(&up));
        assert_eq!(std::fs::metadata(&kubeconfig).expect("kubeconfig").mode() & 0o777, 0o600);
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n  - {{name: c, image: {}, command: [sleep, '3600']}}\n",
            env.shell
        );
        let mut apply = Command::new(&env.kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("kubectl apply");
        std::io::Write::write_all(&mut apply.stdin.take().expect("stdin"), pod.as_bytes()).expect("write");
        assert!(apply.wait().expect("wait").success());
        eventually("pod p Running", Duration::from_secs(120), || {
            let out = kubectl(&["get", "pod", "p", "-o", "jsonpath={.status.phase}"]);
            (String::from_utf8_lossy(&out.stdout) == "Running").then_some(())
        });
        // Every process of the cluster (launcher, bubble, services, the pod) is the user's.
        let footprint = env.footprint_in(&state, &home, "solo");
        assert!(footprint.pids.len() >= 10, "{footprint:?}");
        for pid in &footprint.pids {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(
                status.is_empty() || uid.split_whitespace().skip(1).all(|u| u == "65534"),
                "process {pid} ({}) runs as {uid}",
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            );
        }
        let sleep = kubectl(&["exec", "p", "--", "id", "-u"]);
        assert_eq!(
            String::from_utf8_lossy(&sleep.stdout).trim(),
            "0",
            "root inside the pod only: {}",
            text(&sleep)
        );
        footprint
    }));
    let down = hpk(&["down", "--name", "solo"]);
    let footprint = result.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(down.status.success(), "{}", text(&down));
    let left = env.leftovers(&footprint);
    assert!(left.is_empty(), "{left:#?}");
}

/// `hpk bubble --role runtime` (connector mode's remote side) refuses a missing or unusable
/// client CA before it makes anything.
#[test]
fn a_runtime_bubble_refuses_a_bad_client_ca_and_makes_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let (home, state) = (dir.path().join("home"), dir.path().join("state"));
    let junk = dir.path().join("junk.crt");
    std::fs::write(&junk, "not a certificate\n").expect("write");
    let cases: [(Vec<String>, i32, &str); 3] = [
        (vec![], 2, "--client-ca-file"),
        (vec![format!("--client-ca-file={}", junk.display())], 78, "--client-ca-file"),
        (vec![format!("--client-ca-file={}", dir.path().join("gone.crt").display())], 78, "gone.crt"),
    ];
    for (extra, code, says) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hpk"))
            .args(["bubble", "--role=runtime", "--cluster=c", "--node=n", "--address=127.0.0.1"])
            .arg(format!("--image={}", dir.path().join("image").display()))
            .args(&extra)
            .env("HPK_HOME", &home)
            .env("HPK_STATE_DIR", &state)
            .output()
            .expect("run hpk bubble");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: expected {says:?} in {stderr}");
        assert!(!home.exists() && !state.exists(), "{extra:?} made files");
    }
}

/// Ready means ready: a node whose route into the tunnel is gone turns NotReady, the Node's
/// condition saying which route and why (net-forwarder health NOT_SERVING → the runtime's
/// NetworkReady=false → the kubelet), and Ready again once the route is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_without_its_tunnel_route_turns_not_ready_with_the_reason() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let up = env.up("route", 2);
    assert!(up.status.success(), "hpk up: {}", text(&up));
    let cidr_of =
        |node: &str| env.kubectl_ok("route", &["get", "node", node, "-o", "jsonpath={.spec.podCIDR}"]);
    let peer_cidr = cidr_of("route-1");
    let (bubble, _) = support::bubble_processes("route", "route-2")
        .into_iter()
        .find(|(_, cmdline)| cmdline.contains("bubble-init"))
        .expect("node 2's bubble");
    let ip = |args: &[&str]| {
        Command::new("nsenter")
            .arg(format!("--net=/proc/{bubble}/ns/net"))
            .arg("--")
            .arg("ip")
            .args(args)
            .output()
            .expect("ip")
    };
    // The route as the net-forwarder made it, to put back afterwards.
    let route = text(&ip(&["-4", "route", "show", &peer_cidr, "dev", "hpk-tunnel"]));
    assert!(route.contains(&peer_cidr), "node 2 routes {peer_cidr} into the tunnel: {route}");
    let out = ip(&["route", "del", &peer_cidr, "dev", "hpk-tunnel"]);
    assert!(out.status.success(), "{}", text(&out));

    let ready = |node: &str| {
        let condition = env.kubectl_ok(
            "route",
            &["get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].message}"],
        );
        let (status, message) = condition.split_once(' ').unwrap_or((&condition, ""));
        (status.to_owned(), message.to_owned())
    };
    let message = eventually_or(
        "node 2 turns NotReady",
        Duration::from_secs(90),
        || {
            let (status, message) = ready("route-2");
            (status == "False").then_some(message)
        },
        || env.diagnose("route"),
    );
    assert!(
        message.contains("NetworkReady=false")
            && message.contains(&format!("no route into hpk-tunnel for {peer_cidr}")),
        "the Node does not say why: {message}"
    );
    assert_eq!(ready("route-1").0, "True", "node 1 is fine");

    let mut add = vec!["route", "add"];
    add.extend(route.split_whitespace());
    add.extend(["dev", "hpk-tunnel"]);
    let out = ip(&add);
    assert!(out.status.success(), "put the route back ({add:?}): {}", text(&out));
    eventually_or(
        "node 2 is Ready again",
        Duration::from_secs(90),
        || (ready("route-2").0 == "True").then_some(()),
        || env.diagnose("route"),
    );
}
