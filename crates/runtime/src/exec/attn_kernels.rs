//! The two products of attention for one (batch, head), register-blocked: `scores = q·kᵀ·scale`
//! and `out = p·v`. Every output is one FMA chain in index order started from 0, in the AVX-512
//! and AVX2 kernels and in the portable ones alike, so results never depend on the CPU.

use codegen::kernels::F32Kernel;

/// The best f32 instruction set the CPU has (the GEMM kernels' levels, without their
/// `ENCORE_KERNEL` override: attention is not a GEMM kernel one can force).
fn best_isa() -> F32Kernel {
    F32Kernel::ALL
        .into_iter()
        .rev()
        .find(|k| k.is_supported())
        .unwrap_or(F32Kernel::Scalar)
}

/// Rows per register block.
pub(crate) const IB: usize = 8;
/// Columns per register block (two AVX-512 vectors).
pub(crate) const JB: usize = 32;

/// `scores[i, j] = scale · Σ_d q[i·ldq + d]·kt[d, j]` for `i < m_pad` (a multiple of [`IB`])
/// and `j < n_pad` (a multiple of [`JB`]); `q` holds `m_pad` rows of `dh` at stride `ldq` (a
/// head read in place from `[S, H]`), `kt` is `[dh, n_pad]`, `scores` is `[m_pad, n_pad]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attn_scores(
    q: &[f32],
    ldq: usize,
    kt: &[f32],
    scores: &mut [f32],
    m_pad: usize,
    n_pad: usize,
    dh: usize,
    scale: f32,
) {
    scores_on(best_isa(), q, ldq, kt, scores, m_pad, n_pad, dh, scale)
}

/// [`attn_scores`] on the kernels of `isa` (which the CPU must have: checked).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_on(
    isa: F32Kernel,
    q: &[f32],
    ldq: usize,
    kt: &[f32],
    scores: &mut [f32],
    m_pad: usize,
    n_pad: usize,
    dh: usize,
    scale: f32,
) {
    assert!(isa.is_supported(), "{isa:?} kernels on a CPU without them");
    assert!(m_pad.is_multiple_of(IB) && n_pad.is_multiple_of(JB) && ldq >= dh);
    assert!(m_pad == 0 || q.len() >= (m_pad - 1) * ldq + dh);
    assert!(kt.len() >= dh * n_pad && scores.len() >= m_pad * n_pad);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F; the sizes were checked above.
        F32Kernel::Avx512 => unsafe { avx512::scores(q, ldq, kt, scores, m_pad, n_pad, dh, scale) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2 and FMA; the sizes were checked above.
        F32Kernel::Avx2 => unsafe { avx2::scores(q, ldq, kt, scores, m_pad, n_pad, dh, scale) },
        _ => portable_scores(q, ldq, kt, scores, m_pad, n_pad, dh, scale),
    }
}

/// [`attn_scores`] without vector instructions (and, on CPUs without FMA, with `mul_add` as a
/// library call: slow, but the same bits).
#[allow(clippy::too_many_arguments)]
fn portable_scores(
    q: &[f32],
    ldq: usize,
    kt: &[f32],
    scores: &mut [f32],
    m_pad: usize,
    n_pad: usize,
    dh: usize,
    scale: f32,
) {
    for i0 in (0..m_pad).step_by(IB) {
        for j0 in (0..n_pad).step_by(JB) {
            let mut acc = [[0.0f32; JB]; IB];
            for d in 0..dh {
                let k = &kt[d * n_pad + j0..][..JB];
                for (r, a) in acc.iter_mut().enumerate() {
                    let x = q[(i0 + r) * ldq + d];
                    a.iter_mut()
                        .zip(k)
                        .for_each(|(a, &k)| *a = x.mul_add(k, *a));
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let dst = &mut scores[(i0 + r) * n_pad + j0..][..JB];
                dst.iter_mut().zip(a).for_each(|(d, &a)| *d = a * scale);
            }
        }
    }
}

/// `out[i·ldo + c] = Σ_{j<n} p[i, j]·v[j·ldv + c]` for `i < m_pad` (a multiple of [`IB`]) and
/// `c < dh_pad` (a multiple of [`JB`]); `p` is `[m_pad, ldp]`, `v` holds `n` rows of `dh_pad` at
/// stride `ldv`.
///
/// # Safety
/// `out` must be valid for writes of `m_pad` rows of `dh_pad` at stride `ldo`, and no other
/// thread may access those elements during the call (the heads of one row are written by
/// different tasks, so the output is a pointer, not a slice of the whole row).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attn_values(
    p: &[f32],
    ldp: usize,
    v: &[f32],
    ldv: usize,
    out: *mut f32,
    ldo: usize,
    m_pad: usize,
    n: usize,
    dh_pad: usize,
) {
    // SAFETY: forwarded caller contract.
    unsafe { values_on(best_isa(), p, ldp, v, ldv, out, ldo, m_pad, n, dh_pad) }
}

/// [`attn_values`] on the kernels of `isa` (which the CPU must have: checked).
///
/// # Safety
/// As [`attn_values`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn values_on(
    isa: F32Kernel,
    p: &[f32],
    ldp: usize,
    v: &[f32],
    ldv: usize,
    out: *mut f32,
    ldo: usize,
    m_pad: usize,
    n: usize,
    dh_pad: usize,
) {
    assert!(isa.is_supported(), "{isa:?} kernels on a CPU without them");
    assert!(m_pad.is_multiple_of(IB) && dh_pad.is_multiple_of(JB) && n <= ldp && ldv >= dh_pad);
    assert!(p.len() >= m_pad * ldp && (n == 0 || v.len() >= (n - 1) * ldv + dh_pad));
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F; the input sizes were checked above and the caller
        // vouches for `out`.
        F32Kernel::Avx512 => unsafe { avx512::values(p, ldp, v, ldv, out, ldo, m_pad, n, dh_pad) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2 and FMA; as above.
        F32Kernel::Avx2 => unsafe { avx2::values(p, ldp, v, ldv, out, ldo, m_pad, n, dh_pad) },
        // SAFETY: as above.
        _ => unsafe { portable_values(p, ldp, v, ldv, out, ldo, m_pad, n, dh_pad) },
    }
}

/// [`attn_values`] without vector instructions.
///
/// # Safety
/// As [`attn_values`].
#[allow(clippy::too_many_arguments)]
unsafe fn portable_values(
    p: &[f32],
    ldp: usize,
    v: &[f32],
    ldv: usize,
    out: *mut f32,
    ldo: usize,
    m_pad: usize,
    n: usize,
    dh_pad: usize,
) {
    for i0 in (0..m_pad).step_by(IB) {
        for c0 in (0..dh_pad).step_by(JB) {
            let mut acc = [[0.0f32; JB]; IB];
            for j in 0..n {
                let vr = &v[j * ldv + c0..][..JB];
                for (r, a) in acc.iter_mut().enumerate() {
                    let x = p[(i0 + r) * ldp + j];
                    a.iter_mut()
                        .zip(vr)
                        .for_each(|(a, &v)| *a = x.mul_add(v, *a));
                }
            }
            for (r, a) in acc.iter().enumerate() {
                // SAFETY: row i0 + r < m_pad and columns c0..c0 + JB ≤ dh_pad: the caller's
                // writable block.
                unsafe { std::slice::from_raw_parts_mut(out.add((i0 + r) * ldo + c0), JB) }
                    .copy_from_slice(a);
            }
        }
    }
}

/// The AVX2 kernels: blocks of 4 rows × 16 columns (8 ymm accumulators; an [`IB`] × [`JB`]
/// block would need 32 of the 16 registers), each output the same FMA chain as everywhere.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Rows per AVX2 register block (divides [`super::IB`]).
    const RB: usize = 4;
    /// Columns per AVX2 register block (divides [`super::JB`]).
    const CB: usize = 16;

    /// `out[i·ldo + c] = scale · Σ_t x[i·ldx + t]·y[t·ldy + c]` (no multiply without `scale`)
    /// for `i < m` (a multiple of [`RB`]) and `c < n` (of [`CB`]), `t < depth`: both products'
    /// blocks, `q·kᵀ` (y = kᵀ) and `p·v`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `x` holds `m` rows of `depth` at stride `ldx`, `y`
    /// holds `depth` rows of `n` at stride `ldy`, `out` is writable for `m` rows of `n` at
    /// stride `ldo`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn blocks(
        (x, ldx): (*const f32, usize),
        (y, ldy): (*const f32, usize),
        depth: usize,
        (out, ldo): (*mut f32, usize),
        [m, n]: [usize; 2],
        scale: Option<f32>,
    ) {
        for i0 in (0..m).step_by(RB) {
            for c0 in (0..n).step_by(CB) {
                let mut acc = [[_mm256_setzero_ps(); 2]; RB];
                for t in 0..depth {
                    // SAFETY: t < depth, c0 + 16 <= n and i0 + RB <= m: inside `x` and `y`
                    // (caller contract).
                    unsafe {
                        let y0 = _mm256_loadu_ps(y.add(t * ldy + c0));
                        let y1 = _mm256_loadu_ps(y.add(t * ldy + c0 + 8));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let v = _mm256_broadcast_ss(&*x.add((i0 + r) * ldx + t));
                            a[0] = _mm256_fmadd_ps(v, y0, a[0]);
                            a[1] = _mm256_fmadd_ps(v, y1, a[1]);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    let (a0, a1) = match scale {
                        Some(s) => (
                            _mm256_mul_ps(a[0], _mm256_set1_ps(s)),
                            _mm256_mul_ps(a[1], _mm256_set1_ps(s)),
                        ),
                        None => (a[0], a[1]),
                    };
                    // SAFETY: row i0 + r < m, columns c0..c0 + 16 <= n of `out` (caller
                    // contract).
                    unsafe {
                        let o = out.add((i0 + r) * ldo + c0);
                        _mm256_storeu_ps(o, a0);
                        _mm256_storeu_ps(o.add(8), a1);
                    }
                }
            }
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; sizes as checked by [`super::attn_scores`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores(
        q: &[f32],
        ldq: usize,
        kt: &[f32],
        scores: &mut [f32],
        m_pad: usize,
        n_pad: usize,
        dh: usize,
        scale: f32,
    ) {
        // SAFETY: the caller checked that `q`, `kt` and `scores` hold these blocks.
        unsafe {
            blocks(
                (q.as_ptr(), ldq),
                (kt.as_ptr(), n_pad),
                dh,
                (scores.as_mut_ptr(), n_pad),
                [m_pad, n_pad],
                Some(scale),
            )
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; otherwise as [`super::attn_values`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn values(
        p: &[f32],
        ldp: usize,
        v: &[f32],
        ldv: usize,
        op: *mut f32,
        ldo: usize,
        m_pad: usize,
        n: usize,
        dh_pad: usize,
    ) {
        // SAFETY: the caller checked `p` and `v` and vouches for `op`.
        unsafe {
            blocks(
                (p.as_ptr(), ldp),
                (v.as_ptr(), ldv),
                n,
                (op, ldo),
                [m_pad, dh_pad],
                None,
            )
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{IB, JB};
    use std::arch::x86_64::*;

    /// See [`super::attn_scores`]: 8 rows × 32 columns in 16 accumulators, per `d` two loads of
    /// `kt` and eight broadcasts of `q`.
    ///
    /// # Safety
    /// AVX-512F; the slice sizes checked by the caller.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores(
        q: &[f32],
        ldq: usize,
        kt: &[f32],
        scores: &mut [f32],
        m_pad: usize,
        n_pad: usize,
        dh: usize,
        scale: f32,
    ) {
        let (qp, kp, sp) = (q.as_ptr(), kt.as_ptr(), scores.as_mut_ptr());
        let vs = _mm512_set1_ps(scale);
        for i0 in (0..m_pad).step_by(IB) {
            // The next block's query rows, a head's few cache lines every `ldq` floats (3H
            // apart in place in the QKV output): too far apart for the hardware prefetcher,
            // so each first read of a row would wait on L3 while its FMAs stand idle.
            if i0 + IB < m_pad {
                for r in i0 + IB..i0 + 2 * IB {
                    for line in (0..dh).step_by(16) {
                        // SAFETY: a prefetch is a hint and never faults; the address is
                        // inside `q` (row r < m_pad, column < dh).
                        unsafe { _mm_prefetch::<_MM_HINT_T0>(qp.add(r * ldq + line) as *const i8) };
                    }
                }
            }
            for j0 in (0..n_pad).step_by(JB) {
                let mut acc = [[_mm512_setzero_ps(); 2]; IB];
                for d in 0..dh {
                    // SAFETY: d < dh, j0 + JB ≤ n_pad, i0 + IB ≤ m_pad: inside the slices.
                    unsafe {
                        let k0 = _mm512_loadu_ps(kp.add(d * n_pad + j0));
                        let k1 = _mm512_loadu_ps(kp.add(d * n_pad + j0 + 16));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let x = _mm512_set1_ps(*qp.add((i0 + r) * ldq + d));
                            a[0] = _mm512_fmadd_ps(x, k0, a[0]);
                            a[1] = _mm512_fmadd_ps(x, k1, a[1]);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    // SAFETY: row i0 + r < m_pad, columns j0..j0 + JB ≤ n_pad.
                    unsafe {
                        let o = sp.add((i0 + r) * n_pad + j0);
                        _mm512_storeu_ps(o, _mm512_mul_ps(a[0], vs));
                        _mm512_storeu_ps(o.add(16), _mm512_mul_ps(a[1], vs));
                    }
                }
            }
        }
    }

    /// See [`super::attn_values`]: 8 rows × 32 columns in 16 accumulators, per key two loads of
    /// `v` and eight broadcasts of `p`.
    ///
    /// # Safety
    /// AVX-512F; the slice sizes checked by the caller; `out` as in [`super::attn_values`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn values(
        p: &[f32],
        ldp: usize,
        v: &[f32],
        ldv: usize,
        op: *mut f32,
        ldo: usize,
        m_pad: usize,
        n: usize,
        dh_pad: usize,
    ) {
        let (pp, vp) = (p.as_ptr(), v.as_ptr());
        for i0 in (0..m_pad).step_by(IB) {
            for c0 in (0..dh_pad).step_by(JB) {
                let mut acc = [[_mm512_setzero_ps(); 2]; IB];
                for j in 0..n {
                    // SAFETY: j < n, c0 + JB ≤ dh_pad, i0 + IB ≤ m_pad, j < ldp.
                    unsafe {
                        let v0 = _mm512_loadu_ps(vp.add(j * ldv + c0));
                        let v1 = _mm512_loadu_ps(vp.add(j * ldv + c0 + 16));
                        for (r, a) in acc.iter_mut().enumerate() {
                            let x = _mm512_set1_ps(*pp.add((i0 + r) * ldp + j));
                            a[0] = _mm512_fmadd_ps(x, v0, a[0]);
                            a[1] = _mm512_fmadd_ps(x, v1, a[1]);
                        }
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    // SAFETY: row i0 + r < m_pad, columns c0..c0 + JB ≤ dh_pad: the caller's
                    // writable block.
                    unsafe {
                        let o = op.add((i0 + r) * ldo + c0);
                        _mm512_storeu_ps(o, a[0]);
                        _mm512_storeu_ps(o.add(16), a[1]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels against a plain f64-free reference with the same FMA order: bit-exact, with
    /// rows read and written at strides wider than a head (heads in place in `[S, H]`).
    #[test]
    fn kernels_equal_the_sequential_fma_chain() {
        for isa in F32Kernel::ALL.into_iter().filter(|k| k.is_supported()) {
            kernels_of_isa_equal_the_sequential_fma_chain(isa);
        }
    }

    fn kernels_of_isa_equal_the_sequential_fma_chain(isa: F32Kernel) {
        let mut draw = super::super::lcg24(7);
        let mut rnd = || draw() as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
        let (m_pad, n, dh): (usize, usize, usize) = (16, 45, 24);
        let n_pad = n.div_ceil(JB) * JB;
        let dh_pad = dh.div_ceil(JB) * JB;
        let (ldq, ldv, ldo) = (dh + 5, dh_pad + 7, dh_pad + 3);
        let q: Vec<f32> = (0..m_pad * ldq).map(|_| rnd()).collect();
        let kt: Vec<f32> = (0..dh * n_pad).map(|_| rnd()).collect();
        let mut s = vec![0f32; m_pad * n_pad];
        scores_on(isa, &q, ldq, &kt, &mut s, m_pad, n_pad, dh, 0.125);
        for i in 0..m_pad {
            for j in 0..n_pad {
                let mut a = 0f32;
                for d in 0..dh {
                    a = q[i * ldq + d].mul_add(kt[d * n_pad + j], a);
                }
                assert_eq!(s[i * n_pad + j], a * 0.125, "{isa:?} score {i},{j}");
            }
        }
        let v: Vec<f32> = (0..n * ldv).map(|_| rnd()).collect();
        let mut o = vec![f32::NAN; m_pad * ldo];
        // SAFETY: `o` holds m_pad rows of dh_pad at stride ldo.
        unsafe {
            values_on(
                isa,
                &s,
                n_pad,
                &v,
                ldv,
                o.as_mut_ptr(),
                ldo,
                m_pad,
                n,
                dh_pad,
            )
        };
        for i in 0..m_pad {
            for c in 0..ldo {
                if c >= dh_pad {
                    assert!(
                        o[i * ldo + c].is_nan(),
                        "wrote outside the block at {i},{c}"
                    );
                    continue;
                }
                let mut a = 0f32;
                for j in 0..n {
                    a = s[i * n_pad + j].mul_add(v[j * ldv + c], a);
                }
                assert_eq!(o[i * ldo + c], a, "{isa:?} value {i},{c}");
            }
        }
    }
}
