//! hpk-pause: PID 1 of a sandbox (in progress).
fn main() {}
