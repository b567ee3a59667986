//! The release bundle (`make dist`) as a site receives it: `bin/hpk` is one statically linked
//! program that starts with nothing else on the machine, beside the bubble image (which
//! carries the host side's crun and slirp4netns) and the batch script.

mod support;

use std::path::Path;
use std::process::Command;

use support::text;

/// The bundle, unpacked into a fresh directory.
fn unpacked() -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    let tarball = hpk_integration::release_bundle()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(dir.path()).output().expect("tar");
    assert!(out.status.success(), "tar: {}", text(&out));
    let root = dir.path().join(format!("hpk-{}", env!("CARGO_PKG_VERSION")));
    Some((dir, root))
}

#[test]
fn the_bundle_holds_a_static_hpk_the_image_and_the_script() {
    let Some((_dir, root)) = unpacked() else { return };
    for file in ["bin/hpk", "share/hpk/hpk-bubble.oci.tar", "slurm/hpk.slurm", "README.md"] {
        assert!(root.join(file).is_file(), "the bundle lacks {file}");
    }
    if !hpk_integration::tools_present(&["readelf"]) {
        return;
    }
    let hpk = root.join("bin/hpk");
    let program = Command::new("readelf").arg("-lW").arg(&hpk).output().expect("readelf -l");
    assert!(program.status.success(), "{}", text(&program));
    assert!(
        !String::from_utf8_lossy(&program.stdout).contains("Requesting program interpreter"),
        "bin/hpk asks for a dynamic loader: {}",
        text(&program)
    );
    let dynamic = Command::new("readelf").arg("-dW").arg(&hpk).output().expect("readelf -d");
    assert!(
        !String::from_utf8_lossy(&dynamic.stdout).contains("(NEEDED)"),
        "bin/hpk needs shared libraries: {}",
        text(&dynamic)
    );
}

/// A chroot holding nothing but the binary: no C library, no loader, no /proc, no /dev. That
/// it runs there is what makes it start on RHEL 8's glibc 2.28 and anything else.
#[test]
fn bin_hpk_runs_in_a_chroot_that_holds_nothing_else() {
    let Some((_dir, root)) = unpacked() else { return };
    if !nix::unistd::getuid().is_root() {
        hpk_test_support::skip("chroot needs root");
        return;
    }
    let jail = tempfile::tempdir().expect("tempdir");
    std::fs::copy(root.join("bin/hpk"), jail.path().join("hpk")).expect("copy");
    let entries: Vec<_> =
        std::fs::read_dir(jail.path()).expect("list").flatten().map(|e| e.file_name()).collect();
    assert_eq!(entries, ["hpk"], "the chroot holds the binary alone");
    let out = Command::new("chroot").arg(jail.path()).arg("/hpk").arg("--version").output().expect("chroot");
    assert!(out.status.success(), "hpk --version in an empty chroot: {}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("hpk {}", env!("CARGO_PKG_VERSION")));
    assert!(!Path::new(&jail.path().join("lib")).exists());
}
