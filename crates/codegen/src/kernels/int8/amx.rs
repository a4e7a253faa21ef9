//! AMX int8 kernel: `tdpbusd` on 16×64-byte tiles, a 32×32 block per call (4 C tiles, 2 A tiles,
//! 2 B tiles), written against [`TileUnit`] so the same code runs on hardware ([`HwTiles`],
//! `core::arch::asm!`) and on the software [`TileModel`](super::tile_model::TileModel).
//!
//! Layouts: the B panel is the common K-quad interleave with 32 columns (`[K/4][32][4]`), so a B
//! tile is 16 quads × 64 bytes at row stride 128 (columns 0–15 at offset 0, 16–31 at offset 64).
//! The A panel is 32 rows × `kc` bytes row-major (`kc` a multiple of 64, zero padded), so an A
//! tile is 16 rows × 64 bytes at row stride `kc`. C tiles are stored to the i32 block at
//! `ldc·4` bytes per row.
//!
//! Before any tile instruction Linux needs `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`
//! ([`request_amx_permission`], memoised). Each kernel call configures the tiles and releases
//! them at the end, so no tile state leaks into unrelated code on the thread.

use super::tile_model::{TileConfig, TileUnit};
use crate::kernels::error::KernelError;
use std::sync::OnceLock;

/// Rows per block.
pub const MR: usize = 32;
/// Columns per block (= packed panel width).
pub const NR: usize = 32;
/// K granularity: one A tile row is 64 bytes.
pub const K_ALIGN: usize = 64;

const ARCH_REQ_XCOMP_PERM: i32 = 0x1023;
const XFEATURE_XTILEDATA: i32 = 18;

/// CPUID.(EAX=7,ECX=0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), and XCR0 bits 17–18 (the OS
/// saves tile state).
pub fn cpuid_has_amx_int8() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        if __cpuid(0).eax < 7 {
            return false;
        }
        let r = __cpuid_count(7, 0);
        let hw = (r.edx >> 24) & 1 == 1 && (r.edx >> 25) & 1 == 1;
        let osxsave = (__cpuid(1).ecx >> 27) & 1 == 1;
        if !hw || !osxsave {
            return false;
        }
        let xcr0_lo: u32;
        // SAFETY: OSXSAVE is set, so xgetbv with ecx = 0 is defined; it only reads XCR0.
        unsafe {
            std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") xcr0_lo, out("edx") _, options(nomem, nostack, preserves_flags))
        };
        (xcr0_lo >> 17) & 3 == 3
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Asks Linux for permission to use AMX tile data (once per process; memoised).
///
/// ```
/// let r = codegen::kernels::int8::amx::request_amx_permission();
/// if !codegen::kernels::int8::amx::cpuid_has_amx_int8() { assert!(r.is_err()); }
/// ```
pub fn request_amx_permission() -> Result<(), KernelError> {
    static R: OnceLock<Result<(), KernelError>> = OnceLock::new();
    R.get_or_init(|| {
        if !cpuid_has_amx_int8() {
            return Err(KernelError::Unsupported("amx"));
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, 18) only changes this process's permitted
            // XSAVE features; it takes integer arguments and touches no memory of ours.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            if r != 0 {
                return Err(KernelError::AmxPermission(
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(-1),
                ));
            }
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        Err(KernelError::Unsupported("amx"))
    })
    .clone()
}

/// The hardware tile unit. Only constructible where AMX is usable ([`HwTiles::new`]).
///
/// Tile register numbers are encoded in the instructions, so the runtime indices are dispatched
/// through `match`: any tile for load/store/zero; `C ∈ 0..4`, `A ∈ 4..6`, `B ∈ 6..8` for the dot
/// products (the assignment the kernel uses).
#[derive(Debug)]
pub struct HwTiles(());

impl HwTiles {
    /// Returns the unit if the CPU has AMX-INT8 and Linux granted tile-data permission.
    pub fn new() -> Result<Self, KernelError> {
        request_amx_permission().map(|()| HwTiles(()))
    }
}

#[cfg(target_arch = "x86_64")]
macro_rules! tile_match {
    ($t:expr, $m:ident) => {
        match $t {
            0 => $m!("0"),
            1 => $m!("1"),
            2 => $m!("2"),
            3 => $m!("3"),
            4 => $m!("4"),
            5 => $m!("5"),
            6 => $m!("6"),
            7 => $m!("7"),
            t => panic!("tile index {t} out of range"),
        }
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! dot_match {
    ($op:literal, $c:expr, $a:expr, $b:expr) => {{
        macro_rules! go {
            ($cc:literal, $aa:literal, $bb:literal) => {
                // SAFETY: HwTiles exists only after the AMX permission was granted; the kernel
                // configured compatible shapes before calling (tile ops on unconfigured tiles
                // would fault, never corrupt memory: tdpb* touches registers only).
                unsafe {
                    std::arch::asm!(
                        concat!($op, " tmm", $cc, ", tmm", $aa, ", tmm", $bb),
                        options(nostack)
                    )
                }
            };
        }
        match ($c, $a, $b) {
            (0, 4, 6) => go!("0", "4", "6"),
            (0, 4, 7) => go!("0", "4", "7"),
            (0, 5, 6) => go!("0", "5", "6"),
            (0, 5, 7) => go!("0", "5", "7"),
            (1, 4, 6) => go!("1", "4", "6"),
            (1, 4, 7) => go!("1", "4", "7"),
            (1, 5, 6) => go!("1", "5", "6"),
            (1, 5, 7) => go!("1", "5", "7"),
            (2, 4, 6) => go!("2", "4", "6"),
            (2, 4, 7) => go!("2", "4", "7"),
            (2, 5, 6) => go!("2", "5", "6"),
            (2, 5, 7) => go!("2", "5", "7"),
            (3, 4, 6) => go!("3", "4", "6"),
            (3, 4, 7) => go!("3", "4", "7"),
            (3, 5, 6) => go!("3", "5", "6"),
            (3, 5, 7) => go!("3", "5", "7"),
            // The K tail of `dot_rows`: C 0 and 1, A 5, B 2 and 3.
            (0, 5, 2) => go!("0", "5", "2"),
            (1, 5, 3) => go!("1", "5", "3"),
            t => panic!("tile triple {t:?} not in C 0..4, A 4..6, B 6..8 (or dot_rows' tail)"),
        }
    }};
}

thread_local! {
    /// The configuration this thread's tiles hold (None: released), kept by every
    /// `configure` and `release` of [`HwTiles`], the only way this crate touches the tiles.
    static LOADED: std::cell::Cell<Option<TileConfig>> = const { std::cell::Cell::new(None) };
}

#[cfg(target_arch = "x86_64")]
impl TileUnit for HwTiles {
    #[inline]
    fn configure(&mut self, cfg: &TileConfig) {
        LOADED.set(Some(*cfg));
        // SAFETY: cfg is a valid, 64-byte aligned palette-1 configuration (TileConfig::new
        // checks the shapes); permission was granted when self was created.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) cfg as *const TileConfig, options(nostack, readonly))
        }
    }

    #[inline]
    unsafe fn load(&mut self, tile: usize, base: *const u8, stride: usize) {
        macro_rules! go {
            ($t:literal) => {
                // SAFETY: the caller guarantees every configured row is readable.
                unsafe {
                    std::arch::asm!(concat!("tileloadd tmm", $t, ", [{b} + {s}*1]"), b = in(reg) base, s = in(reg) stride, options(nostack, readonly))
                }
            };
        }
        tile_match!(tile, go)
    }

    #[inline]
    unsafe fn store(&mut self, tile: usize, base: *mut u8, stride: usize) {
        macro_rules! go {
            ($t:literal) => {
                // SAFETY: the caller guarantees every configured row is writable.
                unsafe { std::arch::asm!(concat!("tilestored [{b} + {s}*1], tmm", $t), b = in(reg) base, s = in(reg) stride, options(nostack)) }
            };
        }
        tile_match!(tile, go)
    }

    #[inline]
    fn zero(&mut self, tile: usize) {
        macro_rules! go {
            ($t:literal) => {
                // SAFETY: tilezero only writes a tile register; permission was granted.
                unsafe { std::arch::asm!(concat!("tilezero tmm", $t), options(nostack, nomem)) }
            };
        }
        tile_match!(tile, go)
    }

    #[inline]
    fn dpbusd(&mut self, c: usize, a: usize, b: usize) {
        dot_match!("tdpbusd", c, a, b)
    }

    #[inline]
    fn dpbssd(&mut self, c: usize, a: usize, b: usize) {
        dot_match!("tdpbssd", c, a, b)
    }

    #[inline]
    fn release(&mut self) {
        LOADED.set(None);
        // SAFETY: tilerelease resets tile state to init; always valid once permission exists.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) }
    }
}

/// The tile configuration of the kernel: every tile 16 rows × 64 bytes.
pub fn kernel_config() -> TileConfig {
    TileConfig::new(&[(16, 64); 8])
}

/// `C[32×32] = A_panel · B_panel` over `kc4` K-quads (`kc4` a multiple of 16) on tile unit `t`,
/// which must already hold [`kernel_config`] (the GEMM driver configures once per thread and
/// releases at the end, see [`ukernel_with`] for the self-contained form).
///
/// The B panel's lines of the K step [`B_AHEAD`] ahead are asked into L1 as it goes (half before
/// the step's first products, half before its last): BERT-base INT8 on the 16-vCPU AMX guest
/// (family 6 model 207, 2 threads, busy host) ran 7-11 % faster at batch 1, 8 and 32 than without
/// (sums of three alternating rounds, 2026-12-04), its GEMMs at 35 % of the `tdpbusd` peak
/// instead of 25 %. Without prefetch the microkernel alone had measured 6-16 % faster on the quiet
/// 2-vCPU guest of 2026-12-02, so `cargo bench -p codegen --bench amx` keeps timing both
/// schedules side by side (`product`, `no-pf`).
///
/// # Safety
/// `a` holds `32 · kc4·4` bytes (row stride `kc4·4`), `b` holds `kc4·32·4` bytes, `c` addresses
/// 32 rows (stride `ldc`) of 32 writable i32. `kc4 % 16 == 0`.
pub unsafe fn ukernel_body<T: TileUnit>(
    t: &mut T,
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
) {
    // SAFETY: forwarded caller contract; no hint.
    unsafe { ukernel_body_hinted(t, kc4, a, b, c, ldc, std::ptr::null()) }
}

/// [`ukernel_body`] that also asks for the `kc4` lines from `next` into L2, sixteen per K step
/// (the weights the thread reads after this block, see [`super::UKernel`]; null: none). The
/// prefetches are hints to the cache, the same on the tile model as on hardware.
///
/// # Safety
/// As [`ukernel_body`]; `next` is only prefetched (any value).
pub unsafe fn ukernel_body_hinted<T: TileUnit>(
    t: &mut T,
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
    next: *const i8,
) {
    debug_assert_eq!(kc4 % 16, 0);
    let kc = kc4 * 4;
    for tile in 0..4 {
        t.zero(tile);
    }
    let mut next = next;
    let mut k0 = 0;
    while k0 < kc {
        if !next.is_null() {
            prefetch_lines::<16, L2>(next);
            next = next.wrapping_add(16 * 64);
        }
        // The B lines of step k0 + 64·B_AHEAD: 16 quad rows of 128 bytes, past the panel's end
        // into the next panel, which follows it in memory and is what the next call reads
        // first (a chunk's calls take consecutive panels): BERT-base INT8 batch 8 on the AMX
        // guest of 2026-12-05 ran faster in 8 of 8 alternating pairs (+4.5 % summed) than when
        // the prefetch stopped at the panel's end. Past the weights it is a hint to nowhere.
        let ahead = b.wrapping_add((k0 + 64 * B_AHEAD) * NR);
        prefetch_lines::<16, L1>(ahead);
        // SAFETY: A rows 0..32 at stride kc, bytes k0..k0+64 < kc; B quads k0/4..k0/4+16 at
        // 128 bytes each, inside the panel (caller contract).
        unsafe {
            let bq = b.add(k0 * NR) as *const u8;
            t.load(4, a.add(k0), kc);
            t.load(6, bq, NR * 4);
            t.dpbusd(0, 4, 6);
            t.load(7, bq.add(64), NR * 4);
            t.dpbusd(1, 4, 7);
            prefetch_lines::<16, L1>(ahead.wrapping_add(16 * 64));
            t.load(5, a.add(16 * kc + k0), kc);
            t.dpbusd(2, 5, 6);
            t.dpbusd(3, 5, 7);
        }
        k0 += 64;
    }
    // SAFETY: forwarded caller contract (the 32×32 block at c, stride ldc).
    unsafe { store_block(t, c, ldc) };
}

/// How many K steps (64 bytes of K) ahead of its reads the kernel asks for the B panel's lines.
pub const B_AHEAD: usize = 2;

/// Prefetch hints: into L1 (`_MM_HINT_T0`) and into L2 (`_MM_HINT_T1`).
#[cfg(target_arch = "x86_64")]
const L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const L2: i32 = 0;

/// Asks for the `LINES` cache lines from `p` into the cache level `HINT` names.
#[inline(always)]
fn prefetch_lines<const LINES: usize, const HINT: i32>(p: *const i8) {
    for line in 0..LINES {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint: it never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<HINT>(p.wrapping_add(64 * line))
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p.wrapping_add(64 * line);
    }
}

/// Stores the four 16×16 i32 accumulator tiles (0-3) as the 32×32 block at `c`, `ldc` apart.
///
/// # Safety
/// `c` addresses 32 rows (stride `ldc`) of 32 writable i32.
pub unsafe fn store_block<T: TileUnit>(t: &mut T, c: *mut i32, ldc: usize) {
    let s = ldc * 4;
    // SAFETY: the four 16×16 quadrants of the caller's 32×32 block.
    unsafe {
        t.store(0, c as *mut u8, s);
        t.store(1, c.add(16) as *mut u8, s);
        t.store(2, c.add(16 * ldc) as *mut u8, s);
        t.store(3, c.add(16 * ldc + 16) as *mut u8, s);
    }
}

/// [`ukernel_body`] bracketed by `configure` and `release`: usable on its own.
///
/// # Safety
/// As [`ukernel_body`].
pub unsafe fn ukernel_with<T: TileUnit>(
    t: &mut T,
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
) {
    t.configure(&kernel_config());
    // SAFETY: forwarded caller contract; the unit was just configured.
    unsafe { ukernel_body(t, kc4, a, b, c, ldc) };
    t.release();
}

/// `tdpbusd` throughput with no memory traffic: four independent 16×16 accumulators fed by two
/// A and two B tiles loaded once, `iters` rounds of four dot products (each 16·16·64 MACs).
/// Returns a value of the result so the work is not removed. The AMX roofline divides by this.
#[cfg(target_arch = "x86_64")]
pub fn peak_loop(tiles: &mut HwTiles, iters: usize) -> i32 {
    let src = [1u8; 16 * 64];
    let mut out = [0i32; 16 * 16];
    tiles.configure(&kernel_config());
    for t in 0..4 {
        tiles.zero(t);
    }
    for t in 4..8 {
        // SAFETY: `src` holds the 16 rows × 64 bytes every configured tile reads (stride 64).
        unsafe { tiles.load(t, src.as_ptr(), 64) };
    }
    for _ in 0..iters {
        tiles.dpbusd(0, 4, 6);
        tiles.dpbusd(1, 4, 7);
        tiles.dpbusd(2, 5, 6);
        tiles.dpbusd(3, 5, 7);
    }
    // SAFETY: `out` holds 16 rows of 16 i32 at a 64-byte stride.
    unsafe { tiles.store(0, out.as_mut_ptr() as *mut u8, 64) };
    tiles.release();
    out[0]
}

/// The tile unit configured for [`dot_rows`] with K in whole multiples of 8 quads
/// ([`dot_rows_config`]`(8)`), configured only when this thread's tiles hold another
/// configuration (or none): a configuration costs more than a head's products. The tiles stay
/// configured; a GEMM reconfigures them at its start and releases them at its end.
pub fn dot_rows_tiles() -> Result<HwTiles, KernelError> {
    let mut t = HwTiles::new()?;
    let cfg = dot_rows_config(8);
    if LOADED.get() != Some(cfg) {
        t.configure(&cfg);
    }
    Ok(t)
}

/// The tile configuration of [`dot_rows`] over `steps` K-quads: C 0 and 1 (16 × 16 i32), A 4
/// and B 6, 7 for whole 64-byte K steps, A 5 and B 2, 3 for the remaining `steps % 16` quads
/// (unused tiles left unconfigured).
pub fn dot_rows_config(steps: usize) -> TileConfig {
    let tail = (steps % 16) as u8;
    let (a_tail, b_tail) = if tail == 0 {
        ((0, 0), (0, 0))
    } else {
        ((16, 4 * u16::from(tail)), (tail, 64))
    };
    TileConfig::new(&[
        (16, 64),
        (16, 64),
        b_tail,
        b_tail,
        (16, 64),
        a_tail,
        (16, 64),
        (16, 64),
    ])
}

/// The integer products of attention on the tile unit `t`, configured with
/// [`dot_rows_config`]`(steps)` (or with any `dot_rows_config(s)` whose tail tiles fit:
/// `s % 16 == steps % 16`, or `steps % 16 == 0`, which uses none): for each block of 16 rows
/// `i0` and 32 columns `j0` of `m × n`, the sums `Σ_s Σ_q left[i·ldl + 4s + q] · (byte q of right[s·ldr + j] as i8)` over
/// `steps` K-quads (u8 left rows, s8 right words), handed to `finish(i, j, sums)` sixteen
/// columns at a time, row by row. The layouts are the ones the AVX512-VNNI attention reads (left
/// rows of `4·steps` bytes, right rows of 4-byte K-quads), so both give the same integers.
///
/// # Safety
/// `m % 16 == 0`, `n % 32 == 0`, `steps > 0`, the configuration as above; `left` holds `m`
/// rows of `4·steps` readable bytes at stride `ldl`, `right` `steps` rows of `n` readable words
/// at stride `ldr` (words).
pub unsafe fn dot_rows<T: TileUnit>(
    t: &mut T,
    (left, ldl): (*const u8, usize),
    (right, ldr): (*const u32, usize),
    steps: usize,
    [m, n]: [usize; 2],
    mut finish: impl FnMut(usize, usize, &[i32; 16]),
) {
    #[repr(C, align(64))]
    struct Block([[i32; 32]; 16]);
    let mut block = Block([[0; 32]; 16]);
    let (whole, tail) = (steps / 16, steps % 16);
    let ldr_bytes = 4 * ldr;
    for i0 in (0..m).step_by(16) {
        for j0 in (0..n).step_by(32) {
            t.zero(0);
            t.zero(1);
            // SAFETY: rows i0..i0 + 16 < m of `left`, bytes below 4·steps; quad rows below
            // `steps` of `right`, words j0..j0 + 32 ≤ n (the caller's contract).
            unsafe {
                let a = left.add(i0 * ldl);
                let b = right.add(j0) as *const u8;
                // The K step from quad 16·q into C 0 and 1, with A tile `ta` and B tiles `tb`
                // (the whole steps' tiles or the tail's).
                let mut k_step = |q: usize, ta: usize, tb: [usize; 2]| {
                    t.load(ta, a.add(64 * q), ldl);
                    let bq = b.add(16 * q * ldr_bytes);
                    t.load(tb[0], bq, ldr_bytes);
                    t.load(tb[1], bq.add(64), ldr_bytes);
                    t.dpbusd(0, ta, tb[0]);
                    t.dpbusd(1, ta, tb[1]);
                };
                for q in 0..whole {
                    k_step(q, 4, [6, 7]);
                }
                if tail > 0 {
                    k_step(whole, 5, [2, 3]);
                }
                let out = block.0.as_mut_ptr() as *mut u8;
                t.store(0, out, 128);
                t.store(1, out.add(64), 128);
            }
            for (r, row) in block.0.iter().enumerate() {
                let (lo, hi) = row.split_at(16);
                finish(i0 + r, j0, lo.try_into().expect("16 sums"));
                finish(i0 + r, j0 + 16, hi.try_into().expect("16 sums"));
            }
        }
    }
}

/// The hardware kernel body with the C calling convention, for JIT-compiled unit loops: the
/// GEMM driver configures the tiles on each thread before its units run (`begin`) and releases
/// them after (`end`), so this is [`ukernel_body_hinted`] on the hardware unit and nothing else,
/// the prefetch hint (`next`, see [`super::UKernel`]) included.
///
/// # Safety
/// As [`ukernel_body`]; AMX usable and the tiles configured with [`kernel_config`] on this
/// thread.
#[cfg(target_arch = "x86_64")]
pub unsafe extern "C" fn ukernel_configured(
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
    next: *const i8,
) {
    let mut t = HwTiles(());
    // SAFETY: forwarded caller contract.
    unsafe { ukernel_body_hinted(&mut t, kc4, a, b, c, ldc, next) }
}

/// The hardware kernel.
///
/// # Safety
/// As [`ukernel_with`], and AMX must be usable ([`request_amx_permission`] succeeded).
#[cfg(target_arch = "x86_64")]
pub unsafe fn ukernel(kc4: usize, a: *const u8, b: *const i8, c: *mut i32, ldc: usize) {
    let mut t = HwTiles(());
    // SAFETY: forwarded caller contract.
    unsafe { ukernel_with(&mut t, kc4, a, b, c, ldc) }
}
