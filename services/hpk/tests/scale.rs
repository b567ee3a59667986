//! Many bubbles on one machine: `hpk up --nodes 10` brings every node Ready, a pod on each node
//! reaches the pod on every node and a Service by name (the 10 × 10 reachability matrix), and
//! `hpk down` leaves nothing. The times and memory of the same clusters are measured by
//! `cargo bench -p hpk --bench scale` (docs/benchmarks.md).

mod support;

use support::{Env, prerequisites, reachability_matrix, text};

const NODES: usize = 10;

#[tokio::test(flavor = "multi_thread")]
async fn ten_bubbles_are_ready_and_every_pod_reaches_every_node_and_the_service() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let up = env.up("ten", NODES as u16);
    let output = text(&up);
    assert!(up.status.success(), "hpk up --nodes {NODES}:\n{output}");
    assert!(output.contains(&format!("{NODES} node(s) Ready")), "{output}");
    let nodes = env.kubectl_ok("ten", &["get", "nodes", "--no-headers"]);
    let ready = nodes.lines().filter(|l| l.split_whitespace().nth(1) == Some("Ready")).count();
    assert_eq!(ready, NODES, "{nodes}");

    let matrix = reachability_matrix(&env, "ten", NODES);
    println!("{}", matrix.table());
    let failures = matrix.failures();
    assert!(failures.is_empty(), "unreachable:\n{}\n{}", failures.join("\n"), env.diagnose("ten"));
    let distinct: std::collections::BTreeSet<&String> = matrix.nodes.iter().collect();
    assert_eq!(distinct.len(), NODES, "one pod on each node: {:?}", matrix.nodes);

    let footprint = env.footprint("ten");
    let down = env.down("ten");
    assert!(down.status.success(), "hpk down: {}", text(&down));
    let left = env.leftovers(&footprint);
    assert!(left.is_empty(), "left behind: {left:#?}");
}
