//! A 64-byte aligned, zero-initialised buffer for packed panels and scratch tiles.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every packed buffer: one cache line, one zmm register.
pub const ALIGN: usize = 64;

/// Marker for plain numeric element types that are valid when all bits are zero.
///
/// # Safety
/// Implementors must be `Copy`, have no drop glue, and accept the all-zero bit pattern.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}
// SAFETY: all of these are plain integers or floats; zero bits are a valid value.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for i8 {}

/// An owned, 64-byte aligned slice of `T`, zero-initialised on creation.
///
/// ```
/// use codegen::kernels::AlignedBuf;
/// let b: AlignedBuf<f32> = AlignedBuf::zeroed(10);
/// assert_eq!(b.len(), 10);
/// assert_eq!(b.as_ptr() as usize % 64, 0);
/// ```
pub struct AlignedBuf<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    /// Carved from a huge-page chunk ([`super::hugepages`]) rather than the heap.
    huge: bool,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<T>; T is Send + Sync.
unsafe impl<T: Pod> Send for AlignedBuf<T> {}
// SAFETY: shared access only hands out &[T]; T is Sync.
unsafe impl<T: Pod> Sync for AlignedBuf<T> {}

impl<T: Pod> AlignedBuf<T> {
    fn layout(len: usize) -> Layout {
        let bytes = (len * std::mem::size_of::<T>()).max(ALIGN);
        Layout::from_size_align(bytes.next_multiple_of(ALIGN), ALIGN).expect("buffer too large")
    }

    /// Allocates `len` zeroed elements.
    pub fn zeroed(len: usize) -> Self {
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size (at least ALIGN bytes).
        let raw = unsafe { alloc_zeroed(layout) } as *mut T;
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self {
            ptr,
            len,
            huge: false,
        }
    }

    /// Allocates `len` zeroed elements for packed weights: on transparent huge pages when they
    /// take at least [`super::hugepages::MIN_BYTES`] (shared chunks, see
    /// [`super::hugepages`]), else on the heap as [`AlignedBuf::zeroed`].
    ///
    /// ```
    /// use codegen::kernels::AlignedBuf;
    /// let w: AlignedBuf<i8> = AlignedBuf::for_weights(3 << 20);
    /// assert!(w.iter().all(|&b| b == 0));
    /// assert_eq!(w.as_ptr() as usize % 64, 0);
    /// ```
    pub fn for_weights(len: usize) -> Self {
        let bytes = len * std::mem::size_of::<T>();
        match super::hugepages::alloc_zeroed(bytes) {
            Some(p) => Self {
                // SAFETY: alloc_zeroed returns a non-null, 64-byte aligned pointer to `bytes`
                // zeroed bytes (zero is a valid T: Pod), ours until freed in Drop.
                ptr: unsafe { NonNull::new_unchecked(p as *mut T) },
                len,
                huge: true,
            },
            None => Self::zeroed(len),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer to the first element (64-byte aligned).
    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }

    /// Mutable raw pointer to the first element (64-byte aligned).
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Grows (never shrinks) to at least `len` elements; contents are not preserved.
    pub fn ensure(&mut self, len: usize) {
        if self.len < len {
            *self = Self::zeroed(len);
        }
    }
}

impl<T: Pod> std::ops::Deref for AlignedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr points to `len` initialised (zeroed or written) elements owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> std::ops::DerefMut for AlignedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> Clone for AlignedBuf<T> {
    fn clone(&self) -> Self {
        let mut b = Self::zeroed(self.len);
        b.copy_from_slice(self);
        b
    }
}

impl<T: Pod> Drop for AlignedBuf<T> {
    fn drop(&mut self) {
        if self.huge {
            // SAFETY: ptr came from hugepages::alloc_zeroed for len elements in `for_weights`;
            // dropped once.
            unsafe {
                super::hugepages::free(
                    self.ptr.as_ptr() as *mut u8,
                    self.len * std::mem::size_of::<T>(),
                )
            };
            return;
        }
        // SAFETY: ptr was allocated in `zeroed` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr() as *mut u8, Self::layout(self.len)) }
    }
}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for AlignedBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

/// A raw pointer that workers of one parallel loop share: each writes a disjoint part of the
/// buffer it points into (parts that cannot be split into contiguous slices, such as attention
/// heads interleaved in a row, or GEMM units), or all only read it.
///
/// Making one is safe; every dereference is `unsafe` and its `SAFETY` comment says why the
/// parts are disjoint or read-only.
///
/// ```
/// use codegen::kernels::SharedPtr;
/// let mut v = vec![0u32; 4];
/// let p = SharedPtr(v.as_mut_ptr());
/// std::thread::scope(|s| {
///     for t in 0..4 {
///         // SAFETY: thread t writes element t only; `v` outlives the scope.
///         s.spawn(move || unsafe { *p.get().add(t) = t as u32 });
///     }
/// });
/// assert_eq!(v, [0, 1, 2, 3]);
/// ```
pub struct SharedPtr<T>(pub *mut T);

// Manual impls: derived ones would require `T: Copy`.
impl<T> Clone for SharedPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedPtr<T> {}
// SAFETY: the pointer itself is plain data; what is done through it is checked at each
// dereference (disjoint writes or shared reads, as the type's contract says).
unsafe impl<T> Send for SharedPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SharedPtr<T> {}

impl<T> SharedPtr<T> {
    /// The pointer (a method, so that closures capture the whole `Sync` wrapper, not the field).
    pub fn get(self) -> *mut T {
        self.0
    }
}
