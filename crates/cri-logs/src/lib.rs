//! Container logs, as the kubelet serves `/containerLogs/{namespace}/{pod}/{container}`.
//!
//! Shared by the kubelet (its own API, the log file on its machine) and the pod-runtime
//! (`hpk.podruntime.v1.Remote/ReadLog`, for a kubelet on another machine), so both render a
//! log the same way.
//!
//! [`LogOptions::from_query`] reads the request's query; [`open`] (or [`stream`]) turns the
//! container's log file, in the CRI format (`<RFC3339Nano> <stdout|stderr> <P|F> <content>`
//! per line), into the bytes the client receives: records filtered by stream and `since`,
//! `tailLines` found by reading backwards, `timestamps`, `limitBytes`, and `follow`.
//!
//! Following wakes on inotify events for the file (a 50 ms poll where inotify cannot be set
//! up), shows only lines whose `\n` has been written, and asks [`Running`] at the first end of
//! file and then about once a second; once the container has stopped, the rest of the file is
//! read as without `follow` and the stream ends. When the file at the path is replaced (the
//! kubelet rotated the log: renamed it, and the runtime reopened a new one), the follower
//! reads the old file to its end and goes on with the new one from its start.

mod options;
mod reader;
mod record;
mod tail;
mod watch;

#[cfg(test)]
mod tests;

pub use options::{LogOptions, LogStream};
pub use reader::{Running, open, stream};
