//! The supervisor against a scripted fake: which signals go where, what gets reported, when it
//! stops.

use std::collections::VecDeque;

use nix::sys::signal::Signal::{self, SIGKILL, SIGTERM};

use super::*;

/// One scripted wake-up and what the "kernel" did just before it.
struct Step {
    wake: Wake,
    /// Children that became zombies.
    exits: Vec<ChildExit>,
    /// Orphans reparented to us.
    adopted: Vec<i32>,
}

fn step(wake: Wake) -> Step {
    Step { wake, exits: Vec::new(), adopted: Vec::new() }
}

fn chld(exits: Vec<ChildExit>) -> Step {
    Step { exits, ..step(Wake::ChildExited) }
}

/// A process table: live children, zombies, and a record of every kill and alarm.
#[derive(Default)]
struct FakeOs {
    pid1: bool,
    script: VecDeque<Step>,
    alive: Vec<i32>,
    zombies: VecDeque<ChildExit>,
    kills: Vec<(Target, Signal)>,
    alarms: Vec<u32>,
    /// Every kill and every children listing fails (EPERM, unreadable /proc).
    broken: bool,
}

impl FakeOs {
    fn new(pid1: bool, alive: &[i32], script: Vec<Step>) -> Self {
        Self { pid1, alive: alive.to_vec(), script: script.into(), ..Self::default() }
    }
}

impl Os for FakeOs {
    fn is_pid1(&self) -> bool {
        self.pid1
    }

    fn next_wake(&mut self) -> Result<Wake> {
        let step = self.script.pop_front().expect("the supervisor waited past the end of the script");
        self.alive.extend(step.adopted);
        for exit in step.exits {
            self.alive.retain(|pid| *pid != exit.pid);
            self.zombies.push_back(exit);
        }
        Ok(step.wake)
    }

    fn reap(&mut self) -> Result<Reap> {
        Ok(match self.zombies.pop_front() {
            Some(exit) => Reap::Exited(exit),
            None if self.alive.is_empty() => Reap::NoChildren,
            None => Reap::NoneReady,
        })
    }

    fn children(&mut self) -> Result<Vec<i32>> {
        if self.broken {
            return Err(crate::pause::Error::Sys { action: "list", source: nix::errno::Errno::EIO });
        }
        Ok(self.alive.clone())
    }

    fn kill(&mut self, target: Target, signal: Signal) -> Result<()> {
        self.kills.push((target, signal));
        if self.broken {
            return Err(crate::pause::Error::Sys { action: "kill", source: nix::errno::Errno::EPERM });
        }
        Ok(())
    }

    fn arm_alarm(&mut self, seconds: u32) {
        self.alarms.push(seconds);
    }
}

#[derive(Default)]
struct RecordingSink {
    events: Vec<Event>,
    reconnects: usize,
}

impl EventSink for RecordingSink {
    fn send(&mut self, event: Event) {
        self.events.push(event);
    }
    fn reconnect(&mut self) {
        self.reconnects += 1;
    }
    fn flush(&mut self) {}
}

fn run(os: FakeOs, grace: u32) -> (Shutdown, FakeOs, RecordingSink) {
    let mut supervisor = Supervisor::new(os, RecordingSink::default(), grace);
    let shutdown = supervisor.run().expect("the fake never fails");
    let Supervisor { os, sink, .. } = supervisor;
    assert!(os.script.is_empty(), "steps left unused: the supervisor stopped early");
    (shutdown, os, sink)
}

fn exits(sink: &RecordingSink) -> Vec<ChildExit> {
    sink.events
        .iter()
        .filter_map(|event| match event {
            Event::Exit(exit) => Some(*exit),
            Event::Ready { .. } => None,
        })
        .collect()
}

#[test]
fn every_exit_is_reported_in_order_including_several_per_sigchld() {
    let script = vec![
        chld(vec![ChildExit::exited(10, 3)]),
        chld(vec![ChildExit::killed(11, 9), ChildExit::exited(12, 0)]),
        step(Wake::Terminate(SIGTERM)),
    ];
    let (shutdown, os, sink) = run(FakeOs::new(false, &[10, 11, 12], script), 10);
    assert_eq!(exits(&sink), [ChildExit::exited(10, 3), ChildExit::killed(11, 9), ChildExit::exited(12, 0)]);
    assert_eq!(shutdown, Shutdown { signal: SIGTERM, killed: false });
    assert!(os.kills.is_empty(), "nobody was left to signal");
}

#[test]
fn terminate_is_forwarded_to_each_child_then_the_supervisor_stops_when_they_exit() {
    let script = vec![
        step(Wake::Terminate(SIGTERM)),
        chld(vec![ChildExit::exited(20, 7)]),
        chld(vec![ChildExit::exited(21, 0)]),
    ];
    let (shutdown, os, sink) = run(FakeOs::new(false, &[20, 21], script), 10);
    assert_eq!(os.kills, [(Target::Pid(20), SIGTERM), (Target::Pid(21), SIGTERM)]);
    assert_eq!(os.alarms, [10]);
    assert_eq!(exits(&sink).len(), 2);
    assert!(!shutdown.killed);
}

#[test]
fn as_pid1_the_whole_namespace_gets_the_signal() {
    let script = vec![step(Wake::Terminate(Signal::SIGINT)), chld(vec![ChildExit::killed(2, 2)])];
    let (shutdown, os, _) = run(FakeOs::new(true, &[2], script), 10);
    assert_eq!(os.kills, [(Target::All, Signal::SIGINT)]);
    assert_eq!(shutdown.signal, Signal::SIGINT);
}

#[test]
fn orphans_adopted_while_draining_get_the_signal_once() {
    let mut orphaned = chld(vec![ChildExit::exited(30, 0)]);
    orphaned.adopted = vec![31];
    let script = vec![step(Wake::Terminate(SIGTERM)), orphaned, chld(vec![ChildExit::exited(31, 0)])];
    let (_, os, _) = run(FakeOs::new(false, &[30], script), 10);
    assert_eq!(os.kills, [(Target::Pid(30), SIGTERM), (Target::Pid(31), SIGTERM)]);
}

#[test]
fn after_the_grace_period_what_is_left_gets_sigkill() {
    let script =
        vec![step(Wake::Terminate(SIGTERM)), step(Wake::Alarm), chld(vec![ChildExit::killed(40, 9)])];
    let (shutdown, os, sink) = run(FakeOs::new(false, &[40], script), 1);
    assert_eq!(os.kills, [(Target::Pid(40), SIGTERM), (Target::Pid(40), SIGKILL)]);
    assert_eq!(os.alarms, [1, KILL_WAIT_SECONDS]);
    assert_eq!(exits(&sink), [ChildExit::killed(40, 9)]);
    assert!(shutdown.killed);
}

#[test]
fn zero_grace_kills_at_once_and_a_second_terminate_changes_nothing() {
    let script = vec![
        step(Wake::Terminate(SIGTERM)),
        step(Wake::Terminate(SIGTERM)),
        chld(vec![ChildExit::killed(2, 9)]),
    ];
    let (shutdown, os, _) = run(FakeOs::new(true, &[2], script), 0);
    assert_eq!(os.kills, [(Target::All, SIGKILL)]);
    assert!(shutdown.killed);
}

#[test]
fn survivors_of_sigkill_do_not_keep_the_pause_alive() {
    let script = vec![step(Wake::Terminate(SIGTERM)), step(Wake::Alarm), step(Wake::Alarm)];
    let (shutdown, os, _) = run(FakeOs::new(false, &[50], script), 1);
    assert!(shutdown.killed);
    assert_eq!(os.alive, [50]);
}

#[test]
fn terminate_without_children_stops_at_once() {
    let (shutdown, os, _) = run(FakeOs::new(true, &[], vec![step(Wake::Terminate(SIGTERM))]), 10);
    assert!(!shutdown.killed);
    assert!(os.kills.is_empty() && os.alarms.is_empty());
}

#[test]
fn hangup_reopens_the_channel_and_stray_alarms_are_ignored() {
    let script = vec![step(Wake::Hangup), step(Wake::Alarm), step(Wake::Terminate(SIGTERM))];
    let (_, _, sink) = run(FakeOs::new(false, &[], script), 10);
    assert_eq!(sink.reconnects, 1);
}

#[test]
fn failing_kills_and_listings_do_not_abort_the_shutdown() {
    let script = vec![step(Wake::Terminate(SIGTERM)), step(Wake::Alarm), step(Wake::Alarm)];
    let mut os = FakeOs::new(true, &[2], script);
    os.broken = true;
    let (shutdown, os, _) = run(os, 1);
    assert_eq!(os.kills, [(Target::All, SIGTERM), (Target::All, SIGKILL)]);
    assert!(shutdown.killed);
}
