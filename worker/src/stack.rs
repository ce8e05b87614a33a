//! Work whose stack grows with its input, run where the stack can hold it: on the calling
//! thread when it has room, else on a helper thread with a stack of the size needed.
//!
//! A tool call is checked on the thread of user code that makes it, and user code chooses
//! that thread's stack (`threading.stack_size(32768)` is allowed): parsing and validating
//! arguments nested 16 levels deep overflowed 32 KiB in a debug build (SIGSEGV, the worker
//! and its session lost). The depth is bounded first (`MAX_TOOL_JSON_DEPTH`), so what the
//! work needs is bounded too.

use std::io;

/// Bytes of stack left below the current frame of this thread; `None`: unknown.
pub fn remaining() -> Option<usize> {
    thread_local! {
        /// This thread's lowest stack address, looked up once (for the main thread glibc
        /// reads `/proc/self/maps`, too slow for every call): 0 until then, 1 if unknown.
        static LOWEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    let lowest = LOWEST.with(|lowest| {
        if lowest.get() == 0 {
            lowest.set(lowest_address().unwrap_or(1));
        }
        lowest.get()
    });
    let here = std::hint::black_box(0u8);
    match lowest {
        1 => None,
        lowest => (&raw const here as usize).checked_sub(lowest),
    }
}

/// The lowest address of this thread's stack.
fn lowest_address() -> Option<usize> {
    // SAFETY: a zeroed attr is what pthread_getattr_np initialises; it is destroyed after
    // use. The stack's lowest address and size are plain values written into our locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut low: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let got = libc::pthread_attr_getstack(&attr, &mut low, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (got == 0 && !low.is_null()).then_some(low as usize)
    }
}

/// Runs `work` on this thread when at least `needed` bytes of its stack are left (or it
/// cannot tell), else on a helper thread with a stack of `needed` and waits for it. `Err`:
/// no helper thread could be started (the job's memory or thread limit).
pub fn with_room<T: Send>(needed: usize, work: impl FnOnce() -> T + Send) -> io::Result<T> {
    if remaining().is_none_or(|left| left >= needed) {
        return Ok(work());
    }
    std::thread::scope(|scope| {
        let helper = std::thread::Builder::new()
            .name("snakecage-stack".into())
            .stack_size(needed)
            .spawn_scoped(scope, work)?;
        Ok(helper
            .join()
            .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recurses `levels` deep with a kilobyte of stack per level.
    fn deep(levels: usize) -> usize {
        let frame = std::hint::black_box([1u8; 1024]);
        if levels == 0 {
            return frame[0] as usize;
        }
        frame[levels % 1024] as usize + deep(levels - 1)
    }

    /// On a 64 KiB thread, work of some 300 KiB of stack runs (on a helper with 2 MiB), and a
    /// little runs here.
    #[test]
    fn work_too_deep_for_this_thread_runs_on_a_helper_with_room() {
        let small = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(|| {
                let left = remaining().unwrap();
                assert!(left < 64 * 1024, "{left}");
                let here = std::thread::current().id();
                let (levels, ran_on) =
                    with_room(2 << 20, || (deep(300), std::thread::current().id())).unwrap();
                assert_eq!(levels, 301);
                assert_ne!(ran_on, here);
                let ran_on = with_room(1024, || std::thread::current().id()).unwrap();
                assert_eq!(ran_on, here);
            })
            .unwrap();
        small.join().unwrap();
        assert!(remaining().unwrap() > 64 * 1024);
    }
}
