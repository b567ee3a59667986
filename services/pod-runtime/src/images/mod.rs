//! The OCI image store (in progress).
