//! The fuzz targets' bodies: each AFL++ target in `src/bin` calls one of these on its input.
//! The main workspace compiles this same file into `crates/runtime/tests/fuzz_replay.rs`, which
//! replays the committed corpora and every crash ever found (`fuzz/regressions`) in CI.

use std::sync::OnceLock;

/// The most bytes a target looks at: larger inputs explore nothing new and slow the fuzzer.
pub const MAX_INPUT: usize = 1 << 16;

/// ONNX bytes → import → optimize and compile a session (1 thread). Every failure must be a
/// typed error.
pub fn onnx_import(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let Ok(graph) = frontend_onnx::import_bytes(bytes::Bytes::copy_from_slice(data), None) else {
        return;
    };
    let Ok(model) = runtime::Model::from_graph(graph) else {
        return;
    };
    let _ = runtime::Session::builder(&model).threads(1).build();
}

/// Model file bytes (a compiled `.encore` file or ONNX, told apart by content as
/// `Model::load` does) → load from disk → compile a session (1 thread): the path of
/// `encore run --model FILE`.
pub fn model_file(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let path = std::env::temp_dir().join(format!("encore-fuzz-{}.model", std::process::id()));
    std::fs::write(&path, data).expect("write the model file");
    let model = runtime::Model::load(&path);
    let _ = std::fs::remove_file(&path);
    if let Ok(model) = model {
        let _ = runtime::Session::builder(&model).threads(1).build();
    }
}

/// IR text → graph → print → parse again: a graph that parses prints to text that parses to
/// the same text.
pub fn ir_text(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(graph) = ir::text::parse(text, None) else {
        return;
    };
    // A graph that parses but cannot be printed (say, a constant without its data) is a typed
    // error; one that prints must parse back to the same text.
    let Ok(printed) = ir::text::print(&graph) else {
        return;
    };
    let again = ir::text::parse(&printed, None).expect("printed IR parses");
    assert_eq!(
        ir::text::print(&again).expect("reprint"),
        printed,
        "print-parse-print changed the text"
    );
}

/// `.npy` bytes → tensor; a tensor that parses writes back to bytes that parse to it.
pub fn npy(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let Ok(t) = runtime::TensorValue::from_npy_bytes(data) else {
        return;
    };
    let path = std::env::temp_dir().join(format!("encore-fuzz-{}.npy", std::process::id()));
    t.write_npy(&path).expect("write back");
    let back = runtime::TensorValue::read_npy(&path).expect("read back");
    let _ = std::fs::remove_file(&path);
    assert_eq!(back.shape(), t.shape());
    assert_eq!(back.dtype(), t.dtype());
}

fn tokenizer() -> Option<&'static runtime::text::Tokenizer> {
    static TOK: OnceLock<Option<runtime::text::Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let models =
            std::env::var("ENCORE_MODELS").unwrap_or_else(|_| "../../shared/models".into());
        let path = std::path::Path::new(&models).join("minilm-l6/tokenizer.json");
        runtime::text::Tokenizer::from_file(&path, Default::default()).ok()
    })
    .as_ref()
}

/// Texts (the input split at NUL bytes, lossy UTF-8) → the MiniLM tokenizer front: single
/// texts and pairs. Needs `ENCORE_MODELS` (or `../../shared/models`); without it the target
/// panics at once rather than fuzz nothing.
pub fn tokenizer_front(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let tok = tokenizer().expect("the MiniLM tokenizer (set ENCORE_MODELS)");
    let text = String::from_utf8_lossy(data);
    let texts: Vec<&str> = text.split('\0').collect();
    if let Ok(enc) = tok.encode(&texts) {
        assert_eq!(enc.input_ids.shape()[0], texts.len());
        assert_eq!(enc.input_ids.shape(), enc.attention_mask.shape());
    }
    if texts.len() >= 2 {
        let pairs: Vec<(&str, &str)> = texts.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        let _ = tok.encode_pairs(&pairs);
    }
}

fn tiny_session() -> &'static runtime::Session {
    static SESSION: OnceLock<runtime::Session> = OnceLock::new();
    SESSION.get_or_init(|| {
        use runtime::model_builder::{build_model, write_proto, Architecture, ModelSpec};
        let proto = build_model(&ModelSpec::tiny(Architecture::Bert)).expect("tiny BERT");
        let mut bytes = Vec::new();
        write_proto(&proto, &mut bytes).expect("serialise");
        let graph = frontend_onnx::import_bytes(bytes.into(), None).expect("import");
        let model = runtime::Model::from_graph(graph).expect("model");
        runtime::Session::builder(&model)
            .threads(1)
            .build()
            .expect("session")
    })
}

/// Bytes → a set of input tensors (names, dtypes, ranks, dims and values all from the bytes)
/// → a tiny BERT session's `run`: wrong inputs must be typed errors.
pub fn session_inputs(data: &[u8]) {
    if data.len() > 4096 {
        return;
    }
    let session = tiny_session();
    let names = ["input_ids", "attention_mask", "token_type_ids", "extra"];
    let mut it = data.iter().copied();
    let mut next = move || it.next().unwrap_or(0);
    let mut feeds: Vec<(&str, runtime::TensorValue)> = Vec::new();
    let count = next() % 5;
    for _ in 0..count {
        let name = names[(next() % 4) as usize];
        let rank = (next() % 4) as usize;
        let shape: Vec<usize> = (0..rank).map(|_| (next() % 10) as usize).collect();
        let len: usize = shape.iter().product();
        let kind = next() % 5;
        let mut value = |_| next() as i8;
        let t = match kind {
            0 => runtime::TensorValue::from_i64(
                shape,
                (0..len).map(|i| value(i) as i64 * 7).collect(),
            ),
            1 => runtime::TensorValue::from_i32(shape, (0..len).map(|i| value(i) as i32).collect()),
            2 => runtime::TensorValue::from_f32(
                shape,
                (0..len).map(|i| value(i) as f32 / 3.0).collect(),
            ),
            3 => runtime::TensorValue::from_u8(shape, (0..len).map(|i| value(i) as u8).collect()),
            _ => runtime::TensorValue::from_bool(shape, (0..len).map(|i| value(i) < 0).collect()),
        };
        if let Ok(t) = t {
            feeds.push((name, t));
        }
    }
    let _ = session.run(&feeds);
}
