//! The `hpk` command line.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "hpk", version, about = "HPK: a private Kubernetes cluster of rootless bubbles")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a local cluster of N bubbles on this machine and wait until every node is Ready.
    Up(hpk::local::UpArgs),
    /// Stop a local cluster and remove everything it made.
    Down(hpk::local::NameArgs),
    /// Show a cluster's nodes, endpoints and pod counts.
    Status(hpk::local::NameArgs),
    /// A shell (or a command after --) inside a node's bubble.
    Shell(hpk::shell::ShellArgs),
    /// Inside a bubble: ad-hoc containers with a pod address (also installed as `hpktainer`).
    #[command(subcommand)]
    Tainer(hpk::tainer::TainerCmd),
    /// Images: push the bubble's (one per platform) to a registry as one multi-platform image.
    #[command(subcommand)]
    Image(hpk::push::ImageCmd),
    /// Run one bubble in the foreground until SIGTERM (what hpk up and hpk.slurm start).
    Bubble(hpk::bubble::BubbleArgs),
    /// HPK in a Slurm job: what `slurm/hpk.slurm` runs (the batch step and each node's task).
    #[command(subcommand)]
    Slurm(hpk::slurm::SlurmCmd),
    /// The bubble's first process (started by `hpk bubble` inside the bubble).
    #[command(hide = true)]
    BubbleInit(hpk::init::InitArgs),
    /// Preflight: tries user and mount namespaces and an overlay in DIR (what the bubble
    /// does), and prints how far it got.
    #[command(hide = true)]
    BubbleProbe { dir: std::path::PathBuf },
    /// The launcher's newuidmap/newgidmap helper, run before it leaves the host's user
    /// namespace.
    #[command(hide = true)]
    BubbleMapIds { args: Vec<String> },
}

/// `hpktainer …` is `hpk tainer …` (the name users of the original type inside a bubble).
#[derive(Parser)]
#[command(name = "hpktainer", version, about = "Ad-hoc containers with a pod address, inside an HPK bubble")]
struct Tainer {
    #[command(subcommand)]
    command: hpk::tainer::TainerCmd,
}

fn main() {
    hpk_rpc::limits::raise_nofile_or_warn();
    let invoked_as = std::env::args_os()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()));
    let cli = if invoked_as.as_deref() == Some("hpktainer") {
        Cli { command: Cmd::Tainer(Tainer::parse().command) }
    } else {
        Cli::parse()
    };
    match &cli.command {
        // The bubble's supervisor: its own log capped (the launcher gave it bubble.log).
        Cmd::BubbleInit(args) if args.supervise => {
            match hpk::init::capped_log::CappedLog::for_bubble_stderr() {
                Some(log) => hpk_rpc::telemetry::init_with_writer(hpk_rpc::telemetry::LogFormat::Plain, log),
                None => hpk_rpc::telemetry::init(hpk_rpc::telemetry::LogFormat::Plain),
            }
        }
        _ => hpk_rpc::telemetry::init(hpk_rpc::telemetry::LogFormat::Plain),
    }
    let result = match cli.command {
        // Before any thread: the launcher enters a mount namespace, the reaper blocks signals.
        Cmd::Bubble(args) => hpk::bubble::run(&args),
        Cmd::BubbleProbe { dir } => Ok(hpk::preflight::run_probe(&dir)),
        Cmd::BubbleMapIds { args } => Ok(hpk::bubble::ids::map_ids_helper(&args)),
        Cmd::BubbleInit(args) if !args.supervise => hpk::init::reap(),
        Cmd::BubbleInit(args) => runtime().and_then(|rt| rt.block_on(hpk::init::supervise(args))),
        // Also before any thread: a node's task is its bubble's launcher.
        Cmd::Slurm(hpk::slurm::SlurmCmd::Node(args)) => hpk::slurm::node(&args),
        Cmd::Slurm(hpk::slurm::SlurmCmd::Preflight(args)) => hpk::slurm::preflight_node(&args),
        Cmd::Slurm(hpk::slurm::SlurmCmd::Job(args)) => {
            runtime().and_then(|rt| rt.block_on(hpk::slurm::job(&args)))
        }
        Cmd::Up(args) => runtime().and_then(|rt| rt.block_on(hpk::local::up(&args))).map(|()| 0),
        Cmd::Down(args) => hpk::local::down(&args).map(|()| 0),
        Cmd::Status(args) => runtime().and_then(|rt| rt.block_on(hpk::local::status(&args))).map(|()| 0),
        Cmd::Shell(args) => hpk::shell::run(&args),
        Cmd::Image(hpk::push::ImageCmd::Push(args)) => {
            runtime().and_then(|rt| rt.block_on(hpk::push::run(&args)))
        }
        Cmd::Tainer(hpk::tainer::TainerCmd::Run(args)) => {
            runtime().and_then(|rt| rt.block_on(hpk::tainer::run(&args)))
        }
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("hpk: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

fn runtime() -> hpk::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()
        .map_err(|e| hpk::Error::io("start", "the async runtime", e))
}
