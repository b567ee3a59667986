//! The bubble's own address on the pod network: the pod CIDR's first host, on `lo`.
//!
//! Pods reach the bubble (the kubelet, the node's services) at it, and it is the source of the
//! bubble's own traffic to pods of other nodes, so their answers come back through the tunnel.

use std::net::{IpAddr, Ipv4Addr};

use futures_util::TryStreamExt;

use crate::{Error, Result};

/// Brings `lo` up and adds `addr/32` to it (unless it is there) in the current network namespace.
pub async fn ensure_address(addr: Ipv4Addr) -> Result<()> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|e| Error::io("open a netlink socket", e))?;
    let driver = tokio::spawn(connection);
    let result = async {
        let lo = match handle.link().get().match_name("lo".to_owned()).execute().try_next().await {
            Ok(Some(link)) => link.header.index,
            _ => return Err(Error::Config("the bubble has no lo".into())),
        };
        handle
            .link()
            .set(rtnetlink::LinkUnspec::new_with_index(lo).up().build())
            .execute()
            .await
            .map_err(|e| Error::netlink("set lo up", e))?;
        // Read the whole dump: a stream dropped half-read leaves netlink answers undelivered.
        let have: Vec<_> = handle
            .address()
            .get()
            .set_link_index_filter(lo)
            .set_address_filter(IpAddr::V4(addr))
            .execute()
            .try_collect()
            .await
            .map_err(|e| Error::netlink("list lo's addresses", e))?;
        if !have.is_empty() {
            return Ok(());
        }
        handle
            .address()
            .add(lo, IpAddr::V4(addr), 32)
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("add {addr}/32 to lo"), e))
    }
    .await;
    driver.abort();
    result
}
