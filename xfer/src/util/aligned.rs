//! Page-aligned byte buffers, so a received chunk can go to disk with
//! `O_DIRECT`: straight from this buffer to the device, with no copy into the
//! page cache (the largest CPU cost of a receiving node on a fast link).

use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment that `O_DIRECT` requires of buffers, offsets and lengths.
pub const ALIGN: usize = 4096;

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
        let layout = Layout::from_size_align(size, ALIGN).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
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
        // SAFETY: allocated in `with_capacity` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
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
    #[should_panic(expected = "overflow")]
    fn overfilling_panics() {
        let mut b = AlignedBuf::with_capacity(3);
        b.extend_from_slice(&[1, 2, 3, 4]);
    }
}
