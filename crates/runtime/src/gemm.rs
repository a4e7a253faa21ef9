//! FP32 matrix products on the codegen kernels: weights packed once at compile time
//! ([`PackedWeight`]), activations × activations packed per call.

use codegen::jit::{CompiledF32Unit, CompiledUnit};
use codegen::kernels::f32::gemm_f32_jit;
use codegen::kernels::{
    gemm_f32, gemm_f32_unpacked, EpilogueF32, F32Kernel, Int8Kernel, PackedF32,
};

use crate::exec::Ctx;

/// A constant weight in the layout of the GEMM kernel, made once per session, with the
/// JIT-compiled loop nest of its GEMMs when lowering made one.
pub(crate) struct PackedWeight(PackedF32, Option<CompiledF32Unit>);

impl PackedWeight {
    /// Packs `b`, which is `[k, n]` row-major, or `[n, k]` when `transposed`, for `kernel`
    /// (which this CPU must support); its GEMMs run `unit`'s compiled loop nest when given.
    pub fn pack(
        b: &[f32],
        k: usize,
        n: usize,
        transposed: bool,
        kernel: F32Kernel,
        unit: Option<CompiledF32Unit>,
    ) -> PackedWeight {
        let ld = if transposed { k } else { n };
        PackedWeight(
            PackedF32::pack_strided(kernel, b, k, n, ld, transposed),
            unit,
        )
    }

    pub fn k(&self) -> usize {
        self.0.k()
    }

    pub fn n(&self) -> usize {
        self.0.n()
    }
}

/// `c[m, n] = a[m, k] · w (+ bias[n])`; `a` rows are `lda` apart, `c` is contiguous.
pub(crate) fn gemm_packed(
    ctx: &Ctx<'_>,
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedWeight,
    c: &mut [f32],
    bias: Option<&[f32]>,
) {
    let ep = match bias {
        Some(b) => EpilogueF32::bias(b),
        None => EpilogueF32::none(),
    };
    gemm_packed_program(ctx, m, a, lda, w, c, &ep);
}

/// `c[m, n] = alpha · a[m, k] · op(b)` with `op(b) = b` (`[k, n]`, rows `ldb` apart) or `bᵀ`
/// (`b` is `[n, k]`). `c` is contiguous and overwritten.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_unpacked(
    ctx: &Ctx<'_>,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    b_transposed: bool,
    c: &mut [f32],
    alpha: f32,
) {
    if k == 0 {
        c[..m * n].fill(0.0);
        return;
    }
    let threads = ctx.gemm_threads(m * n * k);
    gemm_f32_unpacked(m, n, k, a, lda, b, ldb, b_transposed, c, n, alpha, threads);
}

/// A constant s8 weight `[k, n]` in the layout of the int8 kernel picked for this CPU (with its
/// column sums, which carry the activation zero-point compensation), made once per session.
pub(crate) struct PackedWeightI8(codegen::kernels::PackedI8, Option<CompiledUnit>);

impl PackedWeightI8 {
    /// Packs `w` (`[k, n]` row-major) for `kernel` when given, else for the picker's kernel;
    /// its GEMMs run `unit`'s compiled loop nest when given.
    pub fn pack(
        w: &[i8],
        k: usize,
        n: usize,
        kernel: Option<Int8Kernel>,
        unit: Option<CompiledUnit>,
    ) -> Result<PackedWeightI8, codegen::kernels::KernelError> {
        match kernel {
            Some(kern) => codegen::kernels::PackedI8::pack_for(kern, w, k, n, n, false),
            None => codegen::kernels::PackedI8::pack(w, k, n, false),
        }
        .map(|p| PackedWeightI8(p, unit))
    }

    /// The JIT-compiled loop nest of this weight's GEMMs.
    pub fn unit(&self) -> Option<&CompiledUnit> {
        self.1.as_ref()
    }

    pub fn k(&self) -> usize {
        self.0.k()
    }

    pub fn n(&self) -> usize {
        self.0.n()
    }

    pub fn inner(&self) -> &codegen::kernels::PackedI8 {
        &self.0
    }
}

/// `c[m, n] = epilogue(a[m, k] · w)` in f32 with a prepacked weight and any epilogue program.
pub(crate) fn gemm_packed_program(
    ctx: &Ctx<'_>,
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedWeight,
    c: &mut [f32],
    ep: &EpilogueF32<'_>,
) {
    let n = w.n();
    let threads = ctx.gemm_threads(m * n * w.k());
    match &w.1 {
        Some(unit) => {
            gemm_f32_jit(m, a, lda, &w.0, c, n, ep, threads, unit);
        }
        None => gemm_f32(m, a, lda, &w.0, c, n, ep, threads),
    }
}
