//! `hpk-net-forwarder`: serve the node's pod network.

use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hpk_net_forwarder::config::ServeArgs;
use hpk_net_forwarder::tap::helper::OpenTapArgs;
use hpk_rpc::telemetry::LogFormat;

/// The node's pod network: veth pairs from the bubble into each pod, the pod CIDR's IPAM, and
/// the authenticated tunnel to the other nodes.
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
    Serve(Box<ServeArgs>),
    /// Bind the tunnel's UDP sockets in this (the host's) network namespace, then run COMMAND
    /// (the one that enters the bubble and serves) with them open; HPK_TUNNEL_FD says which fds.
    TunnelSocket {
        /// Address and port to bind; port 0 picks a free one.
        #[arg(long)]
        bind: SocketAddrV4,
        /// Sockets to bind, a reuse-port group on one port (one receiving thread each in
        /// `serve`); 1 to 16. By default one per CPU this process may use, at most 16.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
        queues: Option<u32>,
        /// The command to run, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Write a new tunnel private key (created mode 0600) to PATH, for `--tunnel-private-key-file`,
    /// and print its public key; an existing file is never replaced.
    TunnelPrivateKey {
        /// Where to write it.
        path: PathBuf,
    },
    /// Print the public key (for the other nodes' `--peer` flags) of a tunnel private key file.
    TunnelPublicKey {
        /// The private key file (mode 0600).
        #[arg(long)]
        private_key_file: PathBuf,
    },
    /// Internal: create a TAP in the network namespace received on stdin, send it back.
    #[command(hide = true)]
    OpenTap(OpenTapArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    hpk_rpc::telemetry::init(cli.log_format);
    hpk_rpc::limits::raise_nofile_or_warn();
    // Before any thread exists: the socket is bound and the process replaced.
    let result = match cli.command {
        Command::TunnelSocket { bind, queues, command } => {
            let queues = queues.map(|q| q as usize).unwrap_or_else(hpk_net_forwarder::tunnel::default_queues);
            Err(hpk_net_forwarder::inherit::exec_with_socket(bind, queues, &command))
        }
        Command::TunnelPrivateKey { path } => {
            hpk_net_forwarder::tunnel::keyfile::generate(&path).map(|id| println!("{}", id.public()))
        }
        Command::TunnelPublicKey { private_key_file } => {
            hpk_net_forwarder::tunnel::keyfile::load(&private_key_file).map(|id| println!("{}", id.public()))
        }
        Command::Serve(args) => serve(*args),
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

fn serve(args: ServeArgs) -> hpk_net_forwarder::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| hpk_net_forwarder::Error::Config(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        let shutdown = hpk_rpc::shutdown::on_signal()
            .map_err(|e| hpk_net_forwarder::Error::Config(format!("cannot install signal handlers: {e}")))?;
        hpk_net_forwarder::run(args, shutdown).await
    })
}
