//! HPK as its users meet it: `sbatch slurm/hpk.slurm` on a real Slurm (slurmctld and one
//! slurmd per test host, each in its own network namespace), submitted by an unprivileged
//! user, and the cluster used through kubectl only.
//!
//! Jobs are submitted from the unpacked release bundle (`make dist`), on nodes that hide crun,
//! slirp4netns, nsenter and unshare, with memory and GPUs as consumables and cgroup process
//! tracking (`hpk_integration::slurm`).
//!
//! - the end-to-end suite on 3 nodes, once with one mapped ID (no newuidmap) and once with
//!   several (subordinate ranges), ended by `scancel`: the Nodes are the allocation, an image
//!   whose files belong to several users runs on every node, the user's files and storage
//!   (a StatefulSet on node-local volumes provisioned on demand, an RWX volume shared by pods
//!   on two nodes) reach pods, the allocation's GPUs reach the pods that ask for them, and
//!   `kubectl top` and an HPA work;
//! - faults: the API server restarted, a worker's bubble killed;
//! - the job's time limit: a graceful end with preStop hooks run;
//! - bad input: more nodes than the partition, two clusters on the same hosts, and each
//!   preflight refusal on one node (another user's state directory, noexec, no space, no
//!   user xattrs, no overlayfs there, a network filesystem, user namespaces disabled, no
//!   /dev/net/tun).

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::slurm::{Ids, SERIAL, SlurmEnv};
use support::{eventually, eventually_or, text};

fn prerequisites() -> bool {
    support::prerequisites().is_some()
        && hpk_integration::tools_present(&[
            "slurmctld",
            "slurmd",
            "munged",
            "sbatch",
            "srun",
            "script",
            "sshfs",
        ])
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

/// A Deployment NAME of REPLICAS pods spread over the nodes, with `grace` seconds to terminate
/// ([`hpk_test_support::manifest::spread_deployment`]).
fn spread(name: &str, replicas: u32, when: &str, grace: u32, container: &str) -> String {
    hpk_test_support::manifest::spread_deployment(name, replicas, when, Some(grace), container)
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

/// Issue 25: a LoadBalancer Service gets the three nodes' addresses, and its port and its
/// nodePort answer on each of them from the login node (outside the cluster), each node's
/// launcher publishing them on its own host.
fn load_balancer_from_the_login_node(env: &SlurmEnv, id: u32, web: &[(String, String, String)]) {
    env.apply(
        id,
        "apiVersion: v1
kind: Service
metadata: {name: web-lb}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 18080, targetPort: 8080}]
",
    );
    let mut nodes: Vec<String> = env.slurm.nodes().iter().map(|n| n.ip.to_string()).collect();
    nodes.sort();
    let ingress = eventually_or(
        "web-lb's ingress: the three nodes",
        Duration::from_secs(60),
        || {
            let out = env.kubectl(
                id,
                &["get", "service", "web-lb", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}"],
            );
            let mut ips: Vec<String> =
                String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_owned).collect();
            ips.sort();
            (ips == nodes).then_some(ips)
        },
        || env.diagnose(id),
    );
    let node_port =
        env.kubectl(id, &["get", "service", "web-lb", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let node_port = String::from_utf8_lossy(&node_port.stdout).trim().to_owned();
    for ip in &ingress {
        for port in ["18080", node_port.as_str()] {
            let body = eventually(
                &format!("web-lb on {ip}:{port} from the login node"),
                Duration::from_secs(60),
                || {
                    let out = Command::new("curl")
                        .args(["-sS", "--max-time", "3", &format!("http://{ip}:{port}/")])
                        .output()
                        .ok()?;
                    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                },
            );
            assert!(
                web.iter().any(|(pod, _, _)| *pod == body),
                "{ip}:{port} answered {body:?}, not a web pod"
            );
        }
    }
    env.kubectl_ok(id, &["delete", "service", "web-lb"]);
}

/// Each Node's capacity and allocatable are what Slurm granted the job on that node: its
/// CPUs, memory and GPUs as `scontrol show job -d` lists them.
fn nodes_are_the_allocation(env: &SlurmEnv, id: u32) {
    let allocation = env.slurm.allocation(id).expect("scontrol show job -d");
    assert_eq!(allocation.len(), 3, "{allocation:?}");
    for a in &allocation {
        for field in ["capacity", "allocatable"] {
            let jsonpath = format!(
                "jsonpath={{.status.{field}.cpu}} {{.status.{field}.memory}} {{.status.{field}.nvidia\\.com/gpu}}"
            );
            let got = env.kubectl_ok(id, &["get", "node", &a.node, "-o", &jsonpath]);
            let parts: Vec<&str> = got.split(' ').collect();
            assert_eq!(parts.len(), 3, "{got:?}");
            assert_eq!(parts[0], a.cpus.to_string(), "{} {field} cpu ({a:?})", a.node);
            assert_eq!(mebibytes(parts[1]), Some(a.memory_mb), "{} {field} memory {got:?} ({a:?})", a.node);
            assert_eq!(
                parts[2].trim().parse::<u32>().unwrap_or(0),
                a.gpus,
                "{} {field} GPUs ({a:?})",
                a.node
            );
        }
    }
}

/// A Kubernetes binary quantity (`3Gi`, `1536Mi`) in MiB.
fn mebibytes(q: &str) -> Option<u64> {
    let (n, shift) = [("Ti", 20), ("Gi", 10), ("Mi", 0)]
        .iter()
        .find_map(|(s, shift)| Some((q.strip_suffix(s)?, *shift)))?;
    n.parse::<u64>().ok().map(|n| n << shift)
}

/// A Deployment of an image whose files belong to several users (a home of UID 1000, a
/// directory of GID 50000, a cache of UID 101), one pod on every node, each container writing
/// and reading its own files as its own user. With several IDs the pods run as those users
/// and see the owners; with one, they run as root of the bubble and an event says so.
fn images_of_several_owners(env: &SlurmEnv, id: u32) {
    let containers = format!(
        "- name: home
  image: {image}
  securityContext: {{runAsUser: 1000, runAsGroup: 1000}}
  command: [sh, -c, 'echo mine > /home/user/note && echo group > /srv/shared/note && {LOOP}']
- name: web
  image: {image}
  securityContext: {{runAsUser: 101, runAsGroup: 101}}
  command: [sh, -c, 'echo page > /var/cache/web/page && {LOOP}']",
        image = env.owners
    );
    let manifest = spread("owners", 3, "DoNotSchedule", 1, &containers).replace(
        "      terminationGracePeriodSeconds: 1\n",
        "      terminationGracePeriodSeconds: 1\n      securityContext: {supplementalGroups: [50000]}\n",
    );
    env.apply(id, &manifest);
    let pods = env.running(id, "app=owners", 3, Duration::from_secs(120));
    let on: std::collections::BTreeSet<&str> = pods.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(on.len(), 3, "one on every node: {pods:?}");
    for (pod, node, _) in &pods {
        let exec = |container: &str, script: &str| {
            let out = env.kubectl(id, &["exec", pod, "-c", container, "--", "sh", "-c", script]);
            assert!(out.status.success(), "{pod} on {node}, {container}: {script}: {}", text(&out));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(
            exec("home", "cat /home/user/note /srv/shared/note /home/user/.profile"),
            "mine\ngroup\necho welcome\n"
        );
        assert_eq!(exec("web", "cat /var/cache/web/page /var/cache/web/index"), "page\ncached\n");
        let (home_id, web_id) = (exec("home", "id -u; id -G"), exec("web", "id -u"));
        if env.ids == Ids::Several {
            assert_eq!(home_id.lines().next(), Some("1000"), "{pod} on {node}: {home_id}");
            assert!(home_id.contains("50000"), "supplementalGroups: {home_id}");
            assert_eq!(web_id.trim(), "101", "{pod} on {node}");
            let owners = exec("home", "stat -c %u:%g /home/user /srv/shared /var/cache/web /home/user/note");
            assert_eq!(owners, "1000:1000\n0:50000\n101:101\n1000:1000\n", "{pod} on {node}");
        } else {
            assert_eq!(home_id.lines().next(), Some("0"), "{pod} on {node}: one ID, so root of the bubble");
            assert_eq!(web_id.trim(), "0", "{pod} on {node}");
            let events = env.kubectl_ok(
                id,
                &[
                    "get",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={pod},reason=SecurityContextNotHonoured"),
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
            );
            assert!(
                events.contains("runAsUser 1000") && events.contains("runAsUser 101"),
                "{pod} on {node}: events {events:?}\n{}",
                env.diagnose(id)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_mapped_id_three_nodes_from_the_bundle_then_scancel_leaves_nothing() {
    end_to_end(Ids::One).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn several_ids_three_nodes_from_the_bundle_then_scancel_leaves_nothing() {
    end_to_end(Ids::Several).await;
}

/// The user's files in pods, through PersistentVolumes (which Pod Security's baseline allows):
/// a pod on a worker reads the read-only `--bind` and writes into `$HOME`, and the file is the
/// user's on the host, whichever IDs the bubble maps.
fn users_files(env: &SlurmEnv, id: u32) {
    let home = env.home();
    let volume = |name: &str, path: &str| {
        format!(
            "apiVersion: v1
kind: PersistentVolume
metadata: {{name: {name}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  storageClassName: ''
  claimRef: {{namespace: default, name: {name}}}
  hostPath: {{path: {path}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}}}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ''
  volumeName: {name}
  resources: {{requests: {{storage: 1Gi}}}}
---
"
        )
    };
    env.apply(
        id,
        &format!(
            "{}{}apiVersion: v1
kind: Pod
metadata: {{name: writer}}
spec:
  restartPolicy: Never
  nodeSelector: {{kubernetes.io/hostname: node2}}
  containers:
  - name: w
    image: {}
    command: [sh, -c, 'cat /inputs/data && hostname > /home-dir/from-pod && (echo x > /inputs/data || echo READ-ONLY)']
    volumeMounts: [{{name: home, mountPath: /home-dir}}, {{name: inputs, mountPath: /inputs}}]
  volumes:
  - {{name: home, persistentVolumeClaim: {{claimName: home}}}}
  - {{name: inputs, persistentVolumeClaim: {{claimName: inputs}}}}
",
            volume("home", &home.display().to_string()),
            volume("inputs", "/data/inputs"),
            env.shell
        ),
    );
    eventually_or(
        "pod writer: Succeeded",
        Duration::from_secs(120),
        || {
            (env.kubectl_ok(id, &["get", "pod", "writer", "-o", "jsonpath={.status.phase}"]) == "Succeeded")
                .then_some(())
        },
        || env.diagnose(id),
    );
    let logs = env.kubectl_ok(id, &["logs", "writer"]);
    assert!(logs.contains("reference") && logs.contains("READ-ONLY"), "the --bind, read-only: {logs}");
    let written = home.join("from-pod");
    assert_eq!(std::fs::read_to_string(&written).expect("the pod's file in $HOME").trim(), "writer");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&written).expect("meta")), env.uid());
    assert_eq!(std::fs::read_to_string(home.join("inputs/data")).expect("inputs").trim(), "reference");
}

/// The allocation's GPUs (`--gres=gpu:2`: the harness's character devices 195:0 and 195:1
/// and fake driver) in pods that ask for them: two one-GPU pods on node2 get different devices,
/// each with the driver's tool and library and the variables numbered from 0; asking for
/// more than is free on the node, by a third pod or by one that wants three, is refused at
/// admission.
fn gpus_in_pods(env: &SlurmEnv, id: u32) {
    let pod = |name: &str, gpus: u32| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeName: node2
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {}
    command: [sleep, '3600']
    resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}
",
            env.shell
        )
    };
    env.apply(id, &(pod("gpu-a", 1) + "---\n" + &pod("gpu-b", 1)));
    let mut devices = Vec::new();
    for name in ["gpu-a", "gpu-b"] {
        eventually_or(
            &format!("pod {name}: Running"),
            Duration::from_secs(120),
            || {
                (env.kubectl_ok(id, &["get", "pod", name, "-o", "jsonpath={.status.phase}"]) == "Running")
                    .then_some(())
            },
            || env.diagnose(id),
        );
        let seen = exec_ok(
            env,
            id,
            name,
            "ls -l /dev/nvidia[0-9]* | awk '{print $1, $5, $6}'; \
             echo VISIBLE=$NVIDIA_VISIBLE_DEVICES/$CUDA_VISIBLE_DEVICES; nvidia-smi",
        );
        let nodes: Vec<&str> = seen.lines().filter(|l| l.starts_with("crw")).collect();
        assert_eq!(nodes.len(), 1, "{name} sees exactly its GPU: {seen}");
        assert!(nodes[0].contains("195, "), "{seen}");
        assert!(seen.contains("VISIBLE=0/0") && seen.contains("fake nvidia-smi: fake NVML"), "{seen}");
        devices.push(nodes[0].to_owned());
    }
    assert_ne!(devices[0], devices[1], "two pods share a GPU: {devices:?}");
    env.apply(id, &(pod("gpu-c", 1) + "---\n" + &pod("three-gpus", 3)));
    for name in ["gpu-c", "three-gpus"] {
        let refused = eventually_or(
            &format!("pod {name}: refused"),
            Duration::from_secs(60),
            || {
                let out = env
                    .kubectl_ok(id, &["get", "pod", name, "-o", "jsonpath={.status.phase} {.status.reason}"]);
                out.starts_with("Failed").then_some(out)
            },
            || env.diagnose(id),
        );
        assert_eq!(refused, "Failed UnexpectedAdmissionError", "{name}");
    }
    env.kubectl_ok(id, &["delete", "pod", "gpu-a", "gpu-b", "gpu-c", "three-gpus", "--wait=false"]);
}

/// Shared storage: an RWX volume of `hpk-shared` (the job's `--shared-volumes`) written on
/// node1 is read on node3, and is the user's on the host.
fn shared_storage(env: &SlurmEnv, id: u32, shared: &std::path::Path) {
    env.apply(
        id,
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scratch}
spec:
  storageClassName: hpk-shared
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 16Mi}}
",
    );
    let pod = |name: &str, node: &str, script: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  containers:
  - name: c
    image: {}
    command: [sh, -c, {script:?}]
    volumeMounts: [{{name: v, mountPath: /v}}]
  volumes: [{{name: v, persistentVolumeClaim: {{claimName: scratch}}}}]
",
            env.shell
        )
    };
    let succeeded = |name: &str| {
        eventually_or(
            &format!("pod {name}: Succeeded"),
            Duration::from_secs(120),
            || {
                (env.kubectl_ok(id, &["get", "pod", name, "-o", "jsonpath={.status.phase}"]) == "Succeeded")
                    .then(|| env.kubectl_ok(id, &["logs", name]))
            },
            || env.diagnose(id),
        )
    };
    env.apply(id, &pod("shared-writer", "node1", "echo from-node1 > /v/note"));
    succeeded("shared-writer");
    env.apply(id, &pod("shared-reader", "node3", "cat /v/note"));
    assert_eq!(succeeded("shared-reader").trim(), "from-node1", "read on another node");
    let notes: Vec<std::path::PathBuf> = std::fs::read_dir(shared)
        .expect("the shared directory")
        .flatten()
        .map(|e| e.path().join("note"))
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&notes[0]).expect("meta")), env.uid());
}

/// The suite a user's session is: `sbatch` from the unpacked bundle on nodes without crun,
/// slirp4netns, nsenter or unshare (nor newuidmap, with one ID), then the cluster through
/// kubectl only.
async fn end_to_end(ids: Ids) {
    if !prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let env = SlurmEnv::start_site(3, ids).await;
    // The user's reference data, bound read-only at another path with --bind.
    let inputs = env.home().join("inputs");
    let made =
        env.slurm.command_as_user("sh").args(["-c", "mkdir inputs && echo reference > inputs/data"]).output();
    assert!(made.is_ok_and(|o| o.status.success()), "the user's inputs");
    let bind = format!("--bind={}:/data/inputs:ro", inputs.display());
    // Shared volumes in the user's home, which every node sees (made by the job).
    let shared = env.home().join("volumes");
    let shared_volumes = format!("--shared-volumes={}", shared.display());
    let t0 = Instant::now();
    let id = env
        .submit_with(
            &["--nodes=3", "--cpus-per-task=2", "--mem=3G", "--gres=gpu:2"],
            &[&bind, &shared_volumes],
        )
        .expect("sbatch");
    let up = env.wait_up(id, t0);
    eprintln!("job {id} ({ids:?}): cluster up {:.1} s after sbatch", up.as_secs_f64());
    let mut nodes = ready_nodes(&env, id);
    nodes.sort();
    assert_eq!(nodes, ["node1", "node2", "node3"], "{}", env.diagnose(id));
    let mode = if ids == Ids::One { "one mapped ID" } else { "several IDs" };
    assert!(
        env.slurm.job_output(id).contains(&format!("hpk: node node2: {mode}")),
        "the launcher says its mode:\n{}",
        env.slurm.job_output(id)
    );
    // ~/.hpk/kubeconfig is the user's: a link to this job's, which is 0600.
    let link = env.home().join(".hpk/kubeconfig");
    assert_eq!(std::fs::read_link(&link).expect("~/.hpk/kubeconfig link"), env.kubeconfig(id));
    let meta = std::fs::metadata(env.kubeconfig(id)).expect("kubeconfig");
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), env.uid());
    nodes_are_the_allocation(&env, id);
    images_of_several_owners(&env, id);
    users_files(&env, id);
    shared_storage(&env, id, &shared);
    gpus_in_pods(&env, id);

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

    load_balancer_from_the_login_node(&env, id, &web);

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
    // kubectl top, through the metrics-server the job deployed: every node of the allocation.
    let top = eventually_or(
        "kubectl top nodes: the 3 nodes",
        Duration::from_secs(120),
        || {
            let out = env.kubectl(id, &["top", "nodes", "--no-headers"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success() && text.lines().count() == 3).then_some(text)
        },
        || env.diagnose(id),
    );
    for line in top.lines() {
        let cpu = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.strip_suffix('m'))
            .and_then(|m| m.parse::<u64>().ok());
        assert!(line.starts_with("node") && cpu.is_some(), "kubectl top nodes: {top}");
    }
    // And pods: the add-ons', each with figures; then an HPA on CPU, 1 → 3 → 1.
    let pods = eventually_or(
        "kubectl top pods: CoreDNS's, metrics-server's, the provisioner's",
        Duration::from_secs(90),
        || {
            let out = env.kubectl(id, &["top", "pods", "-n", "kube-system", "--no-headers"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success() && text.lines().count() >= 4).then_some(text)
        },
        || env.diagnose(id),
    );
    for line in pods.lines() {
        let figures: Vec<&str> = line.split_whitespace().collect();
        assert!(figures.len() == 3 && figures[1].ends_with('m') && figures[2].ends_with("Mi"), "{pods}");
    }
    support::an_hpa_scales_up_under_load_and_back_down(
        &|manifest| env.apply(id, manifest),
        &|args| env.kubectl_ok(id, args),
        &env.shell,
        Duration::from_secs(60),
    );

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

    // A StatefulSet of 2, each pod with a node-local volume of its own from the default
    // StorageClass (provisioned by the local-path provisioner the job deployed), kept across a
    // pod's deletion.
    let started = Instant::now();
    env.apply(
        id,
        &format!(
            "apiVersion: v1
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
      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: db}}}}}}
      containers:
      - name: db
        image: {}
        command: [sh, -c, 'hostname >> /data/boots; {LOOP}']
        volumeMounts: [{{name: data, mountPath: /data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 1Gi}}}}
",
            env.shell
        ),
    );
    let db = env.running(id, "app=db", 2, Duration::from_secs(120));
    eprintln!(
        "job {id}: StatefulSet of 2 with volumes Running {:.1} s after kubectl apply",
        started.elapsed().as_secs_f64()
    );
    let db_nodes: std::collections::BTreeSet<&str> = db.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(db_nodes.len(), 2, "the replicas on two nodes: {db:?}");
    let claims = env.kubectl_ok(id, &["get", "pvc", "-o", "jsonpath={.items[*].spec.storageClassName}"]);
    assert!(claims.split_whitespace().filter(|c| *c == "local-path").count() >= 2, "{claims}");
    for pod in ["db-0", "db-1"] {
        assert_eq!(exec_ok(&env, id, pod, "cat /data/boots").trim(), pod);
    }
    // Not `--wait`: kubectl's wait can miss the deletion when the StatefulSet has already made
    // the new db-0 (see data.rs); the second boot's line is what says the new pod runs.
    env.kubectl_ok(id, &["delete", "pod", "db-0", "--wait=false"]);
    eventually_or(
        "db-0 back with its data",
        Duration::from_secs(90),
        || {
            let out = env.kubectl(id, &["exec", "db-0", "--", "cat", "/data/boots"]);
            (String::from_utf8_lossy(&out.stdout) == "db-0\ndb-0\n").then_some(())
        },
        || env.diagnose(id),
    );
    let again = env.running(id, "app=db", 2, Duration::from_secs(30));
    let node_of =
        |pods: &[(String, String, String)]| pods.iter().find(|p| p.0 == "db-0").map(|p| p.1.clone());
    assert_eq!(node_of(&again), node_of(&db), "db-0 back on its volume's node");

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
}

/// Submits a 3-node job that node3's preflight must refuse: it fails within seconds, its output
/// names node3 with `what` and `fix`, the other nodes were ready, and nothing was made.
fn refused_on_node3(env: &SlurmEnv, what: &str, fix: &str) {
    let t0 = Instant::now();
    let id = env.submit(&["--nodes=3"]).expect("sbatch");
    let info =
        env.slurm.wait_job_state(id, &["FAILED", "COMPLETED"], Duration::from_secs(60)).expect("job ends");
    let output = env.slurm.job_output(id);
    assert_eq!(info.state, "FAILED", "{output}");
    assert_eq!(info.exit_code, "2:0", "{output}");
    assert!(t0.elapsed() < Duration::from_secs(20), "failed after {:?}: {output}", t0.elapsed());
    let line = output.lines().find(|l| l.contains("hpk: node node3:")).unwrap_or_default();
    assert!(line.contains(what), "node3's line names {what:?}: {output}");
    let fixes = output.split("fix: ").nth(1).unwrap_or_default();
    assert!(fixes.lines().next().unwrap_or_default().contains(fix), "the fix {fix:?}: {output}");
    for other in ["node1", "node2"] {
        assert!(output.contains(&format!("hpk: node {other}: ready to start")), "{other} was fine: {output}");
    }
    assert!(!env.cluster_dir(id).exists(), "nothing made for a job that cannot start");
    env.wait_clean(id, Duration::from_secs(10));
}

/// OpenSSH's SFTP server (Debian's `openssh-sftp-server`), the far side of the sshfs mount.
const SFTP_SERVER: &str = "/usr/lib/openssh/sftp-server";

/// Runs `args` in node3's mount namespace (as root, with the host's tools), for what the next
/// jobs there see.
fn on_node3(env: &SlurmEnv, args: &[&str]) {
    let out = env.slurm.on_node(2, args[0]).args(&args[1..]).output().expect("nsenter");
    assert!(out.status.success(), "{args:?} on node3: {}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn each_preflight_refusal_names_the_node_and_the_fix() {
    if !prerequisites() {
        return;
    }
    let _serial = SERIAL.lock().await;
    let env = SlurmEnv::start(3).await;
    let (uid, gid) = (env.uid().to_string(), env.slurm.user().gid.to_string());
    // node3's state directory: what a condition is mounted on, there only.
    let state = format!("/tmp/hpk-{uid}");
    let made_state = !std::path::Path::new(&state).exists();
    std::fs::create_dir_all(&state).expect("mount point");
    // The other nodes see it as the user's own, as HPK would have made it.
    std::os::unix::fs::chown(&state, Some(env.uid()), Some(env.slurm.user().gid)).expect("chown");
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    let tmpfs = |options: &str| on_node3(&env, &["mount", "-t", "tmpfs", "-o", options, "tmpfs", &state]);
    let unmount = || on_node3(&env, &["umount", &state]);

    // Another user made the predictable directory first (review finding C1): refused, not used.
    tmpfs("mode=0777,uid=61001,gid=61001,size=64m");
    refused_on_node3(&env, "belongs to UID 61001", "remove it if it is yours");
    unmount();
    // A noexec filesystem.
    tmpfs(&format!("mode=0700,uid={uid},gid={gid},noexec,size=2g"));
    refused_on_node3(&env, "mounted noexec", "use a filesystem mounted with exec");
    unmount();
    // Too little free space.
    tmpfs(&format!("mode=0700,uid={uid},gid={gid},size=16m"));
    refused_on_node3(&env, "MiB free", "free some space there");
    unmount();
    // A filesystem without user extended attributes (ramfs has none).
    on_node3(&env, &["mount", "-t", "ramfs", "-o", "mode=0700", "ramfs", &state]);
    on_node3(&env, &["chown", &format!("{uid}:{gid}"), &state]);
    refused_on_node3(&env, "user extended attributes", "use ext4, xfs, btrfs or tmpfs");
    unmount();
    // A filesystem overlayfs refuses as its upper layer: an overlay itself.
    let layers = tempfile::tempdir().expect("tempdir");
    for d in ["lower", "upper", "work"] {
        std::fs::create_dir(layers.path().join(d)).expect("mkdir");
    }
    std::os::unix::fs::chown(layers.path().join("upper"), Some(env.uid()), Some(env.slurm.user().gid))
        .expect("chown");
    std::fs::set_permissions(
        layers.path().join("upper"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let l = |d: &str| layers.path().join(d).display().to_string();
    let options = format!("lowerdir={},upperdir={},workdir={}", l("lower"), l("upper"), l("work"));
    on_node3(&env, &["mount", "-t", "overlay", "-o", &options, "overlay", &state]);
    refused_on_node3(&env, "overlayfs with userxattr does not work", "set HPK_STATE_DIR to one");
    unmount();
    // A network filesystem: sshfs (a FUSE client of SFTP, carried here over a pipe to a local
    // sftp-server, so no network is needed), as state on a shared filesystem would be.
    let remote = layers.path().join("remote");
    std::fs::create_dir(&remote).expect("mkdir");
    std::os::unix::fs::chown(&remote, Some(env.uid()), Some(env.slurm.user().gid)).expect("chown");
    std::fs::set_permissions(&remote, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    let sftp = layers.path().join("sftp");
    std::fs::write(&sftp, format!("#!/bin/sh\nexec {SFTP_SERVER}\n")).expect("write");
    std::fs::set_permissions(&sftp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let options = format!("ssh_command={},allow_other", sftp.display());
    on_node3(&env, &["sshfs", "-o", &options, &format!("localhost:{}", remote.display()), &state]);
    refused_on_node3(&env, "is on fuse.sshfs, a network filesystem", "keep state on the node itself");
    unmount();
    // User namespaces disabled (node3's view of the sysctl; the kernel's own refusal under a
    // limit of 0 is the `hpk up` refusal test's).
    let zero = layers.path().join("zero");
    std::fs::write(&zero, "0\n").expect("write");
    on_node3(&env, &["mount", "--bind", &zero.display().to_string(), "/proc/sys/user/max_user_namespaces"]);
    refused_on_node3(
        &env,
        "user namespaces are disabled",
        "ask the administrator for `sysctl -w user.max_user_namespaces=15000`",
    );
    on_node3(&env, &["umount", "/proc/sys/user/max_user_namespaces"]);
    // /dev/net/tun not accessible.
    env.slurm.deny_tun(2).expect("deny tun on node3");
    refused_on_node3(&env, "/dev/net/tun", "ask the administrator for `chmod 0666 /dev/net/tun`");
    if made_state {
        let _ = std::fs::remove_dir_all(&state);
    }
}
