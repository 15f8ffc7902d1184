//! A volume's root folder as a backup keeps it. restic stores what is inside the folder it
//! backs up (`restic backup .`), never the folder itself, so a restore left the new
//! generation's root as Docker made it (`0:0 755`), and a role running as another user (999,
//! PostgreSQL's) could no longer write at the top of its volume. The root's owner, mode and
//! extended attributes travel as tags of the snapshot instead, and are put back after a restore.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// The tag with the root's owner and mode: `pushleft-root=<uid>:<gid>:<octal mode>`.
const OWNER: &str = "pushleft-root=";
/// A tag per extended attribute of the root: `pushleft-root-xattr=<hex name>:<hex value>`.
const XATTR: &str = "pushleft-root-xattr=";
/// Most extended attributes of the root kept, and the longest value: more is left out (with a
/// warning), so a hostile role cannot make the snapshot's tags large.
pub const MAX_XATTRS: usize = 16;
pub const MAX_XATTR_VALUE: usize = 1024;

/// The tags that describe `dir`, the volume's root.
pub fn tags_of(dir: &Path) -> std::io::Result<Vec<String>> {
    let meta = std::fs::metadata(dir)?;
    let mut tags = vec![format!(
        "{OWNER}{}:{}:{:o}",
        meta.uid(),
        meta.gid(),
        meta.permissions().mode() & 0o7777
    )];
    let mut names = vec![0u8; 64 * 1024];
    let n = rustix::fs::listxattr(dir, &mut names[..]).map_err(std::io::Error::from)?;
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if tags.len() > MAX_XATTRS {
            tracing::warn!(dir = %dir.display(), "a volume root with more extended attributes than a backup keeps");
            break;
        }
        let mut value = vec![0u8; MAX_XATTR_VALUE];
        match rustix::fs::getxattr(dir, name, &mut value[..]) {
            Ok(len) => tags.push(format!("{XATTR}{}:{}", hex::encode(name), hex::encode(&value[..len]))),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "an extended attribute of a volume root left out")
            }
        }
    }
    Ok(tags)
}

/// Puts back on `dir` what `tags` (a snapshot's) say of the root it was saved from; a snapshot
/// without them (made before they were kept) changes nothing.
pub fn apply(dir: &Path, tags: &[String]) -> std::io::Result<()> {
    for tag in tags {
        if let Some(rest) = tag.strip_prefix(OWNER) {
            let parts: Vec<&str> = rest.split(':').collect();
            let [uid, gid, mode] = parts[..] else { continue };
            let (Ok(uid), Ok(gid), Ok(mode)) = (uid.parse::<u32>(), gid.parse::<u32>(), u32::from_str_radix(mode, 8))
            else {
                continue;
            };
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7777))?;
        } else if let Some(rest) = tag.strip_prefix(XATTR)
            && let Some((name, value)) = rest.split_once(':')
            && let (Ok(name), Ok(value)) = (hex::decode(name), hex::decode(value))
        {
            rustix::fs::setxattr(dir, name.as_slice(), &value, rustix::fs::XattrFlags::empty())
                .map_err(std::io::Error::from)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roots_owner_and_mode_survive_as_tags() {
        let a = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(a.path(), std::fs::Permissions::from_mode(0o2750)).expect("chmod");
        let tags = tags_of(a.path()).expect("tags");
        assert!(tags[0].starts_with(OWNER) && tags[0].ends_with(":2750"), "{tags:?}");
        let b = tempfile::tempdir().expect("tempdir");
        apply(b.path(), &tags).expect("apply");
        assert_eq!(
            std::fs::metadata(b.path()).expect("meta").permissions().mode() & 0o7777,
            0o2750
        );
        // Tags of another kind, or malformed, change nothing.
        apply(b.path(), &["pushleft-volume=x".to_owned(), format!("{OWNER}x:y")]).expect("ignored");
    }
}
