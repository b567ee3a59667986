//! Admission: a pod's requests counted against the node's allocatable, as the kubelet does for
//! pods bound without the scheduler (by nodeName). A pod that does not fit is rejected with
//! OutOfcpu / OutOfmemory / OutOfpods, never left Pending without a word.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use crate::quantity::{self, InvalidQuantity};

/// A request of the pod that does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestsError {
    /// A container's request or limit.
    #[error("container {container}: {resource}: {source}")]
    Container {
        /// The container.
        container: String,
        /// cpu, memory, nvidia.com/gpu.
        resource: &'static str,
        /// The quantity.
        #[source]
        source: InvalidQuantity,
    },
    /// The pod's overhead.
    #[error(transparent)]
    Overhead(#[from] InvalidQuantity),
}

/// Why a pod was not admitted: the kubelet's reason (OutOfcpu …) and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Rejection {
    /// OutOfcpu, OutOfmemory, OutOfpods, UnexpectedAdmissionError.
    pub reason: String,
    /// What did not fit.
    pub message: String,
}

/// The sysctls any pod may set (upstream's safe set): namespaced, and unable to affect other
/// pods or the node.
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// A sysctl name with `/` as its separator (`kernel/shm_rmid_forced`, which the API allows) in
/// the usual dotted form; the dots of a name written with slashes swap to slashes, as upstream
/// converts them (`net/ipv4/conf/eno2.100/rp_filter` → `net.ipv4.conf.eno2/100.rp_filter`).
pub fn dotted_sysctl(name: &str) -> String {
    let Some(first) = name.find(['.', '/']) else { return name.to_owned() };
    if name.as_bytes()[first] == b'.' {
        return name.to_owned();
    }
    name.chars()
        .map(|c| match c {
            '/' => '.',
            '.' => '/',
            other => other,
        })
        .collect()
}

/// Whether sysctl `name` (dotted) is safe or matches one of `allowed`
/// (`--allowed-unsafe-sysctls`: names, or prefixes ending in `*`).
fn sysctl_allowed(name: &str, allowed: &[String]) -> bool {
    SAFE_SYSCTLS.contains(&name)
        || allowed.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => a == name,
        })
}

/// The checks upstream's kubelet makes of a pod before its resources: the pod's OS is this
/// node's (`PodOSNotSupported`, `PodOSSelectorNodeLabelDoesNotMatch`), and every sysctl it
/// sets is safe or allowed (`SysctlForbidden`).
pub fn check_pod(pod: &Pod, allowed_unsafe_sysctls: &[String]) -> Result<(), Rejection> {
    let spec = pod.spec.as_ref();
    if let Some(os) = spec.and_then(|s| s.os.as_ref()).filter(|os| os.name != "linux") {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: format!(
                "Pod was rejected: Failed to admit pod as the OS field ({}) doesn't match node OS (linux)",
                os.name
            ),
        });
    }
    if let Some(os) = spec
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|n| n.get("kubernetes.io/os"))
        .filter(|os| *os != "linux")
    {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: format!(
                "Pod was rejected: Failed to admit pod as the `kubernetes.io/os` label ({os}) doesn't match node label (linux)"
            ),
        });
    }
    let sysctls = spec.and_then(|s| s.security_context.as_ref()).and_then(|c| c.sysctls.as_ref());
    for sysctl in sysctls.into_iter().flatten() {
        let name = dotted_sysctl(&sysctl.name);
        if !sysctl_allowed(&name, allowed_unsafe_sysctls) {
            return Err(Rejection {
                reason: "SysctlForbidden".into(),
                message: format!(
                    "Pod was rejected: forbidden sysctl: \"{name}\" not allowlisted (--allowed-unsafe-sysctls)"
                ),
            });
        }
    }
    Ok(())
}

/// CPU and memory one pod asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// Millicores.
    pub millicpu: i64,
    /// Bytes.
    pub memory: i64,
    /// GPUs (`nvidia.com/gpu`).
    pub gpus: i64,
}

/// The pod's effective requests: the larger of the sum over its containers and the largest
/// init container (init containers run one at a time), plus its overhead.
pub fn requests(pod: &Pod) -> Result<Requests, RequestsError> {
    let Some(spec) = pod.spec.as_ref() else { return Ok(Requests::default()) };
    let of = |c: &k8s_openapi::api::core::v1::Container| -> Result<Requests, RequestsError> {
        let r = c.resources.as_ref();
        let pick = |name: &str| {
            r.and_then(|r| r.requests.as_ref().and_then(|m| m.get(name)))
                .or_else(|| r.and_then(|r| r.limits.as_ref().and_then(|m| m.get(name))))
        };
        let bad = |resource: &'static str, source: InvalidQuantity| RequestsError::Container {
            container: c.name.clone(),
            resource,
            source,
        };
        Ok(Requests {
            millicpu: pick("cpu")
                .map(quantity::millicores)
                .transpose()
                .map_err(|e| bad("cpu", e))?
                .unwrap_or(0),
            memory: pick("memory")
                .map(quantity::units)
                .transpose()
                .map_err(|e| bad("memory", e))?
                .unwrap_or(0),
            gpus: pick("nvidia.com/gpu")
                .map(quantity::units)
                .transpose()
                .map_err(|e| bad("nvidia.com/gpu", e))?
                .unwrap_or(0),
        })
    };
    let mut sum = Requests::default();
    for c in &spec.containers {
        let r = of(c)?;
        sum.millicpu = sum.millicpu.saturating_add(r.millicpu);
        sum.memory = sum.memory.saturating_add(r.memory);
        sum.gpus = sum.gpus.saturating_add(r.gpus);
    }
    for c in spec.init_containers.iter().flatten() {
        let r = of(c)?;
        sum.millicpu = sum.millicpu.max(r.millicpu);
        sum.memory = sum.memory.max(r.memory);
        sum.gpus = sum.gpus.max(r.gpus);
    }
    for (name, q) in spec.overhead.iter().flatten() {
        match name.as_str() {
            "cpu" => sum.millicpu = sum.millicpu.saturating_add(quantity::millicores(q)?),
            "memory" => sum.memory = sum.memory.saturating_add(quantity::units(q)?),
            _ => {}
        }
    }
    Ok(sum)
}

/// What the node can give.
#[derive(Clone, Copy, Debug, Default)]
pub struct Allocatable {
    /// Millicores.
    pub millicpu: i64,
    /// Bytes.
    pub memory: i64,
    /// GPUs.
    pub gpus: i64,
    /// Pods.
    pub pods: i64,
}

/// A host port a pod asks for: protocol, host IP (empty: every address) and port.
pub type HostPort = (String, String, i32);

/// The host ports `pod`'s containers (and sidecars) ask for.
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = &pod.spec else { return Vec::new() };
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .chain(&spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|h| *h > 0)?;
            let ip = p.host_ip.clone().filter(|ip| ip != "0.0.0.0").unwrap_or_default();
            Some((p.protocol.clone().unwrap_or_else(|| "TCP".into()), ip, port))
        })
        .collect()
}

/// Whether two host ports clash: same protocol and port, and the same host IP or either on
/// every address (the scheduler's NodePorts rule).
fn clash(a: &HostPort, b: &HostPort) -> bool {
    a.0 == b.0 && a.2 == b.2 && (a.1 == b.1 || a.1.is_empty() || b.1.is_empty())
}

/// The pods admitted on this node and what they asked for.
#[derive(Debug, Default)]
pub struct Admitted {
    pods: HashMap<String, Requests>,
    ports: HashMap<String, Vec<HostPort>>,
}

impl Admitted {
    /// Admits pod `uid` as [`Admitted::admit`] does, and only if none of its host ports
    /// clashes with another admitted pod's (rejected `NodePorts`, as the scheduler's rule the
    /// kubelet runs again at admission).
    pub fn admit_with_ports(
        &mut self,
        uid: &str,
        req: Requests,
        ports: Vec<HostPort>,
        alloc: Allocatable,
    ) -> Result<(), Rejection> {
        if !self.pods.contains_key(uid) {
            for (other, theirs) in &self.ports {
                if other == uid {
                    continue;
                }
                if let Some(p) = ports.iter().find(|p| theirs.iter().any(|t| clash(p, t))) {
                    return Err(Rejection {
                        reason: "NodePorts".into(),
                        message: format!(
                            "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports ({} {}{})",
                            p.0,
                            if p.1.is_empty() { String::new() } else { format!("{}:", p.1) },
                            p.2
                        ),
                    });
                }
            }
        }
        self.admit(uid, req, alloc)?;
        if !ports.is_empty() {
            self.ports.insert(uid.to_owned(), ports);
        }
        Ok(())
    }

    /// Admits pod `uid` asking `req` if it fits in `alloc` beside the others; otherwise the
    /// reason (OutOfcpu …) and message of the rejection.
    pub fn admit(&mut self, uid: &str, req: Requests, alloc: Allocatable) -> Result<(), Rejection> {
        if self.pods.contains_key(uid) {
            return Ok(());
        }
        let used = self.used();
        let count = i64::try_from(self.pods.len()).unwrap_or(i64::MAX);
        let checks = [
            ("pods", 1, count, alloc.pods),
            ("cpu", req.millicpu, used.millicpu, alloc.millicpu),
            ("memory", req.memory, used.memory, alloc.memory),
            ("nvidia.com/gpu", req.gpus, used.gpus, alloc.gpus),
        ];
        for (name, asked, in_use, capacity) in checks {
            if asked > 0 && asked.saturating_add(in_use) > capacity {
                let reason = match name {
                    "nvidia.com/gpu" => "UnexpectedAdmissionError".to_owned(),
                    other => format!("OutOf{other}"),
                };
                return Err(Rejection {
                    reason,
                    message: format!(
                        "Pod was rejected: Node didn't have enough resource: {name}, requested: {asked}, used: {in_use}, capacity: {capacity}"
                    ),
                });
            }
        }
        self.pods.insert(uid.to_owned(), req);
        Ok(())
    }

    /// Gives admitted pod `uid` `req` instead of what it had (an in-place resize) if that fits
    /// beside the others; otherwise it keeps what it had, and the answer says whether the node
    /// could ever give it (`Infeasible`) or not now (`Deferred`), with a message.
    pub fn resize(&mut self, uid: &str, req: Requests, alloc: Allocatable) -> Result<(), Rejection> {
        for (name, asked, capacity) in
            [("cpu", req.millicpu, alloc.millicpu), ("memory", req.memory, alloc.memory)]
        {
            if asked > capacity {
                return Err(Rejection {
                    reason: "Infeasible".into(),
                    message: format!(
                        "Node didn't have enough capacity: {name}, requested: {asked}, capacity: {capacity}"
                    ),
                });
            }
        }
        let Some(old) = self.pods.remove(uid) else {
            return Err(Rejection { reason: "Deferred".into(), message: "the pod is not admitted".into() });
        };
        let req = Requests { gpus: old.gpus, ..req };
        let used = self.used();
        for (name, asked, in_use, capacity) in [
            ("cpu", req.millicpu, used.millicpu, alloc.millicpu),
            ("memory", req.memory, used.memory, alloc.memory),
        ] {
            if asked > 0 && asked.saturating_add(in_use) > capacity {
                self.pods.insert(uid.to_owned(), old);
                return Err(Rejection {
                    reason: "Deferred".into(),
                    message: format!(
                        "Node didn't have enough resource: {name}, requested: {asked}, used: {in_use}, capacity: {capacity}"
                    ),
                });
            }
        }
        self.pods.insert(uid.to_owned(), req);
        Ok(())
    }

    /// Records a pod that already runs (adopted after a restart), fitting or not.
    pub fn adopt(&mut self, uid: &str, req: Requests, ports: Vec<HostPort>) {
        self.pods.insert(uid.to_owned(), req);
        if !ports.is_empty() {
            self.ports.insert(uid.to_owned(), ports);
        }
    }

    /// Forgets pod `uid`.
    pub fn release(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.ports.remove(uid);
    }

    /// The sum of the admitted pods' requests.
    pub fn used(&self) -> Requests {
        self.pods.values().fold(Requests::default(), |a, r| Requests {
            millicpu: a.millicpu.saturating_add(r.millicpu),
            memory: a.memory.saturating_add(r.memory),
            gpus: a.gpus.saturating_add(r.gpus),
        })
    }

    /// How many pods are admitted.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_of_another_os_or_with_an_unsafe_sysctl_is_rejected() {
        let with = |spec: serde_json::Value| -> Pod {
            let mut full = serde_json::json!({"containers": [{"name": "a", "image": "i"}]});
            if let (Some(f), Some(more)) = (full.as_object_mut(), spec.as_object()) {
                f.extend(more.clone());
            }
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": full})).expect("pod")
        };
        let reason = |p: &Pod, allowed: &[String]| check_pod(p, allowed).err().map(|r| r.reason);
        assert_eq!(reason(&with(serde_json::json!({})), &[]), None);
        assert_eq!(reason(&with(serde_json::json!({"os": {"name": "linux"}})), &[]), None);
        assert_eq!(
            reason(&with(serde_json::json!({"os": {"name": "windows"}})), &[]).as_deref(),
            Some("PodOSNotSupported")
        );
        let selector = with(serde_json::json!({"nodeSelector": {"kubernetes.io/os": "windows"}}));
        assert_eq!(reason(&selector, &[]).as_deref(), Some("PodOSSelectorNodeLabelDoesNotMatch"));
        let sysctls = |names: &[&str]| {
            let list: Vec<_> = names.iter().map(|n| serde_json::json!({"name": n, "value": "1"})).collect();
            with(serde_json::json!({"securityContext": {"sysctls": list}}))
        };
        assert_eq!(reason(&sysctls(&["kernel.shm_rmid_forced", "kernel/shm_rmid_forced"]), &[]), None);
        let unsafe_one = sysctls(&["kernel.shm_rmid_forced", "kernel.msgmax"]);
        let rejection = check_pod(&unsafe_one, &[]).expect_err("unsafe");
        assert_eq!(rejection.reason, "SysctlForbidden");
        assert!(rejection.message.contains("kernel.msgmax"), "{}", rejection.message);
        assert_eq!(reason(&unsafe_one, &["kernel.msgmax".into()]), None, "allowed by name");
        assert_eq!(reason(&unsafe_one, &["kernel.msg*".into()]), None, "allowed by prefix");
        assert_eq!(
            reason(&sysctls(&["net.core.somaxconn"]), &["kernel.*".into()]).as_deref(),
            Some("SysctlForbidden")
        );
    }

    #[test]
    fn sysctl_names_with_slashes_are_dotted() {
        assert_eq!(dotted_sysctl("kernel/shm_rmid_forced"), "kernel.shm_rmid_forced");
        assert_eq!(dotted_sysctl("kernel.shm_rmid_forced"), "kernel.shm_rmid_forced");
        assert_eq!(dotted_sysctl("net/ipv4/conf/eno2.100/rp_filter"), "net.ipv4.conf.eno2/100.rp_filter");
        assert_eq!(dotted_sysctl("net.ipv4.conf.eno2/100.rp_filter"), "net.ipv4.conf.eno2/100.rp_filter");
        assert_eq!(dotted_sysctl("plain"), "plain");
    }

    fn pod(cpu: &str, init_cpu: Option<&str>) -> Pod {
        let mut spec = serde_json::json!({"containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}},
            {"name": "b", "image": "i", "resources": {"limits": {"cpu": "100m"}}}
        ]});
        if let Some(c) = init_cpu {
            spec["initContainers"] =
                serde_json::json!([{"name": "i", "image": "i", "resources": {"requests": {"cpu": c}}}]);
        }
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    #[test]
    fn requests_sum_containers_and_take_the_larger_init() {
        assert_eq!(requests(&pod("500m", None)), Ok(Requests { millicpu: 600, memory: 64 << 20, gpus: 0 }));
        assert_eq!(requests(&pod("500m", Some("2"))).map(|r| r.millicpu), Ok(2000));
        assert!(
            requests(&pod("lots", None)).expect_err("bad quantity").to_string().contains("container a: cpu")
        );
    }

    #[test]
    fn a_pod_that_does_not_fit_is_rejected_with_the_kubelets_reason() {
        let alloc = Allocatable { millicpu: 2000, memory: 1 << 30, gpus: 0, pods: 2 };
        let mut admitted = Admitted::default();
        let r = Requests { millicpu: 1500, memory: 0, gpus: 0 };
        admitted.admit("1", r, alloc).expect("fits");
        let Rejection { reason, message } = admitted.admit("2", r, alloc).expect_err("cpu");
        assert_eq!(reason, "OutOfcpu");
        assert!(message.contains("requested: 1500, used: 1500, capacity: 2000"), "{message}");
        admitted.admit("3", Requests::default(), alloc).expect("fits: no requests");
        assert_eq!(admitted.admit("4", Requests::default(), alloc).expect_err("pods").reason, "OutOfpods");
        admitted.release("1");
        admitted.admit("2", r, alloc).expect("fits after release");
    }

    #[test]
    fn a_resize_fits_beside_the_others_or_is_infeasible_or_deferred_and_keeps_the_old() {
        let alloc = Allocatable { millicpu: 2000, memory: 1 << 30, gpus: 0, pods: 10 };
        let mut admitted = Admitted::default();
        let r = |millicpu| Requests { millicpu, memory: 0, gpus: 0 };
        admitted.admit("a", r(500), alloc).expect("a");
        admitted.admit("b", r(1000), alloc).expect("b");
        admitted.resize("a", r(1000), alloc).expect("grows into what is free");
        assert_eq!(admitted.used().millicpu, 2000);
        let deferred = admitted.resize("a", r(1500), alloc).expect_err("b holds the rest");
        assert_eq!(deferred.reason, "Deferred");
        assert_eq!(admitted.used().millicpu, 2000, "the old requests are kept");
        let infeasible = admitted.resize("a", r(3000), alloc).expect_err("more than the node");
        assert_eq!(infeasible.reason, "Infeasible");
        admitted.resize("a", r(100), alloc).expect("shrinks");
        assert_eq!(admitted.used().millicpu, 1100);
    }

    #[test]
    fn a_host_port_another_pod_holds_is_rejected_and_free_again_once_it_goes() {
        let alloc = Allocatable { millicpu: 2000, memory: 1 << 30, gpus: 0, pods: 10 };
        let port = |proto: &str, ip: &str, p| (proto.to_owned(), ip.to_owned(), p);
        let mut admitted = Admitted::default();
        admitted.admit_with_ports("a", Requests::default(), vec![port("TCP", "", 8080)], alloc).expect("a");
        let r = admitted
            .admit_with_ports("b", Requests::default(), vec![port("TCP", "10.0.0.1", 8080)], alloc)
            .expect_err("any address clashes");
        assert_eq!(r.reason, "NodePorts");
        assert!(r.message.contains("8080"), "{}", r.message);
        // Another protocol, or another port: fine.
        admitted.admit_with_ports("c", Requests::default(), vec![port("UDP", "", 8080)], alloc).expect("udp");
        admitted
            .admit_with_ports("d", Requests::default(), vec![port("TCP", "", 8081)], alloc)
            .expect("8081");
        admitted.release("a");
        admitted
            .admit_with_ports("b", Requests::default(), vec![port("TCP", "10.0.0.1", 8080)], alloc)
            .expect("freed");
        // Two host IPs side by side.
        admitted
            .admit_with_ports("e", Requests::default(), vec![port("TCP", "10.0.0.2", 8080)], alloc)
            .expect("ip");
    }

    #[test]
    fn host_ports_are_read_from_containers_and_sidecars() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "once", "image": "i", "ports": [{"containerPort": 1, "hostPort": 1001}]},
                {"name": "side", "image": "i", "restartPolicy": "Always", "ports": [{"containerPort": 2, "hostPort": 1002}]}],
            "containers": [{"name": "c", "image": "i", "ports": [
                {"containerPort": 3, "hostPort": 1003, "protocol": "UDP", "hostIP": "0.0.0.0"},
                {"containerPort": 4}]}]}}))
        .expect("pod");
        assert_eq!(
            host_ports(&pod),
            [("TCP".to_owned(), String::new(), 1002), ("UDP".to_owned(), String::new(), 1003)]
        );
    }
}
