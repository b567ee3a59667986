//! The user's paths in every bubble: `$HOME`, the Slurm job's submit directory, and what
//! `--bind SRC[:DST][:ro]` (or `HPK_BIND`) adds, each at its host path unless told another.
//! The kubelet lets pods mount these as hostPath and nothing else of the host
//! (`--allowed-host-path`).
//!
//! HPK's own directories may lie inside a bound path (`~/.hpk` inside `$HOME`: the admin
//! kubeconfig, every cluster's shared directory; the node-local state directory). The launcher
//! hides each under an empty read-only tmpfs in its view of the bound path, and hands the bubble
//! a locked copy of that view (see [`super::locked_clone`]), so not even a process with every
//! capability of the bubble can unmount the cover or remount a read-only bind writable.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use crate::error::{Error, Result};

/// One host path a bubble sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// The host path.
    pub source: PathBuf,
    /// Where the bubble (and its pods, as hostPath) sees it.
    pub dest: PathBuf,
    /// Read-only in the bubble.
    pub readonly: bool,
}

/// The bubble's own directories: a bind may not be one, lie inside one or contain one (it
/// would hide the bubble's programs, devices or HPK's state), except as [`SCRATCH`] allows.
/// Map such a path elsewhere: `--bind /etc/site:/site`.
pub const RESERVED: &[&str] = &[
    "/bin", "/dev", "/etc", "/hpk", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin", "/sys",
    "/tmp", "/usr", "/var",
];

impl FromStr for Bind {
    type Err = String;

    /// `SRC`, `SRC:DST`, `SRC:ro`, `SRC:DST:ro` (`rw` is the default and may be written).
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let (source, dest, mode) = match parts.as_slice() {
            [source] => (*source, *source, None),
            [source, mode @ ("ro" | "rw")] => (*source, *source, Some(*mode)),
            [source, dest] => (*source, *dest, None),
            [source, dest, mode] => (*source, *dest, Some(*mode)),
            _ => return Err(format!("{text:?}: expected SRC[:DST][:ro]")),
        };
        let readonly = match mode {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(other) => return Err(format!("{text:?}: unknown mode {other:?} (ro or rw)")),
        };
        let path = |p: &str, what: &str| {
            let path = Path::new(p);
            if !path.is_absolute() {
                return Err(format!("{text:?}: the {what} {p:?} is not an absolute path"));
            }
            if path.components().any(|c| matches!(c, Component::ParentDir)) {
                return Err(format!("{text:?}: the {what} {p:?} contains '..'"));
            }
            Ok(path.components().collect::<PathBuf>())
        };
        let bind = Self { source: path(source, "source")?, dest: path(dest, "destination")?, readonly };
        check_dest(&bind.dest).map_err(|e| format!("{text:?}: {e}"))?;
        Ok(bind)
    }
}

impl fmt::Display for Bind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source.display(), self.dest.display())?;
        if self.readonly {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

/// The bubble's scratch directories (each a tmpfs of its own): a bind may lie inside one, as
/// a test cluster's home under `/tmp` does, but not be or contain one.
pub const SCRATCH: &[&str] = &["/tmp", "/var/tmp"];

/// Refuses a destination that is `/`, or is, lies inside or contains a [`RESERVED`] directory
/// (inside a [`SCRATCH`] one is fine).
fn check_dest(dest: &Path) -> std::result::Result<(), String> {
    if dest == Path::new("/") {
        return Err("the destination cannot be /".into());
    }
    if SCRATCH.iter().any(|s| dest.starts_with(s) && dest != Path::new(s)) {
        return Ok(());
    }
    for reserved in RESERVED {
        let reserved = Path::new(reserved);
        if dest.starts_with(reserved) || reserved.starts_with(dest) {
            return Err(format!(
                "{} would cover the bubble's own {} (map it elsewhere, e.g. SRC:/data/NAME)",
                dest.display(),
                reserved.display()
            ));
        }
    }
    Ok(())
}

/// What every bubble binds: `$HOME` and the job's submit directory (`SLURM_SUBMIT_DIR`)
/// unless they cannot be bound (then a warning says why), then `explicit`, each checked
/// against the host. `hidden` are HPK's own directories: no source may lie inside one.
pub fn resolve(
    explicit: &[Bind],
    home: Option<&Path>,
    submit_dir: Option<&Path>,
    hidden: &[PathBuf],
) -> Result<(Vec<Bind>, Vec<String>)> {
    let mut binds: Vec<Bind> = Vec::new();
    let mut warnings = Vec::new();
    for (what, path) in [("$HOME", home), ("the job's submit directory", submit_dir)] {
        let Some(path) = path else { continue };
        let text = path.display().to_string();
        let checked = text.parse::<Bind>().map_err(Error::Invalid).and_then(|b| check_source(b, hidden));
        match checked {
            // Already seen through another bind at its own path: once is enough.
            Ok(bind)
                if binds
                    .iter()
                    .any(|b| b.source == b.dest && !b.readonly && bind.source.starts_with(&b.source)) => {}
            Ok(bind) if explicit.iter().any(|b| b.dest == bind.dest) => {}
            Ok(bind) => binds.push(bind),
            Err(e) => warnings.push(format!("{what} ({text}) is not bound into the bubbles: {e}")),
        }
    }
    for bind in explicit {
        if binds
            .iter()
            .chain(explicit.iter().take_while(|b| !std::ptr::eq(*b, bind)))
            .any(|b| b.dest == bind.dest)
        {
            return Err(Error::Invalid(format!("--bind {bind}: {} is bound twice", bind.dest.display())));
        }
        binds.push(
            check_source(bind.clone(), hidden).map_err(|e| Error::Invalid(format!("--bind {bind}: {e}")))?,
        );
    }
    Ok((binds, warnings))
}

/// Checks that `bind`'s source is a directory or file on the host other than `/`, and not
/// inside one of HPK's `hidden` directories.
fn check_source(bind: Bind, hidden: &[PathBuf]) -> Result<Bind> {
    let real = std::fs::canonicalize(&bind.source)
        .map_err(|e| Error::Invalid(format!("{}: {e}", bind.source.display())))?;
    if real == Path::new("/") {
        return Err(Error::Invalid(format!("{} is the host's whole filesystem", bind.source.display())));
    }
    for dir in hidden {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
        if real.starts_with(&dir) {
            return Err(Error::Invalid(format!(
                "{} lies inside {}, which HPK keeps for itself",
                bind.source.display(),
                dir.display()
            )));
        }
    }
    Ok(bind)
}

/// The directories of `hidden` inside `source`, relative to it (both with links resolved).
pub fn hidden_inside(source: &Path, hidden: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(source) = std::fs::canonicalize(source) else { return Vec::new() };
    hidden
        .iter()
        .filter_map(|dir| {
            let dir = std::fs::canonicalize(dir).ok()?;
            dir.strip_prefix(&source).ok().filter(|rel| !rel.as_os_str().is_empty()).map(Path::to_owned)
        })
        .collect()
}

/// HPK's own directories on this host, which no bind may reveal: `~/.hpk` (every cluster's
/// shared directory, the admin kubeconfigs) and the node-local state directory.
pub fn hidden_dirs() -> Result<Vec<PathBuf>> {
    Ok(vec![crate::cluster::hpk_home()?, crate::cluster::state_base()])
}

/// [`resolve`] with this process's `$HOME` and `$SLURM_SUBMIT_DIR`.
pub fn resolve_here(explicit: &[Bind]) -> Result<(Vec<Bind>, Vec<String>)> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    resolve(explicit, var("HOME").as_deref(), var("SLURM_SUBMIT_DIR").as_deref(), &hidden_dirs()?)
}

/// The shared-volumes directory (`--shared-volumes`, where the cluster's ReadWriteMany volumes
/// are made) as a bind at its own path: an absolute path outside HPK's `hidden` directories and
/// the bubble's own, a directory of this user's (`create`: made 0700 with its missing parents
/// when it does not exist; elsewhere it must, as a shared filesystem makes it). Every volume
/// the provisioner makes there is open to all the bubble's IDs, so only the user may own it.
pub fn shared_volumes(dir: &Path, create: bool, hidden: &[PathBuf]) -> Result<Bind> {
    let refuse = |why: String| Error::Invalid(format!("--shared-volumes {}: {why}", dir.display()));
    let bind: Bind = dir.display().to_string().parse().map_err(refuse)?;
    if create && std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        // Where it would be, links in the part that exists resolved: nothing is made inside
        // HPK's own directories.
        let mut existing = dir;
        let mut rest = Vec::new();
        while let (Err(_), Some(parent), Some(name)) =
            (std::fs::symlink_metadata(existing), existing.parent(), existing.file_name())
        {
            rest.push(name);
            existing = parent;
        }
        let mut would_be = std::fs::canonicalize(existing).map_err(|e| refuse(e.to_string()))?;
        would_be.extend(rest.iter().rev());
        if let Some(inside) = hidden
            .iter()
            .find(|h| would_be.starts_with(std::fs::canonicalize(h).unwrap_or_else(|_| (*h).clone())))
        {
            return Err(refuse(format!("lies inside {}, which HPK keeps for itself", inside.display())));
        }
        crate::image::create_private_dir(dir).map_err(|e| refuse(e.to_string()))?;
    }
    let meta = std::fs::metadata(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            refuse("does not exist on this node (it must be on a filesystem every node shares)".into())
        }
        _ => refuse(e.to_string()),
    })?;
    if !meta.is_dir() {
        return Err(refuse("is not a directory".into()));
    }
    let (owner, me) = (std::os::unix::fs::MetadataExt::uid(&meta), nix::unistd::geteuid().as_raw());
    if owner != me {
        return Err(refuse(format!(
            "belongs to UID {owner}, not to this user ({me}): choose a directory of your own"
        )));
    }
    check_source(bind, hidden).map_err(|e| refuse(e.to_string()))
}

/// Makes each bind's view at `root/<i>`, in the launcher's private mount namespace: its source
/// bound with everything mounted below it, each of HPK's `hidden` directories inside it covered
/// by an empty read-only tmpfs, every mount of it read-only if the bind is, and the whole then
/// replaced by a locked copy. Returns the views, in the order of `binds`. On failure nothing
/// stays mounted or made.
pub fn stage(binds: &[Bind], hidden: &[PathBuf], root: &Path) -> Result<Vec<PathBuf>> {
    clear(root).map_err(|e| Error::io("clear", root.display(), e))?;
    crate::image::create_private_dir(root)?;
    let mut views = Vec::new();
    for (i, bind) in binds.iter().enumerate() {
        let at = root.join(i.to_string());
        if let Err(e) = stage_one(bind, hidden, &at) {
            let _ = clear(root);
            return Err(e);
        }
        views.push(at);
    }
    Ok(views)
}

fn stage_one(bind: &Bind, hidden: &[PathBuf], at: &Path) -> Result<()> {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let what = |e: std::io::Error| Error::io("bind", format!("{} for the bubbles", bind.source.display()), e);
    let meta = std::fs::metadata(&bind.source).map_err(what)?;
    if meta.is_dir() {
        crate::image::create_private_dir(at)?;
    } else {
        std::fs::File::create(at).map_err(|e| Error::io("create", at.display(), e))?;
    }
    mount(Some(&bind.source), at, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .map_err(|e| what(e.into()))?;
    let undo = |e: Error| {
        let _ = umount2(at, MntFlags::MNT_DETACH);
        e
    };
    for rel in hidden_inside(&bind.source, hidden) {
        let target = at.join(&rel);
        let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("hpk-hidden"), &target, Some("tmpfs"), flags, Some("size=4k,mode=0500"))
            .map_err(|e| undo(Error::io("hide", target.display(), e.into())))?;
    }
    if bind.readonly {
        for mount_point in mounts_under(at).map_err(|e| undo(Error::io("read", "/proc/self/mountinfo", e)))? {
            super::remount_read_only(&mount_point)
                .map_err(|e| undo(Error::io("remount read-only", mount_point.display(), e)))?;
        }
    }
    super::lock_in_place(at, true, &format!("the view of {}", bind.source.display()))
}

/// The mount points at or below `at` in this mount namespace, parents first.
fn mounts_under(at: &Path) -> std::io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(crate::preflight::statefs::unescape(field)))
        .filter(|point| point.starts_with(at))
        .collect();
    points.sort_by_key(|p| p.components().count());
    points.dedup();
    Ok(points)
}

/// Unmounts and removes every view under `root`, then `root`. Only empty directories and
/// files are removed, one by one: a view still mounted stays (its removal would reach into the
/// user's files) and the error says so.
pub fn clear(root: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir(&path)?,
            Ok(_) => std::fs::remove_file(&path)?,
            Err(_) => {}
        }
    }
    std::fs::remove_dir(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_parse_as_apptainer_writes_them() {
        let bind = |s: &str| s.parse::<Bind>();
        let b =
            |source: &str, dest: &str, readonly| Bind { source: source.into(), dest: dest.into(), readonly };
        assert_eq!(bind("/scratch/alice"), Ok(b("/scratch/alice", "/scratch/alice", false)));
        assert_eq!(bind("/scratch/alice:ro"), Ok(b("/scratch/alice", "/scratch/alice", true)));
        assert_eq!(bind("/project/x:/data"), Ok(b("/project/x", "/data", false)));
        assert_eq!(bind("/project/x:/data:ro"), Ok(b("/project/x", "/data", true)));
        assert_eq!(bind("/project/x:/data:rw"), Ok(b("/project/x", "/data", false)));
        assert_eq!(bind("/tmp/data:/data"), Ok(b("/tmp/data", "/data", false)));
        assert_eq!(bind("/tmp/data"), Ok(b("/tmp/data", "/tmp/data", false)));
        assert_eq!(bind("/var/tmp/run-1:ro"), Ok(b("/var/tmp/run-1", "/var/tmp/run-1", true)));
        assert_eq!(bind("/project//x/"), Ok(b("/project/x", "/project/x", false)));
        for (text, why) in [
            ("scratch", "not an absolute path"),
            ("/a:data", "not an absolute path"),
            ("/a/../etc", "'..'"),
            ("/a:/b:rx", "unknown mode"),
            ("/a:/b:ro:x", "expected SRC[:DST][:ro]"),
            ("", "not an absolute path"),
            ("/", "cannot be /"),
            ("/x:/", "cannot be /"),
            ("/etc", "the bubble's own /etc"),
            ("/tmp", "the bubble's own /tmp"),
            ("/x:/var/tmp", "the bubble's own /var"),
            ("/var", "the bubble's own /var"),
            ("/data:/usr/local/data", "the bubble's own /usr"),
            ("/data:/var/lib/hpk", "the bubble's own /var"),
        ] {
            let err = bind(text).expect_err(text);
            assert!(err.contains(why), "{text}: {err}");
        }
        for text in ["/a", "/a:ro", "/a:/b", "/a:/b:ro"] {
            assert_eq!(bind(text).expect(text).to_string().parse::<Bind>(), bind(text), "{text} round-trips");
        }
    }

    #[test]
    fn home_and_the_submit_directory_come_first_and_bad_ones_are_skipped_with_a_warning() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical");
        let home = base.join("home");
        let hpk_home = home.join(".hpk");
        let job = home.join("job");
        let scratch = base.join("scratch");
        for d in [&hpk_home, &job, &scratch] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let hidden = vec![hpk_home.clone()];
        let explicit: Vec<Bind> =
            vec![format!("{}:/scratch/alice:ro", scratch.display()).parse().expect("bind")];
        let at_home = Bind { source: home.clone(), dest: home.clone(), readonly: false };

        // $HOME at its own path, then --bind; the submit directory inside $HOME is seen there.
        let (binds, warnings) = resolve(&explicit, Some(&home), Some(&job), &hidden).expect("resolve");
        assert_eq!(binds, vec![at_home.clone(), explicit[0].clone()]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let (binds, _) = resolve(&[], Some(&job), Some(&home), &hidden).expect("resolve");
        assert_eq!(binds.len(), 2, "a submit directory above $HOME is bound too: {binds:?}");

        // A $HOME that would cover the bubble's own directories is not bound: a warning.
        let (binds, warnings) = resolve(&explicit, Some(Path::new("/etc")), None, &hidden).expect("resolve");
        assert_eq!(binds, explicit);
        assert!(
            warnings[0].contains("$HOME (/etc)") && warnings[0].contains("bubble's own /etc"),
            "{warnings:?}"
        );
        // An explicit bind to the same destination replaces a default one.
        let over: Vec<Bind> =
            vec![format!("{}:{}", scratch.display(), home.display()).parse().expect("bind")];
        let (binds, _) = resolve(&over, Some(&home), None, &hidden).expect("resolve");
        assert_eq!(binds, over);

        // A missing $HOME is a warning too; a missing --bind source is an error.
        let (_, warnings) =
            resolve(&[], Some(Path::new("/nonexistent/home")), None, &hidden).expect("resolve");
        assert!(warnings[0].contains("No such file"), "{warnings:?}");
        let missing: Bind = "/nonexistent/data:/data".parse().expect("bind");
        let err = resolve(&[missing], None, None, &hidden).expect_err("missing source").to_string();
        assert!(err.contains("--bind /nonexistent/data:/data") && err.contains("No such file"), "{err}");

        // A source inside HPK's own directory, or the whole host, is refused.
        let inside: Bind = format!("{}:/data", hpk_home.display()).parse().expect("bind");
        let err = resolve(&[inside], None, None, &hidden).expect_err("inside").to_string();
        assert!(err.contains("which HPK keeps for itself"), "{err}");
        let all: Bind = "/:/host".parse().expect("bind");
        let err = resolve(&[all], None, None, &hidden).expect_err("root").to_string();
        assert!(err.contains("whole filesystem"), "{err}");

        // The same destination twice is refused.
        let twice: Vec<Bind> = vec![
            format!("{}:/data", scratch.display()).parse().expect("bind"),
            format!("{}:/data", job.display()).parse().expect("bind"),
        ];
        let err = resolve(&twice, None, None, &hidden).expect_err("twice").to_string();
        assert!(err.contains("bound twice"), "{err}");
    }

    #[test]
    fn hpks_directories_inside_a_source_are_found() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let home = std::fs::canonicalize(tmp.path()).expect("canonical");
        std::fs::create_dir_all(home.join(".hpk")).expect("mkdir");
        std::fs::create_dir_all(home.join("state")).expect("mkdir");
        std::os::unix::fs::symlink(home.join("state"), home.join("state-link")).expect("link");
        let hidden = vec![home.join(".hpk"), home.join("state-link"), PathBuf::from("/elsewhere")];
        assert_eq!(hidden_inside(&home, &hidden), vec![PathBuf::from(".hpk"), PathBuf::from("state")]);
        assert!(hidden_inside(&home.join(".hpk"), &hidden).is_empty(), "not the source itself");
    }

    #[test]
    fn the_shared_volumes_directory_is_made_private_or_must_be_the_users_own() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical");
        let hidden = vec![base.join(".hpk")];
        std::fs::create_dir_all(base.join(".hpk")).expect("mkdir");
        let refused = |dir: &Path, create: bool| {
            let err = shared_volumes(dir, create, &hidden).expect_err("refused").to_string();
            assert!(
                err.starts_with(&format!("--shared-volumes {}: ", dir.display())),
                "names the option: {err}"
            );
            err
        };

        // Missing: made, 0700, where the cluster starts; elsewhere it must be there already.
        let made = base.join("a/volumes");
        assert!(refused(&made, false).contains("does not exist on this node"));
        assert!(!made.exists(), "nothing made without create");
        let bind = shared_volumes(&made, true, &hidden).expect("made");
        assert_eq!(bind, Bind { source: made.clone(), dest: made.clone(), readonly: false });
        assert_eq!(std::fs::metadata(&made).expect("meta").mode() & 0o777, 0o700);
        // There already, open to others: used as it is, its mode untouched.
        let open = base.join("project");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o2770)).expect("chmod");
        shared_volumes(&open, true, &hidden).expect("the user's own");
        assert_eq!(std::fs::metadata(&open).expect("meta").mode() & 0o7777, 0o2770);

        std::fs::write(base.join("file"), "x").expect("write");
        assert!(refused(&base.join("file"), true).contains("not a directory"));
        assert!(refused(&base.join(".hpk/vols/x"), true).contains("HPK keeps for itself"));
        assert!(!base.join(".hpk/vols").exists(), "nothing made inside HPK's directory");
        std::fs::create_dir(base.join(".hpk/there")).expect("mkdir");
        assert!(refused(&base.join(".hpk/there"), true).contains("HPK keeps for itself"));
        assert!(refused(Path::new("/etc/hpk-volumes"), true).contains("would cover the bubble's own /etc"));
        assert!(refused(Path::new("volumes"), true).contains("not an absolute path"));
        if nix::unistd::geteuid().is_root() {
            let theirs = base.join("theirs");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            assert!(refused(&theirs, true).contains("belongs to UID 65534"));
        }
    }
}
