//! The reaper and shutdown logic, over small traits so it runs against fakes in unit tests.

use std::collections::BTreeSet;

use nix::sys::signal::Signal;
use tracing::{debug, info, warn};

use super::Result;
use super::event::{ChildExit, Event};

/// How long to wait for SIGKILLed processes before giving up on them (one stuck in an
/// uninterruptible sleep must not keep the sandbox alive; as PID 1 our exit kills it anyway).
const KILL_WAIT_SECONDS: u32 = 5;

/// Why the supervisor woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// SIGTERM or SIGINT: shut down.
    Terminate(Signal),
    /// SIGCHLD: one or more children changed state.
    ChildExited,
    /// SIGHUP: reopen the events channel.
    Hangup,
    /// The alarm armed with [`Os::arm_alarm`] went off.
    Alarm,
}

/// The outcome of one non-blocking wait for any child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reap {
    /// A child was reaped.
    Exited(ChildExit),
    /// Children exist, none has exited.
    NoneReady,
    /// There are no children at all.
    NoChildren,
}

/// Whom to send a signal to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One process.
    Pid(i32),
    /// Every process we may signal in our PID namespace except ourselves (`kill(-1, ..)`).
    All,
}

/// The system calls the supervisor needs.
pub trait Os {
    /// Whether we are PID 1 of our PID namespace.
    fn is_pid1(&self) -> bool;
    /// Blocks until the next signal we handle.
    fn next_wake(&mut self) -> Result<Wake>;
    /// Reaps one exited child without blocking.
    fn reap(&mut self) -> Result<Reap>;
    /// Our direct children now alive.
    fn children(&mut self) -> Result<Vec<i32>>;
    /// Sends `signal`; a target that is already gone is not an error.
    fn kill(&mut self, target: Target, signal: Signal) -> Result<()>;
    /// Delivers [`Wake::Alarm`] after `seconds` (replacing any earlier alarm).
    fn arm_alarm(&mut self, seconds: u32);
}

/// Where events go. Delivery problems are the sink's to handle: it never fails the reaper.
pub trait EventSink {
    /// Queues `event` and tries to deliver it and anything still pending.
    fn send(&mut self, event: Event);
    /// Drops the current connection and opens a new one (SIGHUP).
    fn reconnect(&mut self);
    /// Tries to deliver anything still pending.
    fn flush(&mut self);
}

/// No events channel: exits are only logged.
impl<S: EventSink> EventSink for Option<S> {
    fn send(&mut self, event: Event) {
        if let Some(sink) = self {
            sink.send(event);
        }
    }
    fn reconnect(&mut self) {
        if let Some(sink) = self {
            sink.reconnect();
        }
    }
    fn flush(&mut self) {
        if let Some(sink) = self {
            sink.flush();
        }
    }
}

/// How a shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shutdown {
    /// The signal that asked for it.
    pub signal: Signal,
    /// Whether processes were still alive after the grace period and got SIGKILL.
    pub killed: bool,
}

/// Where a shutdown stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// The signal was forwarded; waiting for the children until the grace alarm.
    Draining(Signal),
    /// SIGKILL was sent; waiting for the last exits until the kill-wait alarm.
    Killing(Signal),
}

/// Reaps, reports and shuts down: the body of `hpk-pause`.
pub struct Supervisor<O, S> {
    os: O,
    sink: S,
    grace_seconds: u32,
    phase: Phase,
    /// Children already sent the shutdown signal (not PID 1: orphans adopted later get it too).
    signalled: BTreeSet<i32>,
}

impl<O: Os, S: EventSink> Supervisor<O, S> {
    /// A supervisor that will wait `grace_seconds` after forwarding a shutdown signal.
    pub fn new(os: O, sink: S, grace_seconds: u32) -> Self {
        Self { os, sink, grace_seconds, phase: Phase::Running, signalled: BTreeSet::new() }
    }

    /// Supervises until a shutdown completes: no children are left, or SIGKILL was not enough.
    pub fn run(&mut self) -> Result<Shutdown> {
        // Children that exited before the loop started have already queued a SIGCHLD; reaping
        // now as well costs one waitpid and keeps the order of events obvious.
        self.reap_all()?;
        loop {
            let wake = self.os.next_wake()?;
            debug!(?wake, "woke");
            if let Some(done) = self.handle(wake)? {
                self.sink.flush();
                return Ok(done);
            }
            self.sink.flush();
        }
    }

    fn handle(&mut self, wake: Wake) -> Result<Option<Shutdown>> {
        match (wake, self.phase) {
            (Wake::ChildExited, _) => self.on_child_exited(),
            (Wake::Terminate(signal), Phase::Running) => self.start_shutdown(signal),
            (Wake::Terminate(signal), _) => {
                info!(%signal, "already shutting down");
                Ok(None)
            }
            (Wake::Hangup, _) => {
                info!("SIGHUP: reopening the events channel");
                self.sink.reconnect();
                Ok(None)
            }
            (Wake::Alarm, Phase::Draining(signal)) => {
                warn!(grace_seconds = self.grace_seconds, "grace period over");
                self.kill_everything(signal)
            }
            (Wake::Alarm, Phase::Killing(signal)) => {
                warn!(alive = ?self.children(), "processes survived SIGKILL; leaving them");
                Ok(Some(Shutdown { signal, killed: true }))
            }
            (Wake::Alarm, Phase::Running) => Ok(None),
        }
    }

    fn on_child_exited(&mut self) -> Result<Option<Shutdown>> {
        let children_left = self.reap_all()?;
        match self.phase {
            Phase::Running => Ok(None),
            Phase::Draining(signal) | Phase::Killing(signal) if !children_left => {
                info!(%signal, "all children gone");
                Ok(Some(Shutdown { signal, killed: matches!(self.phase, Phase::Killing(_)) }))
            }
            Phase::Draining(signal) => {
                // Not PID 1: orphans reparented to us since the forward never got the signal.
                if !self.os.is_pid1() {
                    self.signal_children(signal);
                }
                Ok(None)
            }
            Phase::Killing(_) => {
                // Orphans of killed processes land on us and need their own SIGKILL.
                self.signal_everyone(Signal::SIGKILL);
                Ok(None)
            }
        }
    }

    fn start_shutdown(&mut self, signal: Signal) -> Result<Option<Shutdown>> {
        info!(%signal, grace_seconds = self.grace_seconds, "shutting down");
        if !self.reap_all()? {
            return Ok(Some(Shutdown { signal, killed: false }));
        }
        if self.grace_seconds == 0 {
            return self.kill_everything(signal);
        }
        self.phase = Phase::Draining(signal);
        self.signal_everyone(signal);
        self.os.arm_alarm(self.grace_seconds);
        Ok(None)
    }

    fn kill_everything(&mut self, signal: Signal) -> Result<Option<Shutdown>> {
        self.phase = Phase::Killing(signal);
        self.signal_everyone(Signal::SIGKILL);
        self.os.arm_alarm(KILL_WAIT_SECONDS);
        Ok(None)
    }

    /// The whole namespace when PID 1, else every direct child.
    fn signal_everyone(&mut self, signal: Signal) {
        if self.os.is_pid1() {
            self.kill(Target::All, signal);
            return;
        }
        self.signalled.clear();
        self.signal_children(signal);
    }

    /// Sends `signal` to the direct children that have not had it yet.
    fn signal_children(&mut self, signal: Signal) {
        for pid in self.children() {
            if self.signalled.insert(pid) {
                debug!(pid, %signal, "forwarding");
                self.kill(Target::Pid(pid), signal);
            }
        }
    }

    // A shutdown goes on when one signal cannot be sent or /proc cannot be read: the grace and
    // kill-wait alarms still end it. Only losing the signalfd or waitpid is fatal.

    fn kill(&mut self, target: Target, signal: Signal) {
        if let Err(error) = self.os.kill(target, signal) {
            warn!(?target, %signal, %error, "could not send signal");
        }
    }

    fn children(&mut self) -> Vec<i32> {
        self.os.children().unwrap_or_else(|error| {
            warn!(%error, "could not list children");
            Vec::new()
        })
    }

    /// Reaps every exited child and reports it. Returns whether any children are left.
    fn reap_all(&mut self) -> Result<bool> {
        loop {
            match self.os.reap()? {
                Reap::Exited(exit) => {
                    info!(
                        pid = exit.pid,
                        exit_code = ?exit.exit_code,
                        signal = ?exit.signal,
                        "reaped"
                    );
                    self.signalled.remove(&exit.pid);
                    self.sink.send(Event::Exit(exit));
                }
                Reap::NoneReady => return Ok(true),
                Reap::NoChildren => return Ok(false),
            }
        }
    }
}

#[cfg(test)]
mod tests;
