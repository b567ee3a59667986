//! A container user this bubble cannot give: an ID outside the bubble's mapping makes crun's
//! setuid or setgid fail (EINVAL), so the container would never start. Instead it runs as the
//! bubble's root (the job's user on the host) for each ID that is not mapped, keeps the mapped
//! supplementary groups, and says so in a note that is kept with its record and reported in
//! ContainerStatus. Not a failure: Kubernetes users get their pod, with the reason why its
//! user is not theirs. Mapped IDs are left exactly as asked.

use k8s_cri::v1 as cri;

use super::security::User;
use crate::idmap::IdMappings;

/// The key of the note in ContainerStatus' verbose `info`.
pub const NOT_HONOURED_KEY: &str = "hpk.io/not-honoured";

/// `user` with every ID `ids` does not map replaced, and the note saying which and why;
/// `user` itself and no note when all are mapped (or the mappings are unknown).
pub(crate) fn fit(
    user: User,
    config: &cri::ContainerConfig,
    ids: Option<&IdMappings>,
) -> (User, Option<String>) {
    let Some(ids) = ids else { return (user, None) };
    let sc = config.linux.as_ref().and_then(|l| l.security_context.as_ref());
    let mut not_honoured = Vec::new();
    let uid = if ids.uid_mapped(user.uid) {
        user.uid
    } else {
        not_honoured.push(match sc {
            Some(sc) if sc.run_as_user.is_some() => format!("runAsUser {}", user.uid),
            Some(sc) if !sc.run_as_username.is_empty() => {
                format!("runAsUserName {:?} (uid {})", sc.run_as_username, user.uid)
            }
            _ => format!("the image's user {}", user.uid),
        });
        ids.uids.fallback()
    };
    let gid = if ids.gid_mapped(user.gid) {
        user.gid
    } else {
        not_honoured.push(match sc {
            Some(sc) if sc.run_as_group.is_some() => format!("runAsGroup {}", user.gid),
            _ => format!("group {}", user.gid),
        });
        ids.gids.fallback()
    };
    let dropped: Vec<u32> =
        user.additional_gids.iter().copied().filter(|g| *g != user.gid && !ids.gid_mapped(*g)).collect();
    if !dropped.is_empty() {
        let list = dropped.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let from_pod =
            sc.is_some_and(|sc| dropped.iter().all(|g| sc.supplemental_groups.contains(&i64::from(*g))));
        let what = if from_pod { "supplementalGroups" } else { "supplementary groups" };
        not_honoured.push(format!("{what} {list}"));
    }
    if not_honoured.is_empty() {
        return (user, None);
    }
    let mut additional_gids = vec![gid];
    additional_gids.extend(user.additional_gids.iter().copied().filter(|g| ids.gid_mapped(*g) && *g != gid));
    let note = note(&not_honoured, ids, uid, gid);
    (User { uid, gid, additional_gids }, Some(note))
}

/// `runAsUser 1000 and runAsGroup 3000 are not honoured: this bubble maps one ID (its user);
/// the container runs as uid 0, gid 0, which is the job's user on the host`.
fn note(items: &[String], ids: &IdMappings, uid: u32, gid: u32) -> String {
    let verb = if items.len() == 1 { "is" } else { "are" };
    let list = match items {
        [.., last] if items.len() > 1 => format!("{} and {last}", items[..items.len() - 1].join(", ")),
        _ => items.join(""),
    };
    if ids.is_one_id() {
        return format!(
            "{list} {verb} not honoured: this bubble maps one ID (its user); \
             the container runs as uid {uid}, gid {gid}, which is the job's user on the host"
        );
    }
    format!(
        "{list} {verb} not honoured: this bubble maps only user IDs {} and group IDs {}; \
         the container runs as uid {uid}, gid {gid}",
        ids.uids, ids.gids
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idmap::IdMap;

    fn ids(map: &str) -> IdMappings {
        IdMappings { uids: IdMap::parse(map).expect("map"), gids: IdMap::parse(map).expect("map") }
    }

    fn config(user: Option<i64>, group: Option<i64>, supplemental: &[i64]) -> cri::ContainerConfig {
        let sc = cri::LinuxContainerSecurityContext {
            run_as_user: user.map(|value| cri::Int64Value { value }),
            run_as_group: group.map(|value| cri::Int64Value { value }),
            supplemental_groups: supplemental.to_vec(),
            ..Default::default()
        };
        cri::ContainerConfig {
            linux: Some(cri::LinuxContainerConfig { security_context: Some(sc), ..Default::default() }),
            ..Default::default()
        }
    }

    fn user(uid: u32, gid: u32, additional_gids: &[u32]) -> User {
        User { uid, gid, additional_gids: additional_gids.to_vec() }
    }

    #[test]
    fn one_id_runs_as_root_of_the_bubble_and_says_why() {
        let asked = user(1000, 3000, &[3000, 0, 4000]);
        let (fitted, note) = fit(asked, &config(Some(1000), Some(3000), &[4000]), Some(&ids("0 1000 1")));
        assert_eq!(fitted, user(0, 0, &[0]), "mapped group 0 kept once, the rest dropped");
        assert_eq!(
            note.as_deref(),
            Some(
                "runAsUser 1000, runAsGroup 3000 and supplementalGroups 4000 are not honoured: this \
                 bubble maps one ID (its user); the container runs as uid 0, gid 0, which is the job's \
                 user on the host"
            )
        );
    }

    #[test]
    fn the_image_user_is_named_as_such() {
        let (fitted, note) =
            fit(user(101, 101, &[101]), &cri::ContainerConfig::default(), Some(&ids("0 0 1")));
        assert_eq!(fitted, user(0, 0, &[0]));
        let note = note.expect("a note");
        assert!(note.starts_with("the image's user 101 and group 101 are not honoured"), "{note}");
    }

    #[test]
    fn mapped_ids_are_left_exactly_as_asked() {
        let several = ids("0 1000 1\n1 100000 65536");
        let asked = user(1000, 3000, &[3000, 4000, 50000]);
        let (fitted, note) =
            fit(asked.clone(), &config(Some(1000), Some(3000), &[4000, 50000]), Some(&several));
        assert_eq!((fitted, note), (asked.clone(), None));
        let root = user(0, 0, &[0]);
        assert_eq!(fit(root.clone(), &config(Some(0), None, &[]), Some(&ids("0 1000 1"))), (root, None));
        assert_eq!(
            fit(asked.clone(), &config(Some(1000), None, &[]), None),
            (asked, None),
            "mappings unknown"
        );
    }

    #[test]
    fn only_the_unmapped_groups_are_dropped_with_several_ids() {
        let several = ids("0 1000 1\n1 100000 65536");
        let asked = user(1000, 3000, &[3000, 4000, 70000]);
        let (fitted, note) = fit(asked, &config(Some(1000), Some(3000), &[4000, 70000]), Some(&several));
        assert_eq!(fitted, user(1000, 3000, &[3000, 4000]));
        assert_eq!(
            note.as_deref(),
            Some(
                "supplementalGroups 70000 is not honoured: this bubble maps only user IDs 0, 1-65536 and \
                 group IDs 0, 1-65536; the container runs as uid 1000, gid 3000"
            )
        );
    }
}
