//! Skips that say why, fail when the test command requires every tool, and are counted.

use std::io::Write;
use std::path::Path;

/// Whether a missing prerequisite must fail the test (`HPK_REQUIRE_TOOLS=1`, which the README's
/// test command sets after `scripts/setup.sh` installed everything) rather than skip it.
pub fn requiring_tools() -> bool {
    std::env::var("HPK_REQUIRE_TOOLS").as_deref() == Ok("1")
}

/// The test running on this thread, as the test harness names its thread (or "?" outside one).
fn current_test() -> String {
    std::thread::current().name().unwrap_or("?").to_owned()
}

/// Records a skip: prints `SKIPPED: <why>` and appends `<test>\t<why>` to the file
/// `HPK_SKIP_LOG` names, if any, which CI's closing line counts as skipped.
pub fn skipped(why: &str) {
    let test = current_test();
    eprintln!("SKIPPED: {why}");
    let Some(log) = std::env::var_os("HPK_SKIP_LOG") else { return };
    let line = format!("{test}\t{}\n", why.replace(['\n', '\t'], " "));
    // One write of one short line to a file opened for appending: lines of tests running in
    // parallel do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(Path::new(&log))
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record the skip in HPK_SKIP_LOG={}: {e}", Path::new(&log).display());
    }
}

/// A prerequisite of the test is missing: fails the test under `HPK_REQUIRE_TOOLS=1`, else
/// records the skip ([`skipped`]). The caller returns right after.
pub fn skip(why: impl std::fmt::Display) {
    let why = why.to_string();
    assert!(!requiring_tools(), "prerequisite missing (HPK_REQUIRE_TOOLS=1): {why}");
    skipped(&why);
}

/// An optional prerequisite (one the test command does not install, such as Apptainer) is
/// missing: records the skip even under `HPK_REQUIRE_TOOLS=1`.
pub fn skip_optional(why: impl std::fmt::Display) {
    skipped(&format!("{why} (optional)"));
}

/// The programs of `tools` not found on PATH.
pub fn missing_tools<'a>(tools: &[&'a str]) -> Vec<&'a str> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    tools
        .iter()
        .copied()
        .filter(|tool| !std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_on_path_is_found_and_an_absent_one_is_named() {
        assert_eq!(missing_tools(&["sh", "no-such-tool-hpk"]), vec!["no-such-tool-hpk"]);
    }
}
