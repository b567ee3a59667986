//! Process limits every HPK binary sets at start.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises this process's soft limit on open files to its hard limit and returns the limit now
/// in force. Every connection a service holds is a descriptor, and the soft limit a job step
/// inherits is often 1,024: a few hundred idle connections would otherwise exhaust it. Children
/// (a bubble's services, a pod's containers) inherit the raised limit, as processes under
/// Docker or containerd 1.x do.
pub fn raise_nofile() -> std::io::Result<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// [`raise_nofile`] for `main`: a failure is reported on standard error and the process goes
/// on with the limit it has.
pub fn raise_nofile_or_warn() -> u64 {
    match raise_nofile() {
        Ok(limit) => limit,
        Err(e) => {
            eprintln!("warning: could not raise the open-files limit to its hard limit: {e}");
            getrlimit(Resource::RLIMIT_NOFILE).map(|(soft, _)| soft).unwrap_or(1024)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_becomes_the_hard_limit() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        // Start from a low soft limit, as a job step often does.
        setrlimit(Resource::RLIMIT_NOFILE, 256.min(hard), hard).expect("lower the soft limit");
        assert_eq!(raise_nofile().expect("raise"), hard);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit"), (hard, hard));
    }
}
