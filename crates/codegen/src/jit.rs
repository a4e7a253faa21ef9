//! Cranelift JIT glue: the loop nest of an int8 GEMM work unit, compiled for one shape.
//!
//! A unit of [`crate::kernels::int8`]'s driver is a block of rows × a block of weight panels.
//! Its loop nest (micro-panel rows, epilogue chunks of panels, panels) calls the hand-written
//! microkernel on each `mr × nr` tile and the epilogue on each finished chunk. Compiled here, the
//! nest is specialised to the [`UnitShape`] (register blocking, padded K, accumulator stride) and
//! to the microkernel, whose address is a constant of the code: strides are immediates and the
//! microkernel call is direct to its address rather than through the driver's trait object. No
//! compute is generated (Cranelift emits 128-bit vectors only): the microkernels stay
//! hand-written.
//!
//! Compiled units are cached for the life of the process by shape and microkernel. When the
//! platform refuses executable memory (or the host is not one Cranelift targets) [`compile_unit`]
//! returns an error and callers run the same nest interpreted; the two are bit-identical (the
//! same calls in the same order).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, AbiParam, InstBuilder, Signature, Type, UserFuncName};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};

use crate::kernels::f32::UKernel as F32UKernel;
use crate::kernels::int8::UKernel;

/// The constants a unit's loop nest is specialised on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnitShape {
    /// Rows per microkernel call.
    pub mr: usize,
    /// Columns per microkernel call (one packed panel).
    pub nr: usize,
    /// K padded to the kernel's alignment.
    pub k_pad: usize,
    /// Bytes per row of a packed A micro-panel: `k_pad`, or twice that where the kernel takes
    /// its activations widened to u16 (AVX2).
    pub a_row_bytes: usize,
    /// Stride of the i32 accumulator, in elements.
    pub ldacc: usize,
}

/// Called by the compiled nest after each chunk of panels of a micro-panel row:
/// `(env, micro-panel row index, first panel, end panel)`.
pub type EpilogueCallback = unsafe extern "C" fn(*mut c_void, usize, usize, usize);

/// A compiled unit: `(a_rows, b_panels, acc, env, rows, pan_start, pan_end, chunk, next,
/// next_len)`.
///
/// For each micro-panel row `ip < ceil(rows / mr)` and each chunk `[p0, p1)` of at most `chunk`
/// panels of `[pan_start, pan_end)`: the microkernel on every panel `p` of the chunk, with A at
/// `a_rows + ip·mr·a_row_bytes`, B at `b_panels + p·k_pad·nr`, C at `acc + (p − p0)·nr` i32 (every
/// chunk at the start of the accumulator) and
/// its prefetch hint (`next`) taken from `[next, next + next_len)`: null in row 0 and once the
/// range is used up, else the range's next `k_pad / 4` lines (the cursor then moves by `16·k_pad`
/// bytes); then the epilogue callback with `(env, ip, p0, p1)`.
pub type UnitFn = unsafe extern "C" fn(
    *const u8,
    *const i8,
    *mut i32,
    *mut c_void,
    usize,
    usize,
    usize,
    usize,
    *const i8,
    usize,
);

/// A compiled loop nest and what it cost: its shape, the microkernel and callback its code
/// calls (addresses baked in), the code, and Cranelift's time for it (when it was first asked
/// for in this process).
#[derive(Debug, Clone, Copy)]
pub struct Compiled<S, K, C, F> {
    pub shape: S,
    pub ukernel: K,
    pub callback: C,
    pub f: F,
    pub compile_time: Duration,
}

/// A compiled int8 unit (callback: the epilogue of each chunk).
pub type CompiledUnit = Compiled<UnitShape, UKernel, EpilogueCallback, UnitFn>;

/// Why a unit could not be compiled (the caller runs the interpreted nest instead).
#[derive(Debug, Clone, thiserror::Error)]
pub enum JitError {
    #[error("JIT unavailable on this host: {0}")]
    Unavailable(String),
    #[error("JIT compilation failed: {0}")]
    Compile(String),
}

/// The constants an f32 unit's loop nest is specialised on: the weight's depth and width, the
/// register blocking and the K block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct F32UnitShape {
    pub mr: usize,
    pub nr: usize,
    /// Depth of the weight.
    pub k: usize,
    /// Columns of the weight.
    pub n: usize,
    /// K block: A is packed `kc` columns at a time.
    pub kc: usize,
}

/// Called by a compiled f32 nest to pack A's K block `kb` of the unit: `(env, kb) -> kc` (the
/// block's depth). Then `(env)` again with `kb = usize::MAX` for the epilogue of the finished
/// unit.
pub type F32Callback = unsafe extern "C" fn(*mut c_void, usize) -> usize;

/// A compiled f32 unit: `(b_panels, c, ldc, env, first row, rows, pan_start, pan_end, apack)`.
///
/// For each K block `kb`: the pack callback (A rows into `apack`), then for each micro-panel row
/// `ip` and panel `p` the microkernel with `(kc, apack + ip·mr·kc, b_panels + p·k·nr + kb·kc·nr,
/// c + (row + ip·mr)·ldc + p·nr, ldc, min(mr, rows − ip·mr), min(nr, n − p·nr), kb > 0)`; at the
/// end the callback with `usize::MAX` (the epilogue).
pub type F32UnitFn = unsafe extern "C" fn(
    *const f32,
    *mut f32,
    usize,
    *mut c_void,
    usize,
    usize,
    usize,
    usize,
    *const f32,
);

/// A compiled f32 unit (callback: A packing per K block, then the unit's epilogue).
pub type CompiledF32Unit = Compiled<F32UnitShape, F32UKernel, F32Callback, F32UnitFn>;

/// What a cached unit was compiled for: its shape, microkernel and callback addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum CacheKey {
    Int8(UnitShape, usize, usize),
    F32(F32UnitShape, usize, usize),
}

struct Jit {
    module: JITModule,
    ctx: cranelift_codegen::Context,
    fctx: FunctionBuilderContext,
    /// Code address and compile time of every unit made.
    cache: HashMap<CacheKey, (usize, Duration)>,
    next_id: usize,
}

// SAFETY: the module is only reached through the mutex below, one thread at a time; its
// finalized code is immutable and may be called from any thread.
unsafe impl Send for Jit {}

fn jit() -> Result<&'static Mutex<Jit>, JitError> {
    static JIT: OnceLock<Result<Mutex<Jit>, JitError>> = OnceLock::new();
    JIT.get_or_init(|| {
        let mut flags = settings::builder();
        let set = |f: &mut settings::Builder, k: &str, v: &str| {
            f.set(k, v)
                .map_err(|e| JitError::Unavailable(format!("flag {k}: {e}")))
        };
        set(&mut flags, "use_colocated_libcalls", "false")?;
        set(&mut flags, "is_pic", "false")?;
        set(&mut flags, "opt_level", "speed")?;
        let isa = cranelift_native::builder()
            .map_err(|e| JitError::Unavailable(e.to_string()))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| JitError::Unavailable(e.to_string()))?;
        let module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
        let ctx = module.make_context();
        Ok(Mutex::new(Jit {
            module,
            ctx,
            fctx: FunctionBuilderContext::new(),
            cache: HashMap::new(),
            next_id: 0,
        }))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether `ENCORE_JIT=0` (or `off`) asks for the interpreted loops.
pub fn disabled_by_env() -> bool {
    std::env::var("ENCORE_JIT").is_ok_and(|v| v == "0" || v.eq_ignore_ascii_case("off"))
}

/// The code cached for `key`, or what `build` makes for it (then cached), with its compile time.
fn cached(
    key: CacheKey,
    build: impl FnOnce(&mut Jit) -> Result<*const u8, JitError>,
) -> Result<(*const u8, Duration), JitError> {
    let mut guard = jit()?.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(code, time)) = guard.cache.get(&key) {
        return Ok((code as *const u8, time));
    }
    let t0 = Instant::now();
    let code = build(&mut guard)?;
    let time = t0.elapsed();
    guard.cache.insert(key, (code as usize, time));
    Ok((code, time))
}

/// The compiled unit for `shape` calling `ukernel` and `epilogue`, compiled on first request.
pub fn compile_unit(
    shape: UnitShape,
    ukernel: UKernel,
    epilogue: EpilogueCallback,
) -> Result<CompiledUnit, JitError> {
    if shape.mr == 0
        || shape.nr == 0
        || !shape.k_pad.is_multiple_of(4)
        || shape.a_row_bytes < shape.k_pad
    {
        return Err(JitError::Compile(format!("bad unit shape {shape:?}")));
    }
    let key = CacheKey::Int8(shape, ukernel as usize, epilogue as usize);
    let (code, compile_time) = cached(key, |jit| build(jit, shape, ukernel, epilogue))?;
    Ok(CompiledUnit {
        shape,
        ukernel,
        callback: epilogue,
        // SAFETY: `build` made this code with exactly `UnitFn`'s signature (ten
        // pointer-sized integers, the platform's C convention, no return value), finalized.
        f: unsafe { std::mem::transmute::<*const u8, UnitFn>(code) },
        compile_time,
    })
}

/// A signature in the platform's C convention: `params` pointer-sized integers, then `extra`,
/// returning a pointer-sized integer when `returns`.
fn c_signature(module: &JITModule, params: usize, extra: &[Type], returns: bool) -> Signature {
    let ptr = module.target_config().pointer_type();
    let mut s = Signature::new(module.isa().default_call_conv());
    s.params.extend((0..params).map(|_| AbiParam::new(ptr)));
    s.params.extend(extra.iter().map(|&t| AbiParam::new(t)));
    if returns {
        s.returns.push(AbiParam::new(ptr));
    }
    s
}

/// Declares a new function `name` (made unique) with `sig` and points `jit.ctx` at it.
fn start_function(
    jit: &mut Jit,
    name: &str,
    sig: Signature,
) -> Result<cranelift_module::FuncId, JitError> {
    let name = format!("{name}_{}", jit.next_id);
    jit.next_id += 1;
    let id = jit
        .module
        .declare_function(&name, Linkage::Local, &sig)
        .map_err(|e| JitError::Compile(e.to_string()))?;
    jit.ctx.func.signature = sig;
    jit.ctx.func.name = UserFuncName::user(0, id.as_u32());
    Ok(id)
}

fn build(
    jit: &mut Jit,
    shape: UnitShape,
    ukernel: UKernel,
    epilogue: EpilogueCallback,
) -> Result<*const u8, JitError> {
    let i64t = types::I64;
    debug_assert_eq!(jit.module.target_config().pointer_type(), i64t);
    let ukernel_sig = c_signature(&jit.module, 6, &[], false);
    let epilogue_sig = c_signature(&jit.module, 4, &[], false);
    let name = format!(
        "unit_mr{}_nr{}_k{}_ld{}",
        shape.mr, shape.nr, shape.k_pad, shape.ldacc
    );
    let id = start_function(jit, &name, c_signature(&jit.module, 10, &[], false))?;
    let frontend_config = jit.module.target_config();
    let ctx = &mut jit.ctx;
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut jit.fctx);
        let uk_ref = b.import_signature(ukernel_sig);
        let ep_ref = b.import_signature(epilogue_sig);
        let entry = b.create_block();
        let ip_head = b.create_block();
        let chunk_head = b.create_block();
        let pan_head = b.create_block();
        let pan_body = b.create_block();
        let chunk_end = b.create_block();
        let ip_end = b.create_block();
        let exit = b.create_block();

        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        let (a_rows, b_panels, acc, env, rows, pan_start, pan_end, chunk) =
            (p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
        let (next_start, next_len) = (p[8], p[9]);
        let next_end = b.ins().iadd(next_start, next_len);
        let cursor = b.declare_var(i64t);
        b.def_var(cursor, next_start);
        let ip = b.declare_var(i64t);
        let p0 = b.declare_var(i64t);
        let p1 = b.declare_var(i64t);
        let pan = b.declare_var(i64t);
        // mpan = ceil(rows / mr)
        let rows_up = b.ins().iadd_imm_u(rows, shape.mr as i64 - 1);
        let mpan = b.ins().udiv_imm_u(rows_up, shape.mr as i64);
        let zero = b.ins().iconst(i64t, 0);
        b.def_var(ip, zero);
        b.ins().jump(ip_head, &[]);

        // for ip in 0..mpan
        b.switch_to_block(ip_head);
        let ipv = b.use_var(ip);
        let more = b.ins().icmp(IntCC::UnsignedLessThan, ipv, mpan);
        b.def_var(p0, pan_start);
        b.ins().brif(more, chunk_head, &[], exit, &[]);

        // while p0 < pan_end: p1 = min(p0 + chunk, pan_end)
        b.switch_to_block(chunk_head);
        let p0v = b.use_var(p0);
        let more = b.ins().icmp(IntCC::UnsignedLessThan, p0v, pan_end);
        let next = b.ins().iadd(p0v, chunk);
        let p1v = b.ins().umin(next, pan_end);
        b.def_var(p1, p1v);
        b.def_var(pan, p0v);
        b.ins().brif(more, pan_head, &[], ip_end, &[]);

        // for pan in p0..p1: ukernel(kc4, A micro-panel, B panel, acc tile, ldacc)
        b.switch_to_block(pan_head);
        let panv = b.use_var(pan);
        let p1v = b.use_var(p1);
        let more = b.ins().icmp(IntCC::UnsignedLessThan, panv, p1v);
        b.ins().brif(more, pan_body, &[], chunk_end, &[]);

        b.switch_to_block(pan_body);
        let ipv = b.use_var(ip);
        let panv = b.use_var(pan);
        let a_off = b
            .ins()
            .imul_imm_u(ipv, (shape.mr * shape.a_row_bytes) as i64);
        let a_ptr = b.ins().iadd(a_rows, a_off);
        let b_off = b.ins().imul_imm_u(panv, (shape.k_pad * shape.nr) as i64);
        let b_ptr = b.ins().iadd(b_panels, b_off);
        let p0v = b.use_var(p0);
        let rel = b.ins().isub(panv, p0v);
        let c_off = b.ins().imul_imm_u(rel, (shape.nr * 4) as i64);
        let c_ptr = b.ins().iadd(acc, c_off);
        let kc4 = b.ins().iconst(i64t, (shape.k_pad / 4) as i64);
        let ldacc = b.ins().iconst(i64t, shape.ldacc as i64);
        // The prefetch hint: the next lines of the range in rows after the first.
        let nextv = b.use_var(cursor);
        let later = b.ins().icmp_imm_u(IntCC::NotEqual, ipv, 0);
        let left = b.ins().icmp(IntCC::UnsignedLessThan, nextv, next_end);
        let take = b.ins().band(later, left);
        let null = b.ins().iconst(i64t, 0);
        let hint = b.ins().select(take, nextv, null);
        let moved = b.ins().iadd_imm_u(nextv, (16 * shape.k_pad) as i64);
        let nextv = b.ins().select(take, moved, nextv);
        b.def_var(cursor, nextv);
        let callee = b.ins().iconst(i64t, ukernel as usize as i64);
        b.ins()
            .call_indirect(uk_ref, callee, &[kc4, a_ptr, b_ptr, c_ptr, ldacc, hint]);
        let next = b.ins().iadd_imm_u(panv, 1i64);
        b.def_var(pan, next);
        b.ins().jump(pan_head, &[]);

        // epilogue(env, ip, p0, p1); p0 = p1
        b.switch_to_block(chunk_end);
        let ipv = b.use_var(ip);
        let p0v = b.use_var(p0);
        let p1v = b.use_var(p1);
        let callee = b.ins().iconst(i64t, epilogue as usize as i64);
        b.ins().call_indirect(ep_ref, callee, &[env, ipv, p0v, p1v]);
        b.def_var(p0, p1v);
        b.ins().jump(chunk_head, &[]);

        b.switch_to_block(ip_end);
        let ipv = b.use_var(ip);
        let next = b.ins().iadd_imm_u(ipv, 1i64);
        b.def_var(ip, next);
        b.ins().jump(ip_head, &[]);

        b.switch_to_block(exit);
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize(frontend_config);
    }
    finish(&mut jit.module, ctx, id)
}

/// Defines the function built in `ctx`, finalizes it and returns its code address.
fn finish(
    module: &mut JITModule,
    ctx: &mut cranelift_codegen::Context,
    id: cranelift_module::FuncId,
) -> Result<*const u8, JitError> {
    let defined = module.define_function(id, ctx);
    module.clear_context(ctx);
    defined.map_err(|e| JitError::Compile(format!("{e:?}")))?;
    module
        .finalize_definitions()
        .map_err(|e| JitError::Unavailable(e.to_string()))?;
    Ok(module.get_finalized_function(id))
}

/// The compiled f32 unit for `shape` calling `ukernel` and `callback`, compiled on first request.
pub fn compile_f32_unit(
    shape: F32UnitShape,
    ukernel: F32UKernel,
    callback: F32Callback,
) -> Result<CompiledF32Unit, JitError> {
    if shape.mr == 0 || shape.nr == 0 || shape.kc == 0 {
        return Err(JitError::Compile(format!("bad unit shape {shape:?}")));
    }
    let key = CacheKey::F32(shape, ukernel as usize, callback as usize);
    let (code, compile_time) = cached(key, |jit| build_f32(jit, shape, ukernel, callback))?;
    Ok(CompiledF32Unit {
        shape,
        ukernel,
        callback,
        // SAFETY: `build_f32` made this code with exactly `F32UnitFn`'s signature (nine
        // pointer-sized integers, the C convention, no return value), finalized.
        f: unsafe { std::mem::transmute::<*const u8, F32UnitFn>(code) },
        compile_time,
    })
}

fn build_f32(
    jit: &mut Jit,
    shape: F32UnitShape,
    ukernel: F32UKernel,
    callback: F32Callback,
) -> Result<*const u8, JitError> {
    let i64t = types::I64;
    let ukernel_sig = c_signature(&jit.module, 7, &[types::I8], false);
    let callback_sig = c_signature(&jit.module, 2, &[], true);
    let name = format!(
        "f32_unit_mr{}_nr{}_k{}_n{}_kc{}",
        shape.mr, shape.nr, shape.k, shape.n, shape.kc
    );
    let id = start_function(jit, &name, c_signature(&jit.module, 9, &[], false))?;
    let frontend_config = jit.module.target_config();
    let ctx = &mut jit.ctx;
    let k_blocks = shape.k.div_ceil(shape.kc).max(1);
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut jit.fctx);
        let uk_ref = b.import_signature(ukernel_sig);
        let cb_ref = b.import_signature(callback_sig);
        let entry = b.create_block();
        let kb_head = b.create_block();
        let ip_head = b.create_block();
        let pan_head = b.create_block();
        let pan_body = b.create_block();
        let ip_end = b.create_block();
        let kb_body = b.create_block();
        let exit = b.create_block();

        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        let (b_panels, c, ldc, env, row0, rows, pan_start, pan_end, apack) =
            (p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]);
        let kb = b.declare_var(i64t);
        let kcl = b.declare_var(i64t);
        let ip = b.declare_var(i64t);
        let pan = b.declare_var(i64t);
        let rows_up = b.ins().iadd_imm_u(rows, shape.mr as i64 - 1);
        let mpan = b.ins().udiv_imm_u(rows_up, shape.mr as i64);
        let cb = b.ins().iconst(i64t, callback as usize as i64);
        let zero = b.ins().iconst(i64t, 0);
        b.def_var(kb, zero);
        b.ins().jump(kb_head, &[]);

        // for kb in 0..k_blocks: kcl = pack(env, kb)
        b.switch_to_block(kb_head);
        let kbv = b.use_var(kb);
        let more = b
            .ins()
            .icmp_imm_u(IntCC::UnsignedLessThan, kbv, k_blocks as i64);
        b.ins().brif(more, kb_body, &[], exit, &[]);

        b.switch_to_block(kb_body);
        let kbv = b.use_var(kb);
        let call = b.ins().call_indirect(cb_ref, cb, &[env, kbv]);
        let kc_now = b.inst_results(call)[0];
        b.def_var(kcl, kc_now);
        b.def_var(ip, zero);
        b.ins().jump(ip_head, &[]);

        // for ip in 0..mpan
        b.switch_to_block(ip_head);
        let ipv = b.use_var(ip);
        let more = b.ins().icmp(IntCC::UnsignedLessThan, ipv, mpan);
        b.def_var(pan, pan_start);
        b.ins().brif(more, pan_head, &[], ip_end, &[]);

        // for pan in pan_start..pan_end: the microkernel on one tile
        b.switch_to_block(pan_head);
        let panv = b.use_var(pan);
        let more = b.ins().icmp(IntCC::UnsignedLessThan, panv, pan_end);
        let next_ip_block = b.create_block();
        b.ins().brif(more, pan_body, &[], next_ip_block, &[]);

        b.switch_to_block(pan_body);
        let ipv = b.use_var(ip);
        let panv = b.use_var(pan);
        let kbv = b.use_var(kb);
        let kcv = b.use_var(kcl);
        let ip_rows = b.ins().imul_imm_u(ipv, shape.mr as i64);
        // A micro-panel ip: apack + ip·mr·kc floats
        let a_off = b.ins().imul(ip_rows, kcv);
        let a_off = b.ins().imul_imm_u(a_off, 4);
        let a_ptr = b.ins().iadd(apack, a_off);
        // B: p·k·nr + kb·kc_max·nr floats
        let b_off = b.ins().imul_imm_u(panv, (shape.k * shape.nr * 4) as i64);
        let kb_off = b.ins().imul_imm_u(kbv, (shape.kc * shape.nr * 4) as i64);
        let b_off = b.ins().iadd(b_off, kb_off);
        let b_ptr = b.ins().iadd(b_panels, b_off);
        // C: (row0 + ip·mr)·ldc + p·nr floats
        let row = b.ins().iadd(row0, ip_rows);
        let c_off = b.ins().imul(row, ldc);
        let col = b.ins().imul_imm_u(panv, shape.nr as i64);
        let c_off = b.ins().iadd(c_off, col);
        let c_off = b.ins().imul_imm_u(c_off, 4);
        let c_ptr = b.ins().iadd(c, c_off);
        // mv = min(mr, rows − ip·mr), nv = min(nr, n − p·nr)
        let left = b.ins().isub(rows, ip_rows);
        let mr_c = b.ins().iconst(i64t, shape.mr as i64);
        let mv = b.ins().umin(left, mr_c);
        let n_c = b.ins().iconst(i64t, shape.n as i64);
        let cols_left = b.ins().isub(n_c, col);
        let nr_c = b.ins().iconst(i64t, shape.nr as i64);
        let nv = b.ins().umin(cols_left, nr_c);
        let acc = b.ins().icmp_imm_u(IntCC::NotEqual, kbv, 0i64);
        let callee = b.ins().iconst(i64t, ukernel as usize as i64);
        b.ins().call_indirect(
            uk_ref,
            callee,
            &[kcv, a_ptr, b_ptr, c_ptr, ldc, mv, nv, acc],
        );
        let next = b.ins().iadd_imm_u(panv, 1i64);
        b.def_var(pan, next);
        b.ins().jump(pan_head, &[]);

        b.switch_to_block(next_ip_block);
        let ipv = b.use_var(ip);
        let next = b.ins().iadd_imm_u(ipv, 1i64);
        b.def_var(ip, next);
        b.ins().jump(ip_head, &[]);

        b.switch_to_block(ip_end);
        let kbv = b.use_var(kb);
        let next = b.ins().iadd_imm_u(kbv, 1i64);
        b.def_var(kb, next);
        b.ins().jump(kb_head, &[]);

        // the epilogue of the finished unit
        b.switch_to_block(exit);
        let done = b.ins().iconst(i64t, -1i64);
        b.ins().call_indirect(cb_ref, cb, &[env, done]);
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize(frontend_config);
    }
    finish(&mut jit.module, ctx, id)
}
