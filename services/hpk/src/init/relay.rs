//! The published TCP ports: each listening socket was bound in the host's namespace by the
//! launcher and inherited here; every connection it accepts is joined to the service listening
//! on the same port number on the bubble's loopback. The services keep their own TLS and
//! authentication end to end; this only copies bytes.

use std::net::{Ipv4Addr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};

use super::{InitArgs, inherited_fd};
use crate::error::{Error, Result};

/// Starts one relay task per published TCP port.
pub fn start(args: &InitArgs) -> Result<()> {
    for name in args.role.tcp_ports() {
        let port = args.port(name)?;
        let fd = inherited_fd(name)?;
        let std_listener = crate::fds::claim_listener(fd)
            .map_err(|e| Error::Invalid(format!("the published {name} socket: {e}")))?;
        std_listener.set_nonblocking(true).map_err(|e| Error::io("configure", name, e))?;
        let listener = TcpListener::from_std(std_listener).map_err(|e| Error::io("register", name, e))?;
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let name = (*name).to_owned();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((client, peer)) => {
                        tokio::spawn(relay(client, target, name.clone(), peer));
                    }
                    Err(e) => {
                        // EMFILE and the like: back off briefly instead of spinning.
                        tracing::warn!(port = %name, error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }
    Ok(())
}

async fn relay(mut client: TcpStream, target: SocketAddr, name: String, peer: SocketAddr) {
    let mut upstream = match TcpStream::connect(target).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(port = %name, %peer, error = %e, "service not listening yet: connection closed");
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, 64 << 10, 64 << 10).await;
}
