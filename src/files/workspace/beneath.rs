//! Paths inside a workspace, opened without ever following a link.
//!
//! The supervisor stages and collects files as root in a directory the job owns and may
//! change while it works: a session's threads run between its runs, and a one-shot job's
//! threads until its process is gone. A path opened by name (`workspace.join(path)`)
//! follows whatever a directory on the way has become meanwhile, e.g. a link to `/etc`,
//! so a file collected there would be the host's and a file staged there would be written
//! outside. Here every path is walked one component at a time from the workspace's own
//! descriptor, each directory opened with `O_NOFOLLOW | O_DIRECTORY`: a component that is
//! a link or not a directory fails (`ENOTDIR`; a link at the path itself, `ELOOP`) instead
//! of leading out, and
//! what is opened is pinned by its descriptor whatever is renamed afterwards.

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::NixPath;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

/// A workspace's directory, open; the paths given to its methods are relative to it,
/// normalised (no `.`, `..` or empty components), `/`-separated.
pub(super) struct Root(OwnedFd);

impl Root {
    /// Opens the workspace itself (a path the supervisor made: nothing of the job's on it).
    pub fn open(workspace: &Path) -> io::Result<Self> {
        let fd = nix::fcntl::open(
            workspace,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self(fd))
    }

    /// The directory at `rel` (`""`: the workspace), reached without following a link.
    pub fn dir(&self, rel: &str) -> io::Result<OwnedFd> {
        let mut fd = self.0.try_clone()?;
        for name in components(rel) {
            fd = open_dir_at(&fd, name)?;
        }
        Ok(fd)
    }

    /// The parent directory of `rel`, and `rel`'s last component.
    pub fn parent<'a>(&self, rel: &'a str) -> io::Result<(OwnedFd, &'a str)> {
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        Ok((self.dir(parent)?, name))
    }

    /// Opens the entry at `rel` with `flags` (`O_NOFOLLOW` and `O_CLOEXEC` added): its
    /// directories are reached without following a link, and a link at `rel` itself fails.
    pub fn open_file(&self, rel: &str, flags: OFlag) -> io::Result<File> {
        let (parent, name) = self.parent(rel)?;
        let fd = openat(
            &parent,
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// The entries of the directory at `rel`, as [`list`] gives them (no limit).
    #[cfg(test)]
    pub fn list(&self, rel: &str) -> io::Result<Vec<(OsString, io::Result<Metadata>)>> {
        list(&self.dir(rel)?, usize::MAX)
    }
}

/// The first `limit` entries of `dir` by name (`.` and `..` left out), each with its
/// metadata as `lstat` gives it (a link is a link) or why it could not be read. Names are
/// read up to [`NAMES_READ`] times `limit` (at least [`MIN_NAMES_READ`]) and sorted before
/// the first `limit` are taken, so which entries a budget keeps does not depend on the
/// order the file system lists them in (tmpfs: newest first) unless the directory holds
/// more names than that; only the kept ones are looked at (`lstat`).
pub(super) fn list(
    dir: &OwnedFd,
    limit: usize,
) -> io::Result<Vec<(OsString, io::Result<Metadata>)>> {
    let entries = nix::dir::Dir::from_fd(dir.try_clone()?)?;
    let most = limit.saturating_mul(NAMES_READ).max(MIN_NAMES_READ);
    let mut names = Vec::new();
    for entry in entries {
        if names.len() >= most {
            break;
        }
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        names.push(name.to_owned());
    }
    if names.len() > limit {
        names.sort_unstable();
        names.truncate(limit);
    }
    Ok(names
        .into_iter()
        .map(|name| {
            let meta = entry_metadata(dir, &name);
            (name, meta)
        })
        .collect())
}

/// How many names [`list`] reads for each entry it may keep, at most.
const NAMES_READ: usize = 8;
/// The names [`list`] reads at least, whatever it keeps (a name costs a few dozen bytes).
const MIN_NAMES_READ: usize = 65_536;

/// How deep a scan of a workspace looks (directories below its top); deeper ones are
/// reported, not read. It bounds the descriptors a scan holds open.
pub(super) const MAX_DEPTH: usize = 128;

/// The components of a normalised relative path (none for `""`).
fn components(rel: &str) -> impl Iterator<Item = &str> {
    rel.split('/').filter(|c| !c.is_empty())
}

/// The directory `name` in `dir`; a link there fails (`ENOTDIR`), as does a non-directory.
pub(super) fn open_dir_at(dir: &impl AsFd, name: &(impl NixPath + ?Sized)) -> io::Result<OwnedFd> {
    Ok(openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// `lstat` of `name` in `dir`, through an `O_PATH` descriptor of the entry itself (a link
/// is opened as the link; nothing is read, a FIFO does not block).
fn entry_metadata(dir: &OwnedFd, name: &OsStr) -> io::Result<Metadata> {
    let fd = openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    File::from(fd).metadata()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_on_the_way_are_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "host").unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("real")).unwrap();
        std::fs::write(ws.path().join("real/mine.txt"), "mine").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("secret.txt"),
            ws.path().join("real/file-link"),
        )
        .unwrap();
        let root = Root::open(ws.path()).unwrap();

        let read = |rel: &str| {
            let mut text = String::new();
            io::Read::read_to_string(&mut root.open_file(rel, OFlag::O_RDONLY)?, &mut text)?;
            Ok::<_, io::Error>(text)
        };
        assert_eq!(read("real/mine.txt").unwrap(), "mine");
        let errno = |r: io::Result<String>| r.unwrap_err().raw_os_error();
        // A link where a directory is needed is "not a directory" (`O_DIRECTORY` is checked
        // on the link itself); a link at the path is a loop.
        assert_eq!(errno(read("link/secret.txt")), Some(libc::ENOTDIR));
        assert_eq!(errno(read("real/file-link")), Some(libc::ELOOP));
        assert_eq!(errno(read("real/mine.txt/x")), Some(libc::ENOTDIR));
        assert_eq!(
            root.list("link").err().and_then(|e| e.raw_os_error()),
            Some(libc::ENOTDIR)
        );

        let mut listed: Vec<(String, bool, bool)> = root
            .list("")
            .unwrap()
            .into_iter()
            .map(|(name, meta)| {
                let meta = meta.unwrap();
                let kind = meta.file_type();
                (
                    name.into_string().unwrap(),
                    kind.is_dir(),
                    kind.is_symlink(),
                )
            })
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [("link".into(), false, true), ("real".into(), true, false)]
        );
    }
}
