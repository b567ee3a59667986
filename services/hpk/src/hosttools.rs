//! The programs that start and connect a bubble on the host — crun (the bubble itself) and
//! slirp4netns (its egress) — run from the bubble image's own root filesystem, with the
//! image's own dynamic loader and libraries. Nothing comes from the host's PATH, so a stock
//! compute node needs neither installed, and the host's C library (RHEL 8's glibc 2.28, say)
//! does not matter: `hpk` itself is static, and these run on the image's glibc.
//!
//! A program is started as `<root>/…/ld-linux-….so <loader options> <root>/usr/bin/<tool>`:
//! the loader is given the image's library directories (`--library-path`, searched before
//! anything of the host's) and the name the program should see (`--argv0`). The options apply
//! to that one process; nothing leaks into what it starts (no `LD_LIBRARY_PATH`).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// The programs HPK runs on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// The OCI runtime that creates, starts and stops the bubble.
    Crun,
    /// User-mode networking for the bubble's outbound connections.
    Slirp4netns,
}

impl Tool {
    /// Its program name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Crun => "crun",
            Self::Slirp4netns => "slirp4netns",
        }
    }

    /// Where it lives in the image.
    fn path_in_image(self) -> &'static str {
        match self {
            Self::Crun => "usr/bin/crun",
            Self::Slirp4netns => "usr/bin/slirp4netns",
        }
    }
}

/// The image's dynamic loader for this machine's architecture and its library directory, as
/// Debian lays them out (the multiarch directory under `/usr/lib`).
fn loader_in_image() -> Option<(&'static str, &'static str)> {
    match std::env::consts::ARCH {
        "x86_64" => Some(("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "usr/lib/x86_64-linux-gnu")),
        "aarch64" => Some(("usr/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1", "usr/lib/aarch64-linux-gnu")),
        _ => None,
    }
}

/// The host-side programs of one unpacked bubble image.
#[derive(Debug, Clone)]
pub struct HostTools {
    root: PathBuf,
    loader: PathBuf,
    library_path: OsString,
}

impl HostTools {
    /// The programs of the image unpacked at `root`: its loader, libraries, crun and
    /// slirp4netns must all be there, as real files inside the root (links resolved within it).
    pub fn new(root: &Path) -> Result<Self> {
        let missing = |what: String| Error::Image {
            path: root.to_owned(),
            reason: format!("{what}: the bubble image must carry the programs that start a bubble"),
        };
        let (loader, libs) = loader_in_image()
            .ok_or_else(|| missing(format!("no loader known for {}", std::env::consts::ARCH)))?;
        let loader = resolve_in_root(root, Path::new(loader))
            .ok_or_else(|| missing(format!("no dynamic loader at /{loader}")))?;
        let mut dirs = Vec::new();
        for dir in [libs, "usr/lib"] {
            if let Some(d) = resolve_in_root(root, Path::new(dir)) {
                dirs.push(d.into_os_string());
            }
        }
        let tools = Self { root: root.to_owned(), loader, library_path: join_paths(&dirs) };
        for tool in [Tool::Crun, Tool::Slirp4netns] {
            tools
                .program(tool)
                .ok_or_else(|| missing(format!("no {} at /{}", tool.name(), tool.path_in_image())))?;
        }
        Ok(tools)
    }

    /// The programs of an image a launcher unpacked earlier, at `root` as its record in
    /// `~/.hpk` names it (`hpk down`, `hpk shell`): only from the image cache of the state
    /// directory `state_base`, and only while that directory and the cache are still this
    /// user's alone. After a reboot or a `/tmp` clean-up another user may have made the same
    /// path, and would then choose what runs as this user.
    pub fn from_cache(state_base: &Path, root: &Path) -> Result<Self> {
        let cache = state_base.join("images");
        let inside = root.starts_with(&cache)
            && root.components().all(|c| matches!(c, Component::Normal(_) | Component::RootDir));
        if !inside {
            return Err(Error::Image {
                path: root.to_owned(),
                reason: format!("not in this user's image cache {}: not run", cache.display()),
            });
        }
        crate::preflight::statefs::verify_private(state_base)?;
        crate::preflight::statefs::verify_private(&cache)?;
        Self::new(root)
    }

    /// The unpacked image these programs come from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn program(&self, tool: Tool) -> Option<PathBuf> {
        resolve_in_root(&self.root, Path::new(tool.path_in_image()))
    }

    /// A command that runs `tool` from the image (arguments are added by the caller).
    pub fn command(&self, tool: Tool) -> Command {
        let mut cmd = Command::new(&self.loader);
        // The launcher's secret is its own, not crun's or slirp4netns'.
        cmd.env_remove(crate::cluster::NODE_TOKEN_KEY_ENV);
        cmd.arg("--library-path").arg(&self.library_path).arg("--argv0").arg(tool.name());
        // Checked in `new`; a program removed since fails at its start, with the loader's
        // message, like any missing program would.
        cmd.arg(self.program(tool).unwrap_or_else(|| self.root.join(tool.path_in_image())));
        cmd
    }
}

fn join_paths(dirs: &[OsString]) -> OsString {
    let mut joined = OsString::new();
    for (i, d) in dirs.iter().enumerate() {
        if i > 0 {
            joined.push(":");
        }
        joined.push(d);
    }
    joined
}

/// `rel` inside `root` with every symlink resolved as if `root` were `/` (an absolute link
/// target starts at `root`, `..` never climbs above it), as a path on the host; `None` unless
/// it exists. The image's `/lib64/ld-linux-x86-64.so.2`, for one, is an absolute link that would
/// otherwise lead to the host's loader.
pub fn resolve_in_root(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut parts: Vec<OsString> = Vec::new();
    let mut pending: Vec<OsString> = components(rel);
    pending.reverse();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            parts.pop();
            continue;
        }
        let mut candidate = root.to_path_buf();
        candidate.extend(&parts);
        candidate.push(&part);
        let meta = std::fs::symlink_metadata(&candidate).ok()?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return None;
            }
            let target = std::fs::read_link(&candidate).ok()?;
            if target.is_absolute() {
                parts.clear();
            }
            let mut more = components(&target);
            more.reverse();
            pending.extend(more);
        } else {
            parts.push(part);
        }
    }
    let mut path = root.to_path_buf();
    path.extend(&parts);
    Some(path)
}

fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_resolve_inside_the_root_never_to_the_host() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).expect("mkdir");
        std::fs::write(r.join("usr/lib/x86_64-linux-gnu/ld.so"), b"").expect("write");
        symlink("usr/lib", r.join("lib")).expect("link");
        std::fs::create_dir_all(r.join("usr/lib64")).expect("mkdir");
        // Absolute, as in Debian: must land in the root, not on the host's /usr/lib.
        symlink("/lib/x86_64-linux-gnu/ld.so", r.join("usr/lib64/ld.so")).expect("link");
        symlink("usr/lib64", r.join("lib64")).expect("link");
        assert_eq!(
            resolve_in_root(r, Path::new("lib64/ld.so")),
            Some(r.join("usr/lib/x86_64-linux-gnu/ld.so"))
        );
        // `..` stops at the root.
        symlink("../../../../usr/lib", r.join("usr/up")).expect("link");
        assert_eq!(resolve_in_root(r, Path::new("usr/up")), Some(r.join("usr/lib")));
        assert_eq!(resolve_in_root(r, Path::new("usr/missing")), None);
        // A loop ends.
        symlink("loop", r.join("loop")).expect("link");
        assert_eq!(resolve_in_root(r, Path::new("loop")), None);
    }

    #[test]
    fn an_image_without_crun_is_refused_with_its_name() {
        let root = tempfile::tempdir().expect("tempdir");
        let Some((loader, libs)) = loader_in_image() else { return };
        std::fs::create_dir_all(root.path().join(libs)).expect("mkdir");
        std::fs::write(root.path().join(loader), b"").expect("write");
        let err = HostTools::new(root.path()).expect_err("no crun");
        assert!(err.to_string().contains("no crun at /usr/bin/crun"), "{err}");
        std::fs::create_dir_all(root.path().join("usr/bin")).expect("mkdir");
        std::fs::write(root.path().join("usr/bin/crun"), b"").expect("write");
        std::fs::write(root.path().join("usr/bin/slirp4netns"), b"").expect("write");
        let tools = HostTools::new(root.path()).expect("tools");
        let cmd = tools.command(Tool::Crun);
        assert_eq!(cmd.get_program(), root.path().join(loader));
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args[0], "--library-path");
        assert!(args[1].starts_with(&root.path().join(libs).display().to_string()), "{args:?}");
        assert_eq!(args[2..4], ["--argv0".to_owned(), "crun".to_owned()]);
        assert_eq!(args[4], root.path().join("usr/bin/crun").display().to_string());
    }
}
