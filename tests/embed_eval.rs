//! End-to-end tests of `encore embed` and `encore eval` on MiniLM and the shared data sets.

mod common;

use std::path::Path;

use common::{assert_clean_failure, encore, models_dir, quantize_random, scratch, stderr, stdout};
use runtime::eval::{self, EvalData, TOKENIZER_OPTIONS};
use runtime::text::{SentenceEncoder, Tokenizer};
use runtime::{CompileOptions, Model, Session, TensorValue};
use serde_json::{json, Value};

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// 40 real texts of mixed lengths: movie snippets and two Lee documents.
fn sample_texts(m: &Path) -> Vec<String> {
    let data = EvalData::load(m).unwrap();
    let mut texts: Vec<String> = data.sentiment.examples[..38]
        .iter()
        .map(|e| e.text.clone())
        .collect();
    texts.insert(5, data.lee.documents[3].text.clone());
    texts.push(data.lee.documents[8].text.clone());
    texts
}

fn encoder(m: &Path) -> SentenceEncoder {
    let model = Model::load(m.join("minilm-l6/model.onnx")).unwrap();
    SentenceEncoder::new(
        Session::new(&model, CompileOptions::default()).unwrap(),
        Tokenizer::from_file(m.join("minilm-l6/tokenizer.json"), TOKENIZER_OPTIONS).unwrap(),
    )
}

fn embed_args<'a>(m: &'a Path, input: &'a Path, output: &'a Path) -> Vec<String> {
    [
        "embed",
        "--model",
        path(&m.join("minilm-l6/model.onnx")),
        "--tokenizer",
        path(&m.join("minilm-l6/tokenizer.json")),
        "--input",
        path(input),
        "--output",
        path(output),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run(args: &[String], extra: &[&str]) -> std::process::Output {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend_from_slice(extra);
    encore(&all)
}

/// `embed` on a .txt and on a .jsonl of the same texts gives the library's sentence embeddings,
/// in input order. Batches of 2 make windows of 32 texts: the 40 texts span two windows, each
/// sorted by length, so the test sees the reordering undone across windows.
#[test]
fn embed_txt_and_jsonl_match_the_library_in_input_order() {
    let Some(m) = models_dir("embed_txt_and_jsonl") else {
        return;
    };
    let dir = scratch("embed_matches");
    let texts = sample_texts(&m);
    let txt = dir.join("texts.txt");
    std::fs::write(&txt, texts.join("\n") + "\n").unwrap();
    let jsonl = dir.join("texts.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"id": i, "text": t, "other": "ignored"}).to_string())
        .collect();
    std::fs::write(&jsonl, lines.join("\n")).unwrap();

    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let want = encoder(&m).embed(&refs).unwrap();
    let want = want.as_f32().unwrap();

    for (input, out_name) in [(&txt, "txt.npy"), (&jsonl, "jsonl.npy")] {
        let out = dir.join(out_name);
        let o = run(
            &embed_args(&m, input, &out),
            &["--normalize", "--batch-size", "2", "--threads", "2"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("wrote f32 [40, 384]"), "{}", stderr(&o));
        let got = TensorValue::read_npy(&out).unwrap();
        assert_eq!(got.shape(), &[texts.len(), 384]);
        let got = got.as_f32().unwrap();
        let mut worst = 0.0f32;
        for (i, (g, w)) in got.chunks(384).zip(want.chunks(384)).enumerate() {
            let d = g
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(d <= 1e-5, "{out_name} row {i}: max abs diff {d}");
            worst = worst.max(d);
        }
        println!("{out_name}: 40 rows, max abs diff to the library {worst:.2e}");
        assert!(
            !dir.join(format!("{out_name}.partial")).exists(),
            "no partial file left"
        );
    }

    // CLS pooling, unnormalised: row 0 is the first token's vector of text 0.
    let out = dir.join("cls.npy");
    let o = run(
        &embed_args(&m, &txt, &out),
        &["--pooling", "cls", "--quiet"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let cls = TensorValue::read_npy(&out).unwrap();
    let enc = encoder(&m);
    let tok = enc.tokenizer().encode(&refs[..1]).unwrap();
    let hidden = enc.session().run(&tok.feeds(enc.session())).unwrap();
    let h0 = &hidden[0].1.as_f32().unwrap()[..384];
    let d = cls.as_f32().unwrap()[..384]
        .iter()
        .zip(h0)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(d <= 1e-4, "cls row 0: max abs diff {d}");
}

/// Bad inputs fail before the model is touched, with the file and line named.
#[test]
fn embed_bad_inputs_fail_cleanly() {
    let dir = scratch("embed_bad");
    let args = |input: &Path| -> Vec<String> {
        [
            "embed",
            "--model",
            "no-such-model.onnx",
            "--tokenizer",
            "no-such-tokenizer.json",
            "--input",
            path(input),
            "--output",
            path(&dir.join("out.npy")),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };

    let empty = write("empty.txt", "");
    assert_clean_failure(&run(&args(&empty), &[]), &["empty.txt", "no texts"]);
    let empty = write("empty.jsonl", "");
    assert_clean_failure(&run(&args(&empty), &[]), &["empty.jsonl", "no texts"]);

    let no_field = write(
        "no_field.jsonl",
        "{\"text\": \"fine\"}\n{\"sentence\": \"wrong field\"}\n",
    );
    assert_clean_failure(
        &run(&args(&no_field), &[]),
        &["no_field.jsonl", "line 2", "no field `text`"],
    );
    let other_field = write("other_field.jsonl", "{\"text\": \"fine\"}\n");
    assert_clean_failure(
        &run(&args(&other_field), &["--text-field", "body"]),
        &["line 1", "no field `body`"],
    );
    let bad_json = write("bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": \n");
    assert_clean_failure(
        &run(&args(&bad_json), &[]),
        &["bad.jsonl", "line 2", "not valid JSON"],
    );
    let blank = write("blank.txt", "one\ntwo\n\nfour\n");
    assert_clean_failure(
        &run(&args(&blank), &[]),
        &["blank.txt", "line 3", "empty line"],
    );

    let missing = dir.join("missing.txt");
    assert_clean_failure(&run(&args(&missing), &[]), &["missing.txt", "No such file"]);
    let unknown = write("texts.csv", "a\n");
    assert_clean_failure(&run(&args(&unknown), &[]), &["texts.csv", "--format"]);
    assert!(!dir.join("out.npy").exists(), "no output on failure");
}

/// `eval --json` on MiniLM reproduces the reference figures of the shared README (2,050 texts:
/// the one full evaluation of this file).
#[test]
fn eval_json_reproduces_the_reference_figures() {
    let Some(m) = models_dir("eval_json") else {
        return;
    };
    let o = encore(&[
        "eval",
        "--model",
        path(&m.join("minilm-l6/model.onnx")),
        "--tokenizer",
        path(&m.join("minilm-l6/tokenizer.json")),
        "--data",
        path(&m),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    println!("{v:#}");
    assert_eq!(v["lee_pairs"], 1225);
    assert_eq!(v["sentiment_examples"], 2000);
    let fig = |k: &str| v["model"][k].as_f64().unwrap();
    assert!(
        (fig("lee_pearson") - 0.6564).abs() <= 0.0005,
        "Lee Pearson {}",
        fig("lee_pearson")
    );
    assert_eq!(fig("sentiment_accuracy"), 0.7905);
    assert_eq!(v["model"]["sentiment_correct"], 1581);
    // The README's other two figures, to its four decimals.
    assert!((fig("lee_spearman") - 0.5083).abs() <= 0.0005, "{v}");
    assert!((fig("margin_spearman") - 0.7003).abs() <= 0.0005, "{v}");
    assert!(v.get("baseline").is_none());
}

/// `eval --baseline` (table and JSON) on a small data folder: a model against itself differs
/// by nothing and its embeddings agree to cosine 1.
#[test]
fn eval_baseline_on_a_small_data_folder() {
    let Some(m) = models_dir("eval_baseline") else {
        return;
    };
    let data = EvalData::load(&m).unwrap();
    let dir = scratch("eval_small");
    std::fs::create_dir_all(dir.join("data/lee")).unwrap();
    std::fs::create_dir_all(dir.join("data/movie_sentiment")).unwrap();
    std::fs::create_dir_all(dir.join("minilm-l6")).unwrap();
    std::fs::copy(
        m.join(eval::SENTIMENT_PROBE),
        dir.join(eval::SENTIMENT_PROBE),
    )
    .unwrap();
    let docs: Vec<String> = data.lee.documents[..4]
        .iter()
        .map(|d| json!({"id": d.id, "text": d.text}).to_string())
        .collect();
    std::fs::write(dir.join(eval::LEE_DOCUMENTS), docs.join("\n")).unwrap();
    let pairs: Vec<String> = data
        .lee
        .pairs
        .iter()
        .filter(|p| p.a < 4 && p.b < 4)
        .map(|p| json!({"a": p.a, "b": p.b, "score": p.score}).to_string())
        .collect();
    assert_eq!(pairs.len(), 6);
    std::fs::write(dir.join(eval::LEE_PAIRS), pairs.join("\n")).unwrap();
    let snippets: Vec<String> = data.sentiment.examples[..12]
        .iter()
        .map(|e| json!({"text": e.text, "label": e.label, "score": e.score}).to_string())
        .collect();
    std::fs::write(dir.join(eval::SENTIMENT_TEST), snippets.join("\n")).unwrap();

    let model = m.join("minilm-l6/model.onnx");
    let tokenizer = m.join("minilm-l6/tokenizer.json");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "eval",
            "--model",
            path(&model),
            "--tokenizer",
            path(&tokenizer),
            "--baseline",
            path(&model),
            "--data",
            path(&dir),
        ];
        a.extend_from_slice(extra);
        encore(&a)
    };
    let o = args(&["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["lee_pairs"], 6);
    assert_eq!(v["sentiment_examples"], 12);
    for k in [
        "lee_pearson",
        "lee_spearman",
        "sentiment_accuracy",
        "margin_spearman",
    ] {
        assert_eq!(v["model"][k], v["baseline"][k], "{k}");
        assert_eq!(v["diff"][k].as_f64().unwrap(), 0.0, "{k}");
    }
    let cos = &v["cosine_to_baseline"];
    assert_eq!(cos["texts"], 12);
    assert!(cos["min"].as_f64().unwrap() > 0.999_999, "{cos}");
    assert!(cos["mean"].as_f64().unwrap() > 0.999_999, "{cos}");

    let o = args(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    println!("{table}");
    for needle in [
        "Lee Pearson r",
        "Lee Spearman rho",
        "sentiment accuracy",
        "margin-vs-score Spearman",
        "baseline",
        "+0.0000",
        "mean 1.000000",
    ] {
        assert!(table.contains(needle), "table lacks `{needle}`:\n{table}");
    }

    // --per-layer: every quantized layer of an INT8 MiniLM ranked by its own error.
    let int8 = dir.join("minilm.int8.encore");
    quantize_random(&model, &int8);
    let per_layer = |model: &Path, extra: &[&str]| {
        let mut a = vec![
            "eval",
            "--model",
            path(model),
            "--tokenizer",
            path(&tokenizer),
            "--data",
            path(&dir),
            "--per-layer",
        ];
        a.extend_from_slice(extra);
        encore(&a)
    };
    let o = per_layer(&int8, &["--baseline", path(&model), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let layers = v["per_layer"].as_array().unwrap();
    assert_eq!(
        layers.len(),
        6 * 6,
        "six linears in each of six layers: {v}"
    );
    let errors: Vec<f64> = layers
        .iter()
        .map(|l| l["error"].as_f64().unwrap())
        .collect();
    assert!(errors.windows(2).all(|w| w[0] >= w[1]), "{errors:?}");
    // 8-bit rounding leaves errors near 1 % on MiniLM; 0 would mean nothing was quantized.
    assert!(errors.iter().all(|&e| e > 1e-4 && e < 0.1), "{errors:?}");
    assert_clean_failure(&per_layer(&int8, &[]), &["--per-layer", "--baseline"]);
    assert_clean_failure(
        &per_layer(&model, &["--baseline", path(&model)]),
        &["--per-layer", "no quantized layer"],
    );

    // A malformed data line is named.
    std::fs::write(
        dir.join(eval::SENTIMENT_TEST),
        snippets[0].clone() + "\n{\"text\": \"no label\", \"score\": 1.0}\n",
    )
    .unwrap();
    assert_clean_failure(&args(&[]), &["test.jsonl", "line 2", "no `label` field"]);
    let o = encore(&[
        "eval",
        "--model",
        path(&model),
        "--tokenizer",
        path(&m.join("minilm-l6/tokenizer.json")),
        "--data",
        path(&dir.join("nowhere")),
    ]);
    assert_clean_failure(&o, &["nowhere", "documents.jsonl"]);
}

/// `quantize --calibration` reads text files as `embed` does: a bad line is named before any
/// compute, and a good file calibrates; `--attention int8` says which attention ops it changed,
/// and an unknown `--attention` is a usage error.
#[test]
fn quantize_reads_calibration_text_like_embed() {
    let Some(m) = models_dir("quantize_calibration_text") else {
        return;
    };
    let dir = scratch("quantize_calibration");
    let model = m.join("minilm-l6/model.onnx");
    let tokenizer = m.join("minilm-l6/tokenizer.json");
    let out = dir.join("q.encore");
    let quantize_with = |calibration: &Path, extra: &[&str]| {
        let mut a = vec![
            "quantize",
            "--model",
            path(&model),
            "--tokenizer",
            path(&tokenizer),
            "--calibration",
            path(calibration),
            "--held-back",
            "2",
            "--out",
            path(&out),
        ];
        a.extend_from_slice(extra);
        encore(&a)
    };
    let quantize = |calibration: &Path| quantize_with(calibration, &[]);
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"a fine sentence\"}\n{\"label\": 1}\n").unwrap();
    assert_clean_failure(&quantize(&bad), &["bad.jsonl", "line 2", "no field `text`"]);
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    assert_clean_failure(&quantize(&empty), &["empty.txt", "no texts"]);
    let good = dir.join("good.txt");
    let lines: Vec<String> = (0..8)
        .map(|i| format!("calibration sentence number {i} about a film"))
        .collect();
    std::fs::write(&good, lines.join("\n")).unwrap();
    let o = quantize(&good);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.join("q.encore").is_file());
    assert_clean_failure(
        &quantize_with(&good, &["--attention", "fp16"]),
        &["--attention", "fp16", "f32 or int8"],
    );
    let o = quantize_with(&good, &["--attention", "int8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains("attention products in int8 in 6 attention ops"),
        "{said}"
    );
}
