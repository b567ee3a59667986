//! Faults in a local cluster: each service of a bubble killed with SIGKILL comes back (the
//! bubble's supervisor restarts it) while the pods keep running with their addresses; a whole
//! worker bubble killed turns its node NotReady and its Deployment's pods come back on the
//! other node.

mod support;

use std::time::Duration;

use support::{Env, bubble_processes, eventually_or, prerequisites, text};

fn service_pid(cluster: &str, node: &str, binary: &str) -> Option<u32> {
    bubble_processes(cluster, node)
        .into_iter()
        .find(|(_, c)| c.starts_with(&format!("/usr/local/bin/{binary} ")))
        .map(|(p, _)| p)
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_services_restart_and_a_lost_bubble_moves_its_pods() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let up = env.up("fault", 2);
    assert!(up.status.success(), "hpk up failed:\n{}", text(&up));
    let container = format!("- {{name: httpd, image: {}}}", env.httpd);
    env.apply(
        "fault",
        &hpk_test_support::manifest::spread_deployment("web", 2, "ScheduleAnyway", Some(1), &container),
    );
    let pods = |want_nodes: usize| {
        eventually_or(
            "web pods Running",
            Duration::from_secs(180),
            || {
                let out = env.kubectl("fault", &[
                    "get", "pods", "-l", "app=web", "-o",
                    "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase} {.status.podIP} {.status.containerStatuses[0].restartCount} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
                ]);
                let rows: Vec<Vec<String>> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                    .filter(|w| w.len() == 5) // no deletionTimestamp: not terminating
                    .collect();
                let nodes: std::collections::BTreeSet<&String> = rows.iter().map(|r| &r[1]).collect();
                (rows.len() == 2 && rows.iter().all(|r| r[2] == "Running") && nodes.len() == want_nodes)
                    .then_some(rows)
            },
            || env.diagnose("fault"),
        )
    };
    let before = pods(2);
    let on_worker = before.iter().find(|r| r[1] == "fault-2").expect("a pod on the worker").clone();
    let on_controller = before.iter().find(|r| r[1] == "fault-1").expect("a pod on the controller").clone();

    for service in ["hpk-kubelet", "hpk-pod-runtime", "hpk-net-forwarder"] {
        let old = service_pid("fault", "fault-2", service)
            .unwrap_or_else(|| panic!("{service} in the worker bubble"));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), nix::sys::signal::Signal::SIGKILL)
            .expect("kill");
        let new = eventually_or(
            &format!("{service} restarted"),
            Duration::from_secs(60),
            || service_pid("fault", "fault-2", service).filter(|p| *p != old),
            || env.diagnose("fault"),
        );
        eprintln!("{service}: killed {old}, restarted as {new}");
        eventually_or(
            &format!("fault-2 Ready after {service} restarted"),
            Duration::from_secs(60),
            || {
                let out = env.kubectl(
                    "fault",
                    &[
                        "get",
                        "node",
                        "fault-2",
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ],
                );
                (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
            },
            || env.diagnose("fault"),
        );
        // The pod: same name, same address, never restarted, and it still answers from the
        // other node across the tunnel.
        let now = pods(2);
        let same = now
            .iter()
            .find(|r| r[0] == on_worker[0])
            .unwrap_or_else(|| panic!("{} gone after {service}: {now:?}", on_worker[0]));
        assert_eq!(
            (&same[3], &same[4]),
            (&on_worker[3], &"0".to_owned()),
            "after killing {service}: {same:?}"
        );
        let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {} 8080", on_worker[3]);
        let answer = eventually_or(
            &format!("{} reachable after {service}", on_worker[0]),
            Duration::from_secs(30),
            || {
                let out = env.kubectl("fault", &["exec", &on_controller[0], "--", "sh", "-c", &script]);
                let t = String::from_utf8_lossy(&out.stdout).into_owned();
                t.contains("busybox httpd").then_some(t)
            },
            || env.diagnose("fault"),
        );
        assert!(answer.contains("200"), "{answer}");
    }

    // The whole worker bubble: its first process killed, so the kernel ends all of it.
    let init = bubble_processes("fault", "fault-2")
        .into_iter()
        .find(|(_, c)| c.contains("bubble-init") && !c.contains("--supervise"))
        .expect("the worker's bubble-init")
        .0;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init as i32), nix::sys::signal::Signal::SIGKILL)
        .expect("kill");
    eventually_or(
        "fault-2 not Ready",
        Duration::from_secs(60),
        || {
            let out = env.kubectl(
                "fault",
                &[
                    "get",
                    "node",
                    "fault-2",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
            );
            (String::from_utf8_lossy(&out.stdout) != "True").then_some(())
        },
        || env.diagnose("fault"),
    );
    let after = pods(1);
    assert!(after.iter().all(|r| r[1] == "fault-1"), "both pods on the remaining node: {after:?}");
    let status = text(&env.hpk(&["status", "--name", "fault"]).output().expect("hpk status"));
    assert!(
        status.lines().any(|l| l.starts_with("fault-2") && l.contains("Gone"))
            || !status.contains("fault-2 "),
        "{status}"
    );

    let footprint = env.footprint("fault");
    let down = env.down("fault");
    assert!(down.status.success(), "{}", text(&down));
    assert!(env.leftovers(&footprint).is_empty(), "{:#?}", env.leftovers(&footprint));
}
