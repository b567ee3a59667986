//! CRI `Status` says what is true: RuntimeReady once crun runs over the runtime's state, and
//! NetworkReady only while the net-forwarder that gives pods their addresses answers SERVING
//! (`crictl info`, as the kubelet asks it).

mod support;

use support::{CRICTL_TOOLS, Runtime, tools_present};

fn conditions(runtime: &Runtime) -> Vec<serde_json::Value> {
    let info: serde_json::Value = serde_json::from_str(&runtime.ok(&["info"])).expect("crictl info JSON");
    info["status"]["conditions"].as_array().cloned().unwrap_or_default()
}

fn condition<'a>(all: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    all.iter().find(|c| c["type"] == kind).unwrap_or_else(|| panic!("no {kind} in {all:?}"))
}

#[test]
fn network_ready_follows_the_net_forwarder() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // A net-forwarder that is not there: pods could get no address.
    let missing = dir.path().join("nf/missing.sock");
    let runtime = Runtime::start_with(
        dir.path(),
        "127.0.0.1:1",
        &[&format!("--net-forwarder-socket={}", missing.display())],
    );
    let all = conditions(&runtime);
    assert_eq!(condition(&all, "RuntimeReady")["status"], true, "{all:?}");
    let network = condition(&all, "NetworkReady");
    assert_eq!(network["status"], false, "{all:?}");
    assert_eq!(network["reason"], "NetForwarderNotReady");
    assert!(network["message"].as_str().unwrap_or_default().contains("cannot be reached"), "{network}");
    drop(runtime);

    // Without a net-forwarder configured, pods get loopback only, as designed: ready.
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::start(dir.path(), "127.0.0.1:1");
    let all = conditions(&runtime);
    assert_eq!(condition(&all, "NetworkReady")["status"], true, "{all:?}");
    assert_eq!(condition(&all, "NetworkReady")["reason"], "LoopbackOnly");
    assert_eq!(condition(&all, "RuntimeReady")["status"], true, "{all:?}");
}
