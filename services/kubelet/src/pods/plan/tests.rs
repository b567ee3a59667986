//! Unit tests of `plan`.
