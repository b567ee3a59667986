//! One cancellation token for the whole process, cancelled by SIGTERM or SIGINT.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Returns a token cancelled on the first SIGTERM or SIGINT. Call from inside the runtime.
pub fn on_signal() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!(signal = name, "shutdown requested");
        cancel.cancel();
    });
    Ok(token)
}
