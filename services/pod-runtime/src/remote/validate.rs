//! The checks of a PutFiles request, all done before anything is written: what passes is a
//! [`Plan`] that [`super::files`] may create without looking at the request again.

use std::collections::HashMap;

use hpk_proto::podruntime::v1::{FileEntry, PutFilesRequest, file_entry};

use super::{Error, Result};

/// Longest pod UID (a Kubernetes UID is 36 characters).
const MAX_UID: usize = 64;
/// Longest key: one name under the pod's directory, as a file name may be.
const MAX_KEY: usize = 255;
/// Longest entry path or symlink target (PATH_MAX); the atomic writer's `..<timestamp>/`
/// directory before a 253-character ConfigMap key already passes 255.
const MAX_PATH: usize = 4096;
/// Longest component of any path (NAME_MAX).
const MAX_NAME: usize = 255;
/// Links followed while resolving one symlink target, as the kernel's ELOOP limit.
const MAX_HOPS: u32 = 40;
/// The mode of a file or directory the request gives none for.
pub(crate) const DEFAULT_FILE_MODE: u32 = 0o644;
/// The mode of a directory the request gives none for, and of implicit parents.
pub(crate) const DEFAULT_DIR_MODE: u32 = 0o755;

/// A checked PutFiles request.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) uid: &'a str,
    pub(crate) key: &'a str,
    pub(crate) root: Root<'a>,
}

/// What the key names: one file, or a directory tree.
#[derive(Debug)]
pub(crate) enum Root<'a> {
    File {
        content: &'a [u8],
        mode: u32,
    },
    /// Entries sorted by path, so every parent comes before what is below it.
    Dir(Vec<Entry<'a>>),
}

/// One checked entry of a directory tree.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    pub(crate) path: &'a str,
    pub(crate) kind: Kind<'a>,
    /// The mode to give it, defaults applied (unused for symlinks).
    pub(crate) mode: u32,
}

/// What an entry is.
#[derive(Debug)]
pub(crate) enum Kind<'a> {
    File(&'a [u8]),
    Symlink(&'a str),
    Dir,
}

/// Checks a pod UID: lower-case hex digits and dashes, 1 to 64 of them.
pub(crate) fn check_uid(uid: &str) -> Result<()> {
    let ok = (1..=MAX_UID).contains(&uid.len())
        && uid.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "pod_uid {uid:?} is not a pod UID (1 to {MAX_UID} lower-case hex digits and dashes)"
        )))
    }
}

/// Checks the whole request; `max_content` bounds the sum of the files' sizes.
pub(crate) fn plan(request: &PutFilesRequest, max_content: usize) -> Result<Plan<'_>> {
    check_uid(&request.pod_uid)?;
    let key = request.key.as_str();
    check_relative(&format!("key {key:?}"), key, MAX_KEY)?;
    let total: usize = request
        .entries
        .iter()
        .map(|e| match &e.kind {
            Some(file_entry::Kind::Content(content)) => content.len(),
            _ => 0,
        })
        .fold(0, usize::saturating_add);
    if total > max_content {
        return Err(Error::Invalid(format!(
            "key {key:?}: the files hold {total} bytes, more than the {max_content} one put may carry"
        )));
    }
    let root = if request.directory { tree(&request.entries)? } else { single_file(key, &request.entries)? };
    Ok(Plan { uid: &request.pod_uid, key, root })
}

/// A put that is not a directory: exactly one entry, with an empty path and content.
fn single_file<'a>(key: &str, entries: &'a [FileEntry]) -> Result<Root<'a>> {
    match entries {
        [FileEntry { path, kind: Some(file_entry::Kind::Content(content)), mode }] if path.is_empty() => {
            let mode = check_mode(&format!("key {key:?}"), *mode, DEFAULT_FILE_MODE)?;
            Ok(Root::File { content, mode })
        }
        _ => Err(Error::Invalid(format!(
            "key {key:?}: a put that is not a directory has exactly one entry, with an empty path and \
             content (got {} entries{})",
            entries.len(),
            entries.first().map(|e| format!(", the first {}", describe(e))).unwrap_or_default(),
        ))),
    }
}

fn describe(entry: &FileEntry) -> String {
    let kind = match &entry.kind {
        Some(file_entry::Kind::Content(_)) => "content",
        Some(file_entry::Kind::Symlink(_)) => "a symlink",
        Some(file_entry::Kind::Dir(_)) => "a directory",
        None => "nothing",
    };
    format!("with path {:?} and {kind}", entry.path)
}

/// A directory tree: every path valid and listed once, parents directories, links inside.
fn tree(entries: &[FileEntry]) -> Result<Root<'_>> {
    let mut kinds: HashMap<&str, bool> = HashMap::new(); // path → is a directory
    let mut links: HashMap<&str, &str> = HashMap::new();
    let mut checked = Vec::with_capacity(entries.len());
    for entry in entries {
        let path = entry.path.as_str();
        let what = format!("entry {path:?}");
        check_relative(&what, path, MAX_PATH)?;
        let (kind, default) = match &entry.kind {
            Some(file_entry::Kind::Content(content)) => (Kind::File(content), DEFAULT_FILE_MODE),
            Some(file_entry::Kind::Symlink(target)) => {
                links.insert(path, target);
                (Kind::Symlink(target), 0)
            }
            Some(file_entry::Kind::Dir(_)) => (Kind::Dir, DEFAULT_DIR_MODE),
            None => return Err(Error::Invalid(format!("{what}: has no content, symlink or dir"))),
        };
        let mode = check_mode(&what, entry.mode, default)?;
        if kinds.insert(path, matches!(kind, Kind::Dir)).is_some() {
            return Err(Error::Invalid(format!("{what}: listed more than once")));
        }
        checked.push(Entry { path, kind, mode });
    }
    for entry in &checked {
        for parent in ancestors(entry.path) {
            if kinds.get(parent) == Some(&false) {
                return Err(Error::Invalid(format!(
                    "entry {:?}: its parent {parent:?} is not a directory",
                    entry.path
                )));
            }
        }
        if let Kind::Symlink(target) = entry.kind {
            check_symlink(&links, entry.path, target)?;
        }
    }
    checked.sort_by(|a, b| a.path.cmp(b.path));
    Ok(Root::Dir(checked))
}

/// The proper ancestors of a relative path: `a/b/c` → `a`, `a/b`.
pub(crate) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(at, _)| &path[..at])
}

/// A relative path of normal components: not empty, at most `limit` bytes, no NUL, no
/// leading `/`, no empty, `.` or `..` component, none longer than a file name may be.
fn check_relative(what: &str, path: &str, limit: usize) -> Result<()> {
    let refuse = |why: String| Err(Error::Invalid(format!("{what}: {why}")));
    if path.is_empty() {
        return refuse("must not be empty".into());
    }
    if path.len() > limit {
        return refuse(format!("is {} bytes long, more than {limit}", path.len()));
    }
    if path.contains('\0') {
        return refuse("contains a NUL byte".into());
    }
    if path.starts_with('/') {
        return refuse("must be relative, not start with /".into());
    }
    for component in path.split('/') {
        match component {
            "" => return refuse("has an empty component (// or a trailing /)".into()),
            "." | ".." => return refuse(format!("has a {component:?} component")),
            name if name.len() > MAX_NAME => {
                return refuse(format!("has a component longer than {MAX_NAME} bytes"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Permission bits at most 0o7777; 0 means `default`.
fn check_mode(what: &str, mode: u32, default: u32) -> Result<u32> {
    match mode {
        0 => Ok(default),
        1..=0o7777 => Ok(mode),
        _ => Err(Error::Invalid(format!("{what}: mode {mode:#o} is more than 0o7777"))),
    }
}

/// A symlink target: relative, and resolving within the root, following the links of the
/// same put as the kernel would (a link to `..data/key` where `..data` is a link is fine; a
/// link through `d -> .` to `d/..` is not).
fn check_symlink(links: &HashMap<&str, &str>, path: &str, target: &str) -> Result<()> {
    let what = format!("entry {path:?}");
    let refuse = |why: &str| Err(Error::Invalid(format!("{what}: symlink target {target:?} {why}")));
    if target.is_empty() {
        return refuse("is empty");
    }
    if target.len() > MAX_PATH || target.contains('\0') {
        return refuse("is too long or contains a NUL byte");
    }
    if target.starts_with('/') {
        return refuse("is absolute; it must be relative to the link");
    }
    let dir: Vec<&str> = ancestors(path).last().map(|p| p.split('/').collect()).unwrap_or_default();
    let mut hops = 0;
    match resolve(links, dir, target, &mut hops) {
        Some(_) => Ok(()),
        None if hops > MAX_HOPS => refuse("goes through too many links"),
        None => refuse("leads out of the root"),
    }
}

/// Where `target`, read in the directory `at` (components below the root), ends up; `None`
/// when it leaves the root or loops.
fn resolve<'a>(
    links: &HashMap<&'a str, &'a str>,
    mut at: Vec<&'a str>,
    target: &'a str,
    hops: &mut u32,
) -> Option<Vec<&'a str>> {
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                at.pop()?;
            }
            name => {
                at.push(name);
                if let Some(next) = links.get(at.join("/").as_str()) {
                    *hops += 1;
                    if *hops > MAX_HOPS {
                        return None;
                    }
                    at.pop();
                    at = resolve(links, at, next, hops)?;
                }
            }
        }
    }
    Some(at)
}
