//! hpk-pause: PID 1 of a pod sandbox. Reaps every process, reports each exit to the runtime and
//! shuts the sandbox down on SIGTERM. The logic is in [`hpk_pod_runtime::pause`].

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hpk_pod_runtime::pause::{self, Config};
use tracing::level_filters::LevelFilter;
use tracing::{error, info};

/// PID 1 of a pod sandbox: reaps every process and reports each exit to the runtime.
///
/// On SIGTERM or SIGINT the signal is forwarded (to the whole PID namespace when PID 1, else to
/// each child), the children get `--grace` seconds, then what is left gets SIGKILL, and the
/// pause exits 0. SIGHUP reopens the events channel. When not PID 1 the pause becomes child
/// subreaper, so orphans are reparented to it.
///
/// Events are JSON lines: `{"ready":true,"pid":N}` first on each connection, then
/// `{"pid":N,"host_pid":null,"exit_code":C,"signal":S}` per reaped process.
///
/// Exit codes: 0 after a shutdown, 1 when setup failed, 2 for a usage error.
#[derive(Debug, Parser)]
#[command(name = "hpk-pause", version)]
struct Args {
    /// The runtime's events channel: a UNIX stream socket or a FIFO (or a file) to write to.
    #[arg(long, env = "HPK_PAUSE_EVENTS", value_name = "PATH")]
    events: Option<PathBuf>,

    /// Seconds between forwarding SIGTERM/SIGINT and sending SIGKILL.
    #[arg(long, env = "HPK_PAUSE_GRACE", value_name = "SECONDS", default_value_t = 10)]
    grace: u32,

    /// The most verbose level logged to stderr: off, error, warn, info, debug, trace.
    #[arg(long, env = "HPK_LOG", value_name = "LEVEL", default_value = "info")]
    log: LevelFilter,

    /// A command to start as the first child, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    hpk_rpc::limits::raise_nofile_or_warn();
    // Plain fmt with a level, no EnvFilter: this runs once per pod, so it stays small. A log
    // write that fails (the reader of our stderr went away) is dropped: the default reports it
    // with eprint!, which panics on EPIPE, and PID 1 must not die of a log line.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false)
        .with_max_level(args.log)
        .with_target(false)
        .init();
    let config = Config { events: args.events, grace_seconds: args.grace, command: args.command };
    match pause::run(config) {
        Ok(shutdown) => {
            info!(signal = %shutdown.signal, killed = shutdown.killed, "shut down");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = %e, "hpk-pause failed");
            ExitCode::FAILURE
        }
    }
}
