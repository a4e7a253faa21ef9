//! [`CacheAligned`]: the global allocator an application should install for full speed.
//!
//! Tensors are `Vec`s, which the system allocator places 16 bytes past a cache line (glibc's
//! chunk header), so every 64-byte vector load or store of a tensor row straddles two cache
//! lines and every AMX tile row read in place is split. The kernels' own scratch is aligned
//! ([`codegen::kernels::AlignedBuf`]), but activations belong to the caller's allocator.
//! Measured on the AMX Xeon of 2026-12-02 (`encore bench`, BERT-base INT8 static with int8
//! attention, sequence 128, 2 threads, alternating 5 s runs, sequences/s, system allocator →
//! this one): batch 8 61.8 / 59.2 → 67.0 / 67.3 (+10 %), batch 32 55.3 / 54.1 → 60.8 / 60.9
//! (+11 %), batch 1 49.3 / 48.9 → 51.9 / 48.7 (noise); FP32 batch 8 11.2 / 11.1 → 11.4 / 11.3.
//! The `encore` binary and the Python module install it; an application that embeds the
//! runtime installs it with two lines (below).

use std::alloc::{GlobalAlloc, Layout, System};

/// A [`GlobalAlloc`] over [`System`] that aligns every block of [`CacheAligned::MIN_SIZE`]
/// bytes or more to a 64-byte cache line; smaller blocks are left as they are.
///
/// ```
/// #[global_allocator]
/// static ALLOC: runtime::CacheAligned = runtime::CacheAligned;
///
/// let v = vec![0f32; 100_000];
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheAligned;

impl CacheAligned {
    /// Blocks this large or larger are cache-line aligned (a page: a tensor row of 1024 floats).
    pub const MIN_SIZE: usize = 4096;
    /// The alignment they get.
    pub const ALIGN: usize = 64;

    /// The layout a request is served with: the same size, at least [`Self::ALIGN`] for large
    /// blocks. Every call (alloc, dealloc, realloc) maps a caller's layout through this one
    /// function, so a block is always freed with the layout it was made with.
    fn served(layout: Layout) -> Layout {
        if layout.size() >= Self::MIN_SIZE && layout.align() < Self::ALIGN {
            // A larger power-of-two alignment of a size that was valid stays valid: the size
            // is at least 4096, so rounding it up to 64 cannot pass isize::MAX unless it was
            // within 64 bytes of it, which no real allocation is; then keep the caller's.
            Layout::from_size_align(layout.size(), Self::ALIGN).unwrap_or(layout)
        } else {
            layout
        }
    }
}

// SAFETY: every block comes from `System` with `served(layout)` and goes back to it with
// `served(layout)` of the same caller layout (the GlobalAlloc contract gives dealloc and realloc
// the layout the block was allocated with), so `System` always sees matching layouts; the
// served layout's size equals the caller's and its alignment is at least the caller's.
unsafe impl GlobalAlloc for CacheAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `served` keeps the size non-zero when the caller's is (contract).
        unsafe { System.alloc(Self::served(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(Self::served(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator with `layout`, so by `System` with
        // `served(layout)`.
        unsafe { System.dealloc(ptr, Self::served(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the realloc contract: `new_size`, rounded up to `layout.align()`, does not
        // overflow isize.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let (old_served, new_served) = (Self::served(layout), Self::served(new_layout));
        if old_served.align() == new_served.align() {
            // SAFETY: the block is `System`'s with `old_served`; `System` keeps its alignment
            // through realloc, which is what `new_served` asks.
            return unsafe { System.realloc(ptr, old_served, new_size) };
        }
        // Crossing MIN_SIZE changes the alignment: move the block.
        // SAFETY: a fresh block of `new_layout` (non-zero size: the contract).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks hold at least the copied bytes and are distinct; the old
            // block was made with `layout`.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large blocks come back cache-line aligned, small ones as asked, and realloc across the
    /// threshold in both directions keeps the bytes.
    #[test]
    fn large_blocks_are_cache_line_aligned_and_realloc_keeps_bytes() {
        let a = CacheAligned;
        let small = Layout::from_size_align(100, 4).unwrap();
        let large = Layout::from_size_align(10_000, 4).unwrap();
        // SAFETY: non-zero sizes; every block is freed once, with the layout it was made with.
        unsafe {
            let p = a.alloc(large);
            assert_eq!(p as usize % 64, 0);
            a.dealloc(p, large);

            let p = a.alloc_zeroed(large);
            assert_eq!(p as usize % 64, 0);
            assert!(std::slice::from_raw_parts(p, 10_000)
                .iter()
                .all(|&b| b == 0));
            a.dealloc(p, large);

            let p = a.alloc(small);
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let q = a.realloc(p, small, 8192);
            assert_eq!(q as usize % 64, 0, "grown past MIN_SIZE: aligned");
            assert!((0..100).all(|i| *q.add(i) == i as u8));
            let grown = Layout::from_size_align(8192, 4).unwrap();
            let r = a.realloc(q, grown, 50);
            assert!((0..50).all(|i| *r.add(i) == i as u8));
            a.dealloc(r, Layout::from_size_align(50, 4).unwrap());
        }
    }
}
