//! The lines `hpk-pause` writes on the events channel: one JSON object per line.
//!
//! - `{"ready":true,"pid":<own pid>,"queued":<n>}` first on every connection, once signals are
//!   handled; `queued` exit lines kept while no runtime listened follow it at once (a runtime
//!   that restarted reads them before it reconciles its containers with `/proc`);
//! - `{"pid":..,"host_pid":..,"exit_code":..,"signal":..}` for every reaped process.
//!
//! PIDs are those of the pause's PID namespace; `host_pid` is always `null` from the pause
//! (it cannot see the host's numbering) and is there for the runtime, which maps PIDs through
//! `/proc/<host pid>/status` `NSpid`. Several pauses may share one listening socket: the
//! runtime tells them apart with `SO_PEERCRED`.

use serde::{Deserialize, Serialize};

/// How one reaped process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildExit {
    /// Its PID in the pause's namespace.
    pub pid: i32,
    /// Its PID on the host, when known (never by the pause itself).
    pub host_pid: Option<i32>,
    /// Its exit status, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
}

impl ChildExit {
    /// A process that exited with `code`.
    pub fn exited(pid: i32, code: i32) -> Self {
        Self { pid, host_pid: None, exit_code: Some(code), signal: None }
    }

    /// A process killed by `signal`.
    pub fn killed(pid: i32, signal: i32) -> Self {
        Self { pid, host_pid: None, exit_code: None, signal: Some(signal) }
    }
}

/// One line on the events channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Signal handling is set up; `pid` is the pause's own PID (1 in a sandbox).
    Ready {
        /// The pause's PID in its namespace.
        pid: i32,
        /// How many exit lines, kept while the channel was closed, follow this one.
        queued: usize,
    },
    /// A process was reaped.
    Exit(ChildExit),
}

/// The wire shape; `ready` comes first so a ready line never parses as an exit.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Wire {
    Ready {
        ready: bool,
        pid: i32,
        #[serde(default)]
        queued: usize,
    },
    Exit(ChildExit),
}

impl Event {
    /// The event as one JSON line, newline included.
    pub fn to_line(&self) -> String {
        let wire = match *self {
            Event::Ready { pid, queued } => Wire::Ready { ready: true, pid, queued },
            Event::Exit(exit) => Wire::Exit(exit),
        };
        let mut line = serde_json::to_string(&wire).expect("integers and options always serialize to JSON");
        line.push('\n');
        line
    }

    /// Parses one line written by [`Event::to_line`] (for the runtime and tests).
    pub fn from_line(line: &str) -> Result<Self, serde_json::Error> {
        match serde_json::from_str(line.trim_end())? {
            Wire::Ready { ready: true, pid, queued } => Ok(Event::Ready { pid, queued }),
            Wire::Ready { ready: false, .. } => {
                Err(serde::de::Error::custom("\"ready\": false is never sent by hpk-pause"))
            }
            Wire::Exit(exit) => Ok(Event::Exit(exit)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_match_the_documented_format() {
        assert_eq!(Event::Ready { pid: 1, queued: 0 }.to_line(), "{\"ready\":true,\"pid\":1,\"queued\":0}\n");
        assert_eq!(
            Event::Exit(ChildExit::exited(7, 3)).to_line(),
            "{\"pid\":7,\"host_pid\":null,\"exit_code\":3,\"signal\":null}\n"
        );
        assert_eq!(
            Event::Exit(ChildExit::killed(8, 9)).to_line(),
            "{\"pid\":8,\"host_pid\":null,\"exit_code\":null,\"signal\":9}\n"
        );
    }

    #[test]
    fn lines_round_trip() {
        for event in [
            Event::Ready { pid: 42, queued: 3 },
            Event::Exit(ChildExit::exited(2, 0)),
            Event::Exit(ChildExit::killed(3, 15)),
        ] {
            assert_eq!(Event::from_line(&event.to_line()).ok(), Some(event));
        }
    }

    #[test]
    fn junk_is_an_error() {
        assert!(Event::from_line("{\"ready\":false,\"pid\":1}").is_err());
        assert!(Event::from_line("not json").is_err());
    }
}
