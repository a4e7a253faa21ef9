//! What a `Session` promises besides its numbers: profiling gives the same outputs, the thread
//! count does not change a bit of the result, one session serves concurrent runs of different
//! shapes, and the embedding table's size is known for every model form.

mod common;

use common::*;
use runtime::{CompileOptions, Model, Session};

fn session(id: &str, optimize: bool, threads: usize) -> Option<(Session, serde_json::Value)> {
    let dir = models_dir(&format!("session behaviour on {id}"))?;
    let man = manifest(&dir);
    let entry = model_entry(&man, id).clone();
    let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
    let opts = CompileOptions {
        optimize,
        threads,
        ..CompileOptions::default()
    };
    Some((Session::new(&model, opts).unwrap(), entry))
}

const MODELS: [&str; 5] = [
    "tiny-bert",
    "tiny-xlm-roberta",
    "tiny-bert-qdq",
    "tiny-bert-dynamic",
    "minilm-l6",
];

#[test]
fn run_profiled_gives_the_outputs_of_run_and_a_time_per_node() {
    for id in ["tiny-bert", "tiny-bert-qdq"] {
        for optimize in [false, true] {
            let Some((s, entry)) = session(id, optimize, 2) else {
                return;
            };
            let dir = models_dir(id).unwrap();
            let b = &ref_batches(&dir, &entry)[1];
            let plain = s.run(&b.feeds()).unwrap();
            let (profiled, times) = s.run_profiled(&b.feeds()).unwrap();
            assert_eq!(plain, profiled, "{id} optimize={optimize}");
            let names: std::collections::HashSet<String> = s
                .graph()
                .node_ids()
                .map(|n| s.graph().node(n).name.clone())
                .collect();
            assert!(!times.is_empty(), "{id}: no node times");
            for t in &times {
                assert!(
                    names.contains(&t.node),
                    "{id}: timed node {} is not in the graph",
                    t.node
                );
            }
            let timed: std::collections::HashSet<&str> = times.iter().map(|t| t.op).collect();
            let want = match (optimize, id.contains("qdq")) {
                (false, _) => "softmax",
                (true, false) => "attention_packed",
                (true, true) => "qlinear",
            };
            assert!(
                timed.contains(want),
                "{id} optimize={optimize}: no {want} timed: {timed:?}"
            );
            let total: std::time::Duration = times.iter().map(|t| t.time).sum();
            assert!(
                total > std::time::Duration::ZERO,
                "{id}: every node took no time"
            );
        }
    }
}

/// GEMMs split columns between threads, attention splits heads, and every element is summed in
/// the same order whatever the split: 1 thread and 2 give the same bits.
#[test]
fn one_thread_and_two_give_identical_bits() {
    for id in MODELS {
        let (Some((one, entry)), Some((two, _))) = (session(id, true, 1), session(id, true, 2))
        else {
            return;
        };
        let dir = models_dir(id).unwrap();
        for b in ref_batches(&dir, &entry) {
            let (x, y) = (one.run(&b.feeds()).unwrap(), two.run(&b.feeds()).unwrap());
            for ((name, a), (_, c)) in x.iter().zip(&y) {
                let (a, c) = (a.as_f32().unwrap(), c.as_f32().unwrap());
                let differ = a
                    .iter()
                    .zip(c)
                    .filter(|(p, q)| p.to_bits() != q.to_bits())
                    .count();
                assert_eq!(
                    differ, 0,
                    "{id} {} {name}: {differ} values differ between 1 and 2 threads",
                    b.name
                );
            }
        }
    }
}

/// One session, four threads, each running another reference batch (other shapes) in turn:
/// every result equals the batch's result run alone.
#[test]
fn concurrent_runs_of_different_shapes_share_a_session() {
    for id in ["minilm-l6", "tiny-bert-qdq", "tiny-bert-dynamic"] {
        let Some((s, entry)) = session(id, true, 2) else {
            return;
        };
        let dir = models_dir(id).unwrap();
        let batches = ref_batches(&dir, &entry);
        let alone: Vec<_> = batches.iter().map(|b| s.run(&b.feeds()).unwrap()).collect();
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (s, batches, alone) = (&s, &batches, &alone);
                scope.spawn(move || {
                    for round in 0..3 {
                        let k = (t + round) % batches.len();
                        let got = s.run(&batches[k].feeds()).unwrap();
                        assert_eq!(
                            got, alone[k],
                            "{id} thread {t} round {round} batch {}",
                            batches[k].name
                        );
                    }
                });
            }
        });
    }
}

/// The vocabulary `bench` and `quantize --random-calibration` draw ids from: the embedding
/// table's rows, also when the table is quantized behind a DequantizeLinear (QDQ) or u8
/// (dynamic), before and after the pipelines.
#[test]
fn lookup_rows_finds_the_table_of_every_model_form() {
    for (id, vocab) in [
        ("tiny-bert", 1000),
        ("tiny-bert-qdq", 1000),
        ("tiny-bert-qdq-u8s8", 1000),
        ("tiny-bert-dynamic", 1000),
        ("minilm-l6", 30522),
        ("minilm-l6-qdq", 30522),
    ] {
        for optimize in [false, true] {
            let Some((s, _)) = session(id, optimize, 1) else {
                return;
            };
            assert_eq!(
                s.lookup_rows("input_ids"),
                Some(vocab),
                "{id} optimize={optimize}"
            );
            assert_eq!(s.lookup_rows("attention_mask"), None, "{id}");
        }
    }
}

/// What the builder sets is what the session runs with: threads, the batch limit, no
/// optimisation (the imported graph's own ops run).
#[test]
fn the_builder_sets_the_compile_options() {
    let Some(dir) = models_dir("session builder") else {
        return;
    };
    let man = manifest(&dir);
    let entry = model_entry(&man, "tiny-bert").clone();
    let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
    let s = Session::builder(&model)
        .threads(3)
        .max_batch(1)
        .optimize(false)
        .fuse(false)
        .build()
        .unwrap();
    let o = s.options();
    assert_eq!(
        (o.threads, o.max_batch, o.optimize, o.fuse),
        (3, Some(1), false, false)
    );
    assert!(s
        .graph()
        .node_ids()
        .all(|id| s.graph().node(id).op.name() != "attention"));
    let b = ref_batches(&dir, &entry)
        .into_iter()
        .find(|b| b.input("input_ids").shape()[0] > 1)
        .expect("a reference batch of more than one sequence");
    assert!(matches!(
        s.run(&b.feeds()),
        Err(runtime::Error::BatchTooLarge { max_batch: 1, .. })
    ));
    let defaults = Session::builder(&model).build().unwrap();
    assert!(defaults.options().optimize && defaults.options().fuse);
    assert_eq!(defaults.options().kernel, None);
}

/// A forced kernel runs every weight GEMM: each kernel this CPU runs (the scalar reference
/// among them) gives the picked kernel's results to rounding, and a kernel this CPU lacks is
/// refused at build time.
#[test]
fn a_forced_kernel_gives_the_picked_kernels_results() {
    use runtime::Kernel;
    for id in ["tiny-bert", "tiny-bert-qdq"] {
        let Some(dir) = models_dir("forced kernel") else {
            return;
        };
        let man = manifest(&dir);
        let entry = model_entry(&man, id).clone();
        let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
        let picked = Session::builder(&model).threads(2).build().unwrap();
        for k in Kernel::ALL {
            let built = Session::builder(&model).threads(2).kernel(k).build();
            let Ok(forced) = built else {
                assert!(
                    !k.is_supported(),
                    "{id}: {} refused: {:?}",
                    k.name(),
                    built.err()
                );
                continue;
            };
            assert!(
                k.is_supported(),
                "{id}: {} built though unsupported",
                k.name()
            );
            assert_eq!(forced.options().kernel, Some(k));
            for b in ref_batches(&dir, &entry) {
                let (x, y) = (
                    picked.run(&b.feeds()).unwrap(),
                    forced.run(&b.feeds()).unwrap(),
                );
                for ((name, p), (_, f)) in x.iter().zip(&y) {
                    let e = compare(f, p, None);
                    assert!(
                        e.valid_max < 1e-3,
                        "{id} {} {name} with {}: max error {}",
                        b.name,
                        k.name(),
                        e.valid_max
                    );
                }
            }
        }
    }
}
