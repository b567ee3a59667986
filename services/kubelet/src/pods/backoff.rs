//! The kubelet's restart and image-pull back-off: 10 s, doubling to 5 min; a container that ran
//! for 10 min without trouble starts again from 10 s.

use std::time::Duration;

use tokio::time::Instant;

/// First delay.
pub const INITIAL: Duration = Duration::from_secs(10);
/// Largest delay.
pub const MAX: Duration = Duration::from_secs(300);
/// A container that ran this long resets its back-off.
pub const RESET_AFTER: Duration = Duration::from_secs(600);

/// One back-off sequence (a container's restarts, or its image's pulls).
#[derive(Clone, Debug, Default)]
pub struct Backoff {
    /// The delay the next failure waits; zero before the first.
    delay: Duration,
    /// Until when the current delay lasts.
    until: Option<Instant>,
}

impl Backoff {
    /// Records a failure at `now`: the next attempt waits the current delay, which doubles.
    pub fn fail(&mut self, now: Instant) {
        self.delay = if self.delay.is_zero() { INITIAL } else { (self.delay * 2).min(MAX) };
        self.until = Some(now + self.delay);
    }

    /// Whether an attempt must still wait at `now`.
    pub fn waiting(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// When the current wait ends.
    pub fn until(&self) -> Option<Instant> {
        self.until
    }

    /// The delay now in force.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Forgets earlier failures.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_five_minutes_and_resets() {
        let now = Instant::now();
        let mut b = Backoff::default();
        assert!(!b.waiting(now));
        let mut seen = Vec::new();
        for _ in 0..7 {
            b.fail(now);
            seen.push(b.delay().as_secs());
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300]);
        assert!(b.waiting(now + Duration::from_secs(299)));
        assert!(!b.waiting(now + Duration::from_secs(300)));
        b.reset();
        b.fail(now);
        assert_eq!(b.delay(), INITIAL);
    }
}
