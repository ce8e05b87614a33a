//! The worker's global allocator: the system's, with an emergency reserve, so that a job
//! that has used up its memory limit gets `MemoryError` from a tool call rather than a
//! worker killed by SIGABRT.
//!
//! Rust aborts the process when an allocation fails, and stable Rust cannot make it unwind
//! instead. CPython's own allocations fail softly (`MemoryError`), but a tool call runs
//! Rust too: a thread of `tools.acall`'s pool starting, the call's frame, its registration
//! with the job socket, its answer read and turned into JSON. In a job whose memory is
//! used up but for a few pages, one of those failed and the worker aborted ("memory
//! allocation of 632 bytes failed"), its session lost.
//!
//! So each worker maps a reserve ([`RESERVE_BYTES`]) before its memory limit applies (the
//! job's budget does not pay for it; untouched, it costs no memory either). The first Rust
//! allocation that fails gives it back and tries again, which then finds room. The tool path,
//! where a failure can be reported, first makes sure the reserve is back ([`ensure`]): when
//! it cannot be taken again, the job's memory is truly used up, and the call raises
//! `MemoryError` before it starts anything. The job's result, whose rich outputs may come to
//! megabytes, is read and framed in buffers asked for through [`large`]: without room for
//! them the outputs are dropped with a note, not the worker. A thread of the pool is started only when
//! there is room for it ([`room_for`]): its start maps memory outside the allocator (the
//! stack, Rust's signal stack, CPython's thread state), which no reserve could stand in
//! for. What is left: a second Rust allocation failure before the next call restores the
//! reserve, or CPython failing to create a thread state, still aborts.
//!
//! The normal path pays one atomic load per call, and a null test per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::TryReserveError;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// The reserve: the Rust allocations of up to 64 calls in flight (a few KiB each) many
/// times over, and room for glibc to open an arena for a thread (132 KiB).
pub const RESERVE_BYTES: usize = 2 << 20;

/// The reserve while it is held; null once spent (or never taken).
static BLOCK: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());
/// Whether this process keeps a reserve (a worker, after [`arm`]); the zygote does not.
static ARMED: AtomicBool = AtomicBool::new(false);

/// The system allocator, which spends the reserve to retry an allocation that failed.
pub struct WithReserve;

// SAFETY: every call is passed to `System` with the caller's own arguments; a null result
// is retried once after the reserve (a block of `System`'s this allocator alone owns) is
// freed, and returned as it comes.
unsafe impl GlobalAlloc for WithReserve {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        retried(|| unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        retried(|| unsafe { System.alloc_zeroed(layout) })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on; a failed realloc leaves
        // the block as it was, so it may be tried again.
        retried(|| unsafe { System.realloc(ptr, layout, new_size) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// `allocate()`, and once more after spending the reserve if it failed.
#[inline]
fn retried(mut allocate: impl FnMut() -> *mut u8) -> *mut u8 {
    let p = allocate();
    if !p.is_null() {
        return p;
    }
    spend();
    allocate()
}

/// A reserve taken again after it was spent: a block of the system allocator's, which
/// comes from memory the job has freed (but the allocator kept) as readily as from new.
const RESERVE: Layout = match Layout::from_size_align(RESERVE_BYTES, 16) {
    Ok(layout) => layout,
    Err(_) => panic!("the reserve's layout"),
};

/// The first reserve, a mapping of its own made before the memory limit: unmapped, it
/// gives the limit back exactly what the retried allocation needs room in.
static FIRST: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

/// Gives the reserve back, if it is there (another thread may have spent it already; its
/// room is there for this one too).
#[cold]
fn spend() {
    let reserve = BLOCK.swap(ptr::null_mut(), Ordering::AcqRel);
    if reserve.is_null() {
        return;
    }
    if FIRST
        .compare_exchange(
            reserve,
            ptr::null_mut(),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
    {
        // SAFETY: the mapping `arm` made, taken out of BLOCK by the swap above: nothing
        // else refers to it.
        unsafe { libc::munmap(reserve.cast(), RESERVE_BYTES) };
    } else {
        // SAFETY: a block `restore` allocated with this layout, taken out of BLOCK by the
        // swap above.
        unsafe { System.dealloc(reserve, RESERVE) };
    }
}

/// Maps the first reserve of this worker: before its memory limit is set. Without one
/// (the kernel refused) the worker runs as before, and [`ensure`] asks for nothing. Once.
pub fn arm() -> std::io::Result<()> {
    let reserve = map(RESERVE_BYTES).ok_or_else(std::io::Error::last_os_error)?;
    FIRST.store(reserve, Ordering::Release);
    BLOCK.store(reserve, Ordering::Release);
    ARMED.store(true, Ordering::Release);
    Ok(())
}

/// The job's memory is used up: the reserve could not be taken again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the run's memory is used up (its memory limit): free some before calling a tool")]
pub struct Exhausted;

/// Makes sure the reserve is there before a tool call starts anything: one atomic load
/// while it is; when it was spent, it is taken again, or the call gets [`Exhausted`].
#[inline]
pub fn ensure() -> Result<(), Exhausted> {
    if !ARMED.load(Ordering::Acquire) || !BLOCK.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    restore()
}

#[cold]
fn restore() -> Result<(), Exhausted> {
    // Straight from the system allocator: a failure here must not spend anything.
    // SAFETY: a layout of non-zero size.
    let reserve = unsafe { System.alloc(RESERVE) };
    if reserve.is_null() {
        return Err(Exhausted);
    }
    if BLOCK
        .compare_exchange(
            ptr::null_mut(),
            reserve,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Another thread restored it meanwhile.
        // SAFETY: the block taken just above, never published.
        unsafe { System.dealloc(reserve, RESERVE) };
    }
    Ok(())
}

/// A large buffer for a path that can report its failure (a job's rich outputs, read to
/// be sent): asked for fallibly (`allocate` uses `try_reserve`) with the reserve in place,
/// and given up if getting it spent the reserve for good, so that the small allocations
/// after it, which abort when they fail, still have the reserve to fall back on.
pub fn large<T>(allocate: impl FnOnce() -> Result<T, TryReserveError>) -> Result<T, Exhausted> {
    ensure()?;
    let buffer = allocate().map_err(|_| Exhausted)?;
    ensure()?;
    Ok(buffer)
}

/// Whether `bytes` more could be mapped now: mapped and unmapped at once, with the reserve
/// there. For what is about to map memory outside the allocator (a thread's start).
pub fn room_for(bytes: usize) -> Result<(), Exhausted> {
    ensure()?;
    let probe = map(bytes).ok_or(Exhausted)?;
    // SAFETY: the mapping made just above, never published.
    unsafe { libc::munmap(probe.cast(), bytes) };
    Ok(())
}

/// A private, writable, untouched mapping of `bytes` (what RLIMIT_DATA counts).
fn map(bytes: usize) -> Option<*mut u8> {
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing; nothing
    // else is affected.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spent (as the first failed allocation spends it), the reserve is taken again by
    /// the next `ensure`; a probe for room maps nothing that stays.
    #[test]
    fn a_spent_reserve_is_taken_again_before_the_next_call() {
        arm().unwrap();
        assert_eq!(FIRST.load(Ordering::Acquire), BLOCK.load(Ordering::Acquire));
        assert!(!BLOCK.load(Ordering::Acquire).is_null());
        spend();
        assert!(BLOCK.load(Ordering::Acquire).is_null());
        // An allocation while it is spent goes through as ever.
        let v: Vec<u8> = Vec::with_capacity(1 << 16);
        assert_eq!(v.capacity(), 1 << 16);
        assert!(FIRST.load(Ordering::Acquire).is_null());
        assert_eq!(ensure(), Ok(()));
        assert!(!BLOCK.load(Ordering::Acquire).is_null());
        // The block taken again is the allocator's, given back to it when spent.
        spend();
        assert_eq!(ensure(), Ok(()));
        assert_eq!(room_for(1 << 20), Ok(()));
        assert_eq!(room_for(usize::MAX / 2), Err(Exhausted));
    }
}
