//! The TAP attachment: the fallback for hosts where a veth pair into the pod's namespace is
//! refused (or when `--attach-mode tap` asks for it).
//!
//! The pod gets a TAP named `eth0`, created inside its namespace by a helper process that
//! passes the descriptor back ([`helper`]); the bubble gets a TAP `hpkt` + 11 hex digits of the
//! id's SHA-256 with the gateway address and the /32 route to the pod, configured exactly as a
//! veth's ends are. A [`relay::Relay`] in this process copies frames between the two. Both TAPs
//! are persistent: a restarted net-forwarder re-opens them by name and restarts the relay, and
//! the pod keeps its interface, address and routes (traffic stops while the relay is down). On
//! detach the persistence is cleared and the descriptors closed, which deletes both.

pub mod helper;
pub mod relay;

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

use rtnetlink::Handle;
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::link::{AttachSpec, POD_INTERFACE, configure_host, configure_pod, in_netns};
use crate::stats::Counters;
use crate::tuntap::Device;
use crate::{Error, Result};
use helper::TAP_OPTIONS;
use relay::Relay;

/// Prefix of bubble-side TAP names; anything with it is the net-forwarder's.
pub const TAP_PREFIX: &str = "hpkt";

/// The bubble-side TAP name of a sandbox: the prefix and 11 hex digits of its id's SHA-256.
pub fn tap_interface(sandbox_id: &str) -> String {
    format!("{TAP_PREFIX}{}", &hex::encode(Sha256::digest(sandbox_id))[..11])
}

/// The running relays of TAP attachments, by sandbox id.
#[derive(Default)]
pub struct Taps {
    relays: Mutex<HashMap<String, Relay>>,
}

impl Taps {
    fn relays(&self) -> MutexGuard<'_, HashMap<String, Relay>> {
        // A panic elsewhere while holding the lock leaves the map itself consistent.
        self.relays.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the sandbox is attached with TAPs by this process.
    pub fn contains(&self, sandbox_id: &str) -> bool {
        self.relays().contains_key(sandbox_id)
    }

    /// The relay's counters of a TAP attachment.
    pub fn counters(&self, sandbox_id: &str) -> Option<Counters> {
        self.relays().get(sandbox_id).map(Relay::counters)
    }

    /// Creates both TAPs (or re-opens them, after a restart), configures them as for a veth and
    /// starts the relay. On failure both TAPs are deleted.
    pub async fn attach(&self, h: &Handle, spec: &AttachSpec, netns: &File) -> Result<()> {
        let name = tap_interface(&spec.sandbox_id);
        let pod_netns = netns.try_clone().map_err(|e| Error::io("duplicate the namespace fd", e))?;
        let pod = tokio::task::spawn_blocking(move || helper::open_in(&pod_netns, POD_INTERFACE))
            .await
            .map_err(|_| Error::Config("the TAP helper's thread panicked".into()))??;
        let pod = Arc::new(pod);
        let bubble = match Device::create(&name, TAP_OPTIONS) {
            Ok(bubble) => Arc::new(bubble),
            Err(e) => {
                discard(&pod);
                return Err(e);
            }
        };
        let started = match configure(h, spec, netns, &pod, &bubble).await {
            Ok(()) => Relay::start(pod.clone(), bubble.clone()),
            Err(e) => Err(e),
        };
        match started {
            Ok(relay) => {
                self.relays().insert(spec.sandbox_id.clone(), relay);
                Ok(())
            }
            Err(e) => {
                discard(&pod);
                discard(&bubble);
                Err(e)
            }
        }
    }

    /// Stops a sandbox's relay and deletes both TAPs; nothing to do if it has none.
    pub async fn detach(&self, sandbox_id: &str) {
        let Some(relay) = self.relays().remove(sandbox_id) else { return };
        let stopped = tokio::task::spawn_blocking(move || {
            let (pod, bubble) = relay.stop();
            discard(&pod);
            discard(&bubble);
        });
        if stopped.await.is_err() {
            warn!(sandbox = %sandbox_id, "stopping the relay panicked");
        }
    }
}

async fn configure(h: &Handle, spec: &AttachSpec, netns: &File, pod: &Device, bubble: &Device) -> Result<()> {
    pod.set_persistent(true)?;
    bubble.set_persistent(true)?;
    let pod_side = (POD_INTERFACE.to_owned(), spec.address, spec.mtu);
    in_netns(netns, move |handle| configure_pod(handle, pod_side)).await?;
    configure_host(h, bubble.name(), spec.address, spec.mtu).await
}

/// Lets a device go with its last descriptor, which the caller is about to drop.
fn discard(device: &Device) {
    // Fails only when the device is gone already (its namespace was deleted).
    if let Err(e) = device.set_persistent(false) {
        tracing::debug!(device = device.name(), error = %e, "cannot clear persistence");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_names_fit_and_differ_from_veth_names() {
        let name = tap_interface("sandbox-a");
        assert_eq!(name.len(), 15);
        assert!(name.starts_with(TAP_PREFIX));
        assert_ne!(&name[4..], &crate::link::host_interface("sandbox-b")[4..]);
        assert_eq!(&name[4..], &crate::link::host_interface("sandbox-a")[4..]);
    }
}
