//! `hpk-testcluster up|down`: the harness's cluster for people.
fn main() {}
