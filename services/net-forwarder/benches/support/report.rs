//! The benchmark's results and their markdown table.

use std::fmt::Write as _;

use super::measure::{Rtt, median};

/// What was measured on one path, or why it was not.
pub struct Row {
    pub label: &'static str,
    /// The relay processes whose CPU is counted; `None` for a path without any.
    pub relay: Option<&'static str>,
    pub result: Result<Measured, String>,
}

#[derive(Default)]
pub struct Measured {
    pub gbits: Vec<f64>,
    /// CPU of the relay processes during each round, in % of one core.
    pub relay_cpu: Vec<f64>,
    /// CPU of the whole machine during each round (every process, the kernel's softirqs), in %
    /// of one core.
    pub machine_cpu: Vec<f64>,
    pub rtt: Option<Result<Rtt, String>>,
}

impl Row {
    fn gbits(&self) -> Option<f64> {
        self.result.as_ref().ok().map(|m| median(&m.gbits)).filter(|g| g.is_finite())
    }
}

/// A path compared with another in the same run: `path / base`, and the goal, if any.
pub struct Ratio {
    pub path: usize,
    pub base: usize,
    pub goal: Option<f64>,
}

/// The markdown table; rows are numbered from 1 in the order given.
pub fn table(rows: &[Row], ratios: &[Ratio], rounds: usize) -> String {
    let mut t = format!(
        "| # | path | Gbit/s, median of {rounds} (min–max) | ping avg / p99 ms | relay CPU, % of a core \
         | relay CPU per Gbit/s, % of a core | whole machine CPU, % of a core (per Gbit/s) | ratio | goal \
         |\n|---|---|---|---|---|---|---|---|---|\n"
    );
    for (i, row) in rows.iter().enumerate() {
        let (ratio, goal) = ratio_cells(rows, ratios, i);
        let cells = match &row.result {
            Ok(m) => measured_cells(row, m),
            Err(why) => [why.clone(), "—".into(), "—".into(), "—".into(), "—".into()],
        };
        let _ = writeln!(t, "| {} | {} | {} | {ratio} | {goal} |", i + 1, row.label, cells.join(" | "));
    }
    t
}

fn measured_cells(row: &Row, m: &Measured) -> [String; 5] {
    let range = |v: &[f64]| {
        v.iter().copied().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)))
    };
    let (lo, hi) = range(&m.gbits);
    let gbits = format!("{:.2} ({lo:.2}–{hi:.2})", median(&m.gbits));
    let rtt = match &m.rtt {
        Some(Ok(r)) if r.received == r.sent => format!("{:.3} / {:.3}", r.avg_ms, r.p99_ms),
        Some(Ok(r)) => format!("{:.3} / {:.3} ({} of {} replies)", r.avg_ms, r.p99_ms, r.received, r.sent),
        Some(Err(e)) => e.clone(),
        None => "—".into(),
    };
    let (cpu, per_gbit) = match row.relay {
        None => ("— (no relay)".to_owned(), "—".to_owned()),
        Some(relay) => {
            let cpu = median(&m.relay_cpu);
            let per: Vec<f64> = m.relay_cpu.iter().zip(&m.gbits).map(|(c, g)| c / g).collect();
            (format!("{cpu:.1} ({relay})"), format!("{:.1}", median(&per)))
        }
    };
    let per: Vec<f64> = m.machine_cpu.iter().zip(&m.gbits).map(|(c, g)| c / g).collect();
    let machine = format!("{:.0} ({:.1})", median(&m.machine_cpu), median(&per));
    [gbits, rtt, cpu, per_gbit, machine]
}

/// The ratio and goal cells of row `i`: each ratio whose path is `i`, and where `i` is the
/// base of a ratio without a goal, that ratio seen from this side.
fn ratio_cells(rows: &[Row], ratios: &[Ratio], i: usize) -> (String, String) {
    let (mut ratio, mut goal) = (Vec::new(), Vec::new());
    for r in ratios.iter().filter(|r| r.path == i) {
        let Some(value) = rows[r.path].gbits().zip(rows[r.base].gbits()).map(|(p, b)| p / b) else {
            continue;
        };
        match r.goal {
            Some(min) => {
                ratio.push(format!("{:.0} % of #{}", value * 100.0, r.base + 1));
                let verdict = if value >= min { "met" } else { "**missed**" };
                goal.push(format!("≥ {:.0} %: {verdict}", min * 100.0));
            }
            None => ratio.push(format!("{value:.2}× #{}", r.base + 1)),
        }
    }
    for r in ratios.iter().filter(|r| r.base == i && r.goal.is_none()) {
        if let Some(value) = rows[r.base].gbits().zip(rows[r.path].gbits()).map(|(b, p)| b / p) {
            ratio.push(format!("{value:.2}× #{}", r.path + 1));
        }
    }
    let or_dash = |v: Vec<String>| if v.is_empty() { "—".to_owned() } else { v.join("; ") };
    (or_dash(ratio), or_dash(goal))
}
