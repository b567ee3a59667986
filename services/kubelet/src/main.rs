//! `hpk-kubelet`: the node's kubelet.

fn main() {}
