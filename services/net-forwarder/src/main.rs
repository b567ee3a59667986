//! `hpk-net-forwarder`: serve the node's pod network.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hpk_net_forwarder::config::ServeArgs;
use hpk_net_forwarder::tap::helper::OpenTapArgs;
use hpk_rpc::telemetry::LogFormat;

/// The node's pod network: veth pairs from the bubble into each pod, and the pod CIDR's IPAM.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log output format.
    #[arg(long, global = true, env = "HPK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the NetForwarder API on a UNIX socket until SIGTERM or SIGINT.
    Serve(ServeArgs),
    /// Internal: create a TAP in the network namespace received on stdin, send it back.
    #[command(hide = true)]
    OpenTap(OpenTapArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    hpk_rpc::telemetry::init(cli.log_format);
    let shutdown = match hpk_rpc::shutdown::on_signal() {
        Ok(token) => token,
        Err(e) => {
            tracing::error!(error = %e, "cannot install signal handlers");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => hpk_net_forwarder::run(args, shutdown).await,
        Command::OpenTap(args) => hpk_net_forwarder::tap::helper::serve_open_tap(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "hpk-net-forwarder failed");
            eprintln!("hpk-net-forwarder: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
