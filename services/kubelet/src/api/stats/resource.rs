//! `/metrics/resource`: the Prometheus text metrics-server scrapes, written as upstream's kubelet
//! writes it: families sorted by name and left out when they have no sample, samples sorted by
//! their labels, values in Go's shortest `%g` form, timestamps in milliseconds.

use super::summary::{CpuStats, MemoryStats, Summary, Timestamp};

/// The content type of the text exposition format the metrics are written in.
pub const RESOURCE_METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const CONTAINER_LABELS: &[&str] = &["container", "namespace", "pod"];
const POD_LABELS: &[&str] = &["namespace", "pod"];

/// One metric family.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    label_names: &'static [&'static str],
    samples: Vec<Sample>,
}

/// One sample: label values in the family's label order.
struct Sample {
    labels: Vec<String>,
    value: f64,
    time: Option<Timestamp>,
}

impl Family {
    fn new(
        name: &'static str,
        kind: &'static str,
        label_names: &'static [&'static str],
        help: &'static str,
    ) -> Self {
        Self { name, help, kind, label_names, samples: Vec::new() }
    }
}

/// The metrics of `summary`, with `resource_scrape_error 0`.
pub fn resource_metrics(summary: &Summary) -> String {
    render(families(summary, 0.0))
}

/// What to serve when the summary could not be gathered: `resource_scrape_error 1` alone.
pub fn resource_scrape_failed() -> String {
    render(families(&Summary::default(), 1.0))
}

/// Every family, in name order.
fn families(summary: &Summary, scrape_error: f64) -> Vec<Family> {
    let mut container_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "counter",
        CONTAINER_LABELS,
        "Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut container_memory = Family::new(
        "container_memory_working_set_bytes",
        "gauge",
        CONTAINER_LABELS,
        "Current working set of the container in bytes",
    );
    let mut container_start = Family::new(
        "container_start_time_seconds",
        "gauge",
        CONTAINER_LABELS,
        "Start time of the container since unix epoch in seconds",
    );
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "counter",
        &[],
        "Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut node_memory = Family::new(
        "node_memory_working_set_bytes",
        "gauge",
        &[],
        "Current working set of the node in bytes",
    );
    let mut pod_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "counter",
        POD_LABELS,
        "Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut pod_memory = Family::new(
        "pod_memory_working_set_bytes",
        "gauge",
        POD_LABELS,
        "Current working set of the pod in bytes",
    );
    let mut scrape = Family::new(
        "resource_scrape_error",
        "gauge",
        &[],
        "1 if there was an error while getting container metrics, 0 otherwise",
    );
    scrape.samples.push(Sample { labels: Vec::new(), value: scrape_error, time: None });

    node_cpu.samples.extend(cpu_sample(Vec::new(), summary.node.cpu.as_ref()));
    node_memory.samples.extend(memory_sample(Vec::new(), summary.node.memory.as_ref()));
    for pod in &summary.pods {
        let (namespace, name) = (&pod.pod_ref.namespace, &pod.pod_ref.name);
        let labels = || vec![namespace.clone(), name.clone()];
        pod_cpu.samples.extend(cpu_sample(labels(), pod.cpu.as_ref()));
        pod_memory.samples.extend(memory_sample(labels(), pod.memory.as_ref()));
        for c in &pod.containers {
            let labels = || vec![c.name.clone(), namespace.clone(), name.clone()];
            container_cpu.samples.extend(cpu_sample(labels(), c.cpu.as_ref()));
            container_memory.samples.extend(memory_sample(labels(), c.memory.as_ref()));
            container_start.samples.extend(start_sample(labels(), c.start_time));
        }
    }
    vec![container_cpu, container_memory, container_start, node_cpu, node_memory, pod_cpu, pod_memory, scrape]
}

/// Cumulative core-seconds, stamped when the CPU was sampled.
fn cpu_sample(labels: Vec<String>, cpu: Option<&CpuStats>) -> Option<Sample> {
    let cpu = cpu?;
    let used = cpu.usage_core_nano_seconds?;
    Some(Sample { labels, value: used as f64 / 1e9, time: Some(cpu.time) })
}

/// The working set in bytes, stamped when the memory was sampled.
fn memory_sample(labels: Vec<String>, memory: Option<&MemoryStats>) -> Option<Sample> {
    let memory = memory?;
    let bytes = memory.working_set_bytes?;
    Some(Sample { labels, value: bytes as f64, time: Some(memory.time) })
}

/// The start in seconds since the epoch, stamped with the start itself; none before 1970.
fn start_sample(labels: Vec<String>, start: Timestamp) -> Option<Sample> {
    (start.unix_seconds() > 0).then(|| Sample {
        labels,
        value: start.unix_nanos() as f64 / 1e9,
        time: Some(start),
    })
}

/// The text of the families that have samples.
fn render(families: Vec<Family>) -> String {
    let mut out = String::new();
    for mut family in families.into_iter().filter(|f| !f.samples.is_empty()) {
        family.samples.sort_by(|a, b| a.labels.cmp(&b.labels));
        out.push_str(&format!("# HELP {} [STABLE] {}\n", family.name, family.help));
        out.push_str(&format!("# TYPE {} {}\n", family.name, family.kind));
        for sample in &family.samples {
            out.push_str(&sample_line(family.name, family.label_names, sample));
        }
    }
    out
}

/// `name{label="value",…} value [milliseconds]\n`.
fn sample_line(name: &str, label_names: &[&str], sample: &Sample) -> String {
    let labels: Vec<String> = label_names
        .iter()
        .zip(&sample.labels)
        .map(|(label, value)| format!("{label}=\"{}\"", escape_label_value(value)))
        .collect();
    let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
    let time = sample.time.map(|t| format!(" {}", t.unix_millis())).unwrap_or_default();
    format!("{name}{labels} {}{time}\n", go_float(sample.value))
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape_label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// A value as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it, as Prometheus' Go client
/// does: the shortest digits that read back the same, in exponent form (`1.5e+09`) when the
/// exponent is below -4 or at least 6.
fn go_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    let scientific = format!("{value:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else { return value.to_string() };
    let Ok(exponent) = exponent.parse::<i32>() else { return value.to_string() };
    if (-4..6).contains(&exponent) {
        return value.to_string();
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::stats::summary::{ContainerStats, NodeStats, PodReference, PodStats};

    /// 2021-06-23 05:11:18.302091597 +0800, as upstream's own test of these metrics.
    const AT: Timestamp = Timestamp::from_unix_nanos(1_624_396_278_302_091_597);

    fn cpu(core_nanos: u64) -> Option<CpuStats> {
        Some(CpuStats { time: AT, usage_nano_cores: Some(1), usage_core_nano_seconds: Some(core_nanos) })
    }

    fn memory(bytes: u64) -> Option<MemoryStats> {
        Some(MemoryStats { time: AT, working_set_bytes: Some(bytes), ..Default::default() })
    }

    fn container(name: &str, seconds_before: i64) -> ContainerStats {
        ContainerStats {
            name: name.to_owned(),
            start_time: Timestamp::from_unix_nanos(AT.unix_nanos() - seconds_before * 1_000_000_000),
            cpu: cpu(10_000_000_000),
            memory: memory(1000),
            ..Default::default()
        }
    }

    fn pod(namespace: &str, name: &str, containers: Vec<ContainerStats>) -> PodStats {
        PodStats {
            pod_ref: PodReference {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                uid: "u".to_owned(),
            },
            containers,
            cpu: cpu(20_000_000_000),
            memory: memory(1_619_341_312),
            ..Default::default()
        }
    }

    #[test]
    fn summary_becomes_sorted_families_with_millisecond_timestamps() {
        let summary = Summary {
            node: NodeStats {
                node_name: "n".to_owned(),
                cpu: cpu(1_234_567_000_000),
                memory: memory(1000),
                ..Default::default()
            },
            pods: vec![
                pod("namespace_b", "pod_b", vec![container("container_a", 600)]),
                pod(
                    "namespace_a",
                    "pod_a",
                    vec![container("container_b", 120), container("container_a", 30)],
                ),
            ],
        };
        let expected = "\
# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 10 1624396278302
container_cpu_usage_seconds_total{container=\"container_a\",namespace=\"namespace_b\",pod=\"pod_b\"} 10 1624396278302
container_cpu_usage_seconds_total{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 10 1624396278302
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1000 1624396278302
container_memory_working_set_bytes{container=\"container_a\",namespace=\"namespace_b\",pod=\"pod_b\"} 1000 1624396278302
container_memory_working_set_bytes{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 1000 1624396278302
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1.6243962483020916e+09 1624396248302
container_start_time_seconds{container=\"container_a\",namespace=\"namespace_b\",pod=\"pod_b\"} 1.6243956783020916e+09 1624395678302
container_start_time_seconds{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 1.6243961583020916e+09 1624396158302
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 1234.567 1624396278302
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1000 1624396278302
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace=\"namespace_a\",pod=\"pod_a\"} 20 1624396278302
pod_cpu_usage_seconds_total{namespace=\"namespace_b\",pod=\"pod_b\"} 20 1624396278302
# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{namespace=\"namespace_a\",pod=\"pod_a\"} 1.619341312e+09 1624396278302
pod_memory_working_set_bytes{namespace=\"namespace_b\",pod=\"pod_b\"} 1.619341312e+09 1624396278302
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
";
        assert_eq!(resource_metrics(&summary), expected);
    }

    #[test]
    fn missing_figures_leave_out_samples_and_empty_families() {
        let mut bare = container("app", 30);
        bare.cpu = Some(CpuStats { time: AT, ..Default::default() });
        bare.memory = None;
        let mut before_1970 = container("old", 0);
        before_1970.start_time = Timestamp::from_unix_nanos(-5);
        let mut p = pod("ns", "p", vec![bare, before_1970]);
        p.cpu = None;
        let summary = Summary { node: NodeStats::default(), pods: vec![p] };
        let text = resource_metrics(&summary);
        let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        assert_eq!(
            names,
            [
                "container_cpu_usage_seconds_total counter",
                "container_memory_working_set_bytes gauge",
                "container_start_time_seconds gauge",
                "pod_memory_working_set_bytes gauge",
                "resource_scrape_error gauge",
            ]
        );
        assert!(
            text.contains(
                "container_cpu_usage_seconds_total{container=\"old\",namespace=\"ns\",pod=\"p\"} 10 "
            )
        );
        assert!(!text.contains("container=\"app\",namespace=\"ns\",pod=\"p\"} 10"), "{text}");
        assert!(text.contains("container_start_time_seconds{container=\"app\""), "{text}");
        assert!(!text.contains("container_start_time_seconds{container=\"old\""), "{text}");
    }

    #[test]
    fn a_failed_scrape_says_so_alone() {
        assert_eq!(
            resource_scrape_failed(),
            "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE resource_scrape_error gauge\n\
             resource_scrape_error 1\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let summary = Summary { pods: vec![pod("n\"s", "p\\\n", vec![])], ..Default::default() };
        let text = resource_metrics(&summary);
        assert!(
            text.contains(
                "pod_cpu_usage_seconds_total{namespace=\"n\\\"s\",pod=\"p\\\\\\n\"} 20 1624396278302\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn values_are_written_as_go_writes_them() {
        let cases: [(f64, &str); 11] = [
            (0.0, "0"),
            (10.0, "10"),
            (1000.0, "1000"),
            (123_456.0, "123456"),
            (1_234_567.0, "1.234567e+06"),
            (1_619_341_312.0, "1.619341312e+09"),
            (3.7, "3.7"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e100, "1e+100"),
            (f64::INFINITY, "+Inf"),
        ];
        for (value, text) in cases {
            assert_eq!(go_float(value), text, "{value}");
        }
    }
}
