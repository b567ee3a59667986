//! hpk-test-support: what HPK's tests share, each written once.
//!
//! - [`eventually`] and [`eventually_blocking`]: poll a condition until it holds or a bound
//!   passes, then fail with what was awaited and a diagnosis.
//! - [`skip`], [`skipped`], [`skip_optional`], [`missing_tools`]: prerequisite checks. A
//!   test that lacks a prerequisite prints why and returns early, and records the skip where
//!   CI counts it (`HPK_SKIP_LOG`), so that a skip is never counted as a pass. Under
//!   `HPK_REQUIRE_TOOLS=1` (the README's test command sets it, after installing every tool) a
//!   missing prerequisite fails the test instead.
//! - [`output_within`]: a command run to its end, killed and failing its test past a bound.
//! - [`manifest`]: the pod manifests tests create.
//!
//! No dependency on any HPK crate: every crate's tests may use it.

mod command;
pub mod manifest;
mod skip;
mod wait;

pub use command::output_within;
pub use skip::{missing_tools, requiring_tools, skip, skip_optional, skipped};
pub use wait::{eventually, eventually_blocking};
