//! For unit tests: run a test again, in a child of the test binary, inside a user namespace
//! that maps one ID, as a site user's bubble does; as `nobody` when the test runs as root, since
//! root's own namespace would map root, not a plain user.

use std::ffi::OsStr;
use std::process::Command;

/// The host user the child runs as when the test is root.
pub(crate) const NOBODY: u32 = 65534;

/// `unshare --user --map-root-user EXTRA…`, under `setpriv` as [`NOBODY`] when this test runs as
/// root, and the host UID the child will have.
pub(crate) fn prefix(extra: &[&str]) -> (Vec<String>, u32) {
    let mut prefix = Vec::new();
    let mut host_uid = nix::unistd::geteuid().as_raw();
    if host_uid == 0 {
        let id = NOBODY.to_string();
        prefix.extend(["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups"].map(str::to_owned));
        host_uid = NOBODY;
    }
    prefix.extend(["unshare", "--user", "--map-root-user"].map(str::to_owned));
    prefix.extend(extra.iter().map(|a| (*a).to_owned()));
    (prefix, host_uid)
}

/// Runs the test `module::test` of this test binary again through `prefix`, with `env` set
/// (which tells the test it is the child), and asserts that the child ran it and passed.
/// `module` is the test's `module_path!()`. `None`, running nothing, when this machine does
/// not let the user make the namespace (`prefix… true` fails).
pub(crate) fn rerun(prefix: &[String], module: &str, test: &str, env: &[(&str, &OsStr)]) -> Option<()> {
    let allowed = Command::new(&prefix[0]).args(&prefix[1..]).arg("true").status();
    if !allowed.is_ok_and(|s| s.success()) {
        return None;
    }
    let module = module.split_once("::").map_or(module, |(_, rest)| rest);
    let output = Command::new(&prefix[0])
        .args(&prefix[1..])
        .arg(std::env::current_exe().expect("test binary"))
        .args(["--exact", &format!("{module}::{test}"), "--nocapture"])
        .envs(env.iter().copied())
        .output()
        .expect("runs the prefix");
    let said =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the child failed:\n{said}");
    assert!(said.contains("1 passed"), "the child ran no test:\n{said}");
    Some(())
}
