//! Heap allocations of `Session::run` in the steady state, counted by a global allocator (this
//! test binary only, one test so that no other test allocates beside it).
//!
//! The goal of issue 7 part 4 is no allocation per run. What the caller is handed is allowed:
//! the result vector, and per output its name and its buffer (the buffer leaves the session's
//! arena, which allocates one to replace it). Nothing else: after warm-up a run allocates exactly
//! `1 + 2 × outputs` times, the same every run, and no allocation besides the outputs' is of
//! activation size. With `Session::run_into` and one output vector kept from run to run, a run
//! allocates nothing at all (batches run in parts included); with `run_output` and
//! `Session::recycle`, only the result vector and the names. Shapes are inline, the kernels' bookkeeping (epilogue programs, thread
//! partitions, attention plans, row maps, quantization parameters) lives on the stack or in
//! the arena, and small values of every dtype are recycled like activations.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::*;
use runtime::{Model, Outputs, Session, TensorValue};

struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// Allocations by size class: `[0]` < 64 B, `[i]` in `[2^(i+5), 2^(i+6))`, the last ≥ 2^(CLASSES+4).
const CLASSES: usize = 24;
static BY_SIZE: [AtomicUsize; CLASSES] = [const { AtomicUsize::new(0) }; CLASSES];

/// `ENCORE_ALLOC_TRACE=BYTES`: print where every counted allocation of at least BYTES comes from
/// (a backtrace; its own allocations are not counted).
static TRACE_MIN: AtomicUsize = AtomicUsize::new(usize::MAX);

thread_local! {
    static IN_TRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn note(size: usize) {
    if !ON.load(Ordering::Relaxed) || IN_TRACE.with(|t| t.get()) {
        return;
    }
    COUNT.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(size, Ordering::Relaxed);
    let class = (usize::BITS - (size >> 6).leading_zeros()) as usize;
    BY_SIZE[class.min(CLASSES - 1)].fetch_add(1, Ordering::Relaxed);
    trace("alloc", size);
}

/// With `ENCORE_ALLOC_TRACE`, frees are traced too: a buffer freed during a run instead of
/// going back to the arena is one the next run allocates again.
fn trace(what: &str, size: usize) {
    if !ON.load(Ordering::Relaxed) || IN_TRACE.with(|t| t.get()) {
        return;
    }
    if size >= TRACE_MIN.load(Ordering::Relaxed) {
        IN_TRACE.with(|t| t.set(true));
        {
            // Everything allocated here is freed inside this block, while IN_TRACE holds.
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            let frames: Vec<&str> = bt
                .lines()
                .filter(|l| l.contains("/crates/") || l.contains("runtime::") || l.contains(" at "))
                .filter(|l| !l.contains("steady_state_alloc"))
                .take(80)
                .collect();
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "{what} {size} B:\n{}", frames.join("\n"));
        }
        IN_TRACE.with(|t| t.set(false));
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        trace("free", layout.size());
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What one run allocated.
#[derive(Debug, PartialEq)]
struct Tally {
    count: usize,
    bytes: usize,
    by_size: Vec<usize>,
}

fn counted(f: impl FnOnce()) -> Tally {
    COUNT.store(0, Ordering::SeqCst);
    BYTES.store(0, Ordering::SeqCst);
    BY_SIZE.iter().for_each(|c| c.store(0, Ordering::SeqCst));
    ON.store(true, Ordering::SeqCst);
    f();
    ON.store(false, Ordering::SeqCst);
    Tally {
        count: COUNT.load(Ordering::SeqCst),
        bytes: BYTES.load(Ordering::SeqCst),
        by_size: BY_SIZE.iter().map(|c| c.load(Ordering::SeqCst)).collect(),
    }
}

fn size_class_floor(class: usize) -> usize {
    if class == 0 {
        0
    } else {
        1 << (class + 5)
    }
}

/// `feeds` for batch `batch` × `seq` tokens, the last row padded to half.
fn feeds(session: &Session, batch: usize, seq: usize) -> Vec<(String, TensorValue)> {
    let vocab = session.lookup_rows("input_ids").expect("a token lookup");
    let mut ids = vec![0i64; batch * seq];
    let mut mask = vec![0i64; batch * seq];
    for b in 0..batch {
        let len = if b + 1 == batch { seq / 2 } else { seq };
        for s in 0..len {
            ids[b * seq + s] = (5 + (b * 31 + s * 7) % (vocab - 5)) as i64;
            mask[b * seq + s] = 1;
        }
    }
    let t = |v: Vec<i64>| TensorValue::from_i64(vec![batch, seq], v).unwrap();
    let names: Vec<String> = session.inputs().into_iter().map(|s| s.name).collect();
    [
        ("input_ids", t(ids)),
        ("attention_mask", t(mask)),
        ("token_type_ids", t(vec![0; batch * seq])),
    ]
    .into_iter()
    .filter(|(n, _)| names.iter().any(|x| x == n))
    .map(|(n, t)| (n.to_string(), t))
    .collect()
}

/// Runs `session` on one input until warm, then counts three runs; checks they allocate alike
/// and that no allocation outside the outputs is as large as the smallest activation
/// (`seq × hidden` f32). Returns the tally of one run.
fn steady(id: &str, session: &Session, batch: usize, seq: usize, hidden: usize) -> Tally {
    let f = feeds(session, batch, seq);
    let refs: Vec<(&str, TensorValue)> = f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    for _ in 0..3 {
        session.run(&refs).unwrap();
    }
    let mut outputs = Vec::new();
    let tallies: Vec<Tally> = (0..3)
        .map(|_| counted(|| outputs = session.run(&refs).unwrap()))
        .collect();
    // With one thread a run is deterministic; with more, which worker claims which chunk is
    // not, and so (slightly) is what the workers allocate: a worker that claimed no chunk of
    // some op during the warm-up grows its thread-local scratch the first time it does. The
    // fewest of the three counts is then the steady state (a per-run allocation shows in all).
    let t = if session.options().threads == 1 {
        assert!(
            tallies.iter().all(|x| x == &tallies[0]),
            "{id}: runs after warm-up allocate differently: {tallies:?}"
        );
        &tallies[0]
    } else {
        tallies.iter().min_by_key(|x| x.count).unwrap()
    };
    // The outputs (and their shape vectors and names) are the caller's.
    let out_bytes: Vec<usize> = outputs
        .iter()
        .map(|(_, t)| t.len() * t.dtype().size_of())
        .collect();
    let activation = seq * hidden * 4;
    let large: usize = (0..CLASSES)
        .filter(|&c| size_class_floor(c) >= activation / 2)
        .map(|c| t.by_size[c])
        .sum();
    // An output may leave with any buffer of the arena (a small output in a large recycled
    // buffer), which the next run allocates again: one allocation per output is allowed.
    let allowed = outputs.len();
    {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "{id} ({batch}x{seq}): {} allocations, {} bytes per run; outputs {out_bytes:?} bytes; by size class (from 64 B, doubling): {:?}",
            t.count,
            t.bytes,
            t.by_size
        );
    }
    assert!(
        large <= allowed,
        "{id}: {large} allocations of {} bytes or more per run for {allowed} outputs: activations are not recycled",
        activation / 2
    );
    let handed_over = 1 + 2 * outputs.len();
    assert_eq!(
        t.count, handed_over,
        "{id}: a run allocates {} times, expected {handed_over} (the result vector, and a name and a buffer per output); ENCORE_ALLOC_TRACE=0 shows where from",
        t.count
    );
    reused(id, session, &refs, &outputs);
    recycled(id, session, &refs, &outputs);
    tallies.into_iter().next().unwrap()
}

/// `run_output` giving the outputs it does not keep back to the session, and the caller the
/// one it kept (`Session::recycle`, as `SentenceEncoder` does with the hidden state it pooled):
/// after warm-up a run allocates only its result vector and the names, no buffer.
fn recycled(id: &str, session: &Session, refs: &[(&str, TensorValue)], expected: &Outputs) {
    let (name, want) = &expected[0];
    let once = || {
        let y = session.run_output(refs, name).unwrap();
        assert_eq!(&y, want, "{id}: run_output gives what run gave");
        session.recycle(y);
    };
    for _ in 0..3 {
        once();
    }
    // With threads, up to ten counted runs for one that shows the steady state (see `steady`:
    // a worker's first chunk of an op can fall after the warm-up); a per-run allocation shows
    // in all.
    let small = 1 + expected.len();
    let tries = if session.options().threads > 1 { 10 } else { 1 };
    let mut t = counted(once);
    for _ in 1..tries {
        if t.count == small {
            break;
        }
        t = counted(once);
    }
    assert_eq!(
        t.count, small,
        "{id}: run_output and recycle allocate {} times ({} bytes, by size class {:?}), expected {small} (the result vector and the names); ENCORE_ALLOC_TRACE=0 shows where from",
        t.count, t.bytes, t.by_size
    );
}

/// `run_into` with one output vector kept across runs: after warm-up a run allocates nothing
/// at all (the old outputs' buffers, names and vector serve again), and gives what `run` gave.
fn reused(id: &str, session: &Session, refs: &[(&str, TensorValue)], expected: &Outputs) {
    let mut kept = Vec::new();
    for _ in 0..3 {
        session.run_into(refs, &mut kept).unwrap();
    }
    // Three runs in a row that allocate nothing, within twelve (see `steady`: a worker's
    // first chunk of an op can fall after the warm-up); a per-run allocation shows in all.
    let mut clean = 0;
    for _ in 0..12 {
        let t = counted(|| session.run_into(refs, &mut kept).unwrap());
        clean = if t.count == 0 { clean + 1 } else { 0 };
        if clean == 3 {
            break;
        }
        assert!(
            t.count == 0 || session.options().threads > 1,
            "{id}: a run_into after warm-up allocates {} times ({} bytes, by size class {:?}); ENCORE_ALLOC_TRACE=0 shows where from",
            t.count, t.bytes, t.by_size
        );
    }
    assert_eq!(
        clean, 3,
        "{id}: no three run_into in a row without allocations in twelve; ENCORE_ALLOC_TRACE=0 shows where from"
    );
    assert_eq!(&kept, expected, "{id}: run_into gives what run gave");
}

/// The tests of this binary one at a time: the counters are global.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The models folder and the manifest, with `ENCORE_ALLOC_TRACE` read.
fn setup(test: &str) -> Option<(std::path::PathBuf, serde_json::Value)> {
    let dir = models_dir(test)?;
    if let Some(min) = std::env::var("ENCORE_ALLOC_TRACE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        TRACE_MIN.store(min, Ordering::SeqCst);
    }
    let man = manifest(&dir);
    Some((dir, man))
}

fn load(dir: &std::path::Path, man: &serde_json::Value, id: &str) -> Model {
    let entry = model_entry(man, id);
    Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap()
}

/// FP32 models, 1 and 2 threads a run.
#[test]
fn fp32_runs_allocate_no_activation_buffers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((dir, man)) = setup("steady-state allocations, FP32") else {
        return;
    };
    for (id, hidden) in [("minilm-l6", 384), ("tiny-bert", 128)] {
        let model = load(&dir, &man, id);
        for threads in [1, 2] {
            let s = Session::builder(&model).threads(threads).build().unwrap();
            steady(&format!("{id} {threads}t"), &s, 2, 32, hidden);
        }
    }
}

/// MiniLM made INT8 by `runtime::quantize` (dynamic activations), 1 and 2 threads a run.
#[test]
fn int8_runs_allocate_no_activation_buffers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((dir, man)) = setup("steady-state allocations, INT8") else {
        return;
    };
    let fp32 = load(&dir, &man, "minilm-l6");
    let (int8, _) =
        runtime::quantize::quantize(&fp32, None, &runtime::quantize::QuantizeOptions::default())
            .unwrap();
    for threads in [1, 2] {
        let s = Session::builder(&int8).threads(threads).build().unwrap();
        steady(&format!("minilm-l6 int8 {threads}t"), &s, 2, 32, 384);
    }
}

/// The static-QDQ tiny BERT: its attention runs as standalone QuantizeLinear, DequantizeLinear,
/// Transpose and QMatMul, whose values come from the arena too (u8 and i8 from its byte pool).
#[test]
fn qdq_runs_allocate_no_activation_buffers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((dir, man)) = setup("steady-state allocations, QDQ") else {
        return;
    };
    let model = load(&dir, &man, "tiny-bert-qdq");
    for threads in [1, 2] {
        let s = Session::builder(&model).threads(threads).build().unwrap();
        steady(&format!("tiny-bert-qdq {threads}t"), &s, 2, 32, 128);
    }
}

/// A batch run in parts (`batch_tokens` below the batch's tokens: one sequence a part): each
/// part's outputs are appended to whole outputs in buffers of the arena, and the rows of the
/// batched inputs a part reads are copied into it too, so `run_into` allocates nothing once
/// warm here either, and gives what the whole batch gives.
#[test]
fn runs_in_parts_allocate_nothing_into_kept_outputs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some((dir, man)) = setup("steady-state allocations, batch parts") else {
        return;
    };
    let model = load(&dir, &man, "minilm-l6");
    for threads in [1, 2] {
        let parts = Session::builder(&model)
            .threads(threads)
            .batch_tokens(Some(32))
            .build()
            .unwrap();
        let whole = Session::builder(&model)
            .threads(threads)
            .batch_tokens(None)
            .build()
            .unwrap();
        let f = feeds(&parts, 3, 32);
        let refs: Vec<(&str, TensorValue)> =
            f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        assert_eq!(
            parts.batch_parts(&refs).map(|p| p.len()),
            Some(3),
            "the batch runs in parts"
        );
        let expected = whole.run(&refs).unwrap();
        reused(
            &format!("minilm-l6 parts {threads}t"),
            &parts,
            &refs,
            &expected,
        );
    }
}
