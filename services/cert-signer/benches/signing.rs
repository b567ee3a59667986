//! Signing latency and idle memory of the real `hpk-cert-signer` binary over TLS, beside a
//! baseline: one `openssl x509 -req` process per CSR, the shell-script way of signing a CSR file
//! (what a file-polling signer runs for each request, before adding its polling interval).
//!
//! With `HPK_BENCH_BASELINE_SIGNER=/path/to/hpk-cert-signer` (a build of an earlier commit), the
//! same load then also runs against that binary, in rounds alternating with this one's, and a
//! second table compares the two (docs/benchmarks.md).
//!
//! Run: `cargo bench -p hpk-cert-signer --bench signing` (prints Markdown tables).

#[path = "../tests/support/mod.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use hpk_cert_signer::Profile;
use hpk_cert_signer::client::{CertRequest, build_csr};
use hpk_proto::certsigner::v1::SignRequest;
use hpk_proto::certsigner::v1::cert_signer_client::CertSignerClient;
use support::{Pki, Signer};
use tonic::transport::Channel;

const SEQUENTIAL: usize = 1000;
const CONCURRENT: usize = 100;
const BASELINE: usize = 100;
/// Names another `hpk-cert-signer` binary to measure beside this one.
const BASELINE_SIGNER_ENV: &str = "HPK_BENCH_BASELINE_SIGNER";
/// Rounds per signer in the comparison. The order reverses every round (A B C, C B A, …), so a
/// busy phase of a shared machine falls on every signer alike.
const ROUNDS: usize = 8;
/// Batches of `CONCURRENT` requests in flight per round of the comparison, one after another:
/// one batch takes a few tens of milliseconds, at the mercy of a single hiccup of a shared machine.
const BATCHES: usize = 10;
/// How much worse than the baseline still counts as no regression (the security issue's bound).
const BOUND: f64 = 0.10;

fn main() -> ExitCode {
    support::init_crypto();
    let baseline = match std::env::var_os(BASELINE_SIGNER_ENV).filter(|v| !v.is_empty()) {
        None => None,
        Some(path) => match check_executable(Path::new(&path)) {
            Ok(()) => Some(PathBuf::from(path)),
            Err(why) => {
                eprintln!("signing bench: {BASELINE_SIGNER_ENV}={}: {why}", Path::new(&path).display());
                return ExitCode::FAILURE;
            }
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run());
    if let Some(path) = baseline
        && let Err(why) = runtime.block_on(compare(&path))
    {
        eprintln!("signing bench: against {}: {why}", path.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

async fn run() {
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    // Let start-up allocations settle before calling it idle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = support::rss_kib(signer.pid());

    let requests = serving_requests(1 + SEQUENTIAL + CONCURRENT);
    let Load { mut sequential, mut concurrent, concurrent_wall, .. } =
        load(&signer.url, &signer.ca_pem, &requests, Auth::PerNode, 1, None)
            .await
            .expect("the signer's load");

    // A node's renewals: over mutual TLS, presenting its client certificate (review H3).
    let mut client = signer.client("renewing").await;
    let node_creds = client
        .request(&CertRequest { node_name: "renewing".into(), profile: Profile::Client, sans: vec![] })
        .await
        .expect("the renewing node's client certificate");
    let renewal_channel = hpk_rpc::connect::mutual_tls(
        &signer.url,
        &signer.ca_pem,
        node_creds.chain_pem.as_bytes(),
        node_creds.key_pem.as_bytes(),
        None,
    )
    .await
    .expect("connect as the node");
    let renewal_csr = build_csr(
        &CertRequest {
            node_name: "renewing".into(),
            profile: Profile::Serving,
            sans: vec!["renewing".parse().expect("SAN")],
        },
        &rcgen::KeyPair::generate().expect("key"),
    )
    .expect("CSR");
    let renew = || {
        sign_on(
            renewal_channel.clone(),
            "renewing".into(),
            renewal_csr.clone(),
            support::token_for("renewing"),
        )
    };
    renew().await.expect("renewal");
    let mut renewals = Vec::with_capacity(SEQUENTIAL);
    for _ in 0..SEQUENTIAL {
        renewals.push(renew().await.expect("renewal"));
    }
    let loaded_rss = support::rss_kib(signer.pid());

    let csrs: Vec<String> = requests[..BASELINE].iter().map(|(_, csr)| csr.clone()).collect();
    let baseline = openssl_baseline(&pki, &csrs);

    println!("| measurement | n | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    row("hpk-cert-signer, sequential over one TLS connection", &mut sequential);
    row(
        &format!("hpk-cert-signer, {CONCURRENT} in flight at once (wall {concurrent_wall:.1?})"),
        &mut concurrent,
    );
    row("hpk-cert-signer, renewals presenting the node's certificate (mutual TLS)", &mut renewals);
    match baseline {
        Some(mut samples) => row("baseline: `openssl x509 -req` process per CSR", &mut samples),
        None => println!("| baseline: openssl not found on PATH | - | - | - | - |"),
    }
    println!();
    println!("idle RSS after start-up: {:.1} MiB; after the load: {:.1} MiB", mib(idle_rss), mib(loaded_rss));
}

/// How a signer authenticates nodes: the signer at fcde574 takes one token for every node
/// (`--token-file`); later ones a key from which each node's token is made (`--token-key-file`,
/// review H3).
#[derive(Clone, Copy)]
enum Auth {
    Shared,
    PerNode,
}

/// The one token of [`Auth::Shared`].
const SHARED_TOKEN: &str = "bench-node-token-0123456789abcdef";

impl Auth {
    fn token(self, node: &str) -> String {
        match self {
            Self::Shared => SHARED_TOKEN.into(),
            Self::PerNode => support::token_for(node),
        }
    }

    /// `serve` arguments for this PKI, with the token flag this kind of signer takes.
    fn serve_args(self, pki: &Pki) -> Vec<String> {
        let mut args = pki.serve_args();
        if let Self::Shared = self {
            let file = pki.dir.path().join("local/shared-token");
            support::write_mode(&file, format!("{SHARED_TOKEN}\n").as_bytes(), 0o600);
            for arg in &mut args {
                if arg.starts_with("--token-key-file=") {
                    *arg = format!("--token-file={}", file.display());
                }
            }
        }
        args
    }
}

/// `(node name, CSR)` pairs for serving certificates. The token enrols each node name once:
/// every request of a load is for a name of its own.
fn serving_requests(count: usize) -> Vec<(String, String)> {
    (0..count)
        .map(|i| {
            let name = format!("node-{i}");
            let request = CertRequest {
                node_name: name.clone(),
                profile: Profile::Serving,
                sans: vec![name.parse().expect("SAN"), "10.1.0.1".parse().expect("SAN")],
            };
            let csr = build_csr(&request, &rcgen::KeyPair::generate().expect("key")).expect("CSR");
            (name, csr)
        })
        .collect()
}

/// Latencies of one load on a signer: `SEQUENTIAL` requests one after another over one TLS
/// connection, then batches of `CONCURRENT` at once on it.
struct Load {
    sequential: Vec<Duration>,
    concurrent: Vec<Duration>,
    concurrent_wall: Duration,
    /// The signer's CPU time per request in each phase, when its pid was given.
    cpu: Option<Phases>,
}

/// A figure for each phase of a [`Load`].
#[derive(Clone, Copy)]
struct Phases {
    sequential: Duration,
    concurrent: Duration,
}

/// Runs a [`Load`] of `batches` batches with `requests` (`1 + SEQUENTIAL + batches * CONCURRENT`
/// of them; the first warms the connection) against the signer at `url`, whose certificate
/// `ca_pem` issued; with `pid`, also the CPU time that signer spends.
async fn load(
    url: &str,
    ca_pem: &[u8],
    requests: &[(String, String)],
    auth: Auth,
    batches: usize,
    pid: Option<u32>,
) -> Result<Load, String> {
    let cpu = || pid.and_then(cpu_time);
    let channel =
        hpk_rpc::connect::tls(url, ca_pem, None).await.map_err(|e| format!("connect to {url}: {e}"))?;
    let sign = |i: usize| {
        let (node, csr) = requests[i].clone();
        let token = auth.token(&node);
        sign_on(channel.clone(), node, csr, token)
    };
    // Warm the connection (TLS handshake, HTTP/2 settings) outside the measurement.
    sign(0).await?;
    let cpu_start = cpu();
    let mut sequential = Vec::with_capacity(SEQUENTIAL);
    for i in 1..=SEQUENTIAL {
        sequential.push(sign(i).await?);
    }
    let cpu_sequential = cpu();
    let wall = Instant::now();
    let mut concurrent = Vec::with_capacity(batches * CONCURRENT);
    for batch in 0..batches {
        let first = 1 + SEQUENTIAL + batch * CONCURRENT;
        let tasks: Vec<_> = (first..first + CONCURRENT).map(|i| tokio::spawn(sign(i))).collect();
        for task in tasks {
            concurrent.push(task.await.map_err(|e| format!("a request's task failed: {e}"))??);
        }
    }
    let concurrent_wall = wall.elapsed();
    let cpu = match (cpu_start, cpu_sequential, cpu()) {
        (Some(start), Some(middle), Some(end)) => Some(Phases {
            sequential: per_request(middle.saturating_sub(start), sequential.len()),
            concurrent: per_request(end.saturating_sub(middle), concurrent.len()),
        }),
        _ => None,
    };
    Ok(Load { sequential, concurrent, concurrent_wall, cpu })
}

/// Times one `SignKubeletServingCertificate` RPC with `token`, from the client's side.
async fn sign_on(channel: Channel, node: String, csr: String, token: String) -> Result<Duration, String> {
    let mut client = CertSignerClient::new(channel);
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().expect("header");
    let mut request = tonic::Request::new(SignRequest { node_name: node.clone(), csr_pem: csr });
    request.metadata_mut().insert("authorization", auth);
    let start = Instant::now();
    client
        .sign_kubelet_serving_certificate(request)
        .await
        .map_err(|status| format!("sign for {node}: {status}"))?;
    Ok(start.elapsed())
}

fn openssl_baseline(pki: &Pki, csrs: &[String]) -> Option<Vec<Duration>> {
    let dir = pki.dir.path().join("openssl");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut samples = Vec::with_capacity(csrs.len());
    for (i, csr) in csrs.iter().enumerate() {
        let csr_path = dir.join(format!("{i}.csr"));
        std::fs::write(&csr_path, csr).expect("write CSR");
        let start = Instant::now();
        let status = Command::new("openssl")
            .args(["x509", "-req", "-days", "7", "-CAcreateserial", "-in"])
            .arg(&csr_path)
            .arg("-CA")
            .arg(&pki.serving_ca_cert)
            .arg("-CAkey")
            .arg(&pki.serving_ca_key)
            .arg("-CAserial")
            .arg(dir.join("ca.srl"))
            .arg("-out")
            .arg(dir.join(format!("{i}.crt")))
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        assert!(status.success(), "openssl failed");
        samples.push(start.elapsed());
    }
    Some(samples)
}

/// A signer binary of the comparison, with a PKI of its own, and what its rounds measured.
struct Contender {
    label: String,
    bin: PathBuf,
    pki: Pki,
    /// Keep the enrolment record in a node-local file (`--enrolled-file`, as `hpk up` runs the
    /// signer); the signer at fcde574 has no such flag.
    enrolled_file: bool,
    auth: Auth,
    rounds: Vec<Load>,
    idle_rss_kib: Vec<u64>,
}

impl Contender {
    fn new(label: String, bin: &Path, enrolled_file: bool, auth: Auth) -> Self {
        Self {
            label,
            bin: bin.to_owned(),
            pki: Pki::new(),
            enrolled_file,
            auth,
            rounds: vec![],
            idle_rss_kib: vec![],
        }
    }

    /// Starts a fresh signer process, measures its idle RSS and one [`Load`], and stops it.
    async fn round(&mut self, round: usize, requests: &[(String, String)]) -> Result<(), String> {
        // Flags both this signer and the one at fcde574 take (one serving CA that also signs the
        // signer's own certificate, one client CA, the token or its key); the newer ones only
        // if asked.
        let mut args = self.auth.serve_args(&self.pki);
        if self.enrolled_file {
            let file = self.pki.dir.path().join("local").join(format!("enrolled-{round}"));
            args.push(format!("--enrolled-file={}", file.display()));
        }
        let mut server = Server::start(&self.bin, &self.pki, &args).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let pid = server.child.id();
        self.idle_rss_kib.push(support::rss_kib(pid));
        self.rounds.push(
            load(&server.url, &self.pki.serving_ca_pem(), requests, self.auth, BATCHES, Some(pid)).await?,
        );
        let status = support::terminate(&mut server.child);
        if !status.success() {
            return Err(format!("{} exited with {status} on SIGTERM", self.bin.display()));
        }
        Ok(())
    }

    /// The median over rounds of the signer's CPU time per request in each phase.
    fn cpu(&self) -> Option<Phases> {
        let rounds: Vec<Phases> = self.rounds.iter().filter_map(|r| r.cpu).collect();
        let pick = |f: fn(&Phases) -> Duration| median(&rounds.iter().map(f).collect::<Vec<_>>());
        Some(Phases { sequential: pick(|p| p.sequential)?, concurrent: pick(|p| p.concurrent)? })
    }
}

/// The median of `values`, if any.
fn median<T: Ord + Copy>(values: &[T]) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied()
}

/// CPU time the threads of process `pid` have used so far (`/proc/PID/task/*/schedstat`, in
/// nanoseconds), or `None` where the kernel keeps no such statistics.
fn cpu_time(pid: u32) -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

fn per_request(total: Duration, requests: usize) -> Duration {
    total.div_f64(requests.max(1) as f64)
}

/// Runs the load against this signer (with and without an enrolment file) and the binary at
/// `baseline`, [`ROUNDS`] times each in alternating order, and prints the comparison.
async fn compare(baseline: &Path) -> Result<(), String> {
    let current = Path::new(support::BIN);
    let name =
        baseline.file_name().map_or_else(|| baseline.display().to_string(), |n| n.to_string_lossy().into());
    let mut contenders = [
        Contender::new("HEAD, `--enrolled-file` (as `hpk up` runs it)".into(), current, true, Auth::PerNode),
        Contender::new(
            "HEAD, enrolment in memory (as in the table above)".into(),
            current,
            false,
            Auth::PerNode,
        ),
        Contender::new(format!("baseline `{name}`"), baseline, false, Auth::Shared),
    ];
    let requests = serving_requests(1 + SEQUENTIAL + BATCHES * CONCURRENT);
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..contenders.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let contender = &mut contenders[i];
            contender.round(round, &requests).await.map_err(|why| {
                format!("{} ({}), round {}: {why}", contender.label, contender.bin.display(), round + 1)
            })?;
        }
    }
    print_comparison(baseline, &contenders);
    Ok(())
}

/// What the comparison weighs: pooled p50 and p99 of both loads, the median CPU per request.
struct Figures {
    sequential: (Duration, Duration),
    concurrent: (Duration, Duration),
    cpu: Option<Phases>,
}

/// The table, each signer's memory and CPU, and whether each build of HEAD is within [`BOUND`]
/// of the baseline (the last contender).
fn print_comparison(baseline: &Path, contenders: &[Contender]) {
    println!();
    println!(
        "Against `{BASELINE_SIGNER_ENV}={}`: {ROUNDS} rounds per signer in alternating order, each a \
         fresh process given the same CSRs ({SEQUENTIAL} one after another, then {BATCHES} batches of \
         {CONCURRENT} in flight):",
        baseline.display()
    );
    println!();
    println!("| signer | load | n | p50 | p99 | max | median of each round |");
    println!("|---|---|---|---|---|---|---|");
    let in_flight = format!("{CONCURRENT} in flight at once, {BATCHES} batches a round");
    let figures: Vec<Figures> = contenders
        .iter()
        .map(|c| Figures {
            sequential: comparison_row(c, "sequential over one TLS connection", |l| &l.sequential),
            concurrent: comparison_row(c, &in_flight, |l| &l.concurrent),
            cpu: c.cpu(),
        })
        .collect();
    println!();
    for contender in contenders {
        let rss =
            median(&contender.idle_rss_kib).map_or_else(|| "-".into(), |k| format!("{:.1} MiB", mib(k)));
        let rounds = |f: fn(&Phases) -> Duration| {
            let each: Vec<String> = contender
                .rounds
                .iter()
                .filter_map(|r| r.cpu.as_ref())
                .map(|p| format!("{:.0}", micros(f(p))))
                .collect();
            each.join(", ")
        };
        println!(
            "- {}: idle RSS after start-up {rss} (median of rounds); the signer's CPU time per request, \
             sequential {} µs, in flight {} µs (each round)",
            contender.label,
            rounds(|p| p.sequential),
            rounds(|p| p.concurrent)
        );
    }
    println!();
    let (reference, current) = figures.split_last().expect("a baseline and the current signer");
    for (new, contender) in current.iter().zip(contenders) {
        println!("- {} against the baseline: {}", contender.label, verdict(new, reference));
    }
}

/// Each figure's change from `old`, then "within 10 %" or a **miss** naming the latencies worse
/// by more than [`BOUND`]. CPU time is shown, not judged: the bound is on latency.
fn verdict(new: &Figures, old: &Figures) -> String {
    let changes = [
        ("sequential p50", new.sequential.0, old.sequential.0),
        ("sequential p99", new.sequential.1, old.sequential.1),
        ("in flight p50", new.concurrent.0, old.concurrent.0),
        ("in flight p99", new.concurrent.1, old.concurrent.1),
    ];
    let mut text: Vec<String> =
        changes.iter().map(|(what, n, o)| format!("{what} {:+.1} %", change(*n, *o) * 100.0)).collect();
    if let (Some(n), Some(o)) = (new.cpu, old.cpu) {
        text.push(format!(
            "the signer's CPU time per request sequential {:+.1} %, in flight {:+.1} % (medians of rounds)",
            change(n.sequential, o.sequential) * 100.0,
            change(n.concurrent, o.concurrent) * 100.0
        ));
    }
    let misses: Vec<&str> =
        changes.iter().filter(|(_, n, o)| change(*n, *o) > BOUND).map(|(what, ..)| *what).collect();
    let bound = BOUND * 100.0;
    if misses.is_empty() {
        format!("{}; within {bound:.0} %", text.join(", "))
    } else {
        format!("{}; **miss**: worse by more than {bound:.0} % on {}", text.join(", "), misses.join(", "))
    }
}

/// Prints one row of the comparison: all rounds' samples pooled, and each round's median.
/// Returns the pooled p50 and p99.
fn comparison_row(
    contender: &Contender,
    load: &str,
    samples: impl Fn(&Load) -> &Vec<Duration>,
) -> (Duration, Duration) {
    let medians: Vec<String> = contender
        .rounds
        .iter()
        .filter_map(|round| median(samples(round)))
        .map(|m| format!("{:.2}", ms(m)))
        .collect();
    let mut all: Vec<Duration> =
        contender.rounds.iter().flat_map(|round| samples(round).iter().copied()).collect();
    all.sort_unstable();
    let (p50, p99) = (quantile(&all, 0.50), quantile(&all, 0.99));
    println!(
        "| {} | {load} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} ms |",
        contender.label,
        all.len(),
        ms(p50),
        ms(p99),
        ms(*all.last().expect("samples")),
        medians.join(", ")
    );
    (p50, p99)
}

/// How much longer `new` is than `old`, as a fraction of `old`.
fn change(new: Duration, old: Duration) -> f64 {
    new.as_secs_f64() / old.as_secs_f64() - 1.0
}

/// A signer binary started on a PKI; stopped with SIGTERM when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts `bin` with `args` and waits (bounded) for the address file it writes once it
    /// listens. A binary that cannot run, exits or does not listen is an error, with its log.
    async fn start(bin: &Path, pki: &Pki, args: &[String]) -> Result<Self, String> {
        let address_file = pki.address_file();
        let _ = std::fs::remove_file(&address_file);
        let log_path = pki.dir.path().join("signer.log");
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("create {}: {e}", log_path.display()))?;
        let child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let mut server = Self { child, url: String::new() };
        let failed = |what: String| {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            format!("`{} {}` {what}; its log:\n{log}", bin.display(), args.join(" "))
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(url) = std::fs::read_to_string(&address_file) {
                server.url = url.trim().to_owned();
                return Ok(server);
            }
            match server.child.try_wait() {
                Ok(Some(status)) => return Err(failed(format!("exited with {status} before listening"))),
                Err(e) => return Err(failed(format!("cannot be waited for: {e}"))),
                Ok(None) if Instant::now() >= deadline => {
                    return Err(failed(format!("wrote no {} within 20 s", address_file.display())));
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            support::terminate(&mut self.child);
        }
    }
}

/// A baseline binary must be an executable file, checked before the long first part runs.
fn check_executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err("not an executable file (give the path of an hpk-cert-signer binary)".into());
    }
    Ok(())
}

fn row(name: &str, samples: &mut [Duration]) {
    samples.sort();
    println!(
        "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
        samples.len(),
        ms(quantile(samples, 0.50)),
        ms(quantile(samples, 0.99)),
        ms(*samples.last().expect("samples"))
    );
}

/// The `q` quantile of sorted, non-empty samples (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
