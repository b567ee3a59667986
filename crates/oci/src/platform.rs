//! Platform names as OCI images and Kubernetes spell them (Go's `GOARCH`), and the choice of
//! this machine's image from an index that carries several.

/// The Go name (`GOARCH`) of a Rust target architecture, as Kubernetes labels it and OCI image
/// configs and indexes name it.
pub fn go_arch(rust_arch: &str, little_endian: bool) -> String {
    match (rust_arch, little_endian) {
        ("x86_64", _) => "amd64",
        ("x86", _) => "386",
        ("aarch64", _) => "arm64",
        ("arm", _) => "arm",
        ("powerpc64", true) => "ppc64le",
        ("powerpc64", false) => "ppc64",
        ("s390x", _) => "s390x",
        ("riscv64", _) => "riscv64",
        ("loongarch64", _) => "loong64",
        ("mips64", true) => "mips64le",
        ("mips", true) => "mipsle",
        (other, _) => other,
    }
    .to_owned()
}

/// This build's architecture as Go names it (`amd64`, `arm64`, …).
pub fn architecture() -> String {
    go_arch(std::env::consts::ARCH, cfg!(target_endian = "little"))
}

/// Whether an index entry's platform (`os`, `architecture`, `variant`) runs here: linux, this
/// build's architecture, and for arm64 the only variant a 64-bit Arm Linux runs (`v8`, or none).
pub fn runs_here(os: &str, architecture: &str, variant: Option<&str>) -> bool {
    runs_on(os, architecture, variant, &self::architecture())
}

/// [`runs_here`] for a machine of architecture `host` (Go's name).
pub fn runs_on(os: &str, architecture: &str, variant: Option<&str>, host: &str) -> bool {
    os == "linux"
        && architecture == host
        && match (host, variant) {
            (_, None) => true,
            ("arm64", Some(v)) => v == "v8",
            (_, Some(_)) => true,
        }
}

/// `os/architecture[/variant]`, for messages.
pub fn name(os: &str, architecture: &str, variant: Option<&str>) -> String {
    match variant {
        Some(v) => format!("{os}/{architecture}/{v}"),
        None => format!("{os}/{architecture}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_architecture_names() {
        assert_eq!(go_arch("x86_64", true), "amd64");
        assert_eq!(go_arch("aarch64", true), "arm64");
        assert_eq!(go_arch("x86", true), "386");
        assert_eq!(go_arch("powerpc64", true), "ppc64le");
        assert_eq!(go_arch("powerpc64", false), "ppc64");
        assert_eq!(go_arch("riscv64", true), "riscv64");
        assert_eq!(go_arch("loongarch64", true), "loong64");
        assert_eq!(go_arch("s390x", false), "s390x");
        let expected = if cfg!(target_arch = "x86_64") { "amd64" } else { "arm64" };
        assert_eq!(architecture(), expected);
    }

    #[test]
    fn an_entry_runs_on_its_own_architecture_only() {
        assert!(runs_on("linux", "amd64", None, "amd64"));
        assert!(!runs_on("linux", "arm64", None, "amd64"));
        assert!(runs_on("linux", "arm64", Some("v8"), "arm64"));
        assert!(runs_on("linux", "arm64", None, "arm64"));
        assert!(!runs_on("linux", "arm64", Some("v9"), "arm64"), "v9 code does not run on every v8 machine");
        assert!(!runs_on("windows", "amd64", None, "amd64"));
        assert_eq!(name("linux", "arm64", Some("v8")), "linux/arm64/v8");
        assert_eq!(name("linux", "amd64", None), "linux/amd64");
    }
}
