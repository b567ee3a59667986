//! The logic of `hpk-pause`, PID 1 of every sandbox.
//!
//! The runtime starts `hpk-pause` with crun in new PID, network, IPC, UTS and mount namespaces;
//! pod containers later join them, so a container's init whose parent (crun) has exited is
//! reparented to the pause. The pause therefore:
//!
//! - handles SIGTERM, SIGINT, SIGCHLD and SIGHUP (and SIGALRM, its grace timer) through a
//!   signalfd: PID 1 of a namespace ignores signals it has no handler for, so this is required;
//! - reaps every zombie and reports each exit at once, as one JSON line ([`Event`]), on the
//!   events channel the runtime created — the first line of each connection says it is ready;
//! - on SIGTERM/SIGINT forwards the signal (to the whole namespace when PID 1), waits up to a
//!   grace period, SIGKILLs what is left and returns.
//!
//! When it is not PID 1 (tests, or a command run without a new PID namespace) it makes itself
//! the child subreaper, so orphans are still reparented to it.
//!
//! The decisions live in [`Supervisor`], over the [`Os`] and [`EventSink`] traits, so they are
//! unit-tested with fakes; [`SignalOs`] and [`EventsChannel`] are the real implementations.

mod channel;
mod error;
mod event;
mod os;
mod spawn;
mod supervisor;

pub use channel::EventsChannel;
pub use error::{Error, Result};
pub use event::{ChildExit, Event};
pub use os::SignalOs;
pub use supervisor::{EventSink, Os, Reap, Shutdown, Supervisor, Target, Wake};

use std::ffi::OsString;
use std::path::PathBuf;

use tracing::info;

/// What `hpk-pause` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The runtime's events channel (a UNIX stream socket or a FIFO); `None` reports nothing.
    pub events: Option<PathBuf>,
    /// Seconds between forwarding SIGTERM/SIGINT and SIGKILLing what is left.
    pub grace_seconds: u32,
    /// A command to start as the first child (program and arguments); may be empty.
    pub command: Vec<OsString>,
}

/// Sets up signal handling, reports readiness, starts the optional command and supervises
/// until a SIGTERM/SIGINT shutdown completes.
pub fn run(config: Config) -> Result<Shutdown> {
    // Signals first: a child exiting or a SIGTERM arriving from here on is queued, never lost.
    let os = SignalOs::setup()?;
    let events = match &config.events {
        Some(path) => Some(EventsChannel::connect(path, os.own_pid())?),
        None => None,
    };
    info!(pid = os.own_pid(), pid1 = os.is_pid1(), "ready");
    let mut supervisor = Supervisor::new(os, events, config.grace_seconds);
    if let Some((program, args)) = config.command.split_first() {
        spawn(program, args)?;
    }
    supervisor.run()
}

/// Starts the trailing command. Only its PID is kept: the reaper collects it like any child.
fn spawn(program: &OsString, args: &[OsString]) -> Result<()> {
    let pid = spawn::spawn(program, args)?;
    info!(pid, command = %program.to_string_lossy(), "command started");
    Ok(())
}
