//! What `scontrol show job -o` says about a job.

/// A job as slurmctld reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// The job ID.
    pub id: u32,
    /// `PENDING`, `RUNNING`, `COMPLETING`, `COMPLETED`, `CANCELLED`, `TIMEOUT`, `FAILED`, …
    pub state: String,
    /// Why it is in that state (`None`, `Resources`, …).
    pub reason: String,
    /// The nodes it holds or held, expanded (`node[1-2]` gives `node1`, `node2`); empty while
    /// pending.
    pub nodes: Vec<String>,
    /// `status:signal`, as Slurm prints it (`0:0`, `1:0`, `0:15`).
    pub exit_code: String,
}

impl JobInfo {
    /// Parses one line of `scontrol show job -o`. Values may contain spaces (a job name, a
    /// command line): only the first occurrence of each key is taken, and the keys read here
    /// come before any free-text field.
    pub(super) fn parse(line: &str) -> Option<Self> {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|token| token.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_owned)
        };
        let nodes = match field("NodeList")?.as_str() {
            "" | "(null)" => Vec::new(),
            list => expand_hostlist(list),
        };
        Some(Self {
            id: field("JobId")?.parse().ok()?,
            state: field("JobState")?,
            reason: field("Reason").unwrap_or_default(),
            nodes,
            exit_code: field("ExitCode").unwrap_or_default(),
        })
    }
}

/// What a running job holds on one node, from `scontrol show job -d`'s detail lines
/// (`Nodes=node[1-2] CPU_IDs=0-1 Mem=1536 GRES=gpu:1(IDX:0)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAllocation {
    /// The node.
    pub node: String,
    /// CPUs (the count of `CPU_IDs`).
    pub cpus: u32,
    /// Memory, in MB (Slurm's MB are MiB).
    pub memory_mb: u64,
    /// GPUs (`GRES=gpu:N(…)`, typed or not).
    pub gpus: u32,
}

/// Every node's allocation in `scontrol show job -d` output.
pub fn parse_allocation(text: &str) -> Vec<NodeAllocation> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| l.starts_with("Nodes=") && l.contains("CPU_IDs=")) {
        let field = |key: &str| {
            line.split_whitespace().find_map(|t| t.strip_prefix(key)?.strip_prefix('=')).unwrap_or_default()
        };
        let cpus = field("CPU_IDs").split(',').filter(|r| !r.is_empty()).map(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            match (lo.parse::<u32>(), hi.parse::<u32>()) {
                (Ok(l), Ok(h)) if h >= l => h - l + 1,
                _ => 0,
            }
        });
        let gpus = field("GRES").split(',').filter_map(|g| {
            let rest = g.strip_prefix("gpu:")?;
            let count = rest.split('(').next()?;
            // `gpu:2` or `gpu:a100:2`
            count.rsplit(':').next()?.parse::<u32>().ok()
        });
        let (cpus, gpus): (u32, u32) = (cpus.sum(), gpus.sum());
        let memory_mb = field("Mem").parse().unwrap_or(0);
        for node in expand_hostlist(field("Nodes")) {
            out.push(NodeAllocation { node, cpus, memory_mb, gpus });
        }
    }
    out
}

/// Expands a Slurm hostlist (`node[1-3,5],login`) into names.
pub fn expand_hostlist(list: &str) -> Vec<String> {
    let mut names = Vec::new();
    for group in split_outside_brackets(list) {
        let Some((prefix, rest)) = group.split_once('[') else {
            names.push(group.to_owned());
            continue;
        };
        let (ranges, suffix) = rest.split_once(']').unwrap_or((rest, ""));
        for range in ranges.split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            match (lo.parse::<u32>(), hi.parse::<u32>()) {
                (Ok(l), Ok(h)) => {
                    // Keep zero padding: `node[01-02]` gives `node01`, `node02`.
                    let width = lo.len();
                    names.extend((l..=h).map(|n| format!("{prefix}{n:0width$}{suffix}")));
                }
                _ => names.push(format!("{prefix}{range}{suffix}")),
            }
        }
    }
    names
}

fn split_outside_brackets(list: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_expand() {
        assert_eq!(expand_hostlist("node[1-3]"), ["node1", "node2", "node3"]);
        assert_eq!(expand_hostlist("node[1,3],ctl"), ["node1", "node3", "ctl"]);
        assert_eq!(expand_hostlist("node2"), ["node2"]);
        assert_eq!(expand_hostlist("n[08-10]"), ["n08", "n09", "n10"]);
    }

    #[test]
    fn a_job_line_parses() {
        let line = "JobId=12 JobName=my job UserId=u(1001) JobState=RUNNING Reason=None ExitCode=0:0 \
                    NodeList=node[1-2] BatchHost=node1 Command=/home/u/run it.sh";
        let job = JobInfo::parse(line).expect("parses");
        assert_eq!(job.id, 12);
        assert_eq!(job.state, "RUNNING");
        assert_eq!(job.reason, "None");
        assert_eq!(job.nodes, ["node1", "node2"]);
        assert_eq!(job.exit_code, "0:0");
    }

    #[test]
    fn a_pending_job_has_no_nodes() {
        let line = "JobId=3 JobState=PENDING Reason=Resources ExitCode=0:0 NodeList=(null)";
        assert!(JobInfo::parse(line).expect("parses").nodes.is_empty());
    }

    #[test]
    fn allocations_per_node_from_the_detail_lines() {
        let text = "JobId=2 JobName=wrap\n   NumNodes=3 NumCPUs=4\n   JOB_GRES=gpu:4\n     Nodes=node[1-2] CPU_IDs=0-1 Mem=1536 GRES=gpu:2(IDX:0-1)\n     Nodes=node3 CPU_IDs=0,2-3 Mem=700 GRES=gpu:a100:1(IDX:1)\n   MinCPUsNode=1\n";
        let got = parse_allocation(text);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], NodeAllocation { node: "node1".into(), cpus: 2, memory_mb: 1536, gpus: 2 });
        assert_eq!(got[1].node, "node2");
        assert_eq!(got[2], NodeAllocation { node: "node3".into(), cpus: 3, memory_mb: 700, gpus: 1 });
        let no_gpus = parse_allocation("     Nodes=node1 CPU_IDs=0 Mem=512 GRES=\n");
        assert_eq!(no_gpus[0].gpus, 0);
    }
}
