//! The measurements: iperf3 throughput, ping round trips, CPU time of processes.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, anyhow, bail};

use super::ns::{Guard, Netns, output, wait_until};

/// An iperf3 server in `ns`, bound to `addr:port`, ready when this returns.
pub fn iperf3_server(ns: &dyn Netns, addr: Ipv4Addr, port: u16) -> Result<Guard> {
    let args = [&format!("--net={}", ns.netns_path()), "--", "iperf3", "--server", "--bind"]
        .map(String::from)
        .into_iter()
        .chain([addr.to_string(), "--port".into(), port.to_string()])
        .collect::<Vec<_>>();
    let mut server = Guard::spawn("nsenter", &args)?;
    let (pid, wanted) = (server.pid(), format!("{:08X}:{port:04X}", u32::from(addr).swap_bytes()));
    wait_until(&format!("iperf3 to listen on {addr}:{port}"), || {
        server.check_running()?;
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
        // local_address rem_address st: 0A is LISTEN.
        Ok(table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&wanted.as_str()) && f.get(3) == Some(&"0A")
        }))
    })?;
    Ok(server)
}

/// One iperf3 TCP stream of `seconds` from `ns` to `addr:port`: Gbit/s as the receiver counted.
pub fn iperf3(ns: &dyn Netns, addr: Ipv4Addr, port: u16, seconds: u32) -> Result<f64> {
    let out = ns
        .command("timeout")
        .arg((seconds + 20).to_string())
        .args(["iperf3", "--json", "--connect-timeout", "3000", "--client"])
        .arg(addr.to_string())
        .args(["--port", &port.to_string(), "--time", &seconds.to_string()])
        .stdin(Stdio::null())
        .output()
        .context("run iperf3")?;
    // A failed test exits 1 and still prints its JSON, with an "error".
    gbits(&String::from_utf8_lossy(&out.stdout)).with_context(|| {
        format!("iperf3 to {addr}:{port}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())
    })
}

/// Gbit/s from iperf3's `--json` report: `end.sum_received.bits_per_second`.
pub fn gbits(json: &str) -> Result<f64> {
    let report: serde_json::Value = serde_json::from_str(json).context("iperf3 --json output")?;
    if let Some(error) = report.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3: {error}");
    }
    report
        .pointer("/end/sum_received/bits_per_second")
        .and_then(serde_json::Value::as_f64)
        .map(|bps| bps / 1e9)
        .ok_or_else(|| anyhow!("iperf3 report without end.sum_received.bits_per_second"))
}

/// Round trips of `count` pings 10 ms apart from `ns` to `addr`.
pub struct Rtt {
    pub avg_ms: f64,
    pub p99_ms: f64,
    pub received: usize,
    pub sent: usize,
}

pub fn ping(ns: &dyn Netns, addr: Ipv4Addr, count: usize) -> Result<Rtt> {
    let deadline = (count / 50 + 5).to_string();
    let out = ns
        .command("ping")
        .args(["-n", "-c", &count.to_string(), "-i", "0.01", "-W", "1", "-w", &deadline])
        .arg(addr.to_string())
        .stdin(Stdio::null())
        .output()
        .context("run ping")?;
    // Exits 1 when some replies are missing: what came back still counts.
    rtts(&String::from_utf8_lossy(&out.stdout), count).with_context(|| format!("ping {addr}: {}", out.status))
}

/// Parses iputils ping's `… time=0.051 ms` lines.
pub fn rtts(text: &str, sent: usize) -> Result<Rtt> {
    let mut ms: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split_once("time=")?.1.split_whitespace().next()?.parse().ok())
        .collect();
    if ms.is_empty() {
        bail!("no ping replies");
    }
    ms.sort_by(f64::total_cmp);
    let avg_ms = ms.iter().sum::<f64>() / ms.len() as f64;
    Ok(Rtt { avg_ms, p99_ms: percentile(&ms, 0.99), received: ms.len(), sent })
}

/// The `q` quantile of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of `values` (any order); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Clock ticks per second, the unit of /proc/PID/stat's times.
pub fn ticks_per_second() -> Result<f64> {
    output(Command::new("getconf").arg("CLK_TCK"))?.trim().parse().context("getconf CLK_TCK")
}

/// CPU time the whole machine spent busy (all CPUs: user, nice, system, irq, softirq and steal;
/// not idle or iowait), in clock ticks, from the first line of /proc/stat.
pub fn machine_busy_ticks() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
    machine_busy(&stat).context("parse /proc/stat")
}

/// The busy ticks of a /proc/stat text.
pub fn machine_busy(stat: &str) -> Result<u64> {
    let line = stat.lines().next().filter(|l| l.starts_with("cpu ")).ok_or_else(|| anyhow!("no cpu line"))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?;
    let at = |i: usize| v.get(i).copied().ok_or_else(|| anyhow!("{} fields, not {}", v.len(), i + 1));
    // user nice system idle iowait irq softirq steal (guest time is within user)
    Ok(at(0)? + at(1)? + at(2)? + at(5)? + at(6)? + at(7)?)
}

/// User + system CPU time of the processes `pids` (all their threads), in clock ticks.
pub fn cpu_ticks(pids: &[u32]) -> Result<u64> {
    let mut ticks = 0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("read /proc/{pid}/stat"))?;
        ticks += stat_ticks(&stat).with_context(|| format!("parse /proc/{pid}/stat"))?;
    }
    Ok(ticks)
}

/// utime + stime (fields 14 and 15) of a /proc/PID/stat line. The command name (field 2) is in
/// parentheses and may hold spaces, so fields are counted after its closing one.
pub fn stat_ticks(stat: &str) -> Result<u64> {
    let rest = stat.rsplit_once(')').ok_or_else(|| anyhow!("no ')'"))?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        fields.get(n - 3).ok_or_else(|| anyhow!("no field {n}"))?.parse().context("not a number")
    };
    Ok(field(14)? + field(15)?)
}
