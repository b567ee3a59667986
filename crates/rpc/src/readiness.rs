//! Whether a server's services can do their work, as its gRPC health reports it.
//!
//! A [`Readiness`] starts ready. The service's own checks mark it not ready with a reason (and
//! ready again); [`crate::serve`] turns that into SERVING / NOT_SERVING for every service it
//! serves and for the server as a whole (`""`), and logs each change with the reason. Until
//! shutdown, when everything is NOT_SERVING.

use std::sync::Arc;

use tokio::sync::watch;

/// Ready, or not with why; cheap to clone, every clone the same state.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<watch::Sender<Option<String>>>);

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Ready.
    pub fn new() -> Self {
        Self(Arc::new(watch::channel(None).0))
    }

    /// Ready again (or still).
    pub fn set_ready(&self) {
        self.0.send_if_modified(|state| state.take().is_some());
    }

    /// Not ready, because of `why`. Only a change of the reason notifies.
    pub fn set_not_ready(&self, why: impl Into<String>) {
        let why = why.into();
        self.0.send_if_modified(|state| {
            if state.as_deref() == Some(why.as_str()) {
                return false;
            }
            *state = Some(why);
            true
        });
    }

    /// `Some(why)` while not ready.
    pub fn reason(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    /// Changes to come.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn changes_reach_subscribers_and_repeats_do_not() {
        let readiness = Readiness::new();
        let mut changes = readiness.subscribe();
        assert_eq!(readiness.reason(), None);
        readiness.set_ready();
        assert!(!changes.has_changed().expect("open"), "ready while ready is no change");
        readiness.set_not_ready("the tunnel device is gone");
        assert!(changes.has_changed().expect("open"));
        assert_eq!(changes.borrow_and_update().as_deref(), Some("the tunnel device is gone"));
        readiness.clone().set_not_ready("the tunnel device is gone");
        assert!(!changes.has_changed().expect("open"), "the same reason is no change");
        readiness.set_ready();
        assert_eq!(*changes.borrow_and_update(), None);
        assert_eq!(readiness.reason(), None);
    }
}
