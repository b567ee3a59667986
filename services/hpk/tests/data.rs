//! The user's files in the cluster (`hpk up` on a test host, checked with the real kubectl):
//! `$HOME` and `--bind` paths reach pods as hostPath volumes, what pods write there belongs to
//! the user on the host, a read-only bind stays read-only, HPK's own directory inside `$HOME`
//! is covered (and the cover cannot be lifted from inside a bubble), and a hostPath outside
//! the bound paths is refused with an event that names `--bind` (the node's `/etc/hosts` is
//! the one exception, read-only), an emptyDir of medium Memory is a tmpfs, a `--bind` that cannot be
//! bound fails `hpk up` before anything is made, and `hpk down` leaves the user's
//! files as they were.

mod support;

use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

use support::{Env, eventually, prerequisites, text};

const CLUSTER: &str = "data";

fn events(env: &Env, namespace: &str) -> String {
    env.kubectl_ok(
        CLUSTER,
        &[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "reason=FailedMount",
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_reach_the_users_paths_and_nothing_else() {
    let Some(image) = prerequisites() else { return };
    // The user's home: a fresh directory in the test's own home (the user here is root), with
    // HPK's directory inside it, as ~/.hpk is. Made before the environment, so that it is
    // removed after the environment's clean-up, which needs it.
    let own_home = std::env::var_os("HOME").map(std::path::PathBuf::from).expect("HOME is set");
    let user_home = tempfile::Builder::new().prefix("hpk-test-home-").tempdir_in(&own_home).expect("home");
    let home = std::fs::canonicalize(user_home.path()).expect("canonical home");
    let mut env = Env::start(image).await;
    env.home = tempfile::Builder::new().prefix(".hpk-").tempdir_in(&home).expect("~/.hpk");
    env.user_home = Some(home.clone());
    let hpk_home = env.home.path().to_owned();
    let hpk_home_name = hpk_home.file_name().expect("name").to_string_lossy().into_owned();
    // Two more paths: one read-write at another path, one read-only.
    let scratch = tempfile::tempdir().expect("scratch");
    let reference = tempfile::tempdir().expect("reference");
    std::fs::write(reference.path().join("input"), "reference data\n").expect("write input");
    let scratch_bind = format!("--bind={}:/scratch/hpk-test", scratch.path().display());
    let reference_bind = format!("--bind={}:/project/ref:ro", reference.path().display());

    // A --bind that cannot be bound is refused before anything is made.
    let out = env.up_with("refused", 1, &["--bind=/nonexistent/hpk-test:/data"]);
    assert!(!out.status.success(), "hpk up with a missing --bind source: {}", text(&out));
    assert!(text(&out).contains("--bind /nonexistent/hpk-test:/data"), "says which: {}", text(&out));
    assert!(!env.state.path().join("refused").exists() && !env.home.path().join("refused").exists());
    env.clusters.lock().expect("lock").retain(|c| c != "refused");

    let out = env.up_with(CLUSTER, 1, &[&scratch_bind, &reference_bind]);
    assert!(out.status.success(), "hpk up: {}", text(&out));
    // hostPath needs a namespace that Pod Security lets have it (the README says how).
    env.kubectl_ok(CLUSTER, &["create", "namespace", "mine"]);
    env.kubectl_ok(CLUSTER, &["label", "namespace", "mine", "pod-security.kubernetes.io/enforce=privileged"]);

    let script = format!(
        "echo from-pod > /work/written && echo from-pod > /scratch/written && cat /ref/input && \
         (echo x > /ref/input) 2>/dev/null && echo REF-WRITTEN || echo REF-READ-ONLY; \
         echo HIDDEN-ENTRIES=$(ls -A /home-all/{hpk_home_name} | wc -l); \
         awk '$2 == \"/mem\" {{print \"MEM=\" $3}}' /proc/mounts; \
         echo NODE-HOSTS=$(grep -c ' {CLUSTER}-1$' /node-hosts); \
         (echo x >> /node-hosts) 2>/dev/null && echo HOSTS-WRITTEN || echo HOSTS-READ-ONLY"
    );
    env.apply(
        CLUSTER,
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: paths, namespace: mine}}\nspec:\n  restartPolicy: Never\n  \
             containers:\n  - name: c\n    image: {shell}\n    command: [sh, -c, {script:?}]\n    volumeMounts:\n    \
             - {{name: home, mountPath: /home-all}}\n    - {{name: work, mountPath: /work}}\n    \
             - {{name: scratch, mountPath: /scratch}}\n    - {{name: ref, mountPath: /ref}}\n    \
             - {{name: mem, mountPath: /mem}}\n    - {{name: hosts, mountPath: /node-hosts}}\n  volumes:\n  \
             - {{name: home, hostPath: {{path: {home}}}}}\n  \
             - {{name: work, hostPath: {{path: {home}/work, type: DirectoryOrCreate}}}}\n  \
             - {{name: scratch, hostPath: {{path: /scratch/hpk-test}}}}\n  \
             - {{name: ref, hostPath: {{path: /project/ref}}}}\n  \
             - {{name: mem, emptyDir: {{medium: Memory}}}}\n  \
             - {{name: hosts, hostPath: {{path: /etc/hosts, type: File}}}}\n",
            shell = env.shell,
            home = home.display(),
        ),
    );
    eventually("the pod to finish", Duration::from_secs(120), || {
        let phase =
            env.kubectl_ok(CLUSTER, &["get", "pod", "-n", "mine", "paths", "-o", "jsonpath={.status.phase}"]);
        assert_ne!(
            phase,
            "Failed",
            "the pod failed:\n{}",
            env.kubectl_ok(CLUSTER, &["logs", "-n", "mine", "paths"])
        );
        (phase == "Succeeded").then_some(())
    });
    let logs = env.kubectl_ok(CLUSTER, &["logs", "-n", "mine", "paths"]);
    assert!(logs.contains("reference data"), "the read-only bind is readable: {logs}");
    assert!(
        logs.contains("REF-READ-ONLY") && !logs.contains("REF-WRITTEN"),
        "a :ro bind was written: {logs}"
    );
    assert!(logs.contains("HIDDEN-ENTRIES=0"), "HPK's directory inside $HOME is covered in pods: {logs}");
    // An emptyDir of medium Memory is the kubelet's tmpfs, which the runtime's namespace sees.
    assert!(logs.contains("MEM=tmpfs"), "medium: Memory is a tmpfs in the container: {logs}");
    // The node's /etc/hosts, the one file outside the binds a pod may mount: read-only.
    assert!(logs.contains("NODE-HOSTS=1") && logs.contains("HOSTS-READ-ONLY"), "{logs}");

    // On the host: the files, the user's.
    let me = nix::unistd::getuid().as_raw();
    for written in [home.join("work/written"), scratch.path().join("written")] {
        assert_eq!(std::fs::read_to_string(&written).expect("written on the host"), "from-pod\n");
        assert_eq!(
            std::fs::metadata(&written).expect("meta").uid(),
            me,
            "{} is the user's",
            written.display()
        );
    }
    assert_eq!(std::fs::read_to_string(reference.path().join("input")).expect("input"), "reference data\n");

    // Outside the bound paths, and HPK's own directory inside one: refused, saying why.
    let refused = |name: &str, path: &str| {
        env.apply(
            CLUSTER,
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: mine}}\nspec:\n  containers:\n  \
                 - name: c\n    image: {}\n    command: [sleep, '3600']\n    volumeMounts: [{{name: v, mountPath: /v}}]\n  \
                 volumes:\n  - {{name: v, hostPath: {{path: {path}, type: DirectoryOrCreate}}}}\n",
                env.shell
            ),
        );
    };
    refused("outside", "/opt/hpk-test-outside");
    refused("hidden", &hpk_home.display().to_string());
    eventually("the kubelet refuses both hostPaths", Duration::from_secs(90), || {
        let said = events(&env, "mine");
        (said.contains("/opt/hpk-test-outside") && said.contains(&hpk_home.display().to_string()))
            .then_some(said)
    });
    let said = events(&env, "mine");
    assert!(
        said.contains("lies outside the host paths this cluster binds") && said.contains("--bind"),
        "{said}"
    );
    assert!(said.contains("keeps for HPK itself"), "{said}");

    // A process with every capability of the bubble, in its mount namespace (a pod that broke
    // out): HPK's directory is covered there, the cover stays, and the read-only bind stays so.
    let (init, _) = support::bubble_processes(CLUSTER, &format!("{CLUSTER}-1"))
        .into_iter()
        .find(|(_, cmdline)| cmdline.contains("bubble-init"))
        .expect("the bubble's init");
    let node_dir = env.state.path().join(CLUSTER).join(format!("{CLUSTER}-1"));
    std::fs::copy("/bin/busybox", node_dir.join("busybox")).expect("copy busybox");
    let hidden = hpk_home.display();
    let script = format!(
        "bb=/var/lib/hpk/busybox; \
         $bb test -s /hpk/shared/apiserver && echo ENTERED; \
         $bb mkdir -p /tmp/control && $bb mount -t tmpfs -o ro none /tmp/control && \
         $bb mount -o remount,rw /tmp/control && $bb umount /tmp/control && echo CONTROL; \
         echo ENTRIES=$($bb ls -A {hidden} | $bb wc -l); \
         $bb umount {hidden} && echo UNMOUNTED || echo UMOUNT-REFUSED; \
         $bb umount -l {hidden} && echo UNMOUNTED || echo UMOUNT-REFUSED; \
         echo AFTER=$($bb ls -A {hidden} | $bb wc -l); \
         $bb mount -o remount,bind,rw /project/ref && echo REMOUNTED || echo REMOUNT-REFUSED; \
         ($bb echo x > /project/ref/input) 2>/dev/null && echo WROTE || echo WRITE-REFUSED"
    );
    let out = Command::new("nsenter")
        .arg(format!("--user=/proc/{init}/ns/user"))
        .arg(format!("--mount=/proc/{init}/ns/mnt"))
        .arg(format!("--pid=/proc/{init}/ns/pid"))
        .args(["--", "/var/lib/hpk/busybox", "sh", "-c", &script])
        .output()
        .expect("nsenter");
    let seen = text(&out);
    assert!(seen.contains("ENTERED"), "did not reach the bubble's mount namespace:\n{seen}");
    // The control: there, a mount of the bubble's own can be remounted and unmounted.
    assert!(seen.contains("CONTROL"), "mount and umount do not work there at all:\n{seen}");
    assert!(seen.contains("ENTRIES=0") && seen.contains("AFTER=0"), "HPK's directory showed:\n{seen}");
    assert_eq!(seen.matches("UMOUNT-REFUSED").count(), 2, "the cover was lifted:\n{seen}");
    assert!(
        seen.contains("REMOUNT-REFUSED") && seen.contains("WRITE-REFUSED"),
        "the :ro bind was made writable:\n{seen}"
    );

    // Down: the user's files stay as they were; nothing of the views stays.
    let out = env.down(CLUSTER);
    assert!(out.status.success(), "hpk down: {}", text(&out));
    assert_eq!(std::fs::read_to_string(home.join("work/written")).expect("kept"), "from-pod\n");
    assert_eq!(std::fs::read_to_string(scratch.path().join("written")).expect("kept"), "from-pod\n");
    assert!(reference.path().join("input").exists());
    assert!(hpk_home.exists(), "~/.hpk is still there");
    let left: Vec<_> = walk_names(env.state.path());
    assert!(!left.iter().any(|n| n.ends_with(".binds")), "views left behind: {left:?}");
}

fn walk_names(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(entry.path().display().to_string());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk_names(&entry.path()));
        }
    }
    out
}

const STORAGE: &str = "storage";

/// `(pod, node, uid)` of each pod of `selector`, once `count` are Ready and none is one of
/// `gone` (the UIDs of pods deleted before).
fn ready_pods(env: &Env, selector: &str, count: usize, gone: &[String]) -> Vec<(String, String, String)> {
    eventually(&format!("{count} Ready pods of {selector}"), Duration::from_secs(180), || {
        let out = env.kubectl_ok(
            STORAGE,
            &[
                "get",
                "pods",
                "-l",
                selector,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.uid} \
                 {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ],
        );
        let pods: Vec<(String, String, String)> = out
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.len() == 4 && w[3] == "True" && !gone.iter().any(|uid| uid == w[2]))
                    .then(|| (w[0].to_owned(), w[1].to_owned(), w[2].to_owned()))
            })
            .collect();
        (pods.len() == count).then_some(pods)
    })
}

/// The storage a cluster has out of the box (`hpk up --shared-volumes DIR`, checked with the
/// real kubectl): a StatefulSet of 2 with `volumeClaimTemplates` and no class named gets
/// node-local volumes from the default class, is Ready, and keeps its data, each pod pinned to
/// its volume's node, when its pods are deleted; a ReadWriteMany volume of `hpk-shared` written
/// by a pod on one node is read by a pod on the other; the volume's directory is removed with
/// its claim, and an `hpk-shared-retain` one is kept, with the user's ownership on the host;
/// `hpk down` leaves the shared directory's kept volumes and nothing of the node-local ones.
#[tokio::test(flavor = "multi_thread")]
async fn statefulsets_get_node_local_volumes_and_pods_share_rwx_ones() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let scratch = tempfile::tempdir().expect("scratch");
    // Missing: hpk up makes it.
    let shared = scratch.path().join("volumes");
    let out = env.up_with(STORAGE, 2, &[&format!("--shared-volumes={}", shared.display())]);
    assert!(out.status.success(), "hpk up: {}", text(&out));
    let me = nix::unistd::getuid().as_raw();
    let meta = std::fs::metadata(&shared).expect("hpk up made the shared directory");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (me, 0o700), "the shared directory is the user's alone");

    let classes = env.kubectl_ok(
        STORAGE,
        &[
            "get",
            "storageclass",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.reclaimPolicy} \
             {.metadata.annotations.storageclass\\.kubernetes\\.io/is-default-class}{\"\\n\"}{end}",
        ],
    );
    for class in ["local-path Delete true", "hpk-shared Delete", "hpk-shared-retain Retain"] {
        assert!(classes.lines().any(|l| l.trim() == class), "no StorageClass {class:?}:\n{classes}");
    }

    // Node-local: a StatefulSet whose pods each write who first used their volume.
    let started = std::time::Instant::now();
    env.apply(
        STORAGE,
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: db}}\nspec:\n  clusterIP: None\n  selector: {{app: db}}\n\
             ---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: db}}\nspec:\n  serviceName: db\n  \
             replicas: 2\n  selector: {{matchLabels: {{app: db}}}}\n  template:\n    metadata: {{labels: {{app: db}}}}\n    \
             spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: db\n        image: {shell}\n        \
             command: [sh, -c, '[ -f /data/first ] || echo $(hostname) $(cat /proc/sys/kernel/random/uuid) > /data/first; exec sleep 3600']\n        \
             volumeMounts: [{{name: data, mountPath: /data}}]\n  volumeClaimTemplates:\n  - metadata: {{name: data}}\n    \
             spec:\n      accessModes: [ReadWriteOnce]\n      resources: {{requests: {{storage: 64Mi}}}}\n",
            shell = env.shell
        ),
    );
    let mut first = ready_pods(&env, "app=db", 2, &[]);
    eprintln!(
        "StatefulSet of 2 with volumes: Ready {:.1} s after kubectl apply",
        started.elapsed().as_secs_f64()
    );
    first.sort();
    // Each pod's name and a token of its first start.
    let read = |pod: &str| env.kubectl_ok(STORAGE, &["exec", pod, "--", "cat", "/data/first"]);
    let written: Vec<String> = first.iter().map(|(pod, _, _)| read(pod)).collect();
    for ((pod, _, _), text) in first.iter().zip(&written) {
        assert!(
            text.starts_with(&format!("{pod} ")) && text.trim().len() > pod.len() + 30,
            "{pod}'s volume: {text}"
        );
    }
    let claims = env.kubectl_ok(
        STORAGE,
        &["get", "pvc", "-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.storageClassName} {.status.phase}{\"\\n\"}{end}"],
    );
    assert!(
        claims.contains("data-db-0 local-path Bound") && claims.contains("data-db-1 local-path Bound"),
        "{claims}"
    );
    // On the host, each in its node's own directory.
    let on_host: Vec<String> = (1..=2)
        .flat_map(|i| {
            walk_names(&env.state.path().join(STORAGE).join(format!("{STORAGE}-{i}/volumes/local-path")))
        })
        .filter(|p| p.ends_with("/first"))
        .collect();
    assert_eq!(on_host.len(), 2, "the volumes on the host: {on_host:?}");

    // Not `kubectl delete --wait`: it can miss the deletion and wait a week. It reads the pod,
    // then lists and watches from there; when the StatefulSet has made the new pod of the same
    // name in between, the list has it and the watch never sees a deletion. The new pods are
    // the Ready ones with other UIDs.
    let gone: Vec<String> = first.iter().map(|(_, _, uid)| uid.clone()).collect();
    env.kubectl_ok(STORAGE, &["delete", "pod", "db-0", "db-1", "--wait=false"]);
    let mut again = ready_pods(&env, "app=db", 2, &gone);
    again.sort();
    let placed = |pods: &[(String, String, String)]| -> Vec<(String, String)> {
        pods.iter().map(|(pod, node, _)| (pod.clone(), node.clone())).collect()
    };
    assert_eq!(placed(&again), placed(&first), "each pod is back on its volume's node");
    for ((pod, _, _), text) in again.iter().zip(&written) {
        assert_eq!(&read(pod), text, "{pod}'s data survived its deletion");
    }

    // Shared: written on one node, read on the other; kept or removed as the class says.
    let nodes = [format!("{STORAGE}-1"), format!("{STORAGE}-2")];
    let claim = |name: &str, class: &str| {
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}}}\nspec:\n  storageClassName: {class}\n  \
             accessModes: [ReadWriteMany]\n  resources: {{requests: {{storage: 16Mi}}}}\n"
        )
    };
    let pod = |name: &str, node: &str, claim: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: {node}\n  restartPolicy: Never\n  \
             containers:\n  - name: c\n    image: {shell}\n    command: [sh, -c, {script:?}]\n    \
             volumeMounts: [{{name: v, mountPath: /v}}]\n  volumes:\n  - {{name: v, persistentVolumeClaim: {{claimName: {claim}}}}}\n",
            shell = env.shell
        )
    };
    let finished = |name: &str| {
        eventually(&format!("pod {name} to finish"), Duration::from_secs(120), || {
            let phase = env.kubectl_ok(STORAGE, &["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
            assert_ne!(phase, "Failed", "{name} failed:\n{}", env.kubectl_ok(STORAGE, &["logs", name]));
            (phase == "Succeeded").then(|| env.kubectl_ok(STORAGE, &["logs", name]))
        })
    };
    env.apply(STORAGE, &(claim("scratch", "hpk-shared") + "---\n" + &claim("results", "hpk-shared-retain")));
    env.apply(STORAGE, &pod("writer", &nodes[0], "scratch", "echo written-on-node-1 > /v/note"));
    env.apply(STORAGE, &pod("keeper", &nodes[0], "results", "echo kept > /v/result"));
    finished("writer");
    finished("keeper");
    env.apply(STORAGE, &pod("reader", &nodes[1], "scratch", "cat /v/note"));
    assert_eq!(finished("reader").trim(), "written-on-node-1", "read on the other node");

    let retained = shared.join("retained/default/results/result");
    assert_eq!(std::fs::read_to_string(&retained).expect("the kept volume on the host"), "kept\n");
    assert_eq!(std::fs::metadata(&retained).expect("meta").uid(), me, "the user's");
    let notes: Vec<String> =
        walk_names(&shared).into_iter().filter(|p| p.ends_with("_default_scratch/note")).collect();
    assert_eq!(notes.len(), 1, "the shared volume on the host: {:?}", walk_names(&shared));
    assert_eq!(std::fs::metadata(&notes[0]).expect("meta").uid(), me, "the user's");

    env.kubectl_ok(STORAGE, &["delete", "pod", "writer", "reader", "keeper"]);
    env.kubectl_ok(STORAGE, &["delete", "pvc", "scratch", "results"]);
    let note_dir = std::path::Path::new(&notes[0]).parent().expect("dir").to_owned();
    eventually("the deleted claim's directory to go", Duration::from_secs(90), || {
        (!note_dir.exists()).then_some(())
    });
    assert!(retained.exists(), "the Retain volume was removed with its claim");

    let out = env.down(STORAGE);
    assert!(out.status.success(), "hpk down: {}", text(&out));
    assert!(!env.state.path().join(STORAGE).exists(), "node-local volumes outlived the cluster");
    assert_eq!(std::fs::read_to_string(&retained).expect("kept after hpk down"), "kept\n");
}
