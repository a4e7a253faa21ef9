//! The two products of attention in 8-bit integers, for one (sequence, head):
//! `scores = q·kᵀ` with q quantized per query row and k per key row (both symmetric, ±127), and
//! `out = p·v` with the softmax numerators as u8 (`round(255·2^(s − max))`, see
//! [`super::simd::softmax_quant_row`]) and v quantized per head column. Every scale is an outer
//! index of its product, so each output is one exact i32 sum times two f32 scales, in the
//! AVX-512 VNNI kernels and in the portable ones alike: results never depend on the CPU, only
//! the speed does.

use super::attn_kernels::{IB, JB};

/// The operands of `scores = q·kᵀ` for one head.
pub(crate) struct ScoreOperands<'a> {
    /// `m_pad` rows of `4·dh4` bytes at stride `ldq`: q quantized (±127) plus 128, as u8.
    pub q8: &'a [u8],
    pub ldq: usize,
    /// Row scales of q (`m_pad`).
    pub qs: &'a [f32],
    /// kᵀ in 4-deep slices: word `d4·n_pad + j` holds `k8[j, 4·d4..4·d4 + 4]`, lowest first.
    pub kt: &'a [u32],
    /// `128 · Σ_d k8[j, d]` per key (`n_pad`): what the +128 of q adds to each sum.
    pub kcomp: &'a [i32],
    /// Key scales times the attention scale (`n_pad`).
    pub ks: &'a [f32],
    pub dh4: usize,
}

/// `scores[i, j] = (Σ_d q8[i, d]·k8[j, d] − kcomp[j]) · qs[i] · ks[j]` for `i < m_pad` (a
/// multiple of [`IB`]) and `j < n_pad` (a multiple of [`JB`]); `scores` is `[m_pad, n_pad]`.
pub(crate) fn scores_i8(op: &ScoreOperands<'_>, scores: &mut [f32], m_pad: usize, n_pad: usize) {
    let ScoreOperands {
        q8,
        ldq,
        qs,
        kt,
        kcomp,
        ks,
        dh4,
    } = *op;
    assert!(m_pad.is_multiple_of(IB) && n_pad.is_multiple_of(JB) && ldq >= 4 * dh4);
    assert!(m_pad == 0 || q8.len() >= (m_pad - 1) * ldq + 4 * dh4);
    assert!(qs.len() >= m_pad && kcomp.len() >= n_pad && ks.len() >= n_pad);
    assert!(kt.len() >= dh4 * n_pad && scores.len() >= m_pad * n_pad);
    #[cfg(target_arch = "x86_64")]
    if codegen::kernels::cpu_features().avx512vnni {
        // SAFETY: the CPU has AVX-512 F/BW and VNNI; the sizes were checked above.
        return unsafe { vnni::scores(op, scores, m_pad, n_pad) };
    }
    scores_portable(op, scores, m_pad, n_pad);
}

/// [`scores_i8`] on any CPU (the sizes checked by the caller): the integer sums with AVX2
/// where the CPU has it ([`dot`]).
fn scores_portable(op: &ScoreOperands<'_>, scores: &mut [f32], m_pad: usize, n_pad: usize) {
    dot(
        (op.q8, op.ldq),
        (op.kt, n_pad),
        op.dh4,
        [m_pad, n_pad],
        |i, j, acc| {
            scores[i * n_pad + j] = ((acc - op.kcomp[j]) as f32 * op.qs[i]) * op.ks[j];
        },
    );
}

/// [`dot_portable`]'s sums and calls, with AVX2 where the CPU has it and the block is whole
/// 4 × 8 tiles (as every attention block is: rows a multiple of [`IB`], columns of [`JB`]).
/// Without it, the 8-bit attention ran at half the speed of the f32 one on Zen 3 (2026-12-06):
/// the portable loop was 44 % of a BERT-base static INT8 run.
fn dot(
    (left, ldl): (&[u8], usize),
    (right, ldr): (&[u32], usize),
    steps: usize,
    [m, n]: [usize; 2],
    mut finish: impl FnMut(usize, usize, i32),
) {
    #[cfg(target_arch = "x86_64")]
    if m.is_multiple_of(4) && n.is_multiple_of(8) && codegen::kernels::cpu_features().avx2_fma {
        // SAFETY: the CPU has AVX2; the function checks its bounds.
        return unsafe { dot_avx2((left, ldl), (right, ldr), steps, [m, n], &mut finish) };
    }
    dot_portable((left, ldl), (right, ldr), steps, [m, n], finish)
}

/// [`dot_portable`] with AVX2 on tiles of 4 rows × 8 columns: each 16-byte group of four
/// columns' K quads widened to i16 (`vpmovsxbw`), each row's quad spread to the i16 pattern
/// `a0 a1 a2 a3 a0 …` (`vpshufb`), `vpmaddwd` leaving two partial sums per column that one
/// `vphaddd` adds per tile. Exact: u8 × s8 products in i16, pairs summed in i32.
///
/// # Safety
/// The CPU must have AVX2; `m` a multiple of 4 and `n` of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(
    (left, ldl): (&[u8], usize),
    (right, ldr): (&[u32], usize),
    steps: usize,
    [m, n]: [usize; 2],
    finish: &mut impl FnMut(usize, usize, i32),
) {
    use std::arch::x86_64::*;
    const RB: usize = 4;
    const CB: usize = 8;
    assert!(m.is_multiple_of(RB) && n.is_multiple_of(CB));
    assert!(m == 0 || steps == 0 || left.len() >= (m - 1) * ldl + 4 * steps);
    assert!(m == 0 || steps == 0 || right.len() >= (steps - 1) * ldr + n);
    let spread = _mm256_setr_epi8(
        0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1, //
        0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1,
    );
    for i0 in (0..m).step_by(RB) {
        for j0 in (0..n).step_by(CB) {
            let mut acc = [[_mm256_setzero_si256(); 2]; RB];
            for s in 0..steps {
                // SAFETY: words s·ldr + j0 .. + 8 and bytes (i0 + r)·ldl + 4s .. + 4 lie within
                // the slices (asserted above).
                unsafe {
                    let w = right.as_ptr().add(s * ldr + j0) as *const __m128i;
                    let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w));
                    let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(1)));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let quad = (left.as_ptr().add((i0 + r) * ldl + 4 * s) as *const i32)
                            .read_unaligned();
                        let a = _mm256_shuffle_epi8(_mm256_set1_epi32(quad), spread);
                        acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(a, w0));
                        acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(a, w1));
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                // hadd(columns 0-3, 4-7) = [0 1 4 5 | 2 3 6 7]; the permute orders them.
                let sums =
                    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(acc[0], acc[1]));
                let mut out = [0i32; CB];
                // SAFETY: 8 i32 into an 8-element array.
                unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, sums) };
                for (c, v) in out.into_iter().enumerate() {
                    finish(i0 + r, j0 + c, v);
                }
            }
        }
    }
}

/// `finish(i, j, Σ_s Σ_t left[i·ldl + 4s + t]·(byte t of right[s·ldr + j] as i8))` for
/// `i < m`, `j < n`: the integer product every kernel makes, portably.
fn dot_portable(
    (left, ldl): (&[u8], usize),
    (right, ldr): (&[u32], usize),
    steps: usize,
    [m, n]: [usize; 2],
    mut finish: impl FnMut(usize, usize, i32),
) {
    for i in 0..m {
        let l = &left[i * ldl..][..4 * steps];
        for j in 0..n {
            let mut acc = 0i32;
            for s in 0..steps {
                let w = right[s * ldr + j].to_le_bytes();
                for t in 0..4 {
                    acc += i32::from(l[4 * s + t]) * i32::from(w[t] as i8);
                }
            }
            finish(i, j, acc);
        }
    }
}

/// The operands of `out = p·v` for one head.
pub(crate) struct ValueOperands<'a> {
    /// `m_pad` rows of `4·n4` u8 numerators at stride `ldp` (zero past the real keys).
    pub p8: &'a [u8],
    pub ldp: usize,
    /// Row scales `1/Σ e`, `e` the numerators before rounding (`m_pad`).
    pub rs: &'a [f32],
    /// v in 4-deep slices: word `j4·dh_pad + c` holds `v8[4·j4..4·j4 + 4, c]`, lowest first.
    pub v: &'a [u32],
    /// Column scales of v (`dh_pad`).
    pub vs: &'a [f32],
    pub n4: usize,
}

impl ValueOperands<'_> {
    /// Panics unless the operands hold `m_pad` rows (a multiple of [`IB`]) and `dh_pad`
    /// columns (a multiple of [`JB`]): what the kernels read.
    fn check(&self, m_pad: usize, dh_pad: usize) {
        let ValueOperands {
            p8,
            ldp,
            rs,
            v,
            vs,
            n4,
        } = *self;
        assert!(m_pad.is_multiple_of(IB) && dh_pad.is_multiple_of(JB) && ldp >= 4 * n4);
        assert!(m_pad == 0 || p8.len() >= (m_pad - 1) * ldp + 4 * n4);
        assert!(rs.len() >= m_pad && vs.len() >= dh_pad && v.len() >= n4 * dh_pad);
    }
}

/// `out[i·ldo + c] = (Σ_j p8[i, j]·v8[j, c]) · vs[c] · rs[i]` for `i < m_pad` (a multiple of
/// [`IB`]) and `c < dh_pad` (a multiple of [`JB`]).
///
/// # Safety
/// `out` must be valid for writes of `m_pad` rows of `dh_pad` at stride `ldo`, and no other
/// thread may access those elements during the call.
pub(crate) unsafe fn values_i8(
    op: &ValueOperands<'_>,
    out: *mut f32,
    ldo: usize,
    m_pad: usize,
    dh_pad: usize,
) {
    op.check(m_pad, dh_pad);
    #[cfg(target_arch = "x86_64")]
    if codegen::kernels::cpu_features().avx512vnni {
        // SAFETY: the CPU has AVX-512 F/BW and VNNI; the input sizes were checked above and the
        // caller vouches for `out`.
        return unsafe { vnni::values(op, out, ldo, m_pad, dh_pad) };
    }
    // SAFETY: forwarded caller contract.
    unsafe { values_portable(op, out, ldo, m_pad, dh_pad) }
}

/// Where [`values_u8`] puts a head's output: element `(i, c)` as the byte
/// `quantize_u8(o·inv[c], scale, zero_point)` at `out + i·ldo + c`, `o` the f32 that
/// [`values_i8`] would store there (`inv`, when given, addresses the head's `dh_pad` smoothing
/// factors).
pub(crate) struct U8Sink {
    pub out: *mut u8,
    pub ldo: usize,
    pub inv: Option<*const f32>,
    pub scale: f32,
    pub zero_point: f32,
}

/// [`values_i8`] with each output quantized to u8 in registers as it is made (the bits of
/// `fused::quantize_row_u8` of the f32 rows, without writing and reading them back), where the
/// CPU has AVX512-VNNI; false (nothing written) elsewhere, for the caller to go through f32.
///
/// # Safety
/// `sink.out` must be valid for writes of `m_pad` rows of `dh_pad` bytes at stride `sink.ldo`,
/// touched by no other thread during the call; `sink.inv`, when given, must address `dh_pad`
/// readable f32.
pub(crate) unsafe fn values_u8(
    op: &ValueOperands<'_>,
    sink: &U8Sink,
    m_pad: usize,
    dh_pad: usize,
) -> bool {
    op.check(m_pad, dh_pad);
    #[cfg(target_arch = "x86_64")]
    if codegen::kernels::cpu_features().avx512vnni {
        // SAFETY: the CPU has AVX-512 F/BW and VNNI; the input sizes were checked above and the
        // caller vouches for the sink.
        unsafe { vnni::values_u8(op, sink, m_pad, dh_pad) };
        return true;
    }
    false
}

/// [`values_i8`] on any CPU.
///
/// # Safety
/// As [`values_i8`]; the sizes checked by the caller.
unsafe fn values_portable(
    op: &ValueOperands<'_>,
    out: *mut f32,
    ldo: usize,
    m_pad: usize,
    dh_pad: usize,
) {
    dot(
        (op.p8, op.ldp),
        (op.v, dh_pad),
        op.n4,
        [m_pad, dh_pad],
        |i, c, acc| {
            // SAFETY: row i < m_pad, column c < dh_pad: the caller's writable block.
            unsafe { *out.add(i * ldo + c) = (acc as f32 * op.vs[c]) * op.rs[i] };
        },
    );
}

/// The AMX tile unit, when the int8 picker takes AMX on this CPU (decided once per process:
/// `ENCORE_KERNEL` read once; the picker takes AMX only where Linux granted the tile data).
#[cfg(target_arch = "x86_64")]
fn amx_tiles() -> Option<codegen::kernels::int8::amx::HwTiles> {
    use codegen::kernels::{int8::amx, pick_int8, Int8Kernel};
    static USE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let usable = *USE.get_or_init(|| pick_int8(1024, 64, 64) == Int8Kernel::Amx);
    if usable {
        amx::dot_rows_tiles().ok()
    } else {
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{ScoreOperands, U8Sink, ValueOperands, IB, JB};
    use crate::exec::fused::quantize_u8_16;
    use std::arch::x86_64::*;

    /// `finish(i, j, acc)` for each 16 columns `j` of every row `i < m_pad`, `j < n_pad`
    /// (multiples of [`IB`] and [`JB`]), `acc` the sixteen sums of the integer product (see
    /// [`super::dot_portable`]): 8 rows × 32 columns in 16 accumulators; per 4-deep slice two
    /// loads of the right operand, eight 4-byte broadcasts of the left one and sixteen
    /// `vpdpbusd`.
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI; `left` holds `m_pad` rows of `4·steps` bytes at stride `ldl`,
    /// `right` `steps` rows of `n_pad` words at stride `ldr`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dot(
        (lp, ldl): (*const u8, usize),
        (rp, ldr): (*const u32, usize),
        steps: usize,
        [m_pad, n_pad]: [usize; 2],
        mut finish: impl FnMut(usize, usize, __m512i),
    ) {
        for i0 in (0..m_pad).step_by(IB) {
            for j0 in (0..n_pad).step_by(JB) {
                let mut acc = [[_mm512_setzero_si512(); 2]; IB];
                for s in 0..steps {
                    // SAFETY: s < steps, j0 + JB ≤ n_pad, i0 + IB ≤ m_pad: inside the operands.
                    unsafe {
                        let r0 = _mm512_loadu_si512(rp.add(s * ldr + j0) as *const _);
                        let r1 = _mm512_loadu_si512(rp.add(s * ldr + j0 + 16) as *const _);
                        for (r, a) in acc.iter_mut().enumerate() {
                            let word =
                                (lp.add((i0 + r) * ldl + 4 * s) as *const i32).read_unaligned();
                            let x = _mm512_set1_epi32(word);
                            a[0] = _mm512_dpbusd_epi32(a[0], x, r0);
                            a[1] = _mm512_dpbusd_epi32(a[1], x, r1);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    for (h, &a) in a.iter().enumerate() {
                        finish(i0 + r, j0 + 16 * h, a);
                    }
                }
            }
        }
    }

    /// [`dot`] on the AMX tile unit where the int8 picker takes AMX (`ENCORE_KERNEL` included:
    /// `avx512vnni` keeps attention on the vector units too): whole blocks of 16 rows through
    /// `codegen`'s `amx::dot_rows`, the last 8 rows of an `m_pad` that is not a multiple of 16
    /// through [`dot`]. The same integer sums either way, so the same results.
    ///
    /// # Safety
    /// As [`dot`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dot_any(
        left: (*const u8, usize),
        right: (*const u32, usize),
        steps: usize,
        [m_pad, n_pad]: [usize; 2],
        mut finish: impl FnMut(usize, usize, __m512i),
    ) {
        let whole = m_pad / 16 * 16;
        let tiles = if whole > 0 && steps > 0 && steps.is_multiple_of(8) {
            super::amx_tiles()
        } else {
            None
        };
        let Some(mut t) = tiles else {
            // SAFETY: forwarded caller contract.
            return unsafe { dot(left, right, steps, [m_pad, n_pad], finish) };
        };
        use codegen::kernels::int8::amx;
        // SAFETY: whole ≤ m_pad rows, a multiple of 16; n_pad a multiple of JB = 32; the
        // operands as the caller vouches; the tiles are configured for K in multiples of 8
        // quads, which `steps` is.
        unsafe {
            amx::dot_rows(&mut t, left, right, steps, [whole, n_pad], |i, j, sums| {
                finish(i, j, _mm512_loadu_si512(sums.as_ptr() as *const _))
            })
        };
        if whole < m_pad {
            // SAFETY: rows whole..m_pad of `left`, a multiple of IB (the caller's m_pad).
            unsafe {
                dot(
                    (left.0.add(whole * left.1), left.1),
                    right,
                    steps,
                    [m_pad - whole, n_pad],
                    |i, j, a| finish(whole + i, j, a),
                )
            };
        }
    }

    /// See [`super::scores_i8`].
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI; the slice sizes checked by the caller.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn scores(op: &ScoreOperands<'_>, scores: &mut [f32], m_pad: usize, n_pad: usize) {
        let sp = scores.as_mut_ptr();
        let left = (op.q8.as_ptr(), op.ldq);
        let right = (op.kt.as_ptr(), n_pad);
        let finish = |i: usize, j: usize, a: __m512i| {
            // SAFETY: row i < m_pad, keys j..j + 16 ≤ n_pad: inside every slice.
            unsafe {
                let qs = _mm512_set1_ps(*op.qs.get_unchecked(i));
                let comp = _mm512_loadu_si512(op.kcomp.as_ptr().add(j) as *const _);
                let ks = _mm512_loadu_ps(op.ks.as_ptr().add(j));
                let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(a, comp));
                let s = _mm512_mul_ps(_mm512_mul_ps(s, qs), ks);
                _mm512_storeu_ps(sp.add(i * n_pad + j), s);
            }
        };
        // SAFETY: the operand sizes were checked by the caller.
        unsafe { dot_any(left, right, op.dh4, [m_pad, n_pad], finish) }
    }

    /// See [`super::values_i8`].
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI; the slice sizes checked by the caller; `out` as in
    /// [`super::values_i8`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn values(
        op: &ValueOperands<'_>,
        out: *mut f32,
        ldo: usize,
        m_pad: usize,
        dh_pad: usize,
    ) {
        let left = (op.p8.as_ptr(), op.ldp);
        let right = (op.v.as_ptr(), dh_pad);
        let finish = |i: usize, c: usize, a: __m512i| {
            // SAFETY: row i < m_pad, columns c..c + 16 ≤ dh_pad: the caller's writable block,
            // and inside `rs` and `vs`.
            unsafe { _mm512_storeu_ps(out.add(i * ldo + c), value16(op, i, c, a)) };
        };
        // SAFETY: the operand sizes were checked by the caller.
        unsafe { dot_any(left, right, op.n4, [m_pad, dh_pad], finish) }
    }

    /// The f32 outputs of row `i`, columns `c..c + 16`, from their integer sums `a`:
    /// `(a · vs[c]) · rs[i]`.
    ///
    /// # Safety
    /// AVX-512F; `i` and `c + 16` within the operands' `rs` and `vs`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn value16(op: &ValueOperands<'_>, i: usize, c: usize, a: __m512i) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            let rs = _mm512_set1_ps(*op.rs.get_unchecked(i));
            let vs = _mm512_loadu_ps(op.vs.as_ptr().add(c));
            _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), vs), rs)
        }
    }

    /// See [`super::values_u8`]: the f32 of [`values`] times the smoothing factor, then
    /// `fused::quantize_row_u8`'s vector form (`quantize_u8_16`).
    ///
    /// # Safety
    /// AVX-512 F/BW and VNNI; the slice sizes checked by the caller; the sink as in
    /// [`super::values_u8`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn values_u8(op: &ValueOperands<'_>, sink: &U8Sink, m_pad: usize, dh_pad: usize) {
        let left = (op.p8.as_ptr(), op.ldp);
        let right = (op.v.as_ptr(), dh_pad);
        let (scale, zero_point) = (sink.scale, sink.zero_point);
        let finish = |i: usize, c: usize, a: __m512i| {
            // SAFETY: row i < m_pad, columns c..c + 16 ≤ dh_pad: the caller's writable block,
            // and inside `rs`, `vs` and the smoothing factors.
            unsafe {
                let mut o = value16(op, i, c, a);
                if let Some(inv) = sink.inv {
                    o = _mm512_mul_ps(o, _mm512_loadu_ps(inv.add(c)));
                }
                _mm_storeu_si128(
                    sink.out.add(i * sink.ldo + c) as *mut __m128i,
                    _mm512_cvtepi32_epi8(quantize_u8_16(o, scale, zero_point)),
                );
            }
        };
        // SAFETY: the operand sizes were checked by the caller.
        unsafe { dot_any(left, right, op.n4, [m_pad, dh_pad], finish) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both kernels (the picked one and the one without VNNI) against the definition with random
    /// bytes at the extremes of their ranges (q8 up to 255, k8 and v8 down to −128), rows read
    /// at wider strides: bit-exact.
    #[test]
    fn kernels_equal_their_definition() {
        // (rows, keys, head width): odd sizes, and BERT's head width with 16 + 8 rows and a
        // multiple of 32 keys, whose products go through the tile unit where the CPU has AMX.
        for shape in [(16, 45, 24), (24, 96, 64)] {
            kernels_equal_their_definition_with(scores_i8, values_i8, shape);
            kernels_equal_their_definition_with(scores_portable, values_portable, shape);
        }
    }

    /// [`dot`] (AVX2 where the CPU has it) gives [`dot_portable`]'s sums, with bytes at the
    /// ends of their ranges, on whole tiles and on shapes the AVX2 tiles do not cover.
    #[test]
    fn dot_equals_the_portable_sums() {
        let mut r = super::super::lcg24(5);
        for (m, n, steps) in [
            (8usize, 32usize, 16usize),
            (4, 8, 1),
            (12, 40, 37),
            (5, 8, 3),
            (8, 12, 2),
        ] {
            let (ldl, ldr) = (4 * steps + 3, n + 5);
            let left: Vec<u8> = (0..m * ldl)
                .map(|i| if i % 7 == 0 { 255 } else { r() as u8 })
                .collect();
            let right: Vec<u32> = (0..steps * ldr)
                .map(|i| {
                    if i % 5 == 0 {
                        0x8080_8080
                    } else {
                        r() ^ (r() << 16)
                    }
                })
                .collect();
            let mut want = vec![0i32; m * n];
            dot_portable((&left, ldl), (&right, ldr), steps, [m, n], |i, j, a| {
                want[i * n + j] = a
            });
            let mut got = vec![i32::MIN; m * n];
            dot((&left, ldl), (&right, ldr), steps, [m, n], |i, j, a| {
                got[i * n + j] = a
            });
            assert_eq!(got, want, "m {m} n {n} steps {steps}");
        }
    }

    type Scores = fn(&ScoreOperands<'_>, &mut [f32], usize, usize);
    type Values = unsafe fn(&ValueOperands<'_>, *mut f32, usize, usize, usize);

    fn kernels_equal_their_definition_with(
        scores_i8: Scores,
        values_i8: Values,
        (m_pad, n, dh): (usize, usize, usize),
    ) {
        let mut r = super::super::lcg24(11);
        let (n_pad, dh4) = (n.div_ceil(JB) * JB, dh.div_ceil(4));
        let ldq = 4 * dh4 + 5;
        let q8: Vec<u8> = (0..m_pad * ldq).map(|_| r() as u8).collect();
        let qs: Vec<f32> = (0..m_pad).map(|_| (r() % 1000) as f32 * 1e-3).collect();
        let kt: Vec<u32> = (0..dh4 * n_pad).map(|_| r() ^ (r() << 16)).collect();
        let kcomp: Vec<i32> = (0..n_pad).map(|_| (r() % 5000) as i32 - 2500).collect();
        let ks: Vec<f32> = (0..n_pad).map(|_| (r() % 1000) as f32 * 1e-3).collect();
        let op = ScoreOperands {
            q8: &q8,
            ldq,
            qs: &qs,
            kt: &kt,
            kcomp: &kcomp,
            ks: &ks,
            dh4,
        };
        let mut s = vec![f32::NAN; m_pad * n_pad];
        scores_i8(&op, &mut s, m_pad, n_pad);
        for i in 0..m_pad {
            for j in 0..n_pad {
                let mut acc = 0i32;
                for d in 0..4 * dh4 {
                    let k = kt[(d / 4) * n_pad + j].to_le_bytes()[d % 4] as i8;
                    acc += i32::from(q8[i * ldq + d]) * i32::from(k);
                }
                let want = ((acc - kcomp[j]) as f32 * qs[i]) * ks[j];
                assert_eq!(s[i * n_pad + j].to_bits(), want.to_bits(), "score {i},{j}");
            }
        }
        let n4 = n.div_ceil(4);
        let dh_pad = dh.div_ceil(JB) * JB;
        let ldp = 4 * n4 + 3;
        let p8: Vec<u8> = (0..m_pad * ldp).map(|_| r() as u8).collect();
        let rs: Vec<f32> = (0..m_pad).map(|_| (r() % 1000) as f32 * 1e-5).collect();
        let v: Vec<u32> = (0..n4 * dh_pad).map(|_| r() ^ (r() << 16)).collect();
        let vs: Vec<f32> = (0..dh_pad).map(|_| (r() % 1000) as f32 * 1e-3).collect();
        let op = ValueOperands {
            p8: &p8,
            ldp,
            rs: &rs,
            v: &v,
            vs: &vs,
            n4,
        };
        let ldo = dh_pad + 3;
        let mut o = vec![f32::NAN; m_pad * ldo];
        // SAFETY: `o` holds m_pad rows of dh_pad at stride ldo.
        unsafe { values_i8(&op, o.as_mut_ptr(), ldo, m_pad, dh_pad) };
        for i in 0..m_pad {
            for c in 0..ldo {
                if c >= dh_pad {
                    assert!(o[i * ldo + c].is_nan(), "wrote outside at {i},{c}");
                    continue;
                }
                let mut acc = 0i32;
                for j in 0..4 * n4 {
                    let w = v[(j / 4) * dh_pad + c].to_le_bytes()[j % 4] as i8;
                    acc += i32::from(p8[i * ldp + j]) * i32::from(w);
                }
                let want = (acc as f32 * vs[c]) * rs[i];
                assert_eq!(o[i * ldo + c].to_bits(), want.to_bits(), "value {i},{c}");
            }
        }
    }

    /// The u8 outputs quantized in registers are the bytes `quantize_u8` makes of the f32
    /// outputs (times the smoothing factors when there are some), bit for bit: scales that put
    /// values past both ends of [0, 255], a degenerate scale (0: every quotient ±∞ or NaN), and
    /// nothing written past a row or a head.
    #[test]
    fn u8_values_are_the_quantized_f32_values() {
        let mut r = super::super::lcg24(29);
        let (m_pad, n, dh) = (16usize, 45usize, 64usize);
        let (n4, dh_pad) = (n.div_ceil(4), dh.div_ceil(JB) * JB);
        let ldp = 4 * n4 + 3;
        let p8: Vec<u8> = (0..m_pad * ldp).map(|_| r() as u8).collect();
        let rs: Vec<f32> = (0..m_pad).map(|_| (r() % 1000) as f32 * 1e-5).collect();
        let v: Vec<u32> = (0..n4 * dh_pad).map(|_| r() ^ (r() << 16)).collect();
        let vs: Vec<f32> = (0..dh_pad).map(|_| (r() % 1000) as f32 * 1e-3).collect();
        let smooth: Vec<f32> = (0..dh_pad).map(|_| (r() % 1000) as f32 * 2e-3).collect();
        let op = ValueOperands {
            p8: &p8,
            ldp,
            rs: &rs,
            v: &v,
            vs: &vs,
            n4,
        };
        let mut f = vec![0f32; m_pad * dh_pad];
        // SAFETY: `f` holds m_pad rows of dh_pad.
        unsafe { values_i8(&op, f.as_mut_ptr(), dh_pad, m_pad, dh_pad) };
        let ldo = dh_pad + 5;
        for inv in [None, Some(&smooth)] {
            for (scale, zero_point) in [(0.01f32, 128.0f32), (0.002, 10.0), (0.0, 7.0)] {
                let mut bytes = vec![0xa5u8; m_pad * ldo];
                let sink = U8Sink {
                    out: bytes.as_mut_ptr(),
                    ldo,
                    inv: inv.map(|s| s.as_ptr()),
                    scale,
                    zero_point,
                };
                // SAFETY: `bytes` holds m_pad rows of dh_pad at stride ldo; `smooth` dh_pad.
                if !unsafe { values_u8(&op, &sink, m_pad, dh_pad) } {
                    eprintln!("SKIP u8_values_are_the_quantized_f32_values: no AVX512-VNNI");
                    return;
                }
                for i in 0..m_pad {
                    for c in 0..ldo {
                        let got = bytes[i * ldo + c];
                        if c >= dh_pad {
                            assert_eq!(got, 0xa5, "wrote outside at {i},{c}");
                            continue;
                        }
                        let x = f[i * dh_pad + c] * inv.map_or(1.0, |s| s[c]);
                        let want = crate::exec::fused::quantize_u8(x, scale, zero_point);
                        assert_eq!(
                            got,
                            want,
                            "{i},{c} scale {scale} smoothed {}",
                            inv.is_some()
                        );
                    }
                }
            }
        }
    }
}
