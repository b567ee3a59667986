//! `hpk-kubelet`: the node's kubelet.

use std::process::ExitCode;

use clap::Parser;
use hpk_kubelet::config::KubeletArgs;
use hpk_rpc::telemetry::LogFormat;

/// Register this node with the Kubernetes API and run the pods bound to it through the
/// pod-runtime (CRI).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log output format.
    #[arg(long, env = "HPK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(flatten)]
    args: KubeletArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    hpk_rpc::telemetry::init(cli.log_format);
    hpk_rpc::limits::raise_nofile_or_warn();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("hpk-kubelet: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        let shutdown = hpk_rpc::shutdown::on_signal()
            .map_err(|e| hpk_kubelet::Error::Config(format!("cannot install signal handlers: {e}")))?;
        hpk_kubelet::run(cli.args, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "hpk-kubelet failed");
            eprintln!("hpk-kubelet: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
