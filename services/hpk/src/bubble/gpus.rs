//! The allocation's GPUs in a bubble: which GPUs this node has (`HPK_GPUS`, which `hpk up`
//! sets when it shares a machine's GPUs out among its nodes; else Slurm's `SLURM_STEP_GPUS`,
//! `SLURM_JOB_GPUS`), their CDI description (the host's own, from `/etc/cdi` or
//! `/var/run/cdi`, where it describes each of them; else one made from the device nodes and
//! the driver's files, see [`hpk_cdi::nvidia`]), and what the bubble needs for it: each
//! device node and driver file bound under [`BUBBLE_DIR`], and the spec rewritten to those
//! paths in the node directory's `cdi/`, where the kubelet (which gives each container its
//! own GPUs) and the runtime (which binds them in) read it.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The GPUs of this node, as a comma-separated list of IDs (the `N` of `/dev/nvidiaN`).
pub const GPUS_ENV: &str = "HPK_GPUS";
/// Where the GPUs' device nodes are, when not `/dev`.
pub const DEV_DIR_ENV: &str = "HPK_NVIDIA_DEV_DIR";
/// The root the driver's files are found under, when not `/`.
pub const DRIVER_ROOT_ENV: &str = "HPK_NVIDIA_DRIVER_ROOT";
/// Where the bubble's kubelet and runtime read CDI specs.
pub const CDI_DIR: &str = "/var/lib/hpk/cdi";
/// Where the bubble sees the GPUs' device nodes and driver files (a tmpfs of the bubble's,
/// `/run`: nothing is made in the image).
pub const BUBBLE_DIR: &str = "/run/hpk-gpu";
/// The variables the kubelet sets for a container's GPUs, which no spec's may replace.
const KUBELET_SETS: [&str; 2] = ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"];

/// The spec's file name in the node directory's `cdi/`.
pub const SPEC_FILE: &str = "hpk-nvidia.json";

/// One host path the bubble binds for its GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuBind {
    /// On the host.
    pub source: PathBuf,
    /// In the bubble.
    pub dest: String,
    /// A device node (bound without `nodev`), else a driver file (read-only).
    pub device: bool,
}

/// What [`stage`] made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// The GPUs' IDs.
    pub ids: Vec<u32>,
    /// The binds.
    pub binds: Vec<GpuBind>,
    /// Where the description came from, in words.
    pub source: String,
}

/// The GPU IDs of `list` (`0,1,3`); an entry that is no number (a UUID) is an error naming
/// `var`.
pub fn parse_ids(var: &str, list: &str) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let id = entry.parse::<u32>().map_err(|_| {
            Error::Invalid(format!(
                "{var}={list}: {entry:?} is no GPU number (set {GPUS_ENV} to the /dev/nvidiaN numbers)"
            ))
        })?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// This node's GPUs: `HPK_GPUS` if set (empty: none), else the Slurm step's or job's.
pub fn allocated(env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<u32>> {
    for var in [GPUS_ENV, "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
        if let Some(list) = env(var) {
            return parse_ids(var, &list);
        }
    }
    Ok(Vec::new())
}

/// Where this host keeps its GPUs and driver (`HPK_NVIDIA_DEV_DIR`, `HPK_NVIDIA_DRIVER_ROOT`).
pub fn host(env: &dyn Fn(&str) -> Option<String>) -> hpk_cdi::nvidia::Host {
    let default = hpk_cdi::nvidia::Host::default();
    hpk_cdi::nvidia::Host {
        dev_dir: env(DEV_DIR_ENV).map_or(default.dev_dir, PathBuf::from),
        driver_root: env(DRIVER_ROOT_ENV).map_or(default.driver_root, PathBuf::from),
    }
}

/// The GPUs of this machine (`/dev/nvidiaN` character devices in `dev_dir`), in order, less
/// those `CUDA_VISIBLE_DEVICES` (numbers) leaves out; for `hpk up` to share out.
pub fn on_this_machine(dev_dir: &Path, env: &dyn Fn(&str) -> Option<String>) -> Vec<u32> {
    use std::os::unix::fs::FileTypeExt;
    let mut ids: Vec<u32> = std::fs::read_dir(dev_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let id = e.file_name().to_str()?.strip_prefix("nvidia")?.parse::<u32>().ok()?;
            std::fs::metadata(e.path()).ok().filter(|m| m.file_type().is_char_device()).map(|_| id)
        })
        .collect();
    ids.sort_unstable();
    if let Some(Ok(visible)) = env("CUDA_VISIBLE_DEVICES").map(|l| parse_ids("CUDA_VISIBLE_DEVICES", &l)) {
        ids.retain(|id| visible.contains(id));
    }
    ids
}

/// `ids` shared out among `nodes` nodes, in order, as evenly as they go: among the workers
/// (every node but the first, the controller, which runs the control plane), or to the one
/// node when there is only the controller.
pub fn share_out(ids: &[u32], nodes: usize) -> Vec<Vec<u32>> {
    if nodes <= 1 {
        return vec![ids.to_vec()];
    }
    let workers = nodes - 1;
    std::iter::once(Vec::new())
        .chain((0..workers).map(|i| {
            let (from, to) = (ids.len() * i / workers, ids.len() * (i + 1) / workers);
            ids[from..to].to_vec()
        }))
        .collect()
}

/// Describes GPUs `ids` of `host` for the bubble of `node_dir`: the host's own spec from
/// `host_dirs` where it describes every one of them, else one made from the host; writes the
/// bubble's spec to `node_dir/cdi/` and returns the binds it needs. `None`: no GPUs (and any
/// earlier spec removed).
pub fn stage(
    node_dir: &Path,
    ids: &[u32],
    host: &hpk_cdi::nvidia::Host,
    host_dirs: &[PathBuf],
) -> Result<Option<Staged>> {
    let spec_path = node_dir.join("cdi").join(SPEC_FILE);
    let _ = std::fs::remove_file(&spec_path);
    if ids.is_empty() {
        return Ok(None);
    }
    let names: Vec<String> = ids.iter().map(u32::to_string).collect();
    let (registry, _) = hpk_cdi::Registry::load(host_dirs);
    let (mut spec, source) = match registry.subset(hpk_cdi::GPU_KIND, &names) {
        Ok(spec) => (spec, format!("the host's CDI spec ({})", list(host_dirs))),
        Err(_) => {
            let found = hpk_cdi::nvidia::generate(host, ids).map_err(|e| Error::Prerequisite {
                what: format!("the allocation's GPUs {names:?}: {e}"),
                fix: format!(
                    "run where the GPUs' device nodes are, or set {DEV_DIR_ENV} to their directory \
                     (and {DRIVER_ROOT_ENV} to the driver's root), or give the host a CDI spec \
                     (nvidia-ctk cdi generate)"
                ),
            })?;
            let source = format!(
                "made from {} and {} driver file(s) under {}",
                host.dev_dir.display(),
                found.driver_files,
                host.driver_root.display()
            );
            (found.spec, source)
        }
    };
    let mut binds = Vec::new();
    let mut rebind = |source: &str, device: bool| -> String {
        if let Some(b) = binds.iter().find(|b: &&GpuBind| b.source == Path::new(source)) {
            return b.dest.clone();
        }
        let name = Path::new(source).file_name().and_then(|n| n.to_str()).unwrap_or("file");
        let dest = format!("{BUBBLE_DIR}/{}-{name}", binds.len());
        binds.push(GpuBind { source: PathBuf::from(source), dest: dest.clone(), device });
        dest
    };
    let mut rewrite = |edits: &mut hpk_cdi::ContainerEdits| {
        for node in &mut edits.device_nodes {
            node.host_path = Some(rebind(node.source(), true));
        }
        for mount in &mut edits.mounts {
            mount.host_path = rebind(&mount.host_path, false);
        }
        // The kubelet numbers the devices inside each pod; a host spec's own value (NVIDIA's
        // says `void`, for its hook) would replace that.
        edits
            .env
            .retain(|e| !KUBELET_SETS.iter().any(|k| e.split_once('=').is_some_and(|(key, _)| key == *k)));
        // Hooks name the host's programs, which the bubble does not have.
        for hook in std::mem::take(&mut edits.hooks) {
            tracing::warn!(hook = %hook.path, "the host's CDI hook is not run in the bubble");
        }
    };
    rewrite(&mut spec.container_edits);
    for device in &mut spec.devices {
        rewrite(&mut device.container_edits);
    }
    for bind in &binds {
        if !bind.source.exists() {
            return Err(Error::Prerequisite {
                what: format!(
                    "{} (for the GPUs {names:?}) does not exist on this node",
                    bind.source.display()
                ),
                fix: "fix the host's CDI spec, or remove it so that HPK describes the GPUs itself".into(),
            });
        }
    }
    spec.validate().map_err(|e| Error::Invalid(format!("the bubble's GPU spec: {e}")))?;
    crate::image::create_private_dir(&node_dir.join("cdi"))?;
    crate::cluster::write_file(&spec_path, spec.to_json().as_bytes(), 0o644)?;
    Ok(Some(Staged { ids: ids.to_vec(), binds, source }))
}

fn list(dirs: &[PathBuf]) -> String {
    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        move |k| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_gpus_come_from_hpk_then_the_step_then_the_job() {
        assert_eq!(
            allocated(&env(&[("SLURM_JOB_GPUS", "0,1"), ("SLURM_STEP_GPUS", "1")])).expect("ids"),
            [1]
        );
        assert_eq!(allocated(&env(&[("SLURM_JOB_GPUS", "2,0")])).expect("ids"), [2, 0]);
        assert_eq!(
            allocated(&env(&[(GPUS_ENV, ""), ("SLURM_JOB_GPUS", "0")])).expect("ids"),
            Vec::<u32>::new()
        );
        assert_eq!(allocated(&env(&[])).expect("none"), Vec::<u32>::new());
        let err = allocated(&env(&[("SLURM_STEP_GPUS", "GPU-5d3f")])).expect_err("uuid").to_string();
        assert!(err.contains("SLURM_STEP_GPUS") && err.contains(GPUS_ENV), "{err}");
    }

    #[test]
    fn a_machines_gpus_are_shared_out_in_order() {
        assert_eq!(share_out(&[0, 1], 1), [vec![0, 1]], "the only node gets them all");
        assert_eq!(
            share_out(&[0, 1, 2, 3], 2),
            [vec![], vec![0, 1, 2, 3]],
            "the workers, not the controller"
        );
        assert_eq!(share_out(&[0, 1, 2], 3), [vec![], vec![0], vec![1, 2]]);
        assert_eq!(share_out(&[5], 3), [vec![], vec![], vec![5]]);
        assert_eq!(share_out(&[], 2), [Vec::<u32>::new(), vec![]]);
    }

    #[test]
    fn the_bubbles_spec_names_the_bound_paths_and_the_hosts_own_spec_wins() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dev = tmp.path().join("dev");
        std::fs::create_dir(&dev).expect("mkdir");
        let made = ["nvidia0", "nvidia1"].iter().enumerate().all(|(i, n)| {
            std::process::Command::new("mknod")
                .arg(dev.join(n))
                .args(["c", "195", &i.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        });
        if !made {
            eprintln!("skipped: mknod needs CAP_MKNOD (run as root, as CI does)");
            return;
        }
        let root = tmp.path().join("driver");
        std::fs::create_dir_all(root.join("usr/bin")).expect("mkdir");
        std::fs::write(root.join("usr/bin/nvidia-smi"), "#!/bin/sh\n").expect("write");
        let host = hpk_cdi::nvidia::Host { dev_dir: dev.clone(), driver_root: root };
        let node_dir = tmp.path().join("node");
        std::fs::create_dir(&node_dir).expect("mkdir");
        let no_host_specs = [tmp.path().join("etc-cdi")];

        let staged = stage(&node_dir, &[1], &host, &no_host_specs).expect("stage").expect("GPUs");
        assert!(staged.source.starts_with("made from"), "{}", staged.source);
        let dests: Vec<(&str, bool)> = staged.binds.iter().map(|b| (b.dest.as_str(), b.device)).collect();
        assert_eq!(dests, [("/run/hpk-gpu/0-nvidia-smi", false), ("/run/hpk-gpu/1-nvidia1", true)]);
        let text = std::fs::read_to_string(node_dir.join("cdi").join(SPEC_FILE)).expect("spec");
        let spec = hpk_cdi::Spec::parse(&text, false, Path::new("x.json")).expect("valid");
        assert_eq!(spec.devices.len(), 1);
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(
            (node.path.as_str(), node.host_path.as_deref()),
            ("/dev/nvidia1", Some("/run/hpk-gpu/1-nvidia1"))
        );
        assert_eq!(spec.container_edits.mounts[0].container_path, "/usr/bin/nvidia-smi");

        // The host's own spec, when it describes the GPU: used, its hook dropped.
        let etc = tmp.path().join("etc-cdi");
        std::fs::create_dir(&etc).expect("mkdir");
        let own = format!(
            r#"{{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{{"name":"1","containerEdits":{{"deviceNodes":[{{"path":"/dev/nvidia1","hostPath":"{}"}}]}}}}],
                "containerEdits":{{"env":["NVIDIA_VISIBLE_DEVICES=void","NVIDIA_DRIVER_CAPABILITIES=all"],
                                   "hooks":[{{"hookName":"createContainer","path":"/usr/bin/nvidia-ctk"}}]}}}}"#,
            dev.join("nvidia1").display()
        );
        std::fs::write(etc.join("nvidia.json"), own).expect("write");
        let staged = stage(&node_dir, &[1], &host, std::slice::from_ref(&etc)).expect("stage").expect("GPUs");
        assert!(staged.source.starts_with("the host's CDI spec"), "{}", staged.source);
        assert_eq!(staged.binds.len(), 1, "{staged:?}");
        let text = std::fs::read_to_string(node_dir.join("cdi").join(SPEC_FILE)).expect("spec");
        assert!(!text.contains("nvidia-ctk"), "{text}");
        assert!(!text.contains("void") && text.contains("NVIDIA_DRIVER_CAPABILITIES=all"), "{text}");
        // Not every GPU in it: made from the host instead.
        let staged = stage(&node_dir, &[0, 1], &host, &[etc]).expect("stage").expect("GPUs");
        assert!(staged.source.starts_with("made from"), "{}", staged.source);

        // A GPU the host does not have: refused, naming the fix; no spec left behind.
        let err = stage(&node_dir, &[7], &host, &no_host_specs).expect_err("no GPU 7").to_string();
        assert!(err.contains("nvidia7") && err.contains(DEV_DIR_ENV), "{err}");
        assert!(!node_dir.join("cdi").join(SPEC_FILE).exists());
        assert_eq!(stage(&node_dir, &[], &host, &no_host_specs).expect("none"), None);
        assert_eq!(on_this_machine(&dev, &env(&[])), [0, 1]);
        assert_eq!(on_this_machine(&dev, &env(&[("CUDA_VISIBLE_DEVICES", "1")])), [1]);
    }
}
