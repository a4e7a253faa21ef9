//! Packed weights on transparent huge pages, without rounding each weight up to one.
//!
//! A GEMM at batch 1 streams its weights from memory once per run (BERT-base INT8: 85 MB, more
//! than the L3), and with 4 KB pages every 4 KB of weights costs a TLB miss on top. On 2 MB
//! pages BERT-base INT8 (Zen 4, 2 threads, `ENCORE_HUGE_PAGES=0` against the default, runs
//! alternating) ran batch 1 faster in 8 of 8 pairs (median latency 32.4 → 30.8 ms), sequence
//! 384 in 3 of 4, batch 8 in 4 of 4 (+4 % summed), for 2.2 MB more peak resident memory, with a
//! 1 MB threshold; with today's 64 KB, batch 1 in 7 of 8 pairs (30.6 → 29.8 ms).
//! Giving each weight buffer its own huge pages would round every one up to 2 MB (about 40 MB
//! more resident for BERT-base: tried and dropped before), so large buffers are
//! carved one after another out of shared chunks: 2 MB-aligned anonymous mappings marked
//! `MADV_HUGEPAGE`, a bump pointer each, unmapped when the last buffer in them is freed. Only the
//! touched pages are resident, so a chunk costs at most the unused part of its last huge page.
//!
//! Freed space inside a chunk is not reused until the whole chunk is free (weights are made
//! together when a session is compiled and freed together when it is dropped), but the whole
//! huge pages inside a freed buffer are handed back to the system at once (`MADV_DONTNEED`), so
//! a chunk that outlives most of its buffers (one session's weights carved after another's)
//! does not keep their memory resident.
//!
//! Linux only (elsewhere, and with `ENCORE_HUGE_PAGES=0`, [`alloc_zeroed`] returns `None` and
//! the caller uses the ordinary heap). With THP disabled system-wide (`never`) the advice is a
//! no-op and the pages are ordinary ones.

use std::sync::{Mutex, OnceLock};

/// Buffers at least this large come from the chunks; smaller ones (biases, norms) stay on the
/// heap. BERT-base's 768 × 768 weights (590 KB) are above it.
pub const MIN_BYTES: usize = 64 << 10;
/// One huge page.
const HUGE: usize = 2 << 20;
/// A chunk's usable size (larger buffers get a chunk of their own, rounded up to huge pages).
const CHUNK: usize = 32 << 20;

struct Chunk {
    /// The 2 MB-aligned start of the usable part.
    base: usize,
    /// Usable bytes from `base`.
    size: usize,
    /// Bytes handed out from `base`.
    used: usize,
    /// Buffers handed out and not yet freed.
    live: usize,
    /// What `mmap` returned, and its length: what `munmap` takes back.
    map: (usize, usize),
}

/// Chunks and what they handed out.
#[derive(Default)]
struct Slab {
    chunks: Vec<Chunk>,
}

impl Slab {
    /// `need` bytes (a multiple of 64) from a chunk with room, else from a new one.
    fn alloc(&mut self, need: usize) -> Option<usize> {
        if let Some(c) = self.chunks.iter_mut().find(|c| c.size - c.used >= need) {
            let p = c.base + c.used;
            c.used += need;
            c.live += 1;
            return Some(p);
        }
        let size = need.max(CHUNK).next_multiple_of(HUGE);
        let (map, base) = map_aligned(size)?;
        self.chunks.push(Chunk {
            base,
            size,
            used: need,
            live: 1,
            map,
        });
        Some(base)
    }

    /// Frees the buffer of `bytes` at `addr`; unmaps its chunk when it was the last one there,
    /// else releases the whole huge pages inside the buffer.
    fn free(&mut self, addr: usize, bytes: usize) {
        let Some(i) = self
            .chunks
            .iter()
            .position(|c| c.base <= addr && addr < c.base + c.used)
        else {
            debug_assert!(
                false,
                "freeing {addr:#x}, which no huge-page chunk handed out"
            );
            return;
        };
        self.chunks[i].live -= 1;
        if self.chunks[i].live == 0 {
            let c = self.chunks.swap_remove(i);
            unmap(c.map);
        } else {
            release(addr.next_multiple_of(HUGE)..(addr + bytes) / HUGE * HUGE);
        }
    }
}

fn slab() -> std::sync::MutexGuard<'static, Slab> {
    static SLAB: OnceLock<Mutex<Slab>> = OnceLock::new();
    SLAB.get_or_init(|| Mutex::new(Slab::default()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Whether large weight buffers go on huge pages: not when `ENCORE_HUGE_PAGES=0`.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        cfg!(target_os = "linux") && std::env::var("ENCORE_HUGE_PAGES").map_or(true, |v| v != "0")
    })
}

/// `bytes` zeroed bytes, 64-byte aligned, from a huge-page chunk; `None` when the buffer is
/// small (under [`MIN_BYTES`]), huge pages are off, or the system refuses the mapping. Free with
/// [`free`]. Fresh chunk space is never handed out twice, so it is still zero.
pub fn alloc_zeroed(bytes: usize) -> Option<*mut u8> {
    if bytes < MIN_BYTES || !enabled() {
        return None;
    }
    slab()
        .alloc(bytes.next_multiple_of(64))
        .map(|p| p as *mut u8)
}

/// Returns a buffer of `bytes` from [`alloc_zeroed`]; its chunk is unmapped when it holds no
/// other.
///
/// # Safety
/// `p` came from [`alloc_zeroed`] for `bytes`, is freed once, and is not used after.
pub unsafe fn free(p: *mut u8, bytes: usize) {
    slab().free(p as usize, bytes)
}

/// An anonymous mapping with `size` bytes from a 2 MB boundary, advised for huge pages:
/// `((mapping start, mapping length), aligned start)`.
#[cfg(target_os = "linux")]
fn map_aligned(size: usize) -> Option<((usize, usize), usize)> {
    let len = size + HUGE;
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
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
    if p == libc::MAP_FAILED {
        return None;
    }
    let base = (p as usize).next_multiple_of(HUGE);
    // SAFETY: [base, base + size) lies inside the mapping just made (len = size + 2 MB); the
    // advice only changes how its pages are backed, and failing is harmless (4 KB pages).
    unsafe { libc::madvise(base as *mut libc::c_void, size, libc::MADV_HUGEPAGE) };
    Some(((p as usize, len), base))
}

#[cfg(not(target_os = "linux"))]
fn map_aligned(_size: usize) -> Option<((usize, usize), usize)> {
    None
}

#[cfg(target_os = "linux")]
fn unmap((start, len): (usize, usize)) {
    // SAFETY: exactly a mapping `map_aligned` made, unmapped once (its chunk was just removed
    // from the list), and no buffer in it is live.
    unsafe { libc::munmap(start as *mut libc::c_void, len) };
}

#[cfg(not(target_os = "linux"))]
fn unmap(_: (usize, usize)) {}

/// Hands the pages of `range` (whole huge pages of a freed buffer, or empty) back to the
/// system; they would read as zero, but freed chunk space is never handed out again.
#[cfg(target_os = "linux")]
fn release(range: std::ops::Range<usize>) {
    if range.start < range.end {
        // SAFETY: the range lies inside a freed buffer of a live chunk mapping (private and
        // anonymous), which no one reads or writes any more; MADV_DONTNEED only drops its pages.
        unsafe {
            libc::madvise(
                range.start as *mut libc::c_void,
                range.end - range.start,
                libc::MADV_DONTNEED,
            )
        };
    }
}

#[cfg(not(target_os = "linux"))]
fn release(_: std::ops::Range<usize>) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers share a chunk, are zeroed, aligned and disjoint; the chunk goes away with its
    /// last buffer, and a buffer larger than a chunk gets one of its own in whole huge pages.
    #[test]
    fn buffers_share_chunks_and_chunks_go_with_their_last_buffer() {
        if !cfg!(target_os = "linux") {
            eprintln!("SKIP: huge-page chunks are Linux only");
            return;
        }
        let mut slab = Slab::default();
        let sizes = [HUGE + 128, (3 * HUGE + 5).next_multiple_of(64), MIN_BYTES];
        let bufs: Vec<usize> = sizes
            .iter()
            .map(|&n| slab.alloc(n).expect("an anonymous mapping"))
            .collect();
        assert_eq!(slab.chunks.len(), 1);
        assert_eq!(slab.chunks[0].base % HUGE, 0);
        for (&p, &n) in bufs.iter().zip(&sizes) {
            assert_eq!(p % 64, 0);
            // SAFETY: p holds n bytes of the slab's live chunk, handed out to this test only.
            let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
            assert!(s.iter().all(|&b| b == 0));
            s.fill(0xA5);
        }
        for (i, (&p, &n)) in bufs.iter().zip(&sizes).enumerate() {
            for (&q, &m) in bufs.iter().zip(&sizes).skip(i + 1) {
                assert!(p + n <= q || q + m <= p, "buffers overlap");
            }
        }
        let big = slab.alloc(CHUNK + 64).expect("an anonymous mapping");
        assert_eq!(slab.chunks.len(), 2);
        assert_eq!(slab.chunks[1].size, CHUNK + HUGE);
        slab.free(bufs[0], sizes[0]);
        slab.free(bufs[2], sizes[2]);
        assert_eq!(slab.chunks.len(), 2, "a chunk with a live buffer stays");
        // The first buffer's whole huge page went back to the system (it reads as zero now;
        // the chunk's mapping is still there), its tail did not.
        // SAFETY: inside the live chunk's mapping; nothing else uses that freed space.
        let freed = unsafe { std::slice::from_raw_parts(bufs[0] as *const u8, sizes[0]) };
        assert!(freed[..HUGE].iter().all(|&b| b == 0));
        assert!(freed[HUGE..].iter().all(|&b| b == 0xA5));
        // SAFETY: bufs[1] is still live and holds sizes[1] bytes: the release of its freed
        // neighbours' pages must not have touched it.
        let s = unsafe { std::slice::from_raw_parts(bufs[1] as *const u8, sizes[1]) };
        assert!(s.iter().all(|&b| b == 0xA5));
        slab.free(bufs[1], sizes[1]);
        assert_eq!(slab.chunks.len(), 1);
        slab.free(big, CHUNK + 64);
        assert!(slab.chunks.is_empty());
    }

    /// Small buffers are left to the heap; large ones come back through `free`.
    #[test]
    fn small_buffers_stay_on_the_heap() {
        assert!(alloc_zeroed(MIN_BYTES - 1).is_none());
        if let Some(p) = alloc_zeroed(MIN_BYTES) {
            // SAFETY: from alloc_zeroed for MIN_BYTES, freed once.
            unsafe { free(p, MIN_BYTES) };
        }
    }
}
