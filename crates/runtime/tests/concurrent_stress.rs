//! Many threads, one `Session`: 8 threads × 200 runs each, every thread cycling through inputs of
//! other batch sizes and lengths (and padding) than its neighbours, every output compared bit
//! for bit with what a run of the same input gives when the session runs alone.
//!
//! Models: MiniLM-L6 FP32 (2 threads per run), the INT8 MiniLM that `runtime::quantize` makes
//! from it (dynamic activations, 1 thread per run), and the tiny static-QDQ BERT (2 threads per
//! run). MiniLM in release builds only (in a debug build its 3,200 runs take minutes); the tiny
//! model in both.

mod common;

use common::*;
use runtime::quantize::{quantize, QuantizeOptions};
use runtime::{Model, Session, TensorValue};

const THREADS: usize = 8;
const RUNS: usize = 200;

/// A fixed-seed generator (64-bit LCG, high bits).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

/// One input set: `batch` sequences padded to `seq`, each of its own real length (at least 2:
/// `[CLS]` and `[SEP]`), random ids in between, `token_type_ids` 1 on the second half of the
/// real tokens of odd rows.
fn feeds(session: &Session, batch: usize, seq: usize, rng: &mut Lcg) -> Vec<(String, TensorValue)> {
    let vocab = session.lookup_rows("input_ids").expect("a token lookup");
    let (mut ids, mut mask, mut types) = (
        vec![0i64; batch * seq],
        vec![0i64; batch * seq],
        vec![0i64; batch * seq],
    );
    for b in 0..batch {
        let len = if b == 0 { seq } else { 2 + rng.below(seq - 1) };
        for s in 0..len {
            let i = b * seq + s;
            ids[i] = match s {
                0 => 101.min(vocab as i64 - 1),
                _ if s == len - 1 => 102.min(vocab as i64 - 1),
                _ => rng.below(vocab) as i64,
            };
            mask[i] = 1;
            types[i] = i64::from(b % 2 == 1 && s >= len / 2);
        }
    }
    token_feeds(session, [batch, seq], ids, mask, types)
}

/// Equal names, shapes, dtypes and bits (`-0.0 != 0.0`, a NaN equals the same NaN).
fn same_bits(got: &[(String, TensorValue)], want: &[(String, TensorValue)]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        if gn != wn || g.shape() != w.shape() || g.dtype() != w.dtype() {
            return Err(format!(
                "output {gn} {:?} {} vs {wn} {:?} {}",
                g.shape(),
                g.dtype(),
                w.shape(),
                w.dtype()
            ));
        }
        match (g.as_f32(), w.as_f32()) {
            (Some(a), Some(b)) => {
                let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits());
                let n = differ.count();
                if n > 0 {
                    return Err(format!("{gn}: {n} of {} values differ", a.len()));
                }
            }
            _ if g != w => return Err(format!("{gn}: values differ")),
            _ => {}
        }
    }
    Ok(())
}

/// Runs the stress on `session`: 16 input sets (batch 1 to 4, sequence 3 to `max_seq`), their
/// outputs computed alone first, then 8 threads × 200 runs, thread `t` run `r` taking set
/// `(5t + 3r) % 16`.
fn stress(id: &str, session: &Session, max_seq: usize) {
    let mut rng = Lcg(0x5eed ^ max_seq as u64);
    let sets: Vec<Vec<(String, TensorValue)>> = (0..16)
        .map(|i| {
            let batch = 1 + i % 4;
            let seq = 3 + rng.below(max_seq - 2);
            feeds(session, batch, seq, &mut rng)
        })
        .collect();
    let alone: Vec<_> = sets
        .iter()
        .map(|s| session.run(&as_refs(s)).unwrap())
        .collect();
    let t0 = std::time::Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (sets, alone) = (&sets, &alone);
            scope.spawn(move || {
                // Odd threads run into one kept output vector (`run_into`): the buffers of
                // their last outputs, of another shape, go back to whichever pool the run
                // takes, shared with the other threads' runs.
                let mut kept = Vec::new();
                for r in 0..RUNS {
                    let k = (5 * t + 3 * r) % sets.len();
                    let fresh;
                    let got = if t % 2 == 1 {
                        session.run_into(&as_refs(&sets[k]), &mut kept).unwrap();
                        &kept
                    } else {
                        fresh = session.run(&as_refs(&sets[k])).unwrap();
                        &fresh
                    };
                    if let Err(e) = same_bits(got, &alone[k]) {
                        let shape = sets[k][0].1.shape();
                        panic!("{id}: thread {t} run {r} (set {k}, input {shape:?}): {e}");
                    }
                }
            });
        }
    });
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "{id}: {THREADS} threads x {RUNS} runs identical to the single-thread runs ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
}

fn release_only(test: &str) -> bool {
    if cfg!(debug_assertions) {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP {test}: 3,200 MiniLM runs; run with --release"
        );
        return false;
    }
    true
}

fn load(id: &str) -> Option<Model> {
    let dir = models_dir(&format!("concurrent stress on {id}"))?;
    let entry = model_entry(&manifest(&dir), id).clone();
    Some(Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap())
}

#[test]
fn minilm_fp32_eight_threads_share_one_session() {
    if !release_only("minilm_fp32_eight_threads_share_one_session") {
        return;
    }
    let Some(model) = load("minilm-l6") else {
        return;
    };
    let session = Session::builder(&model).threads(2).build().unwrap();
    stress("minilm-l6 fp32", &session, 24);
}

#[test]
fn minilm_int8_eight_threads_share_one_session() {
    if !release_only("minilm_int8_eight_threads_share_one_session") {
        return;
    }
    let Some(model) = load("minilm-l6") else {
        return;
    };
    let (int8, _) = quantize(&model, None, &QuantizeOptions::default()).unwrap();
    assert!(int8.is_quantized());
    let session = Session::builder(&int8).threads(1).build().unwrap();
    stress("minilm-l6 int8 (runtime::quantize, dynamic)", &session, 24);
}

#[test]
fn tiny_bert_qdq_eight_threads_share_one_session() {
    let Some(model) = load("tiny-bert-qdq") else {
        return;
    };
    let session = Session::builder(&model).threads(2).build().unwrap();
    stress("tiny-bert-qdq", &session, 32);
}
