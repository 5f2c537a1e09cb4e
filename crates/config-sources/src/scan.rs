//! Listing the config files under a directory: recursive, sorted, following symlinks (Kubernetes
//! ConfigMap mounts are symlinks into `..data`) but never a symlink loop, skipping hidden entries.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::SourceError;
use crate::parse::is_config_file;

/// What one walk of the config directory found.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Config files, sorted, by their path under the root (not their symlink target).
    pub files: Vec<PathBuf>,
    /// Subdirectories that could not be listed: files under them keep their last good contents.
    pub unreadable_dirs: Vec<PathBuf>,
    pub errors: Vec<SourceError>,
    /// The walk went through a symlink (a file or a directory): a change can then show up under
    /// another path than the one events name (a ConfigMap's `..data` swap), so only a full walk
    /// sees it.
    pub symlinks: bool,
}

impl Listing {
    /// True when `file` sits under a directory this walk could not read.
    pub(crate) fn under_unreadable_dir(&self, file: &Path) -> bool {
        self.unreadable_dirs.iter().any(|d| file.starts_with(d))
    }
}

/// Entries the walk skips: names starting with a dot (and names that are not UTF-8).
pub(crate) fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_str().is_none_or(|n| n.starts_with('.'))
}

/// Walks `root`. Fails only when `root` itself cannot be listed.
pub(crate) fn list_config_files(root: &Path) -> Result<Listing, SourceError> {
    let dir_error = |e: io::Error| SourceError::Directory {
        dir: root.to_path_buf(),
        reason: e.to_string(),
    };
    let canonical = fs::canonicalize(root).map_err(dir_error)?;
    let entries = read_sorted(root).map_err(dir_error)?;
    let mut visited = HashSet::from([canonical]);
    let mut listing = Listing::default();
    walk_entries(entries, &mut visited, &mut listing);
    listing.files.sort();
    Ok(listing)
}

fn read_sorted(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut paths = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<Vec<_>>>()?;
    paths.sort();
    Ok(paths)
}

fn walk_entries(entries: Vec<PathBuf>, visited: &mut HashSet<PathBuf>, listing: &mut Listing) {
    for path in entries {
        if path.file_name().is_none_or(is_hidden) {
            continue;
        }
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            listing.symlinks = true;
        }
        // `metadata` follows symlinks; a dangling symlink is as good as absent.
        let Ok(meta) = fs::metadata(&path) else { continue };
        if meta.is_dir() {
            let Ok(canonical) = fs::canonicalize(&path) else {
                continue;
            };
            if !visited.insert(canonical) {
                tracing::debug!(dir = %path.display(), "config directory already visited (symlink loop?): skipped");
                continue;
            }
            match read_sorted(&path) {
                Ok(children) => walk_entries(children, visited, listing),
                Err(e) => {
                    listing.errors.push(SourceError::Read {
                        file: path.clone(),
                        reason: e.to_string(),
                    });
                    listing.unreadable_dirs.push(path);
                }
            }
        } else if meta.is_file() && is_config_file(&path) {
            listing.files.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "").unwrap();
    }

    #[test]
    fn lists_config_files_recursively_sorted_skipping_hidden_and_others() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for f in [
            "b.yaml",
            "a/z.yml",
            "a/y.json",
            "c.txt",
            ".hidden.yaml",
            ".git/x.yaml",
            "d.yaml~",
            "e.yaml.swp",
        ] {
            touch(&root.join(f));
        }
        let listing = list_config_files(root).unwrap();
        let rel: Vec<_> = listing
            .files
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
            .collect();
        assert_eq!(rel, [PathBuf::from("a/y.json"), "a/z.yml".into(), "b.yaml".into()]);
        assert!(listing.errors.is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn follows_symlinks_without_looping_like_a_configmap_mount() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // A ConfigMap volume: ..data -> ..2024_01, se.yaml -> ..data/se.yaml
        touch(&root.join("..2024_01/se.yaml"));
        symlink("..2024_01", root.join("..data")).unwrap();
        symlink("..data/se.yaml", root.join("se.yaml")).unwrap();
        // A loop back to the root, and a dangling link.
        symlink(root, root.join("loop")).unwrap();
        symlink("missing.yaml", root.join("dangling.yaml")).unwrap();
        let listing = list_config_files(root).unwrap();
        assert_eq!(listing.files, [root.join("se.yaml")]);
    }

    #[test]
    fn missing_root_is_a_directory_error() {
        let tmp = tempfile::tempdir().unwrap();
        let err = list_config_files(&tmp.path().join("nope")).unwrap_err();
        assert!(matches!(err, SourceError::Directory { .. }), "{err:?}");
        assert!(err.to_string().contains("--configDir"), "{err}");
    }
}
