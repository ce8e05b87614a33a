//! Removing a directory tree a job made, however deep: a job can nest directories tens of
//! thousands deep (each `mkdir` relative to the last), and a recursive removal such as
//! `std::fs::remove_dir_all` then overflows a 2 MiB thread stack, aborting the whole
//! service. This one keeps its own stack of open directories, at most [`MAX_OPEN`] deep: a
//! directory deeper than that is moved up beside the top (a rename within the tree) and
//! taken up from there, so neither the call stack nor the open descriptors grow with the
//! depth. Nothing is ever followed: directories are opened `O_NOFOLLOW`, and links are
//! removed as links.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Directories held open at once while removing a tree.
const MAX_OPEN: usize = 32;

/// One directory being emptied: its descriptor, its name in its parent (none for the top)
/// and the subdirectories still to remove.
struct Frame {
    fd: OwnedFd,
    name: Option<OsString>,
    subdirs: Vec<OsString>,
}

/// Removes `path` and everything beneath it; a file or link at `path` is removed as such.
/// `NotFound` when there is nothing at `path`.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let top = match nix::fcntl::open(path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOTDIR | Errno::ELOOP) => return std::fs::remove_file(path),
        Err(e) => return Err(e.into()),
    };
    let subdirs = remove_all_but_directories(&top)?;
    let mut stack = vec![Frame {
        fd: top,
        name: None,
        subdirs,
    }];
    loop {
        let depth = stack.len();
        let Some(frame) = stack.last_mut() else { break };
        let Some(name) = frame.subdirs.pop() else {
            let done = stack.pop().expect("a frame");
            if let (Some(name), Some(parent)) = (done.name, stack.last()) {
                drop(done.fd);
                ignore_gone(unlinkat(
                    &parent.fd,
                    name.as_os_str(),
                    UnlinkatFlags::RemoveDir,
                ))?;
            }
            continue;
        };
        if depth < MAX_OPEN {
            let fd = match openat(&frame.fd, name.as_os_str(), flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let subdirs = remove_all_but_directories(&fd)?;
            stack.push(Frame {
                fd,
                name: Some(name),
                subdirs,
            });
        } else {
            // Too deep to hold open: moved up beside the top's own subdirectories.
            let moved = OsString::from(format!(
                ".snakecage-removing-{}",
                uuid::Uuid::new_v4().simple()
            ));
            let (top, rest) = stack.split_at_mut(1);
            let parent = &rest.last().expect("deeper than the top").fd;
            renameat(parent, name.as_os_str(), &top[0].fd, moved.as_os_str())?;
            top[0].subdirs.push(moved);
        }
    }
    std::fs::remove_dir(path)
}

/// Unlinks every entry of `dir` that is not a directory; returns the directories' names.
fn remove_all_but_directories(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for entry in nix::dir::Dir::from_fd(dir.try_clone()?)? {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            let is_dir = match entry.file_type() {
                Some(kind) => kind == nix::dir::Type::Directory,
                None => fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) == SFlag::S_IFDIR),
            };
            names.push((name.to_owned(), is_dir));
        }
    }
    let mut subdirs = Vec::new();
    for (name, is_dir) in names {
        if is_dir {
            subdirs.push(name);
        } else {
            ignore_gone(unlinkat(dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir))?;
        }
    }
    Ok(subdirs)
}

fn ignore_gone(result: nix::Result<()>) -> io::Result<()> {
    match result {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20,000 directories deep, with a file and a link out at every level, removed on a
    /// thread whose stack is 128 KiB: nothing recursive, nothing outside touched.
    #[test]
    fn a_tree_deeper_than_any_stack_is_removed_without_following_a_link() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep.txt"), "host").unwrap();
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        let mut cur = nix::fcntl::open(&root, OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        for i in 0..20_000 {
            nix::sys::stat::mkdirat(&cur, "d", Mode::from_bits_truncate(0o755)).unwrap();
            if i % 1000 == 0 {
                let f = openat(
                    &cur,
                    "f.txt",
                    OFlag::O_CREAT | OFlag::O_WRONLY,
                    Mode::from_bits_truncate(0o644),
                )
                .unwrap();
                drop(f);
                nix::unistd::symlinkat(outside.path(), &cur, "out").unwrap();
            }
            cur = openat(&cur, "d", OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        }
        drop(cur);
        let target = root.clone();
        std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn(move || remove_tree(&target))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert!(!root.exists());
        assert_eq!(
            std::fs::read_to_string(outside.path().join("keep.txt")).unwrap(),
            "host"
        );
        // A link or a file at the path is removed as itself; nothing there is NotFound.
        std::os::unix::fs::symlink(outside.path(), &root).unwrap();
        remove_tree(&root).unwrap();
        assert!(outside.path().join("keep.txt").exists());
        assert_eq!(
            remove_tree(&root).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
