//! HPK as its users meet it: `sbatch slurm/hpk.slurm` on a real Slurm (slurmctld and one
//! slurmd per test host, each in its own network namespace), submitted by an unprivileged
//! user, and the cluster used through kubectl only.
//!
//! - the end-to-end suite on 3 nodes, ended by `scancel`;
//! - faults: the API server restarted, a worker's bubble killed;
//! - the job's time limit: a graceful end with preStop hooks run;
//! - bad input: more nodes than the partition, two clusters on the same hosts, a node
//!   without /dev/net/tun.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::slurm::{SERIAL, SlurmEnv};
use support::{eventually_or, text};

fn prerequisites() -> bool {
    support::prerequisites().is_some()
        && hpk_integration::tools_present(&["slurmctld", "slurmd", "munged", "sbatch", "srun", "script"])
}

fn ready_nodes(env: &SlurmEnv, id: u32) -> Vec<String> {
    let out = env.kubectl(
        id,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.ends_with(" True"))
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect()
}

/// A container command that runs until SIGTERM, and exits 0 on it.
const LOOP: &str = r#"trap "exit 0" TERM; while true; do sleep 1; done"#;

/// A Deployment NAME of REPLICAS pods labelled `app: NAME`, spread over the nodes (maxSkew 1,
/// `when` unsatisfiable), with `grace` seconds to terminate; `container` is one item of its
/// container list, from `- `.
fn spread(name: &str, replicas: u32, when: &str, grace: u32, container: &str) -> String {
    let container = container.replace('\n', "\n      ");
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: {grace}
      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: {when}, labelSelector: {{matchLabels: {{app: {name}}}}}}}
      containers:
      {container}
"
    )
}

/// A shell command printing the body's last line of `GET PATH` from HOST:PORT (busybox nc: the
/// static busybox's wget crashes resolving names).
fn get(host: &str, port: u16, path: &str) -> String {
    format!("printf \"GET {path} HTTP/1.0\\r\\n\\r\\n\" | nc -w 5 {host} {port} | tail -n 1")
}

/// `kubectl exec POD -- sh -c SCRIPT`'s stdout, once it succeeds (bounded).
fn exec_ok(env: &SlurmEnv, id: u32, pod: &str, script: &str) -> String {
    let last = std::cell::RefCell::new(String::new());
    eventually_or(
        &format!("exec in {pod}: {script}"),
        Duration::from_secs(60),
        || {
            let out = env.kubectl(id, &["exec", pod, "--", "sh", "-c", script]);
            *last.borrow_mut() = text(&out);
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        },
        || {
            format!(
                "last attempt: {}
{}",
                last.borrow(),
                env.diagnose(id)
            )
        },
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn three_nodes_through_kubectl_then_scancel_leaves_nothing() {
    if !prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let env = SlurmEnv::start(3).await;
    let t0 = Instant::now();
    let id = env.submit(&["--nodes=3"]).expect("sbatch");
    let up = env.wait_up(id, t0);
    eprintln!("job {id}: cluster up {:.1} s after sbatch", up.as_secs_f64());
    let mut nodes = ready_nodes(&env, id);
    nodes.sort();
    assert_eq!(nodes, ["node1", "node2", "node3"], "{}", env.diagnose(id));
    // ~/.hpk/kubeconfig is the user's: a link to this job's, which is 0600.
    let link = env.home().join(".hpk/kubeconfig");
    assert_eq!(std::fs::read_link(&link).expect("~/.hpk/kubeconfig link"), env.kubeconfig(id));
    let meta = std::fs::metadata(env.kubeconfig(id)).expect("kubeconfig");
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), env.uid());

    // A Deployment of 6 spread over the 3 nodes, behind a ClusterIP Service.
    env.apply(
        id,
        &format!(
            "{}---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: client, labels: {{app: client}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: node1}}
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: {shell}, command: [sh, -c, '{LOOP}']}}
---
apiVersion: v1
kind: Pod
metadata: {{name: ticker, labels: {{app: ticker}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: node3}}
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: t, image: {shell}, command: [sh, -c, 'i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done']}}
",
            spread(
                "web",
                6,
                "DoNotSchedule",
                2,
                &format!(
                    "- name: httpd
  image: {}
  command: [sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
  ports: [{{containerPort: 8080}}]",
                    env.shell
                )
            ),
            shell = env.shell
        ),
    );
    let web = env.running(id, "app=web", 6, Duration::from_secs(120));
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for (_, node, _) in &web {
        *per_node.entry(node.clone()).or_default() += 1;
    }
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), [2, 2, 2], "spread: {per_node:?}");
    env.running(id, "app=client", 1, Duration::from_secs(60));

    // The Service by its DNS name from node1, answered by pods on the other nodes too — once
    // its EndpointSlice lists all 6 ready (kube-proxy follows within a sync).
    eventually_or(
        "6 ready endpoints of Service web",
        Duration::from_secs(60),
        || {
            let out = env.kubectl(
                id,
                &[
                    "get",
                    "endpointslices",
                    "-l",
                    "kubernetes.io/service-name=web",
                    "-o",
                    "jsonpath={range .items[*].endpoints[*]}{.conditions.ready}{\"\\n\"}{end}",
                ],
            );
            (String::from_utf8_lossy(&out.stdout).lines().filter(|l| *l == "true").count() == 6).then_some(())
        },
        || env.diagnose(id),
    );
    let requests = format!("for i in $(seq 30); do {}; done", get("web.default.svc.cluster.local", 80, "/"));
    let last = std::cell::RefCell::new(String::new());
    eventually_or(
        "30 requests to the Service answered by ≥ 3 pods, some on other nodes",
        Duration::from_secs(30),
        || {
            let answers = exec_ok(&env, id, "client", &requests);
            let backends: std::collections::BTreeSet<&str> =
                answers.lines().filter(|l| !l.is_empty()).collect();
            let remote =
                web.iter().any(|(name, node, _)| node != "node1" && backends.contains(name.as_str()));
            *last.borrow_mut() = format!("{backends:?}");
            (backends.len() >= 3 && remote).then_some(())
        },
        || format!("last reached {}; pods {web:?}", last.borrow()),
    );

    // Pod to pod across nodes, by pod IP.
    let (far, _, far_ip) = web.iter().find(|(_, node, _)| node == "node3").expect("a web pod on node3");
    let direct = exec_ok(&env, id, "client", &get(far_ip, 8080, "/"));
    assert_eq!(direct.trim(), far, "pod-to-pod TCP from node1 to node3");

    // logs -f of a pod on a worker node: lines keep coming, in order.
    env.running(id, "app=ticker", 1, Duration::from_secs(60));
    let mut follow = env
        .kubectl_cmd(id)
        .args(["logs", "-f", "ticker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = BufReader::new(follow.stdout.take().expect("stdout")).lines();
    let mut ticks = Vec::new();
    let started = Instant::now();
    while ticks.len() < 15 && started.elapsed() < Duration::from_secs(30) {
        match lines.next() {
            Some(Ok(line)) => ticks.push(line),
            _ => break,
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let numbers: Vec<u64> = ticks.iter().filter_map(|l| l.strip_prefix("tick ")?.parse().ok()).collect();
    assert!(numbers.len() == 15 && numbers.windows(2).all(|w| w[1] == w[0] + 1), "logs -f: {ticks:?}");

    // exec -it with a terminal (script gives kubectl one).
    let kubectl = format!(
        "{} --kubeconfig={} exec -it ticker -- sh -c 'tty; echo inside'",
        env.kubectl.display(),
        env.kubeconfig(id).display()
    );
    let tty = std::process::Command::new("script")
        .args(["-qec", &kubectl, "/dev/null"])
        .stdin(Stdio::piped())
        .output()
        .expect("script");
    let shown = text(&tty);
    assert!(
        tty.status.success() && shown.contains("/dev/pts/") && shown.contains("inside"),
        "exec -it: {shown}"
    );

    // port-forward to a pod on a worker.
    let (pf_pod, _, _) = web.iter().find(|(_, node, _)| node == "node2").expect("a web pod on node2");
    let mut pf = env
        .kubectl_cmd(id)
        .args(["port-forward", &format!("pod/{pf_pod}"), ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let mut pf_out = BufReader::new(pf.stdout.take().expect("stdout"));
    let mut first = String::new();
    pf_out.read_line(&mut first).expect("port-forward's first line");
    let local = first
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("port-forward said {first:?}"));
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", local)).expect("connect to the forwarded port");
    std::io::Write::write_all(&mut stream, b"GET / HTTP/1.0\r\n\r\n").expect("request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("reply");
    let _ = pf.kill();
    let _ = pf.wait();
    assert!(reply.contains("200") && reply.trim_end().ends_with(pf_pod.as_str()), "port-forward: {reply}");
    eprintln!("kubectl top: not tested (the bubbles do not run metrics-server)");

    // A Job with parallelism 3.
    env.apply(
        id,
        &format!(
            "apiVersion: batch/v1
kind: Job
metadata: {{name: work}}
spec:
  parallelism: 3
  completions: 3
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: w, image: {}, command: [sh, -c, 'echo done on $(hostname)']}}]
",
            env.shell
        ),
    );
    eventually_or(
        "Job work: 3 succeeded",
        Duration::from_secs(120),
        || {
            (env.kubectl_ok(id, &["get", "job", "work", "-o", "jsonpath={.status.succeeded}"]) == "3")
                .then_some(())
        },
        || env.diagnose(id),
    );

    // A StatefulSet of 2, each pod with a local volume of its own on a worker, kept across a
    // pod's deletion.
    let pv = |node: &str| {
        format!(
            "apiVersion: v1
kind: PersistentVolume
metadata: {{name: local-{node}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: hpk-local
  hostPath: {{path: /var/lib/hpk/volumes/local-{node}, type: DirectoryOrCreate}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]
---
"
        )
    };
    env.apply(
        id,
        &format!(
            "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: hpk-local}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
{}{}apiVersion: v1
kind: Service
metadata: {{name: db}}
spec:
  clusterIP: None
  selector: {{app: db}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db}}
spec:
  serviceName: db
  replicas: 2
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: db
        image: {}
        command: [sh, -c, 'hostname >> /data/boots; {LOOP}']
        volumeMounts: [{{name: data, mountPath: /data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: hpk-local
      resources: {{requests: {{storage: 1Gi}}}}
",
            pv("node2"),
            pv("node3"),
            env.shell
        ),
    );
    let db = env.running(id, "app=db", 2, Duration::from_secs(120));
    let db_nodes: std::collections::BTreeSet<&str> = db.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(db_nodes.len(), 2, "each replica on the node of its volume: {db:?}");
    for pod in ["db-0", "db-1"] {
        assert_eq!(exec_ok(&env, id, pod, "cat /data/boots").trim(), pod);
    }
    env.kubectl_ok(id, &["delete", "pod", "db-0", "--wait=true", "--timeout=90s"]);
    eventually_or(
        "db-0 back with its data",
        Duration::from_secs(90),
        || {
            let out = env.kubectl(id, &["exec", "db-0", "--", "cat", "/data/boots"]);
            (String::from_utf8_lossy(&out.stdout) == "db-0\ndb-0\n").then_some(())
        },
        || env.diagnose(id),
    );

    // scancel: within 60 s nothing of the job remains on any host.
    let t_cancel = Instant::now();
    env.cancel(id, &[]);
    let clean = env.wait_clean(id, Duration::from_secs(60));
    eprintln!(
        "scancel → clean in {:.1} s (measured {:.1} s after scancel)",
        clean.as_secs_f64(),
        t_cancel.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn apiserver_restart_and_a_lost_worker_bubble() {
    if !prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let env = SlurmEnv::start(3).await;
    let id = env.submit(&["--nodes=3"]).expect("sbatch");
    env.wait_up(id, Instant::now());
    let container = format!("- {{name: c, image: {}, command: [sh, -c, '{LOOP}']}}", env.shell);
    env.apply(id, &spread("web", 3, "ScheduleAnyway", 1, &container));
    env.running(id, "app=web", 3, Duration::from_secs(120));
    let restarts = || {
        env.kubectl_ok(
            id,
            &[
                "get",
                "pods",
                "-A",
                "-o",
                "jsonpath={range .items[*]}{.metadata.uid} {.status.containerStatuses[0].restartCount}{\"\\n\"}{end}",
            ],
        )
    };
    let before = restarts();

    // The API server killed: the supervisor restarts it, every kubelet reconnects, no pod
    // restarts.
    let apiserver = env
        .processes()
        .into_iter()
        .find(|(_, c)| c.contains("kube-apiserver") && c.contains("--etcd-servers"))
        .map(|(p, _)| p)
        .expect("the API server of the job");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(apiserver as i32), nix::sys::signal::Signal::SIGKILL)
        .expect("kill");
    let renewed = |node: &str| {
        let out = env.kubectl(
            id,
            &["get", "lease", "-n", "kube-node-lease", node, "-o", "jsonpath={.spec.renewTime}"],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let leases_at_restart = eventually_or(
        "the API server back",
        Duration::from_secs(60),
        || {
            let l: Vec<String> = ["node1", "node2", "node3"].iter().map(|n| renewed(n)).collect();
            l.iter().all(|r| !r.is_empty()).then_some(l)
        },
        || env.diagnose(id),
    );
    eventually_or(
        "every kubelet renewing its lease after the restart",
        Duration::from_secs(60),
        || {
            let now: Vec<String> = ["node1", "node2", "node3"].iter().map(|n| renewed(n)).collect();
            now.iter().zip(&leases_at_restart).all(|(a, b)| a != b).then_some(())
        },
        || env.diagnose(id),
    );
    assert_eq!(ready_nodes(&env, id).len(), 3);
    assert_eq!(restarts(), before, "no pod restarted or was replaced");

    // A worker's bubble killed (its first process): node3 NotReady, its pods move.
    let init = env
        .processes()
        .into_iter()
        .find(|(_, c)| c.contains("bubble-init") && c.contains("--node=node3 ") && !c.contains("--supervise"))
        .map(|(p, _)| p)
        .expect("node3's bubble-init");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init as i32), nix::sys::signal::Signal::SIGKILL)
        .expect("kill");
    eventually_or(
        "node3 NotReady",
        Duration::from_secs(90),
        || (!ready_nodes(&env, id).contains(&"node3".to_owned())).then_some(()),
        || env.diagnose(id),
    );
    eventually_or(
        "3 web pods Running on node1 and node2",
        Duration::from_secs(150),
        || {
            let out = env.kubectl_ok(
                id,
                &[
                    "get",
                    "pods",
                    "-l",
                    "app=web",
                    "--field-selector=status.phase=Running",
                    "-o",
                    "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
                ],
            );
            let live: Vec<&str> = out.lines().filter(|l| l.split_whitespace().count() == 1).collect();
            (live.len() == 3 && live.iter().all(|n| *n != "node3")).then_some(())
        },
        || env.diagnose(id),
    );
    assert!(
        env.slurm.job(id).expect("job").is_some_and(|j| j.state == "RUNNING"),
        "the job goes on without node3"
    );
    env.cancel(id, &[]);
    env.wait_clean(id, Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_time_limit_ends_the_cluster_gracefully_with_prestop_hooks() {
    if !prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let env = SlurmEnv::start(2).await;
    // A listener on the login node the preStop hooks report to.
    let listener = std::net::TcpListener::bind((env.slurm.login_address(), 0)).expect("listener");
    let hook_addr = listener.local_addr().expect("addr");
    let hook = get(&hook_addr.ip().to_string(), hook_addr.port(), "/prestop/$(hostname)");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut line = String::new();
            let _ = BufReader::new(&stream).read_line(&mut line);
            let _ = std::io::Write::write_all(&mut stream, b"HTTP/1.0 200 OK\r\n\r\nok\n");
            let _ = tx.send(line);
        }
    });
    let id = env.submit(&["--nodes=2", "--time=10"]).expect("sbatch");
    env.wait_up(id, Instant::now());
    let container = format!(
        "- name: c
  image: {}
  command: [sh, -c, '{LOOP}']
  lifecycle:
    preStop:
      exec:
        command:
        - sh
        - -c
        - |
          {hook}",
        env.shell
    );
    env.apply(id, &spread("app", 2, "DoNotSchedule", 20, &container));
    let pods = env.running(id, "app=app", 2, Duration::from_secs(120));
    // The time limit brought forward to 2 minutes: with `--signal=B:TERM@120` Slurm signals
    // the batch step at once.
    env.slurm.scontrol(&["update", &format!("JobId={id}"), "TimeLimit=2"]).expect("scontrol update");
    let info = env
        .slurm
        .wait_job_state(id, &["COMPLETED", "TIMEOUT", "FAILED", "CANCELLED"], Duration::from_secs(240))
        .expect("the job ends");
    let output = env.slurm.job_output(id);
    assert_eq!(info.state, "COMPLETED", "the batch step ended the cluster itself:\n{output}");
    assert!(output.contains("job ending (SIGTERM)") && output.contains("every pod terminated"), "{output}");
    let mut hooks: Vec<String> = rx.try_iter().collect();
    hooks.sort();
    for (pod, _, _) in &pods {
        assert!(
            hooks.iter().any(|h| h.contains(&format!("/prestop/{pod} "))),
            "preStop of {pod} not run: {hooks:?}\n{output}"
        );
    }
    env.wait_clean(id, Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_and_two_clusters_on_the_same_hosts() {
    if !prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let env = SlurmEnv::start(3).await;

    // More nodes than the partition has: Slurm refuses, nothing starts.
    let refused = env.submit(&["--nodes=4"]).expect_err("sbatch --nodes=4 on 3 nodes");
    assert!(refused.to_lowercase().contains("node"), "{refused}");
    assert!(!env.home().join(".hpk").exists(), "nothing made for a refused job");
    assert!(env.processes().is_empty());

    // Two clusters of the user on the same two hosts: both work, each its own.
    let a = env.submit(&["--nodes=2", "--nodelist=node1,node2"]).expect("sbatch a");
    let b = env.submit(&["--nodes=2", "--nodelist=node1,node2"]).expect("sbatch b");
    env.wait_up(a, Instant::now());
    env.wait_up(b, Instant::now());
    for id in [a, b] {
        let mut nodes = ready_nodes(&env, id);
        nodes.sort();
        assert_eq!(nodes, ["node1", "node2"], "{}", env.diagnose(id));
        env.apply(
            id,
            &format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: hello, labels: {{app: hello}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: node2}}
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {}, command: [sh, -c, 'echo cluster {id}; {LOOP}']}}]
",
                env.shell
            ),
        );
    }
    for id in [a, b] {
        env.running(id, "app=hello", 1, Duration::from_secs(90));
        eventually_or(
            "hello's log",
            Duration::from_secs(30),
            || (env.kubectl_ok(id, &["logs", "hello"]).trim() == format!("cluster {id}")).then_some(()),
            || env.diagnose(id),
        );
    }
    let servers: std::collections::BTreeSet<String> = [a, b]
        .iter()
        .map(|id| std::fs::read_to_string(env.cluster_dir(*id).join("apiserver")).expect("apiserver"))
        .collect();
    assert_eq!(servers.len(), 2, "two API servers: {servers:?}");
    // One ends; the other goes on. (Processes and sockets are the user's, shared by both jobs:
    // checked once both ended.)
    env.cancel(a, &[]);
    env.slurm.wait_job_state(a, &["CANCELLED"], Duration::from_secs(60)).expect("job a cancelled");
    eventually_or(
        &format!("the files of job {a} removed"),
        Duration::from_secs(60),
        || env.leftover_files(a).is_empty().then_some(()),
        || format!("{:?}", env.leftover_files(a)),
    );
    assert_eq!(ready_nodes(&env, b).len(), 2, "cluster {b} unaffected by the end of {a}");
    assert_eq!(env.kubectl_ok(b, &["logs", "hello"]).trim(), format!("cluster {b}"));
    env.cancel(b, &[]);
    env.wait_clean(b, Duration::from_secs(60));
    assert!(env.leftover_files(a).is_empty());

    // /dev/net/tun not accessible on node3: the job fails in seconds, naming node3 and the fix.
    env.slurm.deny_tun(2).expect("deny tun on node3");
    let t0 = Instant::now();
    let id = env.submit(&["--nodes=3"]).expect("sbatch");
    let info =
        env.slurm.wait_job_state(id, &["FAILED", "COMPLETED"], Duration::from_secs(60)).expect("job ends");
    let output = env.slurm.job_output(id);
    assert_eq!(info.state, "FAILED", "{output}");
    assert!(t0.elapsed() < Duration::from_secs(20), "failed after {:?}", t0.elapsed());
    let line = output.lines().find(|l| l.contains("node node3")).unwrap_or_default();
    assert!(line.contains("/dev/net/tun"), "{output}");
    assert!(output.contains("fix: ask the administrator for `chmod 0666 /dev/net/tun`"), "{output}");
    assert!(!output.contains("node node1: cannot"), "{output}");
    assert!(!env.cluster_dir(id).exists(), "nothing made for a job that cannot start");
    env.wait_clean(id, Duration::from_secs(10));
}
