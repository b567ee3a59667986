//! Test images built without Docker (filled in by the registry work).
