//! The logic of hpk-pause (in progress).
