//! A local OCI registry (filled in by the registry work).
