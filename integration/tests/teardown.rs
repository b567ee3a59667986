//! Teardown leaves nothing behind: no process, namespace, bridge, mount or file — also when the
//! test using the harness panics midway.

use std::path::PathBuf;
use std::sync::mpsc;

use hpk_integration::controlplane::{self, ControlPlane};

/// What a running harness owns, recorded so it can be checked after teardown.
#[derive(Debug)]
struct Traces {
    pids: Vec<(String, u32)>,
    namespaces: Vec<String>,
    bridge: String,
    dir: PathBuf,
}

impl Traces {
    fn of(cp: &ControlPlane) -> Self {
        Self {
            pids: cp.pids(),
            namespaces: cp.network().hosts().iter().map(|h| h.netns.clone()).collect(),
            bridge: cp.network().bridge().to_owned(),
            dir: cp.dir().to_owned(),
        }
    }

    fn assert_alive(&self) {
        for (name, pid) in &self.pids {
            assert!(PathBuf::from(format!("/proc/{pid}")).exists(), "{name} not running");
        }
        assert!(self.dir.exists());
    }

    fn assert_gone(&self) {
        for (name, pid) in &self.pids {
            assert!(!PathBuf::from(format!("/proc/{pid}")).exists(), "{name} (pid {pid}) still running");
        }
        let listed = hpk_integration::netns::ip(&["netns", "list"]).expect("ip netns list");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        for ns in &self.namespaces {
            assert!(!listed.contains(ns.as_str()), "namespace {ns} remains");
            assert!(!mounts.contains(ns.as_str()), "mount of {ns} remains");
            assert!(!PathBuf::from("/run/netns").join(ns).exists(), "/run/netns/{ns} remains");
        }
        assert!(
            !PathBuf::from("/sys/class/net").join(&self.bridge).exists(),
            "bridge {} remains",
            self.bridge
        );
        assert!(!self.dir.exists(), "{} remains", self.dir.display());
    }
}

fn run_in_thread(panic_midway: bool) -> (Traces, bool) {
    let (tx, rx) = mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let cp = ControlPlane::start(&["node1", "node2"]).await.expect("control plane");
            let traces = Traces::of(&cp);
            traces.assert_alive();
            tx.send(traces).expect("send traces");
            assert!(!panic_midway, "the test panics midway, with the control plane running");
            drop(cp);
        });
    })
    .join();
    (rx.recv().expect("traces"), outcome.is_err())
}

#[test]
fn teardown_after_a_normal_end_leaves_nothing() {
    if hpk_integration::skip_unless_available(controlplane::bin_dir()).is_none() {
        return;
    }
    let (traces, panicked) = run_in_thread(false);
    assert!(!panicked);
    traces.assert_gone();
}

#[test]
fn teardown_after_a_panic_midway_leaves_nothing() {
    if hpk_integration::skip_unless_available(controlplane::bin_dir()).is_none() {
        return;
    }
    let (traces, panicked) = run_in_thread(true);
    assert!(panicked, "the inner test was meant to panic");
    traces.assert_gone();
}
