//! The sandbox's network: a pod address from hpk-net-forwarder (a veth pair from the bubble
//! into the sandbox's network namespace), or loopback only when no net-forwarder is configured
//! or the pod uses the host's network.

use std::path::{Path, PathBuf};

use hpk_proto::netforwarder::v1::net_forwarder_client::NetForwarderClient;
use hpk_proto::netforwarder::v1::{AttachRequest, DetachRequest};

use super::{Error, Result};

/// Where a sandbox's interfaces come from.
#[derive(Clone, Debug)]
pub struct PodNetwork {
    socket: PathBuf,
}

impl PodNetwork {
    /// The net-forwarder listening on `socket`.
    pub fn new(socket: &Path) -> Self {
        Self { socket: socket.to_owned() }
    }

    async fn client(&self) -> Result<NetForwarderClient<tonic::transport::Channel>> {
        let channel = hpk_rpc::connect::unix(&self.socket).await.map_err(|e| {
            Error::Unavailable(format!(
                "the net-forwarder at {} cannot be reached: {e}",
                self.socket.display()
            ))
        })?;
        Ok(NetForwarderClient::new(channel))
    }

    /// Whether pods get a network (CRI `NetworkReady`): the net-forwarder answers its health
    /// check SERVING, which it does while its tunnel and routes are in place. `Err` says why
    /// not, with the net-forwarder's own reason when it gives one.
    pub async fn ready(&self) -> std::result::Result<(), String> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let check = async {
            let channel = hpk_rpc::connect::unix(&self.socket).await.map_err(|e| {
                format!("hpk-net-forwarder at {} cannot be reached: {e}", self.socket.display())
            })?;
            let status = HealthClient::new(channel.clone())
                .check(HealthCheckRequest { service: String::new() })
                .await
                .map_err(|s| format!("hpk-net-forwarder's health check failed: {}", s.message()))?
                .into_inner()
                .status;
            if status == ServingStatus::Serving as i32 {
                return Ok(());
            }
            let why = NetForwarderClient::new(channel)
                .stats(hpk_proto::netforwarder::v1::StatsRequest::default())
                .await
                .ok()
                .map(|r| r.into_inner().not_ready)
                .filter(|why| !why.is_empty())
                .unwrap_or_else(|| "no reason given".into());
            Err(format!("hpk-net-forwarder is not serving: {why}"))
        };
        tokio::time::timeout(std::time::Duration::from_secs(3), check)
            .await
            .unwrap_or_else(|_| Err("hpk-net-forwarder did not answer within 3 s".into()))
    }

    /// Gives the sandbox whose network namespace is `netns_path` an interface; returns its
    /// IP address (without prefix length).
    pub(crate) async fn attach(&self, sandbox_id: &str, netns_path: &str) -> Result<String> {
        let reply = self
            .client()
            .await?
            .attach(AttachRequest { sandbox_id: sandbox_id.to_owned(), netns_path: netns_path.to_owned() })
            .await
            .map_err(|s| {
                Error::Unavailable(format!("the net-forwarder refused sandbox {sandbox_id}: {}", s.message()))
            })?
            .into_inner();
        let address = reply.attachment.map(|a| a.address).unwrap_or_default();
        let ip = address.split('/').next().unwrap_or_default().to_owned();
        if ip.parse::<std::net::IpAddr>().is_err() {
            return Err(Error::Unavailable(format!(
                "the net-forwarder gave sandbox {sandbox_id} no address ({address:?})"
            )));
        }
        Ok(ip)
    }

    /// Takes the sandbox's interface and address back; one it does not know is already gone.
    pub(crate) async fn detach(&self, sandbox_id: &str) -> Result<()> {
        match self.client().await?.detach(DetachRequest { sandbox_id: sandbox_id.to_owned() }).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(Error::Unavailable(format!(
                "the net-forwarder could not detach sandbox {sandbox_id}: {}",
                s.message()
            ))),
        }
    }
}
