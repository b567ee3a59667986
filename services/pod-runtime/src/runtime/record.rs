//! Records on disk: what a restarted runtime needs to take its sandboxes and containers back.
//!
//! Each sandbox and container directory holds `config.json` (the CRI config, written once) and
//! `state.json` (what changes: state, times, PIDs, exit), both replaced atomically by rename. A
//! directory without both files was being created when the runtime died: recovery removes it.
//! Nothing is fsynced: the records only matter while the processes they describe live, and
//! those do not survive the machine going down.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Container, Error, Result, Sandbox};

pub(crate) const CONFIG: &str = "config.json";
pub(crate) const STATE: &str = "state.json";

/// The changing part of a sandbox.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SandboxState {
    pub(crate) created_at: i64,
    pub(crate) ready: bool,
    pub(crate) pause_pid: u32,
    #[serde(default)]
    pub(crate) ip: Option<String>,
}

/// The changing part of a container.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ContainerState {
    pub(crate) sandbox_id: String,
    pub(crate) image_ref: String,
    pub(crate) image_id: String,
    /// `cri::ContainerState` as its number.
    pub(crate) state: i32,
    pub(crate) created_at: i64,
    pub(crate) started_at: i64,
    pub(crate) finished_at: i64,
    pub(crate) exit_code: i32,
    pub(crate) reason: String,
    pub(crate) log_path: Option<PathBuf>,
    pub(crate) pause_pid: u32,
    pub(crate) sandbox_pid: Option<i32>,
    pub(crate) start_error: Option<String>,
    pub(crate) shim_pid: Option<u32>,
    /// Records of runtimes before it have none.
    #[serde(default)]
    pub(crate) not_honoured: Option<String>,
}

/// Writes `value` as `dir/name` by way of a temporary file and a rename.
pub(crate) fn write(dir: &Path, name: &str, value: &impl Serialize) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let bytes = serde_json::to_vec(value)
        .map_err(|e| Error::io("encode", &path, std::io::Error::other(e.to_string())))?;
    std::fs::write(&tmp, bytes).map_err(|e| Error::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename into", &path, e))
}

/// Reads `dir/name`; `None` when it does not exist.
pub(crate) fn read<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>> {
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("read", &path, e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::io("parse", &path, std::io::Error::other(e.to_string())))
}

impl Sandbox {
    pub(crate) fn state_record(&self) -> SandboxState {
        SandboxState {
            created_at: self.created_at,
            ready: self.ready,
            pause_pid: self.pause_pid,
            ip: self.ip.clone(),
        }
    }

    /// Saves the sandbox's config and state into `dir`.
    pub(crate) fn save_all(&self, dir: &Path) -> Result<()> {
        write(dir, CONFIG, &self.config)?;
        write(dir, STATE, &self.state_record())
    }
}

impl Container {
    pub(crate) fn state_record(&self) -> ContainerState {
        ContainerState {
            sandbox_id: self.sandbox_id.clone(),
            image_ref: self.image_ref.clone(),
            image_id: self.image_id.clone(),
            state: self.state as i32,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            reason: self.reason.clone(),
            log_path: self.log_path.clone(),
            pause_pid: self.pause_pid,
            sandbox_pid: self.sandbox_pid,
            start_error: self.start_error.clone(),
            shim_pid: self.shim_pid,
            not_honoured: self.not_honoured.clone(),
        }
    }

    /// Saves the container's state; a failure is logged, not returned: the change it records
    /// has happened, and the in-memory state stays right for this run.
    pub(crate) fn save(&self) {
        if let Err(e) = write(&self.dir, STATE, &self.state_record()) {
            tracing::warn!(container = %self.id, error = %e, "saving the container's record failed");
        }
    }

    /// Saves the container's config and state.
    pub(crate) fn save_all(&self) -> Result<()> {
        write(&self.dir, CONFIG, &self.config)?;
        write(&self.dir, STATE, &self.state_record())
    }

    /// A container from its records in `dir`.
    pub(crate) fn from_records(
        id: &str,
        dir: &Path,
        config: cri::ContainerConfig,
        s: ContainerState,
    ) -> Self {
        let state = cri::ContainerState::try_from(s.state).unwrap_or(cri::ContainerState::ContainerUnknown);
        let (exited, _) = tokio::sync::watch::channel(state == cri::ContainerState::ContainerExited);
        Self {
            id: id.to_owned(),
            dir: dir.to_owned(),
            sandbox_id: s.sandbox_id,
            config,
            image_ref: s.image_ref,
            image_id: s.image_id,
            state,
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            reason: s.reason,
            log_path: s.log_path,
            pause_pid: s.pause_pid,
            sandbox_pid: s.sandbox_pid,
            exited,
            start_error: s.start_error,
            shim_pid: s.shim_pid,
            not_honoured: s.not_honoured,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(dir: &Path, not_honoured: Option<&str>) -> Container {
        Container {
            id: "c".repeat(64),
            dir: dir.to_owned(),
            sandbox_id: "s".repeat(64),
            config: cri::ContainerConfig::default(),
            image_ref: String::new(),
            image_id: String::new(),
            state: cri::ContainerState::ContainerRunning,
            created_at: 1,
            started_at: 2,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            log_path: None,
            pause_pid: 0,
            sandbox_pid: Some(5),
            exited: tokio::sync::watch::channel(false).0,
            start_error: None,
            shim_pid: None,
            not_honoured: not_honoured.map(str::to_owned),
        }
    }

    fn reload(dir: &Path) -> Container {
        let config = read(dir, CONFIG).expect("config").expect("a config");
        let state = read(dir, STATE).expect("state").expect("a state");
        Container::from_records(&"c".repeat(64), dir, config, state)
    }

    #[test]
    fn the_note_on_an_unmapped_user_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let note = "runAsUser 1000 is not honoured: this bubble maps one ID (its user)";
        container(dir.path(), Some(note)).save_all().expect("saved");
        let back = reload(dir.path());
        assert_eq!(back.not_honoured.as_deref(), Some(note));
        assert_eq!(back.info().get(crate::runtime::NOT_HONOURED_KEY).map(String::as_str), Some(note));
        container(dir.path(), None).save_all().expect("saved");
        assert!(reload(dir.path()).info().is_empty(), "no note, nothing in info");
    }

    #[test]
    fn records_of_older_runtimes_have_no_note() {
        let dir = tempfile::tempdir().expect("tempdir");
        container(dir.path(), None).save_all().expect("saved");
        let mut state: serde_json::Value = read(dir.path(), STATE).expect("state").expect("a state");
        state.as_object_mut().expect("an object").remove("not_honoured");
        write(dir.path(), STATE, &state).expect("written");
        assert_eq!(reload(dir.path()).not_honoured, None);
    }
}
