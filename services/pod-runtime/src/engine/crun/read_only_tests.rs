//! crun from a read-only mount skips copying itself, as a site user would run it: the test
//! binary runs the test again (as [`child_runs_crun_read_only`]) inside
//! `unshare --user --map-root-user --mount`, as `nobody` when the test runs as root, with the
//! user's own (writable) copy of crun first on PATH, so the child is root of a one-ID bubble
//! with a private mount namespace, as the runtime is.
//!
//! Whether crun copied itself shows in the dynamic loader's trace (`LD_DEBUG=files`): a crun
//! that re-executes its copy initializes the program twice.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;
use crate::one_id::NOBODY;

const WORK: &str = "HPK_TEST_CRUN_READ_ONLY_WORK";

/// How many times crun's program was initialized running `crun list` as `crun` runs it.
fn initializations(crun: &Crun) -> usize {
    let mut cmd = crun.crun();
    cmd.args(["list", "--quiet"]).env("LD_DEBUG", "files");
    let out = cmd.output().expect("runs crun");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "crun list failed: {said}");
    said.lines().filter(|l| l.contains("initialize program:")).count()
}

/// The child's part: in its own mount namespace, with `work/bin/crun` (writable, the user's)
/// first on PATH.
fn child_runs_crun_read_only(work: &Path) {
    let user_crun = work.join("bin/crun");
    assert_eq!(crate::engine::resolve_program("crun"), user_crun, "the user's crun is first on PATH");
    let plain = Crun::new(&work.join("state"));
    assert!(!plain.read_only_binary);
    assert_eq!(initializations(&plain), 2, "crun from a writable file copies itself and runs the copy");

    let crun = Crun::new(&work.join("state")).with_read_only_binary(&work.join("ro"));
    assert!(crun.read_only_binary, "crun runs from a read-only mount");
    assert_eq!(crun.binary, work.join("ro/crun"));
    let denied = fs::OpenOptions::new().write(true).open(&crun.binary).expect_err("not writable");
    assert_eq!(denied.raw_os_error(), Some(nix::libc::EROFS), "{denied}");
    assert!(
        fs::OpenOptions::new().write(true).open(&user_crun).is_ok(),
        "the user's own file stays writable"
    );
    assert_eq!(initializations(&crun), 1, "crun from the read-only mount runs without copying itself");

    // A second runtime in the same place (a restart) mounts again over the file it left.
    let again = Crun::new(&work.join("state")).with_read_only_binary(&work.join("ro"));
    assert!(again.read_only_binary);
    // A link where the bind would go is not followed: crun copies itself instead.
    fs::create_dir_all(work.join("l")).expect("mkdir");
    fs::write(work.join("elsewhere"), "keep").expect("write");
    std::os::unix::fs::symlink(work.join("elsewhere"), work.join("l/crun")).expect("symlink");
    let linked = Crun::new(&work.join("state")).with_read_only_binary(&work.join("l"));
    assert!(!linked.read_only_binary, "a link at the bind's place is refused");
    assert_eq!(fs::read_to_string(work.join("elsewhere")).expect("read"), "keep");
    assert!(
        fs::OpenOptions::new().append(true).open(work.join("elsewhere")).is_ok(),
        "nothing was bound over it"
    );
    // With a prefix crun runs in another mount namespace: nothing is mounted for it.
    let prefixed = Crun::new(&work.join("state")).with_prefix(["env"]).with_read_only_binary(&work.join("p"));
    assert!(!prefixed.read_only_binary);
    assert!(!work.join("p").exists());
}

#[test]
fn crun_runs_from_a_read_only_mount_without_copying_itself() {
    if let Some(work) = std::env::var_os(WORK) {
        return child_runs_crun_read_only(Path::new(&work));
    }
    let crun = crate::engine::resolve_program("crun");
    if !crun.is_absolute() {
        hpk_test_support::skip("crun is not on PATH (scripts/setup.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on the root disk");
    let work = dir.path().join("work");
    fs::create_dir_all(work.join("bin")).expect("bin");
    fs::copy(&crun, work.join("bin/crun")).expect("the user's own crun");
    if nix::unistd::geteuid().is_root() {
        for path in [work.clone(), work.join("bin"), work.join("bin/crun")] {
            std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let path = std::env::join_paths(
        std::iter::once(work.join("bin"))
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("PATH");
    let (prefix, _) = crate::one_id::prefix(&["--mount"]);
    let ran = crate::one_id::rerun(
        &prefix,
        module_path!(),
        "crun_runs_from_a_read_only_mount_without_copying_itself",
        &[(WORK, work.as_os_str()), ("PATH", path.as_os_str())],
    );
    if ran.is_none() {
        hpk_test_support::skip("this machine does not let a user make a user namespace (unshare --user)");
    }
}
