//! Transparent huge pages for the zygote's heap, and only for it: once the preloads are in
//! memory, `MADV_COLLAPSE` (Linux 6.1+) rebuilds every 2 MiB-aligned stretch of its private
//! anonymous memory as one huge page. A fork then copies one page-table entry per 2 MiB
//! instead of 512, and a worker's exit drops them as cheaply; a worker that writes into
//! such a page splits only its own mapping and copies one 4 KiB page, as before. Nothing
//! else changes: the system's THP setting stays as it is (`always` system-wide made every
//! worker's fresh allocations fault in 2 MiB pages and was much slower).

use std::io;

const HUGE: usize = 2 << 20;

/// What one collapse pass did.
pub struct Collapsed {
    pub huge_pages: usize,
    pub failed: usize,
}

/// Collapses the aligned parts of this process's private writable anonymous mappings.
/// Best effort: a stretch the kernel refuses (older kernel, locked or special mapping) is
/// counted and skipped.
pub fn collapse_anonymous() -> io::Result<Collapsed> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut done = Collapsed {
        huge_pages: 0,
        failed: 0,
    };
    for (start, end) in maps.lines().filter_map(anonymous_writable) {
        let (start, end) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if end <= start {
            continue;
        }
        // SAFETY: madvise on a range of our own mappings; MADV_COLLAPSE only changes how
        // the memory is mapped, never its contents.
        let rc =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_COLLAPSE) };
        if rc == 0 {
            done.huge_pages += (end - start) / HUGE;
        } else {
            done.failed += (end - start) / HUGE;
        }
    }
    Ok(done)
}

/// `start-end rw-p offset dev inode [path]`: private, writable, and either without a path
/// or the brk heap.
pub(crate) fn anonymous_writable(line: &str) -> Option<(usize, usize)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    let path = fields.nth(3).unwrap_or("");
    if !perms.starts_with("rw") || !perms.ends_with('p') || !(path.is_empty() || path == "[heap]") {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_private_writable_anonymous_mappings_are_candidates() {
        let heap = "5581a000-55a1a000 rw-p 00000000 00:00 0                          [heap]";
        let anon = "7f0000000000-7f0000400000 rw-p 00000000 00:00 0 ";
        let lib = "7f1000000000-7f1000200000 rw-p 00010000 fd:01 1234   /usr/lib/libc.so.6";
        let stack = "7ffd0000000-7ffd0021000 rw-p 00000000 00:00 0                   [stack]";
        let shared = "7f2000000000-7f2000400000 rw-s 00000000 00:01 99   /dev/zero (deleted)";
        let ro = "7f3000000000-7f3000400000 r--p 00000000 00:00 0 ";
        assert_eq!(anonymous_writable(heap), Some((0x5581a000, 0x55a1a000)));
        assert_eq!(
            anonymous_writable(anon),
            Some((0x7f0000000000, 0x7f0000400000))
        );
        for other in [lib, stack, shared, ro] {
            assert_eq!(anonymous_writable(other), None, "{other}");
        }
    }

    #[test]
    fn a_large_anonymous_mapping_is_collapsed_or_refused_without_harm() {
        let len = 8 * HUGE;
        // SAFETY: a fresh private anonymous mapping we own and unmap below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping is len bytes long and writable.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
        for (i, b) in bytes.iter_mut().enumerate().step_by(4096) {
            *b = (i / 4096) as u8;
        }
        let done = collapse_anonymous().unwrap();
        assert!(
            done.huge_pages + done.failed >= 7,
            "{} {}",
            done.huge_pages,
            done.failed
        );
        for (i, b) in bytes.iter().enumerate().step_by(4096) {
            assert_eq!(*b, (i / 4096) as u8, "contents changed at {i}");
        }
        // SAFETY: unmapping the mapping made above; `bytes` is not used afterwards.
        unsafe { libc::munmap(p, len) };
    }
}
