use super::*;

/// A spec as `nvidia-ctk cdi generate` writes it (YAML, abridged).
const NVIDIA_YAML: &str = r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
"#;

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join(name), text).expect("write");
}

#[test]
fn nvidias_own_yaml_resolves_with_its_hooks_named_as_not_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write(tmp.path(), "nvidia.yaml", NVIDIA_YAML);
    let (registry, errors) = Registry::load(&[tmp.path().to_owned()]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(registry.device_names(GPU_KIND), ["0", "all"]);
    let resolved = registry.resolve(&["nvidia.com/gpu=0".into()]).expect("resolve");
    let paths: Vec<&str> = resolved.edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia0"], "the spec's own edits, then the device's");
    assert_eq!(resolved.edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(resolved.edits.mounts.len(), 1);
    assert!(resolved.edits.mounts[0].readonly());
    assert!(resolved.edits.hooks.is_empty());
    assert_eq!(resolved.not_applied.len(), 1, "{resolved:?}");
    assert!(resolved.not_applied[0].contains("/usr/bin/nvidia-ctk"), "{resolved:?}");

    // Two devices of one spec: its own edits once.
    let both = registry.resolve(&["nvidia.com/gpu=0".into(), "nvidia.com/gpu=all".into()]).expect("resolve");
    assert_eq!(both.edits.env.len(), 1);
    assert_eq!(both.edits.device_nodes.len(), 2, "a node two devices share, once");
}

#[test]
fn a_later_directory_wins_and_a_bad_file_hides_nothing_else() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (etc, run) = (tmp.path().join("etc"), tmp.path().join("run"));
    let spec = |node: &str| {
        format!(
            r#"{{"cdiVersion":"0.6.0","kind":"example.com/fpga","devices":[{{"name":"a","containerEdits":{{"deviceNodes":[{{"path":"{node}"}}]}}}}]}}"#
        )
    };
    write(&etc, "fpga.json", &spec("/dev/etc-fpga"));
    write(&run, "fpga.json", &spec("/dev/run-fpga"));
    write(&run, "broken.json", "{not json");
    write(&run, "ignored.txt", "not a spec");
    let (registry, errors) = Registry::load(&[etc, run.clone(), tmp.path().join("missing")]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("broken.json"), "{}", errors[0]);
    let resolved = registry.resolve(&["example.com/fpga=a".into()]).expect("resolve");
    assert_eq!(resolved.edits.device_nodes[0].path, "/dev/run-fpga");

    let err = registry.resolve(&["example.com/fpga=b".into()]).expect_err("unknown").to_string();
    assert!(err.contains("example.com/fpga=b") && err.contains(&run.display().to_string()), "{err}");
    let err = registry.resolve(&["fpga".into()]).expect_err("malformed").to_string();
    assert!(err.contains("no CDI device name"), "{err}");

    // The same device twice in one directory: the second file's is refused, by name.
    write(&run, "zz-again.json", &spec("/dev/again"));
    let (registry, errors) = Registry::load(&[run]);
    assert!(errors.iter().any(|e| e.to_string().contains("described by another spec")), "{errors:?}");
    assert_eq!(
        registry.resolve(&["example.com/fpga=a".into()]).expect("kept").edits.device_nodes[0].path,
        "/dev/run-fpga"
    );
}

#[test]
fn malformed_specs_are_refused_saying_why() {
    let path = Path::new("/etc/cdi/x.json");
    for (text, why) in [
        (r#"{"cdiVersion":"0.5.0","kind":"nvidia"}"#, "not vendor/class"),
        (r#"{"cdiVersion":"0.5.0","kind":"Nvidia.com/gpu"}"#, "not vendor/class"),
        (r#"{"kind":"nvidia.com/gpu"}"#, "cdiVersion"),
        (r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"../x"}]}"#, "not valid"),
        (r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0"},{"name":"0"}]}"#, "twice"),
        (
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","containerEdits":{"deviceNodes":[{"path":"dev/x"}]}}"#,
            "not an absolute path",
        ),
        (
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","containerEdits":{"mounts":[{"hostPath":"/a/../etc","containerPath":"/b"}]}}"#,
            "not an absolute path",
        ),
        (r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","containerEdits":{"env":["=x"]}}"#, "KEY=value"),
        (
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","containerEdits":{"deviceNodes":[{"path":"/dev/x","type":"z"}]}}"#,
            "type",
        ),
        (r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":"x"}"#, "invalid type"),
    ] {
        let err = Spec::parse(text, false, path).expect_err(text).to_string();
        assert!(err.starts_with("/etc/cdi/x.json: ") && err.contains(why), "{text}: {err}");
    }
    let err = Spec::parse("kind: [", true, path).expect_err("yaml").to_string();
    assert!(err.starts_with("/etc/cdi/x.json: "), "{err}");
}

#[test]
fn an_oversized_spec_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let big =
        format!(r#"{{"cdiVersion":"0.5.0","kind":"a.com/b","x":"{}"}}"#, "y".repeat(MAX_SPEC_BYTES as usize));
    write(tmp.path(), "big.json", &big);
    let (registry, errors) = Registry::load(&[tmp.path().to_owned()]);
    assert!(errors[0].to_string().contains("larger than"), "{errors:?}");
    assert!(registry.device_names("a.com/b").is_empty());
}

/// Makes character device `path` (major, minor) with mknod(1); false where this user may not.
fn mknod(path: &Path, major: u32, minor: u32) -> bool {
    std::process::Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_spec_is_made_from_the_hosts_devices_and_driver_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dev = tmp.path().join("dev");
    std::fs::create_dir(&dev).expect("mkdir");
    if !(mknod(&dev.join("nvidia0"), 195, 0)
        && mknod(&dev.join("nvidia1"), 195, 1)
        && mknod(&dev.join("nvidiactl"), 195, 255))
    {
        eprintln!("skipped: mknod needs CAP_MKNOD (run as root, as CI does)");
        return;
    }
    std::fs::write(dev.join("nvidia-uvm"), "not a device").expect("write");
    let root = tmp.path().join("driver");
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).expect("mkdir");
    std::fs::write(lib.join("libnvidia-ml.so.550.54.15"), "lib").expect("write");
    std::os::unix::fs::symlink("libnvidia-ml.so.550.54.15", lib.join("libnvidia-ml.so.1")).expect("link");
    std::os::unix::fs::symlink("gone", lib.join("libcuda.so.1")).expect("link");
    std::fs::write(lib.join("libnvidia-mlx.so"), "another library").expect("write");
    std::fs::write(lib.join("libc.so.6"), "not the driver's").expect("write");
    std::fs::create_dir_all(root.join("usr/bin")).expect("mkdir");
    std::fs::write(root.join("usr/bin/nvidia-smi"), "#!/bin/sh\n").expect("write");
    let host = nvidia::Host { dev_dir: dev.clone(), driver_root: root.clone() };

    let found = nvidia::generate(&host, &[1]).expect("spec");
    let spec = &found.spec;
    assert_eq!((spec.kind.as_str(), spec.devices.len()), (GPU_KIND, 1));
    let gpu = &spec.devices[0];
    assert_eq!(gpu.name, "1");
    let node = &gpu.container_edits.device_nodes[0];
    assert_eq!((node.path.as_str(), node.major, node.minor), ("/dev/nvidia1", Some(195), Some(1)));
    let real_dev = std::fs::canonicalize(&dev).expect("canonical");
    assert_eq!(node.host_path.as_deref(), Some(real_dev.join("nvidia1").to_str().expect("utf-8")));
    let control: Vec<&str> = spec.container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(control, ["/dev/nvidiactl"], "only the control devices that are character devices");
    let mounts: Vec<(&str, &str)> = spec
        .container_edits
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str()))
        .collect();
    let real_lib = std::fs::canonicalize(&lib).expect("canonical").join("libnvidia-ml.so.550.54.15");
    let real_lib = real_lib.to_str().expect("utf-8");
    let real_smi = std::fs::canonicalize(root.join("usr/bin/nvidia-smi")).expect("canonical");
    assert_eq!(
        mounts,
        [
            ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", real_lib),
            ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", real_lib),
            ("/usr/bin/nvidia-smi", real_smi.to_str().expect("utf-8")),
        ],
        "links resolved, dangling ones and other libraries left out"
    );
    assert_eq!(found.driver_files, 3);
    assert!(spec.container_edits.mounts.iter().all(Mount::readonly));

    // What it writes, another reads back.
    let back = Spec::parse(&spec.to_json(), false, Path::new("x.json")).expect("its own JSON");
    assert_eq!(&back, spec);

    let err = nvidia::generate(&host, &[0, 7]).expect_err("no GPU 7").to_string();
    assert!(err.contains("GPU 7") && err.contains("nvidia7"), "{err}");
}
