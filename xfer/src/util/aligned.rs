//! Page-aligned byte buffers, so a received chunk can go to disk with
//! `O_DIRECT`: straight from this buffer to the device, with no copy into the
//! page cache (the largest CPU cost of a receiving node on a fast link).

//!
//! Freed buffers go back to a small pool and are handed out again. A chunk
//! is megabytes, which the allocator maps fresh and unmaps on free: every
//! chunk then cost a page fault, a zeroed page and a TLB flush per 4 KiB,
//! about a quarter of a receiving node's CPU. Reused, its pages stay mapped.

use std::alloc::{alloc, dealloc, Layout};
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Most bytes the pool keeps for reuse: a window of 16 requests of 4 MiB
/// chunks in flight on four transfers, or of 16 MiB chunks on one. Beyond
/// it, freed buffers go back to the allocator.
const POOL_BYTES: usize = 256 << 20;
/// Smaller buffers (small files) go straight back to the allocator, which
/// serves them from its heap without faults anyway.
const POOL_MIN: usize = 256 << 10;

/// Freed allocations by size, kept for the next buffer of the same size;
/// the oldest make room for newer ones (a file's last chunk has a size of
/// its own, which must not crowd out the common size).
struct Pool {
    free: VecDeque<(usize, NonNull<u8>)>,
    bytes: usize,
}

// SAFETY: the pool owns the allocations it holds; nothing else points to them.
unsafe impl Send for Pool {}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    free: VecDeque::new(),
    bytes: 0,
});

/// Alignment that `O_DIRECT` requires of buffers, offsets and lengths.
pub const ALIGN: usize = 4096;
/// A transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// A page-aligned buffer of fixed capacity, filled front to back. Only the
/// filled part is ever readable, so no byte is exposed uninitialised and no
/// time is spent zeroing.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    filled: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]` of initialised bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// An empty buffer that can take `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> AlignedBuf {
        let size = capacity.div_ceil(ALIGN).max(1) * ALIGN;
        // A chunk-sized buffer sits on huge pages where it can: the copy
        // into it, the hash over it and the `O_DIRECT` write pinning it
        // then walk 2 MiB pages, not 4 KiB ones.
        let layout = layout_of(size);
        let align = layout.align();
        let reused = {
            let mut pool = POOL.lock().unwrap();
            let found = pool.free.iter().rposition(|&(s, _)| s == size);
            found.and_then(|i| {
                pool.bytes -= size;
                pool.free.remove(i).map(|(_, p)| p)
            })
        };
        let ptr = match reused {
            Some(p) => p,
            None => {
                // SAFETY: the layout has a non-zero size.
                let raw = unsafe { alloc(layout) };
                let Some(ptr) = NonNull::new(raw) else {
                    std::alloc::handle_alloc_error(layout)
                };
                if align == HUGE_PAGE {
                    // SAFETY: advice on memory we just allocated; it
                    // changes no contents. Failure (no THP) is harmless.
                    unsafe {
                        libc::madvise(ptr.as_ptr().cast(), size, libc::MADV_HUGEPAGE);
                    }
                }
                ptr
            }
        };
        AlignedBuf {
            ptr,
            capacity,
            filled: 0,
            layout,
        }
    }

    /// Appends bytes. Panics if they do not fit.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        assert!(
            bytes.len() <= self.capacity - self.filled,
            "AlignedBuf overflow"
        );
        // SAFETY: the destination range lies inside our allocation, and the
        // source is a distinct borrowed slice.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(self.filled),
                bytes.len(),
            );
        }
        self.filled += bytes.len();
    }

    /// Bytes filled so far.
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Whether nothing is filled yet.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Room left.
    pub fn remaining(&self) -> usize {
        self.capacity - self.filled
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were written by extend_from_slice.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.filled) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let size = self.layout.size();
        let mut evicted = Vec::new();
        if (POOL_MIN..=POOL_BYTES).contains(&size) {
            let mut pool = POOL.lock().unwrap();
            while pool.bytes + size > POOL_BYTES {
                let Some(old) = pool.free.pop_front() else {
                    break;
                };
                pool.bytes -= old.0;
                evicted.push(old);
            }
            pool.bytes += size;
            pool.free.push_back((size, self.ptr));
        } else {
            evicted.push((size, self.ptr));
        }
        for (size, ptr) in evicted {
            // SAFETY: allocated in `with_capacity` with the layout of this
            // size (its alignment follows from its size).
            unsafe { dealloc(ptr.as_ptr(), layout_of(size)) }
        }
    }
}

/// The layout of a buffer of `size` bytes (a multiple of [`ALIGN`]).
fn layout_of(size: usize) -> Layout {
    let align = if size >= HUGE_PAGE { HUGE_PAGE } else { ALIGN };
    Layout::from_size_align(size, align).expect("valid layout")
}

/// Whether `data` written at `offset` meets `O_DIRECT`'s alignment rules.
pub fn direct_ok(data: &[u8], offset: u64) -> bool {
    data.as_ptr() as usize % ALIGN == 0
        && data.len() % ALIGN == 0
        && offset % ALIGN as u64 == 0
        && !data.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_fill_in_order() {
        for len in [1, 4095, 4096, 4097, 4 << 20] {
            let mut b = AlignedBuf::with_capacity(len);
            assert!(b.is_empty());
            b.extend_from_slice(&vec![3u8; len - 1]);
            b.extend_from_slice(&[7]);
            assert_eq!(b.remaining(), 0);
            assert_eq!(b.as_ref().len(), len);
            assert_eq!(b.as_ref().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.as_ref()[len - 1], 7);
        }
        let mut b = AlignedBuf::with_capacity(8192);
        b.extend_from_slice(&[0; 8192]);
        assert!(direct_ok(b.as_ref(), 4096));
        assert!(!direct_ok(b.as_ref(), 100));
        assert!(!direct_ok(&b.as_ref()[..100], 0));
    }

    #[test]
    fn a_freed_buffer_is_reused_empty() {
        // A size no other test asks for, so the pooled buffer is this one.
        let len = POOL_MIN + 7 * ALIGN + 123;
        let mut b = AlignedBuf::with_capacity(len);
        b.extend_from_slice(&[9; 100]);
        let first = b.as_ref().as_ptr();
        drop(b);
        let again = AlignedBuf::with_capacity(len - 5);
        assert_eq!(again.as_ref().as_ptr(), first);
        assert!(again.is_empty());
        assert_eq!(again.remaining(), len - 5);
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn overfilling_panics() {
        let mut b = AlignedBuf::with_capacity(3);
        b.extend_from_slice(&[1, 2, 3, 4]);
    }
}
