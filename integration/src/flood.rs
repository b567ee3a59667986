//! An unauthenticated connection flood, as another user on the cluster network would send it
//! (review H2): for each target, keep `connections` TCP connections open for a while. Half send
//! nothing; half send the first bytes of a TLS ClientHello and stall. A connection the server
//! closes is opened again a second later, so the pressure lasts the whole run.
//!
//! `hpk-testcluster flood` runs it; the attack tests start that on a test host of its own, as
//! an unprivileged user.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What one target saw.
#[derive(Debug, Default)]
pub struct Report {
    /// The target.
    pub target: Option<SocketAddr>,
    /// Connections established.
    pub opened: u64,
    /// Connections the server closed (end of stream or reset).
    pub closed_by_server: u64,
    /// Connection attempts that failed.
    pub connect_errors: u64,
    /// The most connections open at once, as the attacker saw them.
    pub most_open: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = self.target.map_or_else(|| "?".to_owned(), |t| t.to_string());
        write!(
            f,
            "target={target} opened={} closed_by_server={} connect_errors={} most_open={}",
            self.opened, self.closed_by_server, self.connect_errors, self.most_open
        )
    }
}

/// Floods every target with `connections` connections for `duration`; one report per target.
pub async fn run(targets: &[SocketAddr], connections: usize, duration: Duration) -> Vec<Report> {
    let deadline = tokio::time::Instant::now() + duration;
    let mut runs = Vec::new();
    for &target in targets {
        let counters = Arc::new(Counters::default());
        let mut tasks = Vec::new();
        for i in 0..connections {
            let counters = counters.clone();
            tasks.push(tokio::spawn(async move {
                let _ = tokio::time::timeout_at(deadline, hold(target, i % 2 == 1, &counters)).await;
            }));
        }
        runs.push((target, counters, tasks));
    }
    let mut reports = Vec::new();
    for (target, counters, tasks) in runs {
        for task in tasks {
            let _ = task.await;
        }
        reports.push(Report {
            target: Some(target),
            opened: counters.opened.load(Ordering::Relaxed),
            closed_by_server: counters.closed.load(Ordering::Relaxed),
            connect_errors: counters.errors.load(Ordering::Relaxed),
            most_open: counters.most.load(Ordering::Relaxed),
        });
    }
    reports
}

#[derive(Default)]
struct Counters {
    opened: AtomicU64,
    closed: AtomicU64,
    errors: AtomicU64,
    open: AtomicUsize,
    most: AtomicUsize,
}

/// Holds one connection to `target` open, opening it again whenever the server closes it.
async fn hold(target: SocketAddr, partial_hello: bool, counters: &Counters) {
    loop {
        let mut conn = match TcpStream::connect(target).await {
            Ok(conn) => conn,
            Err(_) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        counters.opened.fetch_add(1, Ordering::Relaxed);
        let now = counters.open.fetch_add(1, Ordering::Relaxed) + 1;
        counters.most.fetch_max(now, Ordering::Relaxed);
        if partial_hello {
            // A TLS handshake record header, then silence.
            let _ = conn.write_all(&[0x16, 0x03, 0x01]).await;
        }
        let mut buf = [0u8; 1024];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        counters.open.fetch_sub(1, Ordering::Relaxed);
        counters.closed.fetch_add(1, Ordering::Relaxed);
        drop(conn);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_what_a_server_that_closes_everything_does() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                drop(conn);
            }
        });
        let reports = run(&[addr], 10, Duration::from_millis(1500)).await;
        assert_eq!(reports.len(), 1);
        let r = &reports[0];
        // Each of the 10 is opened, closed, and opened again after a second.
        assert!(r.opened >= 20 && r.closed_by_server >= 10, "{r}");
        assert_eq!(r.connect_errors, 0, "{r}");
    }
}
