//! End-to-end tests of the command line on the shared models.

mod common;

use common::{assert_clean_failure, encore, models_dir, scratch, stderr, stdout};
use runtime::TensorValue;

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn run_with_npy_inputs_writes_every_output_matching_the_reference() {
    let Some(m) = models_dir("run_with_npy_inputs") else {
        return;
    };
    let r = |t: &str| m.join(format!("reference/tiny-bert/b1.{t}.npy"));
    let mask = TensorValue::read_npy(r("attention_mask")).unwrap();
    let mask = mask.to_i64_vec().unwrap();
    for padding_free in [true, false] {
        let out = scratch(&format!("run_npy_{padding_free}"));
        let mut args = vec![
            "run".to_string(),
            "--model".into(),
            m.join("tiny/bert/model.onnx").to_str().unwrap().into(),
            "--output-dir".into(),
            out.to_str().unwrap().into(),
        ];
        for t in ["input_ids", "attention_mask", "token_type_ids"] {
            args.push("--input".into());
            args.push(format!("{t}={}", r(t).display()));
        }
        if !padding_free {
            args.push("--no-padding-free".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = encore(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        for name in ["last_hidden_state", "pooler_output"] {
            let ours = TensorValue::read_npy(out.join(format!("{name}.npy"))).unwrap();
            let want = TensorValue::read_npy(r(name)).unwrap();
            assert_eq!(ours.shape(), want.shape());
            let (ours, want) = (ours.as_f32().unwrap(), want.as_f32().unwrap());
            if padding_free && name == "last_hidden_state" {
                // Real tokens match the reference; the padding was not computed: zeros.
                let row = ours.len() / mask.len();
                for (i, &m) in mask.iter().enumerate() {
                    let (a, b) = (&ours[i * row..][..row], &want[i * row..][..row]);
                    if m == 0 {
                        assert!(a.iter().all(|&x| x == 0.0), "padded token {i}: {a:?}");
                    } else {
                        let d = max_abs_diff(a, b);
                        assert!(d <= 1e-4, "{name} token {i}: max abs diff {d}");
                    }
                }
            } else {
                // Padded rows included: the same graph defines them, so they match too.
                let d = max_abs_diff(ours, want);
                assert!(d <= 1e-4, "{name}: max abs diff {d}");
            }
        }
    }
}

#[test]
fn run_on_text_prints_normalised_sentence_embeddings() {
    let Some(m) = models_dir("run_on_text") else {
        return;
    };
    let out = scratch("run_text");
    let o = encore(&[
        "run",
        "--model",
        m.join("minilm-l6/model.onnx").to_str().unwrap(),
        "--tokenizer",
        m.join("minilm-l6/tokenizer.json").to_str().unwrap(),
        "--text",
        "A man is playing a guitar.",
        "--text",
        "The weather is lovely today, and the children are out in the park.",
        "--pooling",
        "mean",
        "--normalize",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = TensorValue::read_npy(out.join("sentence_embedding.npy")).unwrap();
    assert_eq!(e.shape(), &[2, 384]);
    for row in e.as_f32().unwrap().chunks(384) {
        let norm: f32 = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }
    let texts = [
        "A man is playing a guitar.",
        "The weather is lovely today, and the children are out in the park.",
    ];
    // The library's sentence embedding of the same texts (same tokenizer options as the CLI's
    // defaults: truncation to 256, padding to the longest).
    let tokenizer = runtime::text::Tokenizer::from_file(
        m.join("minilm-l6/tokenizer.json"),
        runtime::text::TokenizerOptions {
            max_length: Some(256),
            padding: runtime::text::Padding::Longest,
        },
    )
    .unwrap();
    let enc = tokenizer.encode(&texts).unwrap();
    let model = runtime::Model::load(m.join("minilm-l6/model.onnx")).unwrap();
    let session = runtime::Session::new(&model, runtime::CompileOptions::default()).unwrap();
    let lib = runtime::text::SentenceEncoder::new(session, tokenizer)
        .embed(&texts)
        .unwrap();
    let d = max_abs_diff(e.as_f32().unwrap(), lib.as_f32().unwrap());
    assert!(
        d <= 1e-5,
        "CLI vs library sentence embeddings: max abs diff {d}"
    );
    // And pooled by hand here from the CLI's own token states (`--pooling none`): the mean over
    // the tokens the mask keeps, then unit norm. Wrong pooling (CLS, padding counted, another
    // output) differs by far more than 1e-5.
    let raw = scratch("run_text_raw");
    let model_path = m.join("minilm-l6/model.onnx");
    let tok_path = m.join("minilm-l6/tokenizer.json");
    let mut args = vec![
        "run",
        "--model",
        model_path.to_str().unwrap(),
        "--tokenizer",
        tok_path.to_str().unwrap(),
        "--output-dir",
        raw.to_str().unwrap(),
    ];
    for t in texts {
        args.extend(["--text", t]);
    }
    let o = encore(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let hidden = TensorValue::read_npy(raw.join("last_hidden_state.npy")).unwrap();
    let mask = enc.attention_mask.to_i64_vec().unwrap();
    let (b, s, h) = (hidden.shape()[0], hidden.shape()[1], hidden.shape()[2]);
    assert_eq!((b, s * b), (2, mask.len()));
    let hv = hidden.as_f32().unwrap();
    for i in 0..b {
        let mut pooled = vec![0f64; h];
        let mut n = 0.0;
        for t in 0..s {
            if mask[i * s + t] != 0 {
                n += 1.0;
                for (p, v) in pooled.iter_mut().zip(&hv[(i * s + t) * h..][..h]) {
                    *p += *v as f64;
                }
            }
        }
        let norm = pooled.iter().map(|p| (p / n).powi(2)).sum::<f64>().sqrt();
        for (j, p) in pooled.iter().enumerate() {
            let want = p / n / norm;
            let got = e.as_f32().unwrap()[i * h + j] as f64;
            assert!(
                (got - want).abs() <= 1e-5,
                "row {i} [{j}]: CLI {got}, pooled here {want}"
            );
        }
    }
    let printed = encore(&[
        "run",
        "--model",
        m.join("minilm-l6/model.onnx").to_str().unwrap(),
        "--tokenizer",
        m.join("minilm-l6/tokenizer.json").to_str().unwrap(),
        "--text",
        "hello",
        "--pooling",
        "mean",
        "--normalize",
    ]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    assert!(
        stdout(&printed).starts_with("sentence_embedding: f32[1, 384]"),
        "{}",
        stdout(&printed)
    );
}

/// `dump --explain` says what the pack pipeline decided: packed for the FP32 model, declined
/// with the op that may combine tokens for the dynamic-QDQ one (its whole-tensor activation
/// quantization), whose dump then has no packed op.
#[test]
fn dump_explains_padding_free_decisions() {
    let Some(m) = models_dir("dump_explains_padding_free") else {
        return;
    };
    let dump = |file: &str| {
        let model = m.join(file);
        let o = encore(&["dump", "--model", model.to_str().unwrap(), "--explain"]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let fp32 = dump("tiny/bert/model.onnx");
    assert!(
        fp32.contains("// fired PackTokens:") && fp32.contains("ops run on the real tokens only"),
        "{fp32}"
    );
    let dynamic = dump("tiny/bert/model.dynamic.onnx");
    assert!(
        dynamic.contains("// declined PackTokens:")
            && dynamic.contains("`qlinear` after the token-wise layers may combine tokens"),
        "{dynamic}"
    );
    assert!(!dynamic.contains(" = pack_rows("), "{dynamic}");
}

#[test]
fn dump_after_lower_prints_the_program_a_session_runs() {
    let Some(m) = models_dir("dump_after_lower") else {
        return;
    };
    let model = m.join("tiny/bert/model.dynamic.onnx");
    let o = encore(&[
        "dump",
        "--model",
        model.to_str().unwrap(),
        "--after",
        "lower",
        "--threads",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    // Only the program: no graph dump before it.
    assert!(
        text.starts_with("// after lower\nprogram threads=2 slots="),
        "{text}"
    );
    // Every int8 product (per layer the merged QKV, the output projection, the FFN pair; then
    // the pooler) reads a weight packed for an int8 kernel, and says how its columns are shared.
    let packed_i8 = text
        .lines()
        .filter(|l| l.starts_with("weight w") && l.contains("= pack_i8[kernel="))
        .count();
    let qlinears: Vec<&str> = text.lines().filter(|l| l.contains(" = qlinear[")).collect();
    assert!(packed_i8 > 0 && packed_i8 == qlinears.len(), "{text}");
    assert!(
        qlinears
            .iter()
            .all(|l| l.contains(" split=columns(") || l.contains(" split=rows(")),
        "{text}"
    );
    assert!(text.contains(r#" check=token("input_ids")"#), "{text}");
    // Buffers are shared by values that do not live at once.
    assert!(
        text.lines()
            .any(|l| l.starts_with("buffer b") && l.contains(", %")),
        "{text}"
    );
    assert!(
        text.contains("\noutput \"last_hidden_state\" = %"),
        "{text}"
    );
    // `all` ends with the lowered program too.
    let o = encore(&["dump", "--model", model.to_str().unwrap(), "--after", "all"]);
    assert!(
        stdout(&o).contains("// after PackTokens\n")
            && stdout(&o).contains("// after lower\nprogram threads=")
    );
}

#[test]
fn dump_prints_the_graph_after_each_pass() {
    let Some(m) = models_dir("dump") else { return };
    let model = m.join("tiny/bert/model.onnx");
    let o = encore(&["dump", "--model", model.to_str().unwrap(), "--after", "all"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for pass in [
        "import",
        "ShapeInference",
        "ConstantFolding",
        "RecognizeAttention",
        "FoldQdq",
        "FuseEpilogue",
        "PackTokens",
    ] {
        assert!(
            text.contains(&format!("// after {pass}")),
            "no dump after {pass}"
        );
    }
    let o = encore(&["dump", "--model", model.to_str().unwrap()]);
    let final_text = stdout(&o);
    // Each layer's attention reads its Q, K and V from one merged GEMM, and runs on the
    // packed real tokens of the batch.
    assert_eq!(
        final_text.matches(" = attention_packed[").count(),
        2,
        "{final_text}"
    );
    // What enters packed: the two id inputs (the lookups make packed rows) and the position
    // embeddings (the row of each token's position).
    assert_eq!(
        final_text.matches(" = pack_rows(").count(),
        3,
        "{final_text}"
    );
    assert!(
        final_text.contains(": i64[1,packed_tokens]  # input_ids/pack_rows"),
        "{final_text}"
    );
    // After `fuse`, GELU lives in the FFN1 epilogue of each layer, not as its own op.
    assert_eq!(final_text.matches(" = gelu[").count(), 0, "{final_text}");
    assert_eq!(
        final_text.matches("epilogue=(bias, gelu_erf)").count(),
        2,
        "{final_text}"
    );

    let o = encore(&[
        "dump",
        "--model",
        model.to_str().unwrap(),
        "--stop-after",
        "import",
    ]);
    assert!(
        stdout(&o).contains(" = shape"),
        "the import still has its Shape nodes"
    );
    let o = encore(&[
        "dump",
        "--model",
        model.to_str().unwrap(),
        "--stop-after",
        "NoSuchPass",
    ]);
    assert_clean_failure(&o, &["NoSuchPass"]);
}

#[test]
fn built_models_run_and_bench_prints_json() {
    let dir = scratch("built");
    let path = dir.join("distil.onnx");
    let o = encore(&[
        "build-model",
        "--preset",
        "distilbert-tiny",
        "--opset",
        "14",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = encore(&[
        "bench",
        "--model",
        path.to_str().unwrap(),
        "--batch",
        "2",
        "--seq",
        "16",
        "--seconds",
        "0.2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(v["throughput_seq_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["latency_ms_p99"].as_f64().unwrap() >= v["latency_ms_p50"].as_f64().unwrap());
    assert_eq!(v["batch"], 2);
}

#[test]
fn bad_models_fail_cleanly() {
    let dir = scratch("bad_models");
    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, b"\x08\x07\xff\xff\xff\xff garbage").unwrap();
    let o = encore(&["dump", "--model", garbage.to_str().unwrap()]);
    assert_clean_failure(&o, &["ONNX"]);
    let missing = dir.join("missing.onnx");
    let o = encore(&[
        "run",
        "--model",
        missing.to_str().unwrap(),
        "--input",
        "a=b.npy",
    ]);
    assert_clean_failure(&o, &["missing.onnx"]);

    let Some(m) = models_dir("bad_models") else {
        return;
    };
    let bytes = std::fs::read(m.join("tiny/distilbert/model.onnx")).unwrap();
    for cut in [1, 100, bytes.len() / 3, bytes.len() - 1] {
        let p = dir.join(format!("cut{cut}.onnx"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let o = encore(&["dump", "--model", p.to_str().unwrap()]);
        assert_clean_failure(&o, &[]);
    }
}

#[test]
fn bad_inputs_fail_cleanly() {
    let Some(m) = models_dir("bad_inputs") else {
        return;
    };
    let dir = scratch("bad_inputs");
    let model = m.join("tiny/bert/model.onnx");
    let write = |name: &str, t: TensorValue| {
        let p = dir.join(name);
        t.write_npy(&p).unwrap();
        p
    };
    let ids = |v: i64, seq: usize| TensorValue::from_i64(vec![1, seq], vec![v; seq]).unwrap();
    let ones = |seq: usize| TensorValue::from_i64(vec![1, seq], vec![1; seq]).unwrap();
    let zeros = |seq: usize| TensorValue::from_i64(vec![1, seq], vec![0; seq]).unwrap();
    let run = |ids_p: &std::path::Path, mask_p: &std::path::Path, tt_p: &std::path::Path| {
        encore(&[
            "run",
            "--model",
            model.to_str().unwrap(),
            "--input",
            &format!("input_ids={}", ids_p.display()),
            "--input",
            &format!("attention_mask={}", mask_p.display()),
            "--input",
            &format!("token_type_ids={}", tt_p.display()),
        ])
    };
    let mask8 = write("mask8.npy", ones(8));
    let tt8 = write("tt8.npy", zeros(8));

    let oov = write("oov.npy", ids(1000, 8));
    assert_clean_failure(
        &run(&oov, &mask8, &tt8),
        &["input_ids", "1000", "vocabulary"],
    );
    let neg = write("neg.npy", ids(-5, 8));
    assert_clean_failure(&run(&neg, &mask8, &tt8), &["input_ids", "-5"]);

    let long = write("long.npy", ids(7, 129));
    let (mask129, tt129) = (write("m129.npy", ones(129)), write("t129.npy", zeros(129)));
    assert_clean_failure(&run(&long, &mask129, &tt129), &["129", "128"]);

    let f32ids = write(
        "f32.npy",
        TensorValue::from_f32(vec![1, 8], vec![7.0; 8]).unwrap(),
    );
    assert_clean_failure(&run(&f32ids, &mask8, &tt8), &["input_ids", "f32"]);

    let rank1 = write(
        "rank1.npy",
        TensorValue::from_i64(vec![8], vec![7; 8]).unwrap(),
    );
    assert_clean_failure(&run(&rank1, &mask8, &tt8), &["input_ids", "rank"]);

    let ids8 = write("ids8.npy", ids(7, 8));
    let mask9 = write("mask9.npy", ones(9));
    assert_clean_failure(&run(&ids8, &mask9, &tt8), &["attention_mask"]);

    let o = encore(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--input",
        &format!("input_ids={}", ids8.display()),
    ]);
    assert_clean_failure(&o, &["missing input", "attention_mask"]);

    let notnpy = dir.join("not.npy");
    std::fs::write(&notnpy, b"hello").unwrap();
    assert_clean_failure(&run(&notnpy, &mask8, &tt8), &["not.npy"]);

    let o = encore(&[
        "run",
        "--model",
        m.join("minilm-l6/model.onnx").to_str().unwrap(),
        "--tokenizer",
        m.join("minilm-l6/tokenizer.json").to_str().unwrap(),
        "--text",
        "",
    ]);
    assert_clean_failure(&o, &["empty"]);
}

#[test]
fn hwbench_times_every_kernel_and_marks_one_pick_per_dtype() {
    let o = encore(&["hwbench", "--m", "16", "--n", "48", "--k", "64", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let rows = rows.as_array().unwrap();
    assert!(
        rows.iter().any(|r| r["kernel"] == "scalar"),
        "the oracle always runs"
    );
    for dtype in ["int8", "f32"] {
        let of_dtype: Vec<_> = rows.iter().filter(|r| r["dtype"] == dtype).collect();
        assert!(!of_dtype.is_empty(), "no {dtype} rows");
        let picked = of_dtype.iter().filter(|r| r["picked"] == true).count();
        assert_eq!(
            picked, 1,
            "{dtype}: exactly one kernel is the picker's choice"
        );
        for r in of_dtype {
            assert!(r["gops"].as_f64().unwrap() > 0.0, "{r}");
            assert_eq!(
                (r["m"].as_u64(), r["n"].as_u64(), r["k"].as_u64()),
                (Some(16), Some(48), Some(64))
            );
        }
    }
    let o = encore(&["hwbench", "--m", "0"]);
    assert_clean_failure(&o, &["--m"]);
}

/// `demo` builds, compiles and measures a preset; an unknown preset is a clean usage error.
#[test]
fn demo_runs_a_preset_and_refuses_unknown_ones() {
    let o = encore(&[
        "demo",
        "--preset",
        "bert-tiny",
        "--batch",
        "1",
        "--seq",
        "8",
        "--seconds",
        "0.05",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("building bert-tiny ("), "{out}");
    let throughput: f64 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("throughput"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no throughput printed: {out}"));
    assert!(throughput > 0.0, "{out}");
    let o = encore(&["demo", "--preset", "bert-huge"]);
    assert_clean_failure(&o, &["--preset", "bert-huge"]);
}

/// `run` on text with each option that shapes the batch or the output.
#[test]
fn run_text_options_shape_the_batch_and_the_output() {
    let Some(m) = models_dir("run_text_options") else {
        return;
    };
    let model = m.join("minilm-l6/model.onnx");
    let tok = m.join("minilm-l6/tokenizer.json");
    let base = [
        "run",
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
    ];
    let run = |extra: &[&str], name: &str| -> (std::process::Output, std::path::PathBuf) {
        let dir = scratch(name);
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(extra);
        args.extend(["--output-dir", dir.to_str().unwrap()]);
        (encore(&args), dir)
    };
    let hidden =
        |dir: &std::path::Path| TensorValue::read_npy(dir.join("last_hidden_state.npy")).unwrap();
    let long = "one two three four five six seven eight nine ten";
    // --pad-to: the batch is padded to 20 tokens, and the real tokens are what they are unpadded.
    let (o, padded) = run(&["--text", "a short one", "--pad-to", "20"], "run_pad_to");
    assert!(o.status.success(), "{}", stderr(&o));
    let (o, plain) = run(&["--text", "a short one"], "run_plain");
    assert!(o.status.success(), "{}", stderr(&o));
    let (p, q) = (hidden(&padded), hidden(&plain));
    assert_eq!(p.shape(), &[1, 20, 384]);
    let n = q.shape()[1];
    assert_eq!(q.shape(), &[1, n, 384]);
    let d = max_abs_diff(&p.as_f32().unwrap()[..n * 384], q.as_f32().unwrap());
    assert!(d <= 1e-4, "padding changed the real tokens by {d}");
    // --max-length: 12 words truncated to 5 tokens ([CLS] + 3 + [SEP]).
    let (o, cut) = run(&["--text", long, "--max-length", "5"], "run_max_length");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(hidden(&cut).shape(), &[1, 5, 384]);
    // --no-optimize: the graph as imported gives the optimized result.
    let (o, raw) = run(&["--text", long, "--no-optimize"], "run_no_optimize");
    assert!(o.status.success(), "{}", stderr(&o));
    let (o, opt) = run(&["--text", long], "run_optimized");
    assert!(o.status.success(), "{}", stderr(&o));
    let d = max_abs_diff(
        hidden(&raw).as_f32().unwrap(),
        hidden(&opt).as_f32().unwrap(),
    );
    assert!(d <= 1e-4, "--no-optimize differs by {d}");
    // --max-batch: two texts with a limit of one is a clean failure.
    let (o, _) = run(
        &["--text", "a", "--text", "b", "--max-batch", "1"],
        "run_max_batch",
    );
    assert_clean_failure(&o, &["2", "1"]);
    // --full prints every value of a row; without it, 8 and an ellipsis.
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--text", "hi", "--pooling", "mean"]);
    let short = stdout(&encore(&args));
    args.push("--full");
    let full = stdout(&encore(&args));
    let row = |s: &str| {
        s.lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .count()
    };
    // "[0]", the values, and "…" when cut.
    assert_eq!(row(&short), 1 + 8 + 1, "{short}");
    assert!(short.lines().nth(1).unwrap().ends_with('…'), "{short}");
    assert_eq!(row(&full), 1 + 384, "{full}");
}

/// Output names come from the model file: they are written inside the output folder whatever
/// they hold.
#[test]
fn output_names_cannot_escape_the_output_folder() {
    let dir = scratch("sanitise");
    let g = ir::text::parse(
        "%0 = input[name=\"x\"] : f32[2]\n%1 = relu(%0) : f32[2]\noutput \"../up/a b\" = %1\n",
        None,
    )
    .unwrap();
    let model = dir.join("m.encore");
    runtime::Model::from_graph(g).unwrap().save(&model).unwrap();
    let x = dir.join("x.npy");
    TensorValue::from_f32(vec![2], vec![-1.0, 2.0])
        .unwrap()
        .write_npy(&x)
        .unwrap();
    let out = dir.join("out");
    let o = encore(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, [".._up_a_b.npy"]);
    assert!(!dir.join("up").exists());
    let y = TensorValue::read_npy(out.join(".._up_a_b.npy")).unwrap();
    assert_eq!(y.as_f32().unwrap(), &[0.0, 2.0]);
}

/// `bench` draws ids from the model's own table, also on a QDQ model (whose table is behind a
/// DequantizeLinear); models it cannot feed and bad presets are clean errors.
/// `bench --lengths-from`: batches of the real token counts of a text file (fixed draws, each
/// padded to its longest), every padded token computed or not.
#[test]
fn bench_on_batches_of_real_lengths() {
    let Some(m) = models_dir("bench_real_lengths") else {
        return;
    };
    let texts = m.join("data/movie_sentiment/test.jsonl");
    let tokenizer = m.join("minilm-l6/tokenizer.json");
    let model = m.join("tiny/bert/model.onnx");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--batch",
            "4",
            "--seq",
            "24",
            "--seconds",
            "0",
            "--warmup",
            "0",
            "--min-runs",
            "1",
            "--distinct-batches",
            "3",
            "--lengths-from",
            texts.to_str().unwrap(),
            "--tokenizer",
            tokenizer.to_str().unwrap(),
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = encore(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(stdout(&o).trim()).unwrap()
    };
    let packed = run(&[]);
    let padded = run(&["--no-padding-free"]);
    assert_eq!(packed["padding_free"], true);
    assert_eq!(padded["padding_free"], false);
    // The same draws both times: 3 batches of 4 lengths in 1..=24, not all full.
    assert_eq!(packed["lengths"], padded["lengths"]);
    let lengths: Vec<Vec<usize>> = serde_json::from_value(packed["lengths"].clone()).unwrap();
    assert_eq!(lengths.len(), 3);
    assert!(lengths.iter().all(|b| b.len() == 4));
    assert!(lengths.iter().flatten().all(|&l| (1..=24).contains(&l)));
    assert!(lengths.iter().flatten().any(|&l| l < 24), "{lengths:?}");
    // Whole cycles through the distinct batches.
    assert_eq!(packed["runs"].as_u64().unwrap() % 3, 0);
    let o = encore(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--lengths-from",
        texts.to_str().unwrap(),
    ]);
    // A usage error of clap's (exit code 2) naming the missing flag.
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--tokenizer"), "{}", stderr(&o));
}

#[test]
fn bench_on_quantized_models_and_error_paths() {
    let Some(m) = models_dir("bench_error_paths") else {
        return;
    };
    let bench = |model: &std::path::Path| {
        encore(&[
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--batch",
            "1",
            "--seq",
            "8",
            "--seconds",
            "0.05",
            "--warmup",
            "0",
            "--min-runs",
            "1",
            "--json",
        ])
    };
    for file in ["tiny/bert/model.qdq.onnx", "tiny/bert/model.dynamic.onnx"] {
        let o = bench(&m.join(file));
        assert!(o.status.success(), "{file}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        assert!(v["throughput_seq_per_s"].as_f64().unwrap() > 0.0, "{file}");
    }
    let o = bench(&m.join("minilm-l6/sentiment_head.onnx"));
    assert_clean_failure(&o, &["sentence_embedding"]);
    let dir = scratch("build_model_errors");
    let out = dir.join("x.onnx");
    let o = encore(&[
        "build-model",
        "--preset",
        "bert-huge",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_clean_failure(&o, &["bert-huge"]);
    let o = encore(&[
        "build-model",
        "--preset",
        "bert-tiny",
        "--opset",
        "13",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && !stderr(&o).contains("panicked"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists(), "a refused build wrote {}", out.display());
}
