//! The crun engine (in progress).
