//! Address management for the node's pod CIDR, persisted in the state directory.
//!
//! Every change is written to `allocations.json` through a temporary file, fsync and rename
//! before it is acknowledged, so a crash never loses an allocation that a pod already uses and a
//! restart never hands its address out again. Addresses are handed out round-robin (next-fit
//! from the last one given), so a freed address is reused as late as possible.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cidr::PodCidr;
use crate::netns::NetnsId;
use crate::{Error, Result};

const STATE_FILE: &str = "allocations.json";
const STATE_VERSION: u32 = 1;

/// One sandbox's address and what it was given for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The CRI sandbox id.
    pub sandbox_id: String,
    /// The pod's address.
    pub address: Ipv4Addr,
    /// The sandbox's network namespace as given to Attach.
    pub netns_path: PathBuf,
    /// That namespace's identity when it was attached.
    pub netns: NetnsId,
}

#[derive(Serialize, Deserialize)]
struct State {
    version: u32,
    pod_cidr: String,
    /// Index (among pod addresses) where the next search starts.
    next: u32,
    allocations: BTreeMap<String, Allocation>,
}

/// The allocations of one pod CIDR, mirrored in a state directory.
pub struct Ipam {
    path: PathBuf,
    cidr: PodCidr,
    next: u32,
    by_sandbox: BTreeMap<String, Allocation>,
    by_index: BTreeMap<u32, String>,
}

impl Ipam {
    /// Loads the allocations recorded in `dir` (created 0700 if missing) for `cidr`. Fails if the
    /// directory holds allocations of another CIDR, or addresses outside this one.
    pub fn open(dir: &Path, cidr: PodCidr) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| state_err("create", dir, source))?;
        let path = dir.join(STATE_FILE);
        let mut ipam = Ipam { path, cidr, next: 0, by_sandbox: BTreeMap::new(), by_index: BTreeMap::new() };
        let text = match std::fs::read(&ipam.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ipam),
            Err(source) => return Err(state_err("read", &ipam.path, source)),
        };
        let state: State = serde_json::from_slice(&text)
            .map_err(|source| Error::CorruptState { path: ipam.path.clone(), source })?;
        ipam.load(state)?;
        Ok(ipam)
    }

    fn load(&mut self, state: State) -> Result<()> {
        if state.version != STATE_VERSION {
            return Err(Error::Config(format!(
                "{} has version {}, this net-forwarder reads version {STATE_VERSION}",
                self.path.display(),
                state.version
            )));
        }
        if state.pod_cidr != self.cidr.to_string() && !state.allocations.is_empty() {
            return Err(Error::Config(format!(
                "{} holds {} allocations from pod CIDR {}, not {}: detach those pods or remove the file",
                self.path.display(),
                state.allocations.len(),
                state.pod_cidr,
                self.cidr
            )));
        }
        self.next = if state.next < self.cidr.pod_capacity() { state.next } else { 0 };
        for (id, alloc) in state.allocations {
            let index = self.cidr.pod_index(alloc.address).ok_or_else(|| {
                Error::Config(format!(
                    "{}: {} is not a pod address of {}",
                    self.path.display(),
                    alloc.address,
                    self.cidr
                ))
            })?;
            if id != alloc.sandbox_id || self.by_index.insert(index, id.clone()).is_some() {
                return Err(Error::Config(format!(
                    "{}: inconsistent record for sandbox {id} ({})",
                    self.path.display(),
                    alloc.address
                )));
            }
            self.by_sandbox.insert(id, alloc);
        }
        Ok(())
    }

    /// The pod CIDR.
    pub fn cidr(&self) -> PodCidr {
        self.cidr
    }

    /// The allocation of a sandbox.
    pub fn get(&self, sandbox_id: &str) -> Option<&Allocation> {
        self.by_sandbox.get(sandbox_id)
    }

    /// Every allocation, by sandbox id.
    pub fn list(&self) -> impl Iterator<Item = &Allocation> {
        self.by_sandbox.values()
    }

    /// How many pod addresses are free.
    pub fn free(&self) -> u32 {
        self.cidr.pod_capacity() - self.by_index.len() as u32
    }

    /// Allocates an address for a sandbox and records it durably.
    pub fn allocate(&mut self, sandbox_id: &str, netns_path: &Path, netns: NetnsId) -> Result<Allocation> {
        if self.by_sandbox.contains_key(sandbox_id) {
            return Err(Error::AlreadyExists(sandbox_id.to_owned()));
        }
        let capacity = self.cidr.pod_capacity();
        let index = (0..capacity)
            .map(|i| (self.next + i) % capacity)
            .find(|i| !self.by_index.contains_key(i))
            .ok_or_else(|| Error::Exhausted { cidr: self.cidr.to_string(), capacity })?;
        let address = self.cidr.pod_address(index).expect("index is below pod_capacity");
        let alloc = Allocation {
            sandbox_id: sandbox_id.to_owned(),
            address,
            netns_path: netns_path.to_owned(),
            netns,
        };
        let previous_next = self.next;
        self.next = (index + 1) % capacity;
        self.by_index.insert(index, sandbox_id.to_owned());
        self.by_sandbox.insert(sandbox_id.to_owned(), alloc.clone());
        if let Err(e) = self.persist() {
            self.by_index.remove(&index);
            self.by_sandbox.remove(sandbox_id);
            self.next = previous_next;
            return Err(e);
        }
        Ok(alloc)
    }

    /// Frees a sandbox's address and records that durably.
    pub fn release(&mut self, sandbox_id: &str) -> Result<Allocation> {
        let alloc = self
            .by_sandbox
            .remove(sandbox_id)
            .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_id} is not attached")))?;
        let index = self.cidr.pod_index(alloc.address).expect("loaded allocations are pod addresses");
        self.by_index.remove(&index);
        if let Err(e) = self.persist() {
            self.by_index.insert(index, sandbox_id.to_owned());
            self.by_sandbox.insert(sandbox_id.to_owned(), alloc);
            return Err(e);
        }
        Ok(alloc)
    }

    /// Frees the addresses of sandboxes whose network namespace is gone (or is another one
    /// now), as found at start after the net-forwarder was down; returns what was freed.
    pub fn reclaim_vanished(&mut self) -> Result<Vec<Allocation>> {
        let gone: Vec<String> = self
            .by_sandbox
            .values()
            .filter(|a| !a.netns.is_at(&a.netns_path))
            .map(|a| a.sandbox_id.clone())
            .collect();
        let mut freed = Vec::with_capacity(gone.len());
        for id in gone {
            freed.push(self.release(&id)?);
        }
        Ok(freed)
    }

    fn persist(&self) -> Result<()> {
        let state = State {
            version: STATE_VERSION,
            pod_cidr: self.cidr.to_string(),
            next: self.next,
            allocations: self.by_sandbox.clone(),
        };
        let text = serde_json::to_vec_pretty(&state).expect("the state serializes to JSON");
        write_atomic(&self.path, &text)
    }
}

/// Writes `data` to `path` through a temporary file in the same directory, fsync and rename,
/// then fsyncs the directory so the rename itself is durable.
fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("json.tmp");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(data)?;
        file.sync_all()
    };
    write().map_err(|source| state_err("write", &tmp, source))?;
    std::fs::rename(&tmp, path).map_err(|source| state_err("rename into place", path, source))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| state_err("sync directory", dir, source))
}

fn state_err(action: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::State { action, path: path.to_owned(), source }
}

#[cfg(test)]
#[path = "ipam_tests.rs"]
mod tests;
