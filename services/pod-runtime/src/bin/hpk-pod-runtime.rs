//! `hpk-pod-runtime`: the CRI v1 runtime of a bubble.

use std::process::ExitCode;

use clap::Parser;
use hpk_pod_runtime::server::ServeArgs;
use hpk_rpc::telemetry::LogFormat;

/// The CRI v1 runtime of an HPK bubble: sandboxes held by hpk-pause, containers run by crun.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    /// Log output format.
    #[arg(long, env = "HPK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    hpk_rpc::limits::raise_nofile_or_warn();
    if std::env::args_os().nth(1).is_some_and(|a| a == hpk_pod_runtime::logshim::SUBCOMMAND) {
        let args = hpk_pod_runtime::logshim::Args::parse_from(std::env::args_os().skip(1));
        return match hpk_pod_runtime::logshim::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("hpk-pod-runtime log-shim {}: {e}", args.id);
                ExitCode::FAILURE
            }
        };
    }
    let mut cli = Cli::parse();
    hpk_rpc::telemetry::init(cli.log_format);
    // Before any thread exists: a multi-threaded process cannot unshare its mount namespace.
    match hpk_pod_runtime::engine::enter_private_mount_namespace() {
        Ok(mode) => cli.serve.cgroup_mode = mode,
        Err(e) => {
            eprintln!("hpk-pod-runtime: {e}");
            return ExitCode::from(78);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hpk-pod-runtime: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = hpk_rpc::shutdown::on_signal().map_err(|e| (e.to_string(), ExitCode::FAILURE))?;
        hpk_pod_runtime::server::run(cli.serve, shutdown).await.map_err(|e| {
            // A configuration at fault is EX_CONFIG, as in every HPK binary.
            let code = match e {
                hpk_pod_runtime::server::Error::Config(_) => ExitCode::from(78),
                _ => ExitCode::FAILURE,
            };
            (e.to_string(), code)
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((e, code)) => {
            tracing::error!(error = %e, "hpk-pod-runtime failed");
            eprintln!("hpk-pod-runtime: {e}");
            code
        }
    }
}
