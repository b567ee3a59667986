use std::path::PathBuf;

/// What can go wrong running sandboxes and containers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// crun (or mount) failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stderr.
        stderr: String,
    },
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// crun's answer could not be understood.
    #[error("unexpected output from crun: {0}")]
    Parse(String),
    /// A path given for a mount or a log escapes its directory.
    #[error("path {path:?} escapes {base}")]
    PathEscapes {
        /// The path given.
        path: String,
        /// The directory it must stay in.
        base: PathBuf,
    },
    /// A mount source inside a volume that leads through a symbolic link (or through a file
    /// where a directory must be): the volume changed under it, or the path was never plain.
    #[error(
        "mount source {path:?} in {root}: {at:?} is {found}; paths inside a volume are followed without links"
    )]
    SubPathLink {
        /// The volume.
        root: PathBuf,
        /// The path inside it.
        path: String,
        /// The component that is a link, with those before it.
        at: String,
        /// What it is, in words.
        found: &'static str,
    },
    /// The engine cannot do what was asked (Apptainer's syntax or features do not reach).
    #[error("{0}")]
    Unsupported(String),
    /// What the engine needs of a container or image is not there (a SIF not pulled).
    #[error("{kind} {id:?} not found")]
    NotFound {
        /// What was looked for.
        kind: &'static str,
        /// Its ID or reference.
        id: String,
    },
    /// The container is not in a state that allows the operation (no running process, a
    /// launch that failed).
    #[error("{0}")]
    FailedPrecondition(String),
    /// An identifier is not usable as a container ID or directory name.
    #[error("invalid identifier {0:?}: use letters, digits, '-', '_' and '.'")]
    BadId(String),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { action, path: path.into(), source }
    }
}

/// Runs a command to completion; a non-zero exit is an error with its stderr.
pub(crate) fn run(cmd: &mut std::process::Command) -> Result<Vec<u8>> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| Error::io("run", shown.clone(), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out.stdout)
}
