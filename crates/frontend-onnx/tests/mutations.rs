//! Structural mutations of a real model (rewired inputs, deleted nodes, swapped op types,
//! dropped or retyped attributes, wrong initializer dims, flipped bytes) give `Ok` or a typed
//! error, never a panic.

mod common;
#[path = "common/mutate.rs"]
mod mutate;

use std::panic::{catch_unwind, AssertUnwindSafe};

use mutate::{mutate, Rng};
use prost::Message;

#[test]
fn mutated_models_never_panic() {
    let Some(dir) = common::models_dir() else {
        return;
    };
    // More rounds for a longer local run: MUTATION_ROUNDS=5000.
    let rounds: usize = std::env::var("MUTATION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    for file in [
        "tiny/distilbert/model.onnx",
        "tiny/bert/model.dynamic.onnx",
        "tiny/xlm-roberta/model.onnx",
    ] {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let base = frontend_onnx::decode_model(bytes.clone().into()).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut ok, mut err) = (0, 0);
        for round in 0..rounds {
            let mut m = base.clone();
            let what: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate(&mut m, &mut rng))
                .collect();
            let encoded = m.encode_to_vec();
            let r = catch_unwind(AssertUnwindSafe(|| {
                frontend_onnx::import_bytes(encoded.into(), None)
            }));
            match r {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(_)) => err += 1,
                Err(_) => panic!("{file}, round {round}: import panicked after {what:?}"),
            }
        }
        // Flipped bytes in the encoded file.
        for round in 0..rounds {
            let mut b = bytes.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            let r = catch_unwind(AssertUnwindSafe(|| {
                frontend_onnx::import_bytes(b.into(), None)
            }));
            assert!(r.is_ok(), "{file}, byte round {round}: import panicked");
        }
        eprintln!("{file}: {ok} mutants imported, {err} rejected");
        assert!(
            err > 0,
            "{file}: no mutation was caught, the mutations do nothing"
        );
    }
}
