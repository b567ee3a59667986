//! Rate limits for log lines that a peer can cause at will (refused requests, failed TLS
//! handshakes): a flood must not fill the node-local disk the logs and etcd share (review M6).
//! One [`LogLimit`] per kind of line lets [`LogLimit::BURST`] lines through per
//! [`LogLimit::WINDOW`], counts the rest, and hands the count to the next line let through,
//! which the caller reports first with [`LogLimit::summary`]:
//!
//! ```
//! # use hpk_rpc::log_limit::LogLimit;
//! let refusals = LogLimit::default();
//! if let Some(dropped) = refusals.admit() {
//!     if let Some(summary) = refusals.summary(dropped) {
//!         tracing::warn!(dropped, "{summary}");
//!     }
//!     tracing::warn!("request refused");
//! }
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lets a few lines of one kind through per window and counts the others.
#[derive(Debug)]
pub struct LogLimit {
    burst: u32,
    window: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    started: Option<Instant>,
    logged: u32,
    dropped: u64,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new(Self::BURST, Self::WINDOW)
    }
}

impl LogLimit {
    /// Lines let through per window by default.
    pub const BURST: u32 = 5;
    /// The default window.
    pub const WINDOW: Duration = Duration::from_secs(10);

    /// At most `burst` lines per `window`.
    pub fn new(burst: u32, window: Duration) -> Self {
        Self { burst, window, state: Mutex::new(State::default()) }
    }

    /// Whether to log a line now: `Some(dropped)`, the lines left out since the last one let
    /// through, or `None` to leave this one out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`LogLimit::admit`] at `now`.
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        // A poisoned lock only means another thread panicked while counting: keep counting.
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.started.is_none_or(|t| now.saturating_duration_since(t) >= self.window) {
            state.started = Some(now);
            state.logged = 0;
        }
        if state.logged < self.burst {
            state.logged += 1;
            Some(std::mem::take(&mut state.dropped))
        } else {
            state.dropped += 1;
            None
        }
    }

    /// The line that reports `dropped` lines left out, if any were.
    pub fn summary(&self, dropped: u64) -> Option<String> {
        (dropped > 0).then(|| {
            format!(
                "… {dropped} more like the next line were not logged (at most {} every {} s)",
                self.burst,
                self.window.as_secs()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_the_count_of_the_rest() {
        let limit = LogLimit::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        assert_eq!((0..3).map(|i| limit.admit_at(at(i))).collect::<Vec<_>>(), vec![Some(0); 3]);
        // A flood inside the window: nothing more gets through.
        assert!((0..10_000).all(|i| limit.admit_at(at(100 + i / 10)).is_none()));
        // The first line of the next window carries the count, the next ones none.
        assert_eq!(limit.admit_at(at(10_000)), Some(10_000));
        assert_eq!(limit.admit_at(at(10_001)), Some(0));
        assert_eq!(limit.admit_at(at(10_002)), Some(0));
        assert_eq!(limit.admit_at(at(10_003)), None);
        assert_eq!(limit.admit_at(at(25_000)), Some(1));
    }

    #[test]
    fn lines_over_a_flood_stay_bounded() {
        let limit = LogLimit::default();
        let t0 = Instant::now();
        // 100 refusals a millisecond for a minute: 6 windows of BURST lines, and no more.
        let logged = (0..6_000_000u64)
            .filter(|i| limit.admit_at(t0 + Duration::from_nanos(i * 10_000)).is_some())
            .count();
        assert_eq!(logged, 6 * LogLimit::BURST as usize);
    }

    #[test]
    fn the_summary_says_how_many_and_nothing_when_none() {
        let limit = LogLimit::default();
        assert_eq!(limit.summary(0), None);
        let line = limit.summary(42).expect("a line");
        assert!(line.contains("42 more") && line.contains("every 10 s"), "{line}");
    }
}
