//! The memfd snapshot of the zygote's heap: once the preloads are in memory and the heap is
//! frozen, every private anonymous writable mapping is copied into a memfd and mapped back
//! `MAP_PRIVATE` at the same address. A private file mapping that nobody has written to has
//! no `anon_vma`, and fork does not copy page tables for such a mapping (the child faults
//! the pages in from the file when it reads them), so a fork of a big interpreter copies
//! only what the zygote has written since; a worker's exit unmaps only what it touched.
//! The price: each page a worker reads faults once (16 pages at a time, the kernel's fault
//! around), where an anonymous mapping had its page-table entries copied at fork. Light
//! jobs win, jobs that read much of the heap lose a little (see BENCHMARKS.md, lever 3).
//!
//! Invariants the caller keeps: the process is single-threaded (nothing else writes to
//! memory between a mapping's copy and its replacement), and after the snapshot the zygote
//! runs no Python of its own between forks (each page it writes becomes anonymous again and
//! gives its mapping an `anon_vma`, which fork then copies in full).
//!
//! One difference from anonymous memory, documented for whoever adds an allocator:
//! `MADV_DONTNEED` on such a mapping makes the next read return the snapshot's bytes, not
//! zeros (glibc's malloc, pymalloc and numpy do not rely on it: they `munmap` or trim).

use std::ffi::CStr;
use std::io;

/// The name every snapshot memfd carries (`/memfd:snakecage-snapshot (deleted)` in maps).
pub const MEMFD_NAME: &CStr = c"snakecage-snapshot";
const PAGE: usize = 4096;

/// What one snapshot did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Snapshotted {
    /// Mappings replaced by a memfd.
    pub mappings: usize,
    /// Bytes copied (resident pages only; the rest are holes that read as zeros).
    pub resident_bytes: usize,
}

/// Snapshots every private writable anonymous mapping of this process (and the brk heap).
///
/// # Safety
/// The process must be single-threaded: another thread writing to one of these mappings
/// between its copy and its replacement would lose that write.
pub unsafe fn snapshot_anonymous() -> io::Result<Snapshotted> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let ranges: Vec<(usize, usize)> = maps
        .lines()
        .filter_map(crate::hugepages::anonymous_writable)
        .collect();
    // SAFETY: the caller guarantees this process is single-threaded; the ranges are its
    // own private writable anonymous mappings, read just above.
    unsafe { snapshot_ranges(&ranges) }
}

/// Replaces each `(start, end)` mapping with a memfd copy mapped `MAP_PRIVATE` at the same
/// address, read-write.
///
/// # Safety
/// Each range must be exactly one private read-write mapping of this process that no
/// other thread writes to during the call.
pub unsafe fn snapshot_ranges(ranges: &[(usize, usize)]) -> io::Result<Snapshotted> {
    // Allocated up front: nothing below may touch the heap while it is being replaced.
    let largest = ranges.iter().map(|(s, e)| e - s).max().unwrap_or(0);
    let mut resident = vec![0u8; largest.div_ceil(PAGE)];
    let mut done = Snapshotted::default();
    for &(start, end) in ranges {
        // SAFETY: forwarded from the caller; `resident` has a byte per page of the range.
        done.resident_bytes += unsafe { snapshot_one(start, end - start, &mut resident)? };
        done.mappings += 1;
    }
    Ok(done)
}

/// One mapping. Between the copy and the `mmap` nothing but system calls runs, on the
/// stack and on `resident` (heap memory: if it lies in this very mapping, it is only read
/// after the copy of its page and its contents no longer matter once we are past it).
///
/// # Safety
/// See [`snapshot_ranges`].
unsafe fn snapshot_one(start: usize, len: usize, resident: &mut [u8]) -> io::Result<usize> {
    let pages = len / PAGE;
    // SAFETY: memfd_create takes a NUL-terminated name and flags.
    let fd = unsafe {
        libc::memfd_create(
            MEMFD_NAME.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let result = (|| {
        // SAFETY: fd is the memfd just created.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Which pages are resident: the rest were never touched (or are the zero page)
        // and stay holes in the memfd, which read as zeros as they did before.
        // SAFETY: start..start+len is a mapping of ours; `resident` has >= pages bytes.
        if unsafe { libc::mincore(start as *mut libc::c_void, len, resident.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut copied = 0;
        let mut page = 0;
        while page < pages {
            if resident[page] & 1 == 0 {
                page += 1;
                continue;
            }
            let run_start = page;
            while page < pages && resident[page] & 1 == 1 {
                page += 1;
            }
            let (mut off, run_end) = (run_start * PAGE, page * PAGE);
            while off < run_end {
                // SAFETY: reading our own mapped memory into the memfd at the same offset.
                let n = unsafe {
                    libc::pwrite(
                        fd,
                        (start + off) as *const libc::c_void,
                        run_end - off,
                        off as libc::off_t,
                    )
                };
                if n <= 0 {
                    return Err(io::Error::last_os_error());
                }
                off += n as usize;
                copied += n as usize;
            }
        }
        // SAFETY: MAP_FIXED over exactly the mapping just copied; its contents are now the
        // memfd's, byte for byte, and nothing has written to it since the copy.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Nothing may change the file under the mapping now: a shrink would turn the
        // zygote's heap into SIGBUS, a write would show through to every worker.
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on the memfd we own.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(copied)
    })();
    // SAFETY: closing the memfd we created; the mapping keeps the file alive.
    unsafe { libc::close(fd) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh private anonymous mapping of `pages` pages, every other page written,
    /// between two inaccessible guard pages so that the kernel cannot merge it with a
    /// neighbour (the tests run in parallel and map side by side).
    fn mapping(pages: usize) -> (usize, usize) {
        let len = pages * PAGE;
        // SAFETY: a fresh reservation, unmapped by `unmap`.
        let guard = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + 2 * PAGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(guard, libc::MAP_FAILED);
        // SAFETY: MAP_FIXED inside the reservation just made, which nothing else uses.
        let p = unsafe {
            libc::mmap(
                (guard as usize + PAGE) as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let start = p as usize;
        for page in (0..pages).step_by(2) {
            // SAFETY: inside the mapping just made.
            unsafe { *((start + page * PAGE + 7) as *mut u8) = (page % 251) as u8 + 1 };
        }
        (start, start + len)
    }

    /// Unmaps a mapping made by [`mapping`] and its guard pages.
    fn unmap(start: usize, end: usize) {
        // SAFETY: the test's own mapping and guards; nothing points into them any more.
        unsafe { libc::munmap((start - PAGE) as *mut libc::c_void, end - start + 2 * PAGE) };
    }

    fn maps_line(start: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let prefix = format!("{start:x}-");
        maps.lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no mapping at {start:x}"))
            .to_owned()
    }

    /// `Anonymous:` kB of the mapping at `start` in this process's smaps.
    fn anonymous_kb(start: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let prefix = format!("{start:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&prefix));
        lines.next().expect("mapping in smaps");
        lines
            .find_map(|l| l.strip_prefix("Anonymous:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .unwrap()
    }

    #[test]
    fn a_snapshotted_mapping_keeps_its_contents_and_address_and_stays_writable() {
        let pages = 64;
        let (start, end) = mapping(pages);
        assert!(!maps_line(start).contains("memfd"));
        // SAFETY: the mapping is ours and only this thread touches it.
        let done = unsafe { snapshot_ranges(&[(start, end)]) }.unwrap();
        assert_eq!(done.mappings, 1);
        assert_eq!(
            done.resident_bytes,
            pages / 2 * PAGE,
            "only written pages copied"
        );
        let line = maps_line(start);
        assert!(
            line.contains("rw-p") && line.contains("/memfd:snakecage-snapshot"),
            "{line}"
        );
        for page in 0..pages {
            // SAFETY: inside the mapping, which is still mapped read-write.
            let b = unsafe { *((start + page * PAGE + 7) as *const u8) };
            let want = if page % 2 == 0 {
                (page % 251) as u8 + 1
            } else {
                0
            };
            assert_eq!(b, want, "page {page}");
        }
        assert_eq!(anonymous_kb(start), 0, "nothing written since the snapshot");
        // SAFETY: inside the mapping.
        unsafe { *((start + 3 * PAGE) as *mut u8) = 9 };
        // SAFETY: as above.
        assert_eq!(unsafe { *((start + 3 * PAGE) as *const u8) }, 9);
        assert_eq!(anonymous_kb(start), 4, "a write copies one page, privately");
        unmap(start, end);
    }

    #[test]
    fn forks_leave_the_snapshot_shared_and_children_see_its_contents() {
        let pages = 32;
        let (start, end) = mapping(pages);
        // SAFETY: the mapping is ours and only this thread touches it.
        unsafe { snapshot_ranges(&[(start, end)]) }.unwrap();
        for _ in 0..20 {
            // SAFETY: the child only reads memory, writes one page of its own copy and
            // calls _exit; no allocation, no lock (the test harness may have threads).
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                // SAFETY: inside the inherited mapping.
                let ok = unsafe { *((start + 2 * PAGE + 7) as *const u8) } == 3;
                // SAFETY: the child's private copy of the page.
                unsafe { *((start + 4 * PAGE) as *mut u8) = 1 };
                // SAFETY: ends the child without unwinding or running destructors.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let mut status = 0;
            // SAFETY: waiting for the child just forked.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        }
        assert_eq!(
            anonymous_kb(start),
            0,
            "the children's writes stayed theirs; the parent's mapping is still the file"
        );
        unmap(start, end);
    }
}
