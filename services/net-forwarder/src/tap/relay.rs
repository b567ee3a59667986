//! The relay of one TAP attachment: frames copied between the pod's TAP and the bubble's, with
//! their virtio-net headers passed through unchanged.
//!
//! Both devices have IFF_VNET_HDR and TSO/checksum offloads, so a TCP burst crosses as 64 KiB
//! GSO frames with partial checksums, one read and one write each: the cost of a relay is per
//! frame, not per byte. One thread per direction with plain blocking-style I/O: the directions
//! run on separate cores with no scheduling between them, and a thread needs no state beyond
//! its buffer. The descriptors are non-blocking and a thread waits in `poll` only when its
//! source is empty, on the source and on a pipe whose write end the relay holds: dropping it
//! (on stop) wakes both threads. Under constant traffic they never poll, so they also check a
//! flag before each frame.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tracing::{debug, warn};

use crate::stats::Counters;
use crate::tuntap::{Device, VNET_HDR_LEN};
use crate::{Error, Result};

/// Room for a virtio-net header and a 64 KiB GSO frame with its Ethernet header.
const BUFFER: usize = VNET_HDR_LEN + 65536 + 512;

/// Counters of one direction.
#[derive(Default)]
struct Direction {
    frames: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
    errors: AtomicU64,
}

struct Shared {
    stopping: AtomicBool,
    /// Pod → bubble.
    from_pod: Direction,
    /// Bubble → pod.
    to_pod: Direction,
}

/// A running relay between a pod's TAP and its bubble-side TAP.
pub struct Relay {
    shared: Arc<Shared>,
    /// Dropping it makes the read end poll as hung up, which wakes a waiting thread.
    wake: Option<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
    pod: Arc<Device>,
    bubble: Arc<Device>,
}

impl Relay {
    /// Starts the two copying threads; both devices are switched to non-blocking mode.
    pub fn start(pod: Arc<Device>, bubble: Arc<Device>) -> Result<Self> {
        pod.set_nonblocking()?;
        bubble.set_nonblocking()?;
        let (wait, wake) =
            nix::unistd::pipe().map_err(|e| Error::io("create the relay's wake-up pipe", e.into()))?;
        let wait = Arc::new(wait);
        let shared = Arc::new(Shared {
            stopping: AtomicBool::new(false),
            from_pod: Direction::default(),
            to_pod: Direction::default(),
        });
        let mut relay = Relay { shared, wake: Some(wake), threads: Vec::new(), pod, bubble };
        for from_pod in [true, false] {
            let (src, dst) = if from_pod {
                (relay.pod.clone(), relay.bubble.clone())
            } else {
                (relay.bubble.clone(), relay.pod.clone())
            };
            let (shared, wait) = (relay.shared.clone(), wait.clone());
            let spawned = std::thread::Builder::new().name("tap-relay".into()).spawn(move || {
                let counters = if from_pod { &shared.from_pod } else { &shared.to_pod };
                copy(&src, &dst, &wait, &shared.stopping, counters);
            });
            match spawned {
                Ok(handle) => relay.threads.push(handle),
                Err(e) => {
                    relay.shutdown();
                    return Err(Error::io("start a relay thread", e));
                }
            }
        }
        Ok(relay)
    }

    /// The attachment's counters as seen from the bubble, as for a veth: `rx` came from the
    /// pod, `tx` went to it. Dropped: frames the relay could not write; errors: failed reads.
    pub fn counters(&self) -> Counters {
        let (rx, tx) = (&self.shared.from_pod, &self.shared.to_pod);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            rx_bytes: get(&rx.bytes),
            rx_packets: get(&rx.frames),
            rx_errors: get(&rx.errors),
            rx_dropped: get(&rx.dropped),
            tx_bytes: get(&tx.bytes),
            tx_packets: get(&tx.frames),
            tx_errors: get(&tx.errors),
            tx_dropped: get(&tx.dropped),
        }
    }

    /// Stops and joins both threads; returns the devices (pod, bubble) for the caller to keep
    /// or delete.
    pub fn stop(mut self) -> (Arc<Device>, Arc<Device>) {
        self.shutdown();
        (self.pod.clone(), self.bubble.clone())
    }

    fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.wake = None;
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                warn!("a relay thread panicked");
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Copies frames from `src` to `dst` until `stopping` is set or `src` is gone.
fn copy(src: &Device, dst: &Device, wait: &OwnedFd, stopping: &AtomicBool, counters: &Direction) {
    let mut buffer = vec![0u8; BUFFER];
    while !stopping.load(Ordering::Relaxed) {
        let n = match src.file().read(&mut buffer) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !wait_readable(src, wait) {
                    return;
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EBADFD: the device was deleted (its namespace went away); nothing more comes.
                debug!(device = src.name(), error = %e, "relay source closed");
                return;
            }
        };
        if n <= VNET_HDR_LEN {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // A TAP takes a frame whole or not at all.
        match dst.file().write(&buffer[..n]) {
            Ok(written) if written == n => {
                counters.frames.fetch_add(1, Ordering::Relaxed);
                counters.bytes.fetch_add((n - VNET_HDR_LEN) as u64, Ordering::Relaxed);
            }
            // Down, no carrier, out of memory, or deleted: the frame is lost, as on a wire.
            _ => {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Waits until `src` has a frame (true) or the relay is stopping or `src` is gone (false).
fn wait_readable(src: &Device, wait: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(src.as_fd(), PollFlags::POLLIN), PollFd::new(wait.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::NONE) {
        Ok(_) => {
            let woken = fds[1].revents().is_some_and(|r| !r.is_empty());
            let gone = fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL));
            !woken && !gone
        }
        Err(nix::errno::Errno::EINTR) => true,
        Err(e) => {
            warn!(device = src.name(), error = %e, "relay cannot poll");
            false
        }
    }
}
