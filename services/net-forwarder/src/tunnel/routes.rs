//! The bubble's side of the tunnel in the kernel: the TUN device up with its MTU and GSO limit,
//! and one route per peer's pod CIDR into the device (from the bubble's own address,
//! [`crate::bubble`]).

use std::net::Ipv4Addr;

use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use super::{DEVICE, MAX_PAYLOAD};
use crate::peers::Peer;
use crate::tuntap::VNET_HDR_LEN;
use crate::{Error, Result};

/// GSO packets the kernel may hand the tunnel: whatever fits one datagram with the header.
const GSO_MAX_SIZE: u32 = (MAX_PAYLOAD - VNET_HDR_LEN - 64) as u32;

const RT_TABLE_MAIN: u8 = 254;

/// Netlink in the bubble, for the tunnel's device and routes.
pub struct Routes {
    handle: Handle,
    index: u32,
}

impl Routes {
    /// Opens netlink in the current namespace (inside a tokio runtime) and finds the device.
    pub async fn open() -> Result<Self> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::io("open a netlink socket", e))?;
        tokio::spawn(connection);
        let mut links = handle.link().get().match_name(DEVICE.to_owned()).execute();
        let index = match links.try_next().await {
            Ok(Some(link)) => link.header.index,
            Ok(None) | Err(_) => return Err(Error::Config(format!("the tunnel device {DEVICE} is missing"))),
        };
        Ok(Routes { handle, index })
    }

    /// Sets the device's MTU (that of the pods) and GSO limit, and brings it up.
    pub async fn configure_device(&self, mtu: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(self.index)
            .mtu(mtu)
            .append_extra_attribute(LinkAttribute::GsoMaxSize(GSO_MAX_SIZE))
            .up()
            .build();
        self.handle.link().set(msg).execute().await.map_err(|e| {
            Error::netlink(format!("set {DEVICE} up (mtu {mtu}, gso_max_size {GSO_MAX_SIZE})"), e)
        })
    }

    /// Makes the routes into the device exactly one per peer, with `source` as the preferred
    /// source address.
    pub async fn sync(&self, peers: &[Peer], source: Ipv4Addr) -> Result<()> {
        let present = self.present().await?;
        for msg in &present {
            let keep = destination(msg).is_some_and(|(dst, len)| {
                peers.iter().any(|p| p.pod_cidr.network() == dst && p.pod_cidr.prefix() == len)
            }) && pref_source(msg) == Some(source);
            if !keep {
                self.handle
                    .route()
                    .del(msg.clone())
                    .execute()
                    .await
                    .map_err(|e| Error::netlink(format!("delete a stale route via {DEVICE}"), e))?;
            }
        }
        for peer in peers {
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(peer.pod_cidr.network(), peer.pod_cidr.prefix())
                .output_interface(self.index)
                .pref_source(source)
                .scope(RouteScope::Link)
                .build();
            self.handle
                .route()
                .add(route)
                .replace()
                .execute()
                .await
                .map_err(|e| Error::netlink(format!("route {} dev {DEVICE}", peer.pod_cidr), e))?;
        }
        Ok(())
    }

    /// The routes that leave through the device.
    pub async fn present(&self) -> Result<Vec<RouteMessage>> {
        let all: Vec<RouteMessage> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(|e| Error::netlink("list routes", e))?;
        Ok(all
            .into_iter()
            .filter(|m| m.header.table == RT_TABLE_MAIN)
            .filter(|m| m.attributes.iter().any(|a| matches!(a, RouteAttribute::Oif(i) if *i == self.index)))
            .filter(|m| destination(m).is_some())
            .collect())
    }
}

fn destination(msg: &RouteMessage) -> Option<(Ipv4Addr, u8)> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
            Some((*ip, msg.header.destination_prefix_length))
        }
        _ => None,
    })
}

fn pref_source(msg: &RouteMessage) -> Option<Ipv4Addr> {
    msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::PrefSource(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    })
}
