//! Replays the fuzzers' committed corpora (`fuzz/corpus/TARGET`) and every input that once
//! crashed or hung a target (`fuzz/regressions/TARGET`) through the same target functions the
//! fuzzers run (`fuzz/src/targets.rs`, compiled into this test): any panic fails the test.

mod common;

#[allow(dead_code)]
#[path = "../../../fuzz/src/targets.rs"]
mod targets;

use std::path::Path;

fn replay(name: &str, target: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut count = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
            continue;
        };
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let data = std::fs::read(&f).expect("read a corpus file");
            let result = std::panic::catch_unwind(|| target(&data));
            assert!(result.is_ok(), "{name} panicked on {}", f.display());
            count += 1;
        }
    }
    count
}

#[test]
fn onnx_import_corpus() {
    assert!(
        replay("onnx_import", targets::onnx_import) > 0,
        "no ONNX corpus"
    );
}

#[test]
fn model_file_corpus() {
    assert!(
        replay("model_file", targets::model_file) > 0,
        "no model-file corpus"
    );
}

#[test]
fn ir_text_corpus() {
    assert!(replay("ir_text", targets::ir_text) > 0, "no IR corpus");
}

#[test]
fn npy_corpus() {
    assert!(replay("npy", targets::npy) > 0, "no .npy corpus");
}

#[test]
fn tokenizer_front_corpus() {
    let Some(models) = common::models_dir("tokenizer_front_corpus") else {
        return;
    };
    // The target finds the tokenizer through ENCORE_MODELS, as the fuzzer runs it.
    std::env::set_var("ENCORE_MODELS", &models);
    assert!(replay("tokenizer_front", targets::tokenizer_front) > 0);
}

#[test]
fn session_inputs_corpus() {
    assert!(replay("session_inputs", targets::session_inputs) > 0);
}
