//! `hpk-cert-signer`: run the signer (`serve`) or get a certificate from it (`request`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hpk_cert_signer::config::{NodeTokenArgs, RequestArgs, ServeArgs};
use hpk_rpc::telemetry::LogFormat;

/// The HPK controller's kubelet certificate signer.
///
/// `serve` runs on the controller with the cluster CAs; `request` is what each node (and an
/// operator) runs to get a certificate for a key generated locally, with the node's token that
/// `node-token` makes from the cluster's key.
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
    /// Serve signing requests over TLS until SIGTERM or SIGINT.
    Serve(Box<ServeArgs>),
    /// Request a kubelet certificate; with --renew, keep it renewed.
    Request(Box<RequestArgs>),
    /// Print or write a node's token, made from the cluster's node-token key.
    NodeToken(NodeTokenArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    hpk_rpc::telemetry::init(cli.log_format);
    hpk_rpc::limits::raise_nofile_or_warn();
    if let Err(e) = rustls::crypto::ring::default_provider().install_default() {
        tracing::debug!(?e, "a crypto provider was already installed");
    }
    let shutdown = match hpk_rpc::shutdown::on_signal() {
        Ok(token) => token,
        Err(e) => {
            tracing::error!(error = %e, "cannot install signal handlers");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => hpk_cert_signer::run(*args, shutdown).await,
        Command::Request(args) => hpk_cert_signer::request(*args, shutdown).await,
        Command::NodeToken(args) => hpk_cert_signer::node_token(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "hpk-cert-signer failed");
            eprintln!("hpk-cert-signer: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
