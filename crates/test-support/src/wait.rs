//! Waiting for a condition, level-triggered: poll until it holds or the bound passes.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(100);

/// Polls `check` every 100 ms until it returns `Some`, and returns that. After `within` it
/// panics with `what` and `diagnose()` (logs, state: what a reader needs to see why).
pub async fn eventually<T, F, Fut>(
    what: &str,
    within: Duration,
    mut check: F,
    diagnose: impl FnOnce() -> String,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not within {within:?}\n{}", diagnose());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for code without a runtime: polls on this thread.
pub fn eventually_blocking<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
    diagnose: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return found;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not within {within:?}\n{}", diagnose());
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_what_the_check_found_once_it_holds() {
        let mut calls = 0;
        let found = eventually_blocking(
            "third call",
            Duration::from_secs(5),
            || {
                calls += 1;
                (calls == 3).then_some(calls)
            },
            String::new,
        );
        assert_eq!(found, 3);
    }

    #[test]
    #[should_panic(expected = "never: not within")]
    fn fails_with_what_and_the_diagnosis_after_the_bound() {
        eventually_blocking("never", Duration::from_millis(150), || None::<()>, || "the diagnosis".into());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_async_form_polls_until_it_holds() {
        let mut calls = 0;
        let found = eventually(
            "second call",
            Duration::from_secs(5),
            || {
                calls += 1;
                let now = calls;
                async move { (now == 2).then_some(now) }
            },
            String::new,
        )
        .await;
        assert_eq!(found, 2);
    }
}
