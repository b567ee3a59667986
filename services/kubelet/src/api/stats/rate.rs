//! `usageNanoCores`: the kubelet's own rate from two cumulative CPU samples of the same node, pod
//! or container. The runtime's rate is not used: it changes with every caller's sample.

use std::collections::{HashMap, HashSet};

/// A rate is computed over at least this long (1 s), so scrapes close together give no noise.
pub const MIN_WINDOW_NANOS: i64 = 1_000_000_000;

#[derive(Clone, Copy, Debug)]
struct Sample {
    /// When, in nanoseconds since the epoch.
    at: i64,
    /// Cumulative CPU time, in core-nanoseconds.
    usage: u64,
    /// The rate computed when this sample was taken.
    rate: Option<u64>,
}

/// The last sample and rate per key (one key per node, pod sandbox or container).
#[derive(Debug, Default)]
pub struct CpuRates {
    samples: HashMap<String, Sample>,
}

impl CpuRates {
    /// Records `usage` (cumulative core-nanoseconds) of `key` at `at` (nanoseconds since the
    /// epoch) and returns its rate in nanocores:
    /// - no sample yet: none (the sample is kept);
    /// - the last one at least [`MIN_WINDOW_NANOS`] old: Δusage / Δtime, and this sample
    ///   replaces it (none if the counter went back, as when a pod's container exits);
    /// - the last one younger: the rate computed with it, and it stays;
    /// - the clock went back: none, and this sample replaces the last.
    pub fn update(&mut self, key: &str, at: i64, usage: u64) -> Option<u64> {
        let sample = Sample { at, usage, rate: None };
        let Some(last) = self.samples.get_mut(key) else {
            self.samples.insert(key.to_owned(), sample);
            return None;
        };
        let elapsed = at.saturating_sub(last.at);
        if elapsed < 0 {
            *last = sample;
            return None;
        }
        if elapsed < MIN_WINDOW_NANOS {
            return last.rate;
        }
        let rate = usage.checked_sub(last.usage).and_then(|used| nanocores(used, elapsed));
        *last = Sample { rate, ..sample };
        rate
    }

    /// Forgets every key not in `live`.
    pub fn retain(&mut self, live: &HashSet<String>) {
        self.samples.retain(|key, _| live.contains(key));
    }

    /// How many keys have a sample.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no key has a sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// `used` core-nanoseconds over `elapsed` nanoseconds, in nanocores.
fn nanocores(used: u64, elapsed: i64) -> Option<u64> {
    let elapsed = u128::try_from(elapsed).ok().filter(|e| *e > 0)?;
    u64::try_from(u128::from(used) * 1_000_000_000 / elapsed).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000_000;

    #[test]
    fn a_rate_needs_a_sample_a_second_old() {
        let mut rates = CpuRates::default();
        assert_eq!(rates.update("c", 10 * SECOND, 0), None);
        // Half a core over two seconds.
        assert_eq!(rates.update("c", 12 * SECOND, 1_000_000_000), Some(500_000_000));
        // Exactly one second later counts: 1.5 cores.
        assert_eq!(rates.update("c", 13 * SECOND, 2_500_000_000), Some(1_500_000_000));
    }

    #[test]
    fn a_young_sample_reuses_the_last_rate_and_keeps_the_older_sample() {
        let mut rates = CpuRates::default();
        assert_eq!(rates.update("c", 0, 0), None);
        assert_eq!(rates.update("c", 2 * SECOND, 1_000_000_000), Some(500_000_000));
        // Half a second later: the same rate, however much was used meanwhile.
        assert_eq!(rates.update("c", 2 * SECOND + SECOND / 2, 3_000_000_000), Some(500_000_000));
        // One second after the kept sample (at 2 s, 1e9): 1e9 more over 1 s is one core. Had
        // the young sample replaced it, this would be under a second and give 0.5 again.
        assert_eq!(rates.update("c", 3 * SECOND, 2_000_000_000), Some(1_000_000_000));
    }

    #[test]
    fn no_rate_before_the_first_full_window() {
        let mut rates = CpuRates::default();
        assert_eq!(rates.update("c", 0, 0), None);
        assert_eq!(rates.update("c", SECOND / 2, 100), None);
        assert_eq!(rates.update("c", SECOND, 250_000_000), Some(250_000_000));
    }

    #[test]
    fn a_counter_going_back_or_a_clock_going_back_gives_no_rate() {
        let mut rates = CpuRates::default();
        rates.update("p", 0, 5_000_000_000);
        assert_eq!(rates.update("p", 2 * SECOND, 1_000_000_000), None);
        assert_eq!(rates.update("p", 4 * SECOND, 3_000_000_000), Some(1_000_000_000));
        assert_eq!(rates.update("p", SECOND, 3_000_000_000), None);
        assert_eq!(rates.update("p", 3 * SECOND, 3_200_000_000), Some(100_000_000));
    }

    #[test]
    fn keys_are_separate_and_forgotten_when_gone() {
        let mut rates = CpuRates::default();
        rates.update("a", 0, 0);
        rates.update("b", 0, 0);
        assert_eq!(rates.update("a", SECOND, 1_000_000_000), Some(1_000_000_000));
        assert_eq!(rates.len(), 2);
        rates.retain(&HashSet::from(["a".to_owned()]));
        assert_eq!(rates.len(), 1);
        // "b" starts over: no rate from its forgotten sample.
        assert_eq!(rates.update("b", 2 * SECOND, 2_000_000_000), None);
        assert_eq!(rates.update("a", 2 * SECOND, 1_500_000_000), Some(500_000_000));
    }
}
