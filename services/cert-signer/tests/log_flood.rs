//! A flood of requests with bad tokens logs a few lines, not one per request (review M6).
//!
//! A test binary of its own, with this one test: tracing caches each log callsite's interest
//! process-wide, and a unit test beside others raced them. Another test's thread hitting the
//! interceptor's callsite first, with no subscriber, stored "never" after this test's subscriber
//! was counted in, and this test saw 1 line of 5 (CI at stop 36).

use std::sync::{Arc, Mutex};

use hpk_cert_signer::token::RequireToken;
use hpk_rpc::log_limit::LogLimit;
use tonic::Request;
use tonic::service::Interceptor;

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn bad_request() -> Request<()> {
    let mut request = Request::new(());
    request.metadata_mut().insert("authorization", "Bearer wrong".parse().expect("ascii"));
    request
}

#[test]
fn a_flood_of_bad_tokens_logs_a_few_lines() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    tracing::subscriber::with_default(subscriber, || {
        let mut check = RequireToken::default();
        for _ in 0..1000 {
            assert!(check.call(bad_request()).is_err(), "every one is refused");
        }
    });
    let text = String::from_utf8(lines.0.lock().expect("lock").clone()).expect("utf-8");
    assert_eq!(text.matches("request refused").count(), LogLimit::BURST as usize, "{text}");
    assert!(text.contains("verdict=\"unauthenticated\""), "{text}");
}
