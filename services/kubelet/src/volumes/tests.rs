//! `PodVolumes` end to end on a temp dir, with objects from [`FakeObjects`].

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use serde_json::json;

use super::fake::{FakeObjects, pod};
use super::*;

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

/// The `..<timestamp>` version directories of an atomic-writer volume.
fn versions(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("..2"))
        .collect();
    found.sort();
    found
}

fn ctx() -> VolumeContext {
    VolumeContext::default()
}

async fn prepare(pod: &Pod, dir: &Path, objects: &FakeObjects) -> Result<PodVolumes, VolumeError> {
    PodVolumes::prepare(pod, dir, &ctx(), objects).await
}

#[tokio::test]
async fn config_map_items_and_default_mode_use_the_atomic_layout() {
    let objects = FakeObjects::default();
    objects.add_config_map(json!({"metadata": {"name": "app", "namespace": "ns"},
        "data": {"a": "alpha", "b": "beta", "c": "gamma"}, "binaryData": {"bin": "AAEC"}}));
    let pod = pod(
        json!([{"name": "conf", "configMap": {"name": "app", "defaultMode": 0o640,
            "items": [{"key": "a", "path": "sub/a.txt", "mode": 0o600}, {"key": "b", "path": "b"},
                      {"key": "bin", "path": "bin"}]}}]),
        json!([]),
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    let vol = tmp.path().join("volumes/conf");
    assert_eq!(fs::read_to_string(vol.join("sub/a.txt")).expect("a"), "alpha");
    assert_eq!(fs::read_to_string(vol.join("b")).expect("b"), "beta");
    assert_eq!(fs::read(vol.join("bin")).expect("bin"), vec![0, 1, 2]);
    assert!(!vol.join("c").exists(), "only the listed items are projected");
    assert_eq!(mode(&vol.join("sub/a.txt")), 0o600);
    assert_eq!(mode(&vol.join("b")), 0o640);
    let found = versions(&vol);
    assert_eq!(found.len(), 1);
    let version = &found[0];
    // ..YYYY_MM_DD_HH_MM_SS.nnnnnnnnn
    assert_eq!(version.len(), "..2026_11_30_03_04_05.123456789".len(), "{version}");
    assert_eq!(fs::read_link(vol.join("..data")).expect("..data"), Path::new(version));
    assert_eq!(fs::read_link(vol.join("b")).expect("link"), Path::new("..data/b"));
    assert_eq!(fs::read_link(vol.join("sub")).expect("link"), Path::new("..data/sub"));
    assert_eq!(mode(&vol.join(version)), 0o755);
    assert_eq!(mode(&vol.join(version).join("sub")), 0o755);
}

#[tokio::test]
async fn refresh_swaps_changed_content_atomically() {
    let objects = FakeObjects::default();
    objects.add_config_map(json!({"metadata": {"name": "app", "namespace": "ns"},
        "data": {"key": "old", "gone": "soon"}}));
    let pod = pod(json!([{"name": "conf", "configMap": {"name": "app"}}]), json!([]));
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut volumes = prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    let vol = tmp.path().join("volumes/conf");
    let old_version = versions(&vol).remove(0);
    let mut held = fs::File::open(vol.join("key")).expect("open through the link");
    assert!(!volumes.refresh(&pod, &ctx(), &objects).await.expect("refresh"), "nothing changed");

    objects.add_config_map(json!({"metadata": {"name": "app", "namespace": "ns"}, "data": {"key": "new"}}));
    assert!(volumes.refresh(&pod, &ctx(), &objects).await.expect("refresh"), "content changed");
    assert_eq!(fs::read_to_string(vol.join("key")).expect("reopen"), "new");
    let mut before = String::new();
    held.read_to_string(&mut before).expect("read held");
    assert_eq!(before, "old", "an open file keeps the version it opened");
    assert!(!vol.join(&old_version).exists(), "old version removed");
    assert_eq!(versions(&vol).len(), 1);
    assert!(fs::symlink_metadata(vol.join("gone")).is_err(), "the removed key's link is gone");
    assert!(!vol.join("..data_tmp").exists());
    assert!(!volumes.refresh(&pod, &ctx(), &objects).await.expect("refresh"), "unchanged again");
}

#[tokio::test]
async fn missing_config_map_or_key_fails_unless_optional() {
    let objects = FakeObjects::default();
    objects.add_config_map(json!({"metadata": {"name": "app", "namespace": "ns"}, "data": {"a": "1"}}));
    let tmp = tempfile::tempdir().expect("tempdir");

    let missing = pod(json!([{"name": "conf", "configMap": {"name": "nope"}}]), json!([]));
    let err = prepare(&missing, tmp.path(), &objects).await.expect_err("missing object");
    assert!(
        matches!(&err, VolumeError::ObjectMissing { name, kind: "ConfigMap", .. } if name == "nope"),
        "{err:?}"
    );
    assert!(err.to_string().contains("ConfigMap ns/nope not found"), "{err}");
    assert!(!tmp.path().join("volumes/conf").exists(), "nothing written for the failing volume");

    let missing_key = pod(
        json!([{"name": "conf", "configMap": {"name": "app", "items": [{"key": "zz", "path": "z"}]}}]),
        json!([]),
    );
    let err = prepare(&missing_key, tmp.path(), &objects).await.expect_err("missing key");
    assert!(matches!(&err, VolumeError::KeyMissing { key, .. } if key == "zz"), "{err:?}");
    assert!(err.to_string().contains("has no key \"zz\""), "{err}");

    let optional = pod(
        json!([{"name": "opt", "configMap": {"name": "nope", "optional": true}},
               {"name": "part", "configMap": {"name": "app", "optional": true,
                   "items": [{"key": "zz", "path": "z"}, {"key": "a", "path": "a"}]}}]),
        json!([]),
    );
    prepare(&optional, tmp.path(), &objects).await.expect("optional sources are fine");
    assert!(tmp.path().join("volumes/opt/..data").exists(), "an empty volume");
    assert_eq!(fs::read_to_string(tmp.path().join("volumes/part/a")).expect("a"), "1");
    assert!(!tmp.path().join("volumes/part/z").exists());
}

#[tokio::test]
async fn secret_default_mode_is_honoured() {
    let objects = FakeObjects::default();
    objects.add_secret(json!({"metadata": {"name": "creds", "namespace": "ns"},
        "data": {"password": "aHVudGVyMg=="}}));
    let pod = pod(json!([{"name": "s", "secret": {"secretName": "creds", "defaultMode": 0o400}}]), json!([]));
    let tmp = tempfile::tempdir().expect("tempdir");
    prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    let file = tmp.path().join("volumes/s/password");
    assert_eq!(mode(&file), 0o400);
    assert_eq!(fs::read_to_string(&file).expect("readable at 0400 by its owner"), "hunter2");
}

#[tokio::test]
async fn downward_api_files_follow_the_pod() {
    let objects = FakeObjects::default();
    let mut pod = pod(
        json!([{"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o600},
            {"path": "mem", "resourceFieldRef": {"containerName": "main", "resource": "limits.memory"}}]}}]),
        json!([]),
    );
    let context = VolumeContext {
        facts: crate::downward::PodFacts { allocatable_memory: 1 << 30, ..Default::default() },
        ..Default::default()
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut volumes = PodVolumes::prepare(&pod, tmp.path(), &context, &objects).await.expect("prepared");
    let vol = tmp.path().join("volumes/info");
    assert_eq!(fs::read_to_string(vol.join("labels")).expect("labels"), "app=\"web\"\ntier=\"front\"");
    assert_eq!(fs::read_to_string(vol.join("name")).expect("name"), "web");
    assert_eq!(mode(&vol.join("name")), 0o600);
    assert_eq!(fs::read_to_string(vol.join("mem")).expect("mem"), (1u64 << 30).to_string());

    pod.metadata.labels.get_or_insert_default().insert("tier".into(), "back".into());
    assert!(volumes.refresh(&pod, &context, &objects).await.expect("refresh"));
    assert_eq!(fs::read_to_string(vol.join("labels")).expect("labels"), "app=\"web\"\ntier=\"back\"");
}

/// The volume the API server injects into every pod.
fn kube_api_access() -> serde_json::Value {
    json!([{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}}])
}

fn root_ca(objects: &FakeObjects) {
    objects.add_config_map(json!({"metadata": {"name": "kube-root-ca.crt", "namespace": "ns"},
        "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n"}}));
}

#[tokio::test]
async fn projected_kube_api_access_has_token_ca_and_namespace() {
    let objects = FakeObjects::default();
    root_ca(&objects);
    let pod = pod(
        kube_api_access(),
        json!([{"name": "kube-api-access-x7k2p",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]),
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let volumes = prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    let vol = tmp.path().join("volumes/kube-api-access-x7k2p");
    assert_eq!(fs::read_to_string(vol.join("token")).expect("token"), "token-1");
    assert_eq!(mode(&vol.join("token")), 0o644);
    assert_eq!(fs::read_to_string(vol.join("ca.crt")).expect("ca"), "-----BEGIN CERTIFICATE-----\n");
    assert_eq!(fs::read_to_string(vol.join("namespace")).expect("ns"), "ns");
    let request = objects.last_token_request.lock().expect("lock").clone().expect("asked for a token");
    assert_eq!(request, ("ns".into(), "builder".into(), "web".into(), vec![], 3607));

    let container = &pod.spec.as_ref().expect("spec").containers[0];
    let mounts = volumes.mounts_for(container, &BTreeMap::new()).expect("mounts").mounts;
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].container_path, "/var/run/secrets/kubernetes.io/serviceaccount");
    assert_eq!(Path::new(&mounts[0].host_path), vol);
    assert!(mounts[0].readonly);
}

#[tokio::test]
async fn tokens_rotate_only_when_due() {
    let objects = FakeObjects::default();
    root_ca(&objects);
    let pod = pod(kube_api_access(), json!([]));
    let tmp = tempfile::tempdir().expect("tempdir");
    let token = tmp.path().join("volumes/kube-api-access-x7k2p/token");

    let mut volumes = prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    assert!(!volumes.refresh(&pod, &ctx(), &objects).await.expect("refresh"), "a fresh 1 h token stays");
    assert_eq!(objects.tokens_issued.load(Ordering::SeqCst), 1);

    // Tokens that live 200 ms: after 250 ms, more than 80 % of the lifetime has passed.
    objects.token_lifetime_ms.store(200, Ordering::SeqCst);
    let mut volumes2 = prepare(&pod, tmp.path(), &objects).await.expect("prepared again");
    assert_eq!(fs::read_to_string(&token).expect("token"), "token-2");
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    assert!(volumes2.refresh(&pod, &ctx(), &objects).await.expect("refresh"), "rotated");
    assert_eq!(fs::read_to_string(&token).expect("token"), "token-3");
    assert_eq!(versions(&tmp.path().join("volumes/kube-api-access-x7k2p")).len(), 1);
    drop(volumes);
}

#[tokio::test]
async fn claims_mount_their_host_path_volume() {
    let objects = FakeObjects::default();
    let data = tempfile::tempdir().expect("tempdir");
    objects.add_claim(json!({"metadata": {"name": "data", "namespace": "ns"},
        "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}}));
    objects.add_volume(json!({"metadata": {"name": "pv-1"}, "spec": {
        "hostPath": {"path": data.path(), "type": "Directory"},
        "claimRef": {"name": "data", "namespace": "ns"}}}));
    objects.add_claim(
        json!({"metadata": {"name": "waiting", "namespace": "ns"}, "status": {"phase": "Pending"}}),
    );
    objects.add_claim(json!({"metadata": {"name": "remote", "namespace": "ns"},
        "spec": {"volumeName": "pv-nfs"}, "status": {"phase": "Bound"}}));
    objects
        .add_volume(json!({"metadata": {"name": "pv-nfs"}, "spec": {"nfs": {"server": "s", "path": "/x"}}}));

    let good = pod(
        json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data", "readOnly": true}}]),
        json!([{"name": "d", "mountPath": "/data"}]),
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let volumes = prepare(&good, tmp.path(), &objects).await.expect("bound claim");
    let mounts = volumes
        .mounts_for(&good.spec.as_ref().expect("spec").containers[0], &BTreeMap::new())
        .expect("mounts")
        .mounts;
    assert_eq!(Path::new(&mounts[0].host_path), data.path());
    assert!(mounts[0].readonly, "the claim's readOnly holds");

    let pending = pod(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "waiting"}}]), json!([]));
    let err = prepare(&pending, tmp.path(), &objects).await.expect_err("pending claim");
    assert!(err.to_string().contains("ns/waiting: is Pending, not Bound"), "{err}");
    let remote = pod(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "remote"}}]), json!([]));
    let err = prepare(&remote, tmp.path(), &objects).await.expect_err("nfs pv");
    assert!(err.to_string().contains("not a hostPath or local volume"), "{err}");
    let absent = pod(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}]), json!([]));
    let err = prepare(&absent, tmp.path(), &objects).await.expect_err("no claim");
    assert!(err.to_string().contains("ns/nope: not found"), "{err}");
}

#[tokio::test]
async fn unsupported_volume_types_say_which() {
    let objects = FakeObjects::default();
    let tmp = tempfile::tempdir().expect("tempdir");
    let nfs = pod(json!([{"name": "share", "nfs": {"server": "nas", "path": "/export"}}]), json!([]));
    let err = prepare(&nfs, tmp.path(), &objects).await.expect_err("nfs");
    assert!(matches!(&err, VolumeError::Unsupported { volume, kind } if volume == "share" && kind == "nfs"));
    assert_eq!(err.to_string(), "volume \"share\": nfs volumes are not supported on this node");
    let bundle = pod(
        json!([{"name": "p", "projected": {"sources": [{"clusterTrustBundle": {"path": "b", "name": "x"}}]}}]),
        json!([]),
    );
    let err = prepare(&bundle, tmp.path(), &objects).await.expect_err("trust bundle");
    assert!(matches!(&err, VolumeError::Unsupported { kind, .. } if kind == "projected clusterTrustBundle"));
}

#[tokio::test]
async fn empty_dirs_are_world_writable_and_report_what_is_not_enforced() {
    let objects = FakeObjects::default();
    let pod = pod(
        json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}, {"name": "plain", "emptyDir": {}}]),
        json!([]),
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let volumes = prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    assert_eq!(mode(&tmp.path().join("volumes/scratch")), 0o777);
    assert_eq!(mode(&tmp.path().join("volumes")), 0o755);
    assert_eq!(
        volumes.unenforced(),
        vec!["emptyDir \"scratch\": sizeLimit 1Gi is not enforced on disk".to_owned()]
    );
}

#[tokio::test]
async fn memory_empty_dir_is_a_tmpfs_or_says_it_is_not() {
    let objects = FakeObjects::default();
    let pod = pod(json!([{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]), json!([]));
    let tmp = tempfile::tempdir().expect("tempdir");
    let volumes = prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    let dir = tmp.path().join("volumes/shm");
    fs::write(dir.join("f"), b"x").expect("writable");
    if empty_dir::is_mount_point(&dir) {
        assert!(volumes.unenforced().is_empty(), "{:?}", volumes.unenforced());
        let info = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let line = info.lines().find(|l| l.contains(&*dir.to_string_lossy())).expect("listed");
        assert!(line.contains(" - tmpfs ") && line.contains("size=16384k"), "{line}");
        // Preparing again finds the mount and does not stack another.
        prepare(&pod, tmp.path(), &objects).await.expect("prepared again");
        let again = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert_eq!(again.lines().filter(|l| l.contains(&*dir.to_string_lossy())).count(), 1);
    } else {
        eprintln!("tmpfs mount not permitted here; checking the fallback");
        assert!(volumes.unenforced()[0].contains("medium Memory is a directory on disk"));
    }
    remove(tmp.path()).expect("removed");
    assert!(!tmp.path().exists());
    let info = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!info.contains(&*dir.to_string_lossy()), "unmounted");
}

#[tokio::test]
async fn remove_deletes_everything_but_follows_no_symlink() {
    let objects = FakeObjects::default();
    objects.add_config_map(json!({"metadata": {"name": "app", "namespace": "ns"}, "data": {"k": "v"}}));
    let outside = tempfile::tempdir().expect("outside");
    fs::write(outside.path().join("precious"), b"keep").expect("write");
    let host = tempfile::tempdir().expect("host");
    fs::write(host.path().join("host-file"), b"keep").expect("write");
    let pod = pod(
        json!([{"name": "scratch", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "app"}},
               {"name": "h", "hostPath": {"path": host.path(), "type": "Directory"}}]),
        json!([]),
    );
    let parent = tempfile::tempdir().expect("tempdir");
    let pod_dir = parent.path().join("pod");
    prepare(&pod, &pod_dir, &objects).await.expect("prepared");
    write_etc_hosts(&pod, "10.0.0.1", "cluster.local", &pod_dir).expect("hosts");
    // What a container could do with its emptyDir.
    std::os::unix::fs::symlink(outside.path(), pod_dir.join("volumes/scratch/escape")).expect("plant");
    std::os::unix::fs::symlink(outside.path().join("precious"), pod_dir.join("volumes/scratch/file"))
        .expect("plant");
    fs::create_dir(pod_dir.join("volumes/scratch/deep")).expect("mkdir");
    fs::write(pod_dir.join("volumes/scratch/deep/data"), b"x").expect("write");

    remove(&pod_dir).expect("removed");
    assert!(!pod_dir.exists());
    assert_eq!(fs::read(outside.path().join("precious")).expect("outside intact"), b"keep");
    assert_eq!(fs::read(host.path().join("host-file")).expect("hostPath intact"), b"keep");
    remove(&pod_dir).expect("removing twice is fine");
}

#[tokio::test]
async fn host_paths_into_hpks_directories_are_refused_with_the_reason() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = fs::canonicalize(tmp.path()).expect("canonical");
    let reserved = base.join("hpk");
    fs::create_dir_all(reserved.join("shared")).expect("mkdir");
    std::os::unix::fs::symlink(reserved.join("shared"), base.join("innocent")).expect("link");
    let context = VolumeContext {
        host_paths: HostPaths { forbidden: vec![reserved.clone()], ..HostPaths::default() },
        ..Default::default()
    };
    let objects = FakeObjects::default();
    objects.add_claim(json!({"metadata": {"name": "data", "namespace": "ns"},
        "spec": {"volumeName": "pv-hpk"}, "status": {"phase": "Bound"}}));
    objects.add_volume(json!({"metadata": {"name": "pv-hpk"}, "spec": {"local": {"path": reserved}}}));
    let cases = [
        (json!({"name": "h", "hostPath": {"path": reserved.join("shared")}}), "lies inside"),
        (json!({"name": "h", "hostPath": {"path": base.join("innocent")}}), "lies inside"),
        (json!({"name": "h", "hostPath": {"path": "/"}}), "contains"),
        (json!({"name": "h", "persistentVolumeClaim": {"claimName": "data"}}), "lies inside"),
    ];
    for (volume, relation) in cases {
        let pod = pod(json!([volume.clone()]), json!([]));
        let err =
            PodVolumes::prepare(&pod, &base.join("pod"), &context, &objects).await.expect_err("refused");
        let text = err.to_string();
        assert!(matches!(err, VolumeError::HostPathForbidden { .. }), "{volume}: {text}");
        assert!(text.contains(relation) && text.contains("keeps for HPK itself"), "{volume}: {text}");
    }
    let fine = pod(
        json!([{"name": "h", "hostPath": {"path": base.join("elsewhere"), "type": "DirectoryOrCreate"}}]),
        json!([]),
    );
    PodVolumes::prepare(&fine, &base.join("pod"), &context, &objects).await.expect("an unrelated path");
}

fn container(pod: &Pod) -> &Container {
    &pod.spec.as_ref().expect("spec").containers[0]
}

#[tokio::test]
async fn mounts_resolve_sub_paths_inside_their_volume() {
    let objects = FakeObjects::default();
    objects
        .add_config_map(json!({"metadata": {"name": "app", "namespace": "ns"}, "data": {"app.conf": "x"}}));
    let pod = pod(
        json!([{"name": "scratch", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "app"}}]),
        json!([{"name": "scratch", "mountPath": "/logs", "subPathExpr": "logs/$(POD_NAME)",
                "mountPropagation": "HostToContainer"},
               {"name": "scratch", "mountPath": "/cache", "subPath": "cache", "readOnly": true},
               {"name": "conf", "mountPath": "/etc/app.conf", "subPath": "app.conf"}]),
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let volumes = prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    let env: BTreeMap<String, String> = [("POD_NAME".to_owned(), "web-0".to_owned())].into();
    let all = volumes.mounts_for(container(&pod), &env).expect("mounts");
    let mounts = &all.mounts;
    let root = fs::canonicalize(tmp.path()).expect("canonical");
    let logs = root.join("volumes/scratch/logs/web-0");
    assert_eq!(Path::new(&mounts[0].host_path), logs);
    assert!(logs.is_dir(), "a missing subPath is created as a directory");
    assert_eq!(mounts[0].propagation, i32::from(k8s_cri::v1::MountPropagation::PropagationHostToContainer));
    assert!(!mounts[0].readonly);
    assert_eq!(mounts[1].container_path, "/cache");
    assert!(mounts[1].readonly);
    assert_eq!(mounts[1].propagation, i32::from(k8s_cri::v1::MountPropagation::PropagationPrivate));
    // A configMap key through its links, still inside the volume, always read-only.
    let conf = Path::new(&mounts[2].host_path);
    assert!(conf.starts_with(root.join("volumes/conf")) && conf.is_file(), "{}", conf.display());
    assert!(mounts[2].readonly);
    // The runtime is told each subPath mount's volume, to resolve it again without links.
    let (key, value) = all.annotation().expect("annotation");
    assert_eq!(key, SUB_PATH_ROOTS);
    let roots: BTreeMap<String, String> = serde_json::from_str(&value).expect("JSON");
    let volume = |name: &str| root.join("volumes").join(name).display().to_string();
    assert_eq!(roots.len(), 3);
    assert_eq!((roots["/logs"].clone(), roots["/etc/app.conf"].clone()), (volume("scratch"), volume("conf")));
    // A mount shipped elsewhere (connector mode) is no longer inside its volume: left out.
    let mut shipped = all.clone();
    shipped.mounts[0].host_path = "/runtime/pod-files/uid/volumes/scratch/logs/web-0".into();
    let (_, value) = shipped.annotation().expect("annotation");
    let roots: BTreeMap<String, String> = serde_json::from_str(&value).expect("JSON");
    assert!(!roots.contains_key("/logs") && roots.len() == 2, "{roots:?}");
}

#[tokio::test]
async fn mounts_refuse_paths_that_leave_the_volume() {
    let objects = FakeObjects::default();
    let tmp = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("outside");
    let volumes_of =
        |mount: serde_json::Value| pod(json!([{"name": "scratch", "emptyDir": {}}]), json!([mount]));
    let base = volumes_of(json!({"name": "scratch", "mountPath": "/x"}));
    let volumes = prepare(&base, tmp.path(), &objects).await.expect("prepared");
    std::os::unix::fs::symlink(outside.path(), tmp.path().join("volumes/scratch/out")).expect("plant");
    std::os::unix::fs::symlink("../..", tmp.path().join("volumes/scratch/up")).expect("plant");
    let env = BTreeMap::from([("P".to_owned(), "../etc".to_owned())]);
    let cases = [
        (json!({"name": "scratch", "mountPath": "/x", "subPath": "../etc"}), "must not contain '..'"),
        (json!({"name": "scratch", "mountPath": "/x", "subPath": "a/../../b"}), "must not contain '..'"),
        (json!({"name": "scratch", "mountPath": "/x", "subPath": "/etc"}), "must be relative"),
        (json!({"name": "scratch", "mountPath": "/x", "subPathExpr": "$(P)"}), "must not contain '..'"),
        (json!({"name": "scratch", "mountPath": "/x", "subPath": "out/sub"}), "outside the volume"),
        (json!({"name": "scratch", "mountPath": "/x", "subPath": "up"}), "outside the volume"),
        (json!({"name": "other", "mountPath": "/x"}), "which the pod does not have"),
        (
            json!({"name": "scratch", "mountPath": "/x", "mountPropagation": "Bidirectional"}),
            "only allowed for privileged",
        ),
    ];
    for (mount, expected) in cases {
        let pod = volumes_of(mount.clone());
        let err = volumes.mounts_for(container(&pod), &env).expect_err("refused");
        assert!(err.to_string().contains(expected), "{mount}: {err}");
    }
    assert!(!outside.path().join("sub").exists(), "nothing created outside");
}

#[tokio::test]
async fn fs_group_makes_volumes_readable_by_the_pods_user() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        hpk_test_support::skip("giving files the pod's user and fsGroup needs root (CAP_CHOWN)");
        return;
    }
    let objects = FakeObjects::default();
    root_ca(&objects);
    objects.add_secret(json!({"metadata": {"name": "creds", "namespace": "ns"}, "data": {"k": "dg=="}}));
    let mut volumes_json = kube_api_access();
    let list = volumes_json.as_array_mut().expect("array");
    list.push(json!({"name": "s", "secret": {"secretName": "creds", "defaultMode": 0o400,
        "items": [{"key": "k", "path": "nested/k"}]}}));
    list.push(json!({"name": "scratch", "emptyDir": {}}));
    let mut pod = pod(volumes_json, json!([]));
    pod.spec.as_mut().expect("spec").security_context =
        Some(serde_json::from_value(json!({"fsGroup": 2000, "runAsUser": 1000})).expect("security context"));
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut volumes = prepare(&pod, tmp.path(), &objects).await.expect("prepared");
    let meta = |p: &str| fs::metadata(tmp.path().join("volumes").join(p)).expect(p);

    let secret = meta("s/nested/k");
    assert_eq!((secret.gid(), secret.mode() & 0o7777), (2000, 0o440), "0400 plus group read");
    let nested = meta("s/nested");
    assert_eq!((nested.gid(), nested.mode() & 0o7777), (2000, 0o2755), "setgid directory");
    let token = meta("kube-api-access-x7k2p/token");
    assert_eq!((token.uid(), token.gid(), token.mode() & 0o7777), (1000, 2000, 0o640));
    let scratch = meta("scratch");
    assert_eq!((scratch.gid(), scratch.mode() & 0o7777), (2000, 0o2777));
    assert!(!volumes.refresh(&pod, &ctx(), &objects).await.expect("refresh"), "ownership is not a change");
}

#[tokio::test]
async fn an_fs_group_a_one_id_bubble_lacks_is_not_enforced_and_said_so() {
    use std::os::unix::fs::MetadataExt;
    let objects = FakeObjects::default();
    root_ca(&objects);
    objects.add_secret(json!({"metadata": {"name": "creds", "namespace": "ns"}, "data": {"k": "dg=="}}));
    let mut volumes_json = kube_api_access();
    let list = volumes_json.as_array_mut().expect("array");
    list.push(json!({"name": "s", "secret": {"secretName": "creds", "defaultMode": 0o600}}));
    list.push(json!({"name": "scratch", "emptyDir": {}}));
    let mut pod = pod(volumes_json, json!([]));
    pod.spec.as_mut().expect("spec").security_context =
        Some(serde_json::from_value(json!({"fsGroup": 2000, "runAsUser": 1000})).expect("security context"));
    let ids = crate::idmap::IdMappings::from_text("0 1000 1", "0 1000 1").expect("maps");
    let one_id = VolumeContext { ids: Some(ids), ..Default::default() };
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut volumes = PodVolumes::prepare(&pod, tmp.path(), &one_id, &objects).await.expect("not a failure");
    let meta = |p: &str| fs::metadata(tmp.path().join("volumes").join(p)).expect(p);
    let ours = fs::metadata(tmp.path()).expect("meta");
    let secret = meta("s/k");
    assert_eq!((secret.uid(), secret.gid(), secret.mode() & 0o7777), (ours.uid(), ours.gid(), 0o600));
    let token = meta("kube-api-access-x7k2p/token");
    assert_eq!((token.uid(), token.gid()), (ours.uid(), ours.gid()), "the bubble user's, not 1000:2000");
    let scratch = meta("scratch");
    assert_eq!(
        (scratch.gid(), scratch.mode() & 0o7777),
        (ours.gid(), 0o777),
        "no setgid to a group not here"
    );
    assert_eq!(
        volumes.unenforced(),
        vec![
            "fsGroup 2000 is not enforced: this bubble maps one ID (the job's user); the pod's volumes stay \
             owned by the bubble's user, root in its containers"
                .to_owned()
        ]
    );
    assert!(!volumes.refresh(&pod, &one_id, &objects).await.expect("refresh"), "nothing changed");
}
