//! Starting the optional command with a clean signal state.
//!
//! `std::process::Command` leaves the signal mask alone here (measured: the child of a pause
//! started with it had SIGTERM, SIGINT, SIGHUP, SIGCHLD and SIGALRM blocked, so a forwarded
//! SIGTERM never reached it), and resetting it in `pre_exec` would need `unsafe`. posix_spawn
//! takes the mask and the default dispositions as attributes instead.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawnp};
use nix::sys::signal::{SigSet, Signal};

use super::os::HANDLED;
use super::{Error, Result};

/// Starts `program` (looked up on PATH) with `args`, our environment, an empty signal mask and
/// default dispositions for the signals we handle or ignore. Returns its PID.
pub(crate) fn spawn(program: &OsString, args: &[OsString]) -> Result<i32> {
    let failed = |source| Error::Spawn { command: program.to_string_lossy().into_owned(), source };
    let argv = std::iter::once(program)
        .chain(args)
        .map(|arg| c_string(arg.as_bytes()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| failed(Errno::EINVAL))?;
    let envp: Vec<CString> = std::env::vars_os()
        .filter_map(|(key, value)| c_string(&[key.as_bytes(), b"=", value.as_bytes()].concat()))
        .collect();
    let attr = clean_signal_state().map_err(failed)?;
    let actions = PosixSpawnFileActions::init().map_err(failed)?;
    let pid = posix_spawnp(&argv[0], &actions, &attr, &argv, &envp).map_err(failed)?;
    Ok(pid.as_raw())
}

fn c_string(bytes: &[u8]) -> Option<CString> {
    CString::new(bytes).ok()
}

fn clean_signal_state() -> nix::Result<PosixSpawnAttr> {
    let mut attr = PosixSpawnAttr::init()?;
    let mut defaults = SigSet::empty();
    // Rust ignores SIGPIPE for us; the command should get the usual default.
    for signal in HANDLED.into_iter().chain([Signal::SIGPIPE]) {
        defaults.add(signal);
    }
    attr.set_sigdefault(&defaults)?;
    attr.set_sigmask(&SigSet::empty())?;
    attr.set_flags(PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK)?;
    Ok(attr)
}
