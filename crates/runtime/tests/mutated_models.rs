//! Mutated real models (the importer's mutations) that still import are compiled and run: each
//! gives outputs or a typed error at compile or run time, never a panic. The importer's own test
//! stops after import; declutter, kernel selection, weight packing and execution see the
//! mutants only here.

mod common;
#[path = "../../frontend-onnx/tests/common/mutate.rs"]
mod mutate;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::*;
use mutate::{mutate, Rng};
use prost::Message;
use runtime::{CompileOptions, Model, Session};

#[test]
fn mutated_models_compile_and_run_or_fail_cleanly() {
    let Some(dir) = models_dir("mutated models") else {
        return;
    };
    let man = manifest(&dir);
    let rounds: usize = std::env::var("MUTATION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    for id in [
        "tiny-distilbert",
        "tiny-bert-dynamic",
        "tiny-xlm-roberta",
        "tiny-bert-qdq",
    ] {
        let entry = model_entry(&man, id);
        let file = entry["file"].as_str().unwrap();
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let base = frontend_onnx::decode_model(bytes.into()).unwrap();
        let batch = &ref_batches(&dir, entry)[1];
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let (mut imported, mut compiled, mut ran) = (0, 0, 0);
        for round in 0..rounds {
            let mut m = base.clone();
            let what: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate(&mut m, &mut rng))
                .collect();
            let Ok(g) = frontend_onnx::import_bytes(m.encode_to_vec().into(), None) else {
                continue;
            };
            imported += 1;
            for optimize in [false, true] {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    let model = Model::from_graph(g.clone())?;
                    let opts = CompileOptions {
                        optimize,
                        threads: 1,
                        ..CompileOptions::default()
                    };
                    let s = Session::new(&model, opts)?;
                    Ok::<_, runtime::Error>((s.run(&batch.feeds()), ()))
                }));
                match r {
                    Err(_) => {
                        panic!("{id} round {round} optimize={optimize}: panicked after {what:?}")
                    }
                    Ok(Err(_)) => {}
                    Ok(Ok((out, ()))) => {
                        compiled += 1;
                        ran += usize::from(out.is_ok());
                    }
                }
            }
        }
        println!("{id}: {imported} of {rounds} mutants imported; compiled {compiled} times and ran {ran} (as imported and optimized)");
        assert!(
            compiled > 0,
            "{id}: no mutant compiled, the test exercises nothing past import"
        );
    }
}
