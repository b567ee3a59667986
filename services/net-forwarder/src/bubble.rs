//! The bubble's own address on the pod network: the pod CIDR's first host, on `lo`.
//!
//! Pods reach the bubble (the kubelet, the node's services) at it, and it is the source of the
//! bubble's own traffic to pods of other nodes, so their answers come back through the tunnel.

use std::net::Ipv4Addr;

use crate::link::{Netlink, add_address, set_up};
use crate::{Error, Result};

/// Brings `lo` up and gives it `addr/32` (unless it has it) in the current network namespace.
pub async fn ensure_address(addr: Ipv4Addr) -> Result<()> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|e| Error::io("open a netlink socket", e))?;
    let driver = tokio::spawn(connection);
    let result = async {
        let lo = Netlink::index_of(&handle, "lo")
            .await?
            .ok_or_else(|| Error::Config("the bubble has no lo".into()))?;
        set_up(&handle, lo, "lo").await?;
        add_address(&handle, lo, addr, "lo").await
    }
    .await;
    driver.abort();
    result
}
