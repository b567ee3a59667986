//! Liveness, readiness and startup probes: one attempt (`check.rs`: exec through CRI
//! ExecSync; httpGet, tcpSocket and grpc through `hpk-probe`'s clients, or in connector mode
//! through the remote runtime's `Remote/Probe`, which runs the same clients on its side) and
//! the worker that runs a probe on its schedule and reports when its thresholds are crossed
//! (`worker.rs`).

mod check;
mod worker;

#[cfg(test)]
mod testing;

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Container;

pub use check::check;
pub use hpk_probe::ProbeFailure;
pub use worker::spawn;

/// Which of a container's probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// Restart the container when it fails.
    Liveness,
    /// Keep the pod out of Service endpoints while it fails.
    Readiness,
    /// Hold liveness and readiness back until it succeeds once.
    Startup,
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        })
    }
}

/// What a probe talks to.
#[derive(Clone)]
pub struct Target {
    /// The pod's primary address: the default host of httpGet and tcpSocket, the host of grpc.
    pub pod_ip: Option<IpAddr>,
    /// The container, for exec probes.
    pub container_id: String,
    /// The container's spec, for named ports.
    pub container: Container,
    /// The runtime, for exec probes.
    pub cri: std::sync::Arc<dyn crate::cri::CriClient>,
    /// The pod's sandbox, which a remote runtime's probes name.
    pub sandbox_id: String,
    /// In connector mode, the remote runtime, which runs the network probes on its side (the
    /// pod's address is not reachable from this machine); `None`: this machine runs them.
    pub remote: Option<hpk_proto::podruntime::v1::remote_client::RemoteClient<tonic::transport::Channel>>,
}

/// The result of one probe attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The container passed.
    Success,
    /// The container failed, worded as the kubelet's Unhealthy event
    /// (`Liveness probe failed: HTTP probe failed with statuscode: 500`).
    Failure(String),
    /// The container passed, with a warning worded as the kubelet's ProbeWarning event
    /// (`Liveness probe warning: Probe terminated redirects, Response body: …`).
    Warning(String),
    /// The attempt could not be made (a remote runtime that does not answer): thrown away,
    /// as upstream's prober throws away its own errors, with neither an event nor a count
    /// toward a threshold. A node cut from its runtime reports NotReady instead.
    Unknown(String),
}

/// What a probe worker tells the pod's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeReport {
    /// One attempt failed (worth an Unhealthy event even below the threshold).
    Failed {
        /// The container's name.
        container: String,
        /// Which probe.
        kind: ProbeKind,
        /// Why, as in [`Outcome::Failure`].
        message: String,
    },
    /// One attempt passed with a warning (a ProbeWarning event).
    Warned {
        /// The container's name.
        container: String,
        /// Which probe.
        kind: ProbeKind,
        /// What, as in [`Outcome::Warning`].
        message: String,
    },
    /// The probe's verdict changed: successThreshold successes or failureThreshold failures in
    /// a row.
    Changed {
        /// The container's name.
        container: String,
        /// Which probe.
        kind: ProbeKind,
        /// Ready, alive, or started.
        healthy: bool,
    },
}
