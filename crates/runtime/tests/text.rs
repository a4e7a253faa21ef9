//! The text front on MiniLM: tokenization reproduces the reference ids from the reference texts,
//! pooled embeddings match the sentence-transformers references, empty input is refused.

mod common;

use std::path::Path;

use common::*;
use runtime::eval::{self, LeeSet, Probe, SentimentSet};
use runtime::text::{
    l2_normalize, mean_pool, sentence_embeddings, Padding, SentenceEncoder, Tokenizer,
    TokenizerOptions,
};
use runtime::{CompileOptions, Error, Model, Session, TensorValue};
use serde_json::Value;

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The texts behind the MiniLM reference batches (make_models.py): b0 = the first 4 test
/// snippets; b1 = pairs (snippets 4–6, snippets 7–9) truncated to 64; b2 = Lee documents 8, 23.
struct Texts {
    b0: Vec<String>,
    b1: Vec<(String, String)>,
    b2: Vec<String>,
}

fn texts(dir: &Path) -> Texts {
    let snip: Vec<String> = jsonl(&dir.join("data/movie_sentiment/test.jsonl"))
        .iter()
        .map(|r| r["text"].as_str().unwrap().to_string())
        .collect();
    let lee = jsonl(&dir.join("data/lee/documents.jsonl"));
    let doc = |id: i64| {
        lee.iter().find(|d| d["id"] == id).unwrap()["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    Texts {
        b0: snip[..4].to_vec(),
        b1: (4..7)
            .map(|i| (snip[i].clone(), snip[i + 3].clone()))
            .collect(),
        b2: vec![doc(8), doc(23)],
    }
}

fn tokenizer(dir: &Path, max: usize) -> Tokenizer {
    Tokenizer::from_file(
        dir.join("minilm-l6/tokenizer.json"),
        TokenizerOptions {
            max_length: Some(max),
            padding: Padding::Longest,
        },
    )
    .unwrap()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn tokenization_reproduces_reference_ids() {
    let Some(dir) = models_dir("tokenization") else {
        return;
    };
    let man = manifest(&dir);
    let refs = ref_batches(&dir, model_entry(&man, "minilm-l6"));
    let t = texts(&dir);
    let tok = tokenizer(&dir, 256);
    let encs = [
        ("b0", tok.encode(&strs(&t.b0)).unwrap()),
        (
            "b1",
            tokenizer(&dir, 64)
                .encode_pairs(
                    &t.b1
                        .iter()
                        .map(|(a, b)| (a.as_str(), b.as_str()))
                        .collect::<Vec<_>>(),
                )
                .unwrap(),
        ),
        ("b2", tok.encode(&strs(&t.b2)).unwrap()),
    ];
    for (name, enc) in encs {
        let r = refs.iter().find(|r| r.name == name).unwrap();
        assert_eq!(&enc.input_ids, r.input("input_ids"), "{name} input_ids");
        assert_eq!(
            &enc.attention_mask,
            r.input("attention_mask"),
            "{name} attention_mask"
        );
        assert_eq!(
            &enc.token_type_ids,
            r.input("token_type_ids"),
            "{name} token_type_ids"
        );
        let ids = enc.input_ids.as_i64().unwrap();
        assert_eq!(ids[0], 101, "[CLS] first");
        println!(
            "{name}: {:?} tokens match the reference",
            enc.input_ids.shape()
        );
    }
}

#[test]
fn truncation_and_padding() {
    let Some(dir) = models_dir("truncation") else {
        return;
    };
    let long = "word ".repeat(400);
    let tok = tokenizer(&dir, 256);
    let enc = tok.encode(&["hello world", &long]).unwrap();
    assert_eq!(enc.input_ids.shape(), &[2, 256]);
    let ids = enc.input_ids.as_i64().unwrap();
    let mask = enc.attention_mask.as_i64().unwrap();
    // "hello world" is [CLS] hello world [SEP], then [PAD] = 0 with mask 0.
    assert_eq!(ids[0], 101);
    assert_eq!(ids[3], 102);
    assert!(ids[4..256].iter().all(|&x| x == 0));
    assert_eq!(mask[..256].iter().sum::<i64>(), 4);
    // The long text is cut to 256 tokens, [SEP] last, mask all ones.
    assert_eq!(ids[256], 101);
    assert_eq!(ids[511], 102);
    assert!(mask[256..].iter().all(|&m| m == 1));
    assert!(enc.token_type_ids.as_i64().unwrap().iter().all(|&t| t == 0));
    let fixed = Tokenizer::from_file(
        dir.join("minilm-l6/tokenizer.json"),
        TokenizerOptions {
            max_length: Some(256),
            padding: Padding::Fixed(16),
        },
    )
    .unwrap();
    let enc = fixed.encode(&["hello world", &long]).unwrap();
    assert_eq!(enc.input_ids.shape(), &[2, 16]);
    // Too short for [CLS] and [SEP]: an error, not a panic.
    for max in [0, 1] {
        let tiny = Tokenizer::from_file(
            dir.join("minilm-l6/tokenizer.json"),
            TokenizerOptions {
                max_length: Some(max),
                padding: Padding::Longest,
            },
        );
        match tiny.and_then(|t| t.encode(&["hello world"])) {
            Err(Error::Tokenizer(m)) => println!("max_length {max}: {m}"),
            other => panic!("max_length {max}: {other:?}"),
        }
    }
    let three = Tokenizer::from_file(
        dir.join("minilm-l6/tokenizer.json"),
        TokenizerOptions {
            max_length: Some(4),
            padding: Padding::Longest,
        },
    )
    .unwrap();
    assert!(matches!(
        three.encode_pairs(&[("a b", "c d")]),
        Err(Error::Tokenizer(_))
    ));
    assert_eq!(three.encode(&[&long]).unwrap().input_ids.shape(), &[1, 4]);
}

#[test]
fn empty_text_is_refused() {
    let Some(dir) = models_dir("empty text") else {
        return;
    };
    let tok = tokenizer(&dir, 256);
    assert!(matches!(
        tok.encode(&[]),
        Err(Error::EmptyText { index: None })
    ));
    assert!(matches!(
        tok.encode(&["fine", ""]),
        Err(Error::EmptyText { index: Some(1) })
    ));
    assert!(matches!(
        tok.encode(&["  \t"]),
        Err(Error::EmptyText { index: Some(0) })
    ));
    assert!(matches!(
        tok.encode_pairs(&[]),
        Err(Error::EmptyText { index: None })
    ));
    let missing = Tokenizer::from_file(
        dir.join("no-such-tokenizer.json"),
        TokenizerOptions::default(),
    );
    assert!(matches!(missing, Err(Error::Tokenizer(_))));
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn check_embeddings(got: &TensorValue, want: &TensorValue, what: &str) {
    assert_eq!(got.shape(), want.shape());
    let h = got.shape()[1];
    for (i, (g, w)) in got
        .as_f32()
        .unwrap()
        .chunks(h)
        .zip(want.as_f32().unwrap().chunks(h))
        .enumerate()
    {
        let c = cosine(g, w);
        let max = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!("{what} row {i}: cosine {c:.9}, max abs {max:.2e}");
        // Unit vectors: max abs 1e-5 per value is what an FP32 implementation reaches (the
        // hidden states agree to 1e-4, and pooling averages them); a cosine bound alone would
        // let a whole embedding drift.
        assert!(max <= 1e-5, "{what} row {i}: max abs {max}");
        assert!(c >= 0.99999, "{what} row {i}: cosine {c}");
    }
}

#[test]
fn minilm_sentence_embeddings_match_reference() {
    let Some(dir) = models_dir("minilm embeddings") else {
        return;
    };
    let man = manifest(&dir);
    let entry = model_entry(&man, "minilm-l6");
    let model = Model::load(dir.join("minilm-l6/model.onnx")).unwrap();
    let session = Session::new(&model, CompileOptions::default()).unwrap();
    for b in ref_batches(&dir, entry) {
        let out = session.run(&b.feeds()).unwrap();
        let emb = sentence_embeddings(&out[0].1, b.input("attention_mask")).unwrap();
        let want = &b
            .derived
            .iter()
            .find(|(n, _)| n == "sentence_embedding")
            .unwrap()
            .1;
        check_embeddings(&emb, want, &format!("minilm {}", b.name));
    }
    // End to end from text: tokenizer + session + pooling.
    let t = texts(&dir);
    let enc = SentenceEncoder::new(session, tokenizer(&dir, 256));
    for (name, texts) in [("b0", &t.b0), ("b2", &t.b2)] {
        let emb = enc.embed(&strs(texts)).unwrap();
        let want = TensorValue::read_npy(
            dir.join(format!("reference/minilm-l6/{name}.sentence_embedding.npy")),
        )
        .unwrap();
        check_embeddings(&emb, &want, &format!("minilm text {name}"));
    }
    assert!(matches!(enc.embed(&[]), Err(Error::EmptyText { .. })));
}

#[test]
fn sentiment_head_matches_direct_computation() {
    let Some(dir) = models_dir("sentiment head") else {
        return;
    };
    let model = Model::load(dir.join("minilm-l6/sentiment_head.onnx")).unwrap();
    // The probe's weights, read independently from the graph's constants.
    let mut w = None;
    let mut bias = None;
    for id in model.graph().node_ids() {
        if let Some(t) = model.graph().const_value(id.into()) {
            match t.shape() {
                [2, 384] => w = Some((t.to_vec::<f32>().unwrap(), false)),
                [384, 2] => w = Some((t.to_vec::<f32>().unwrap(), true)),
                [2] => bias = Some(t.to_vec::<f32>().unwrap()),
                _ => {}
            }
        }
    }
    let ((w, w_is_kn), bias) = (w.expect("weight [2,384]"), bias.expect("bias [2]"));
    // runtime::eval's probe (from sentiment_head.safetensors) is the same probe.
    let probe = Probe::load(&dir).unwrap();
    for optimize in [false, true] {
        let session = Session::new(
            &model,
            CompileOptions {
                optimize,
                ..Default::default()
            },
        )
        .unwrap();
        for name in ["b0", "b1", "b2"] {
            let emb = TensorValue::read_npy(
                dir.join(format!("reference/minilm-l6/{name}.sentence_embedding.npy")),
            )
            .unwrap();
            let out = session.run(&[("sentence_embedding", emb.clone())]).unwrap();
            let logits = out[0].1.as_f32().unwrap();
            let e = emb.as_f32().unwrap();
            for (r, row) in e.chunks(384).enumerate() {
                for c in 0..2 {
                    let want: f64 = bias[c] as f64
                        + (0..384)
                            .map(|k| {
                                row[k] as f64
                                    * if w_is_kn {
                                        w[k * 2 + c]
                                    } else {
                                        w[c * 384 + k]
                                    } as f64
                            })
                            .sum::<f64>();
                    let got = logits[r * 2 + c] as f64;
                    let lib = probe.logits(row).unwrap()[c];
                    assert!(
                        (lib - want).abs() < 1e-5,
                        "{name} row {r} probe logit {c}: {lib} vs {want}"
                    );
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{name} row {r} logit {c}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn pooling_helpers() {
    let h = TensorValue::from_f32(vec![2, 2, 2], vec![1., 1., 3., 3., 5., 5., 7., 7.]).unwrap();
    let m = TensorValue::from_i64(vec![2, 2], vec![1, 1, 1, 0]).unwrap();
    assert_eq!(
        mean_pool(&h, &m).unwrap().as_f32().unwrap(),
        &[2., 2., 5., 5.]
    );
    let n =
        l2_normalize(&TensorValue::from_f32(vec![2, 2], vec![3., 4., 0., 0.]).unwrap()).unwrap();
    assert_eq!(n.as_f32().unwrap(), &[0.6, 0.8, 0.0, 0.0]);
    assert!(mean_pool(&h, &TensorValue::from_i64(vec![2], vec![1, 1]).unwrap()).is_err());
}

/// The Lee document-similarity metric end to end (tokenizer, FP32 MiniLM, pooling) through
/// `runtime::eval`: Pearson r of embedding cosines against human scores equals the manifest's
/// onnxruntime figure.
#[test]
fn lee_similarity_matches_manifest() {
    let Some(dir) = models_dir("lee similarity") else {
        return;
    };
    let man = manifest(&dir);
    let want = &man["metrics"]["lee_doc_similarity"]["minilm-l6"];
    let (want, want_rho) = (
        want["pearson"].as_f64().unwrap(),
        want["spearman"].as_f64().unwrap(),
    );
    let lee = LeeSet::load(&dir).unwrap();
    let model = Model::load(dir.join("minilm-l6/model.onnx")).unwrap();
    let session = Session::new(&model, CompileOptions::default()).unwrap();
    let enc = SentenceEncoder::new(session, tokenizer(&dir, 256));
    // Batches of 8 in length order, as the reference script.
    let m = lee.evaluate(&eval::encoder_fn(&enc)).unwrap();
    println!(
        "Lee Pearson r = {:.6} (onnxruntime: {want:.6}), Spearman rho = {:.6} (onnxruntime: {want_rho:.6}) over {} pairs",
        m.pearson, m.spearman, m.pairs
    );
    assert_eq!(m.pairs, 1225);
    assert!(
        (m.pearson - want).abs() < 1e-4,
        "Pearson {} vs {want}",
        m.pearson
    );
    // Spearman too: same batches, same ties as scipy.
    assert!(
        (m.spearman - want_rho).abs() < 1e-4,
        "Spearman {} vs {want_rho}",
        m.spearman
    );
}

/// Movie-snippet sentiment end to end through `runtime::eval`: FP32 MiniLM embeddings of the
/// 2,000 test snippets through the probe `sentiment_head.safetensors`; accuracy equals the
/// manifest's onnxruntime figure. About 60k tokens: run in release builds only.
#[test]
fn sentiment_accuracy_matches_manifest() {
    if cfg!(debug_assertions) {
        {
            // Straight to stderr: the harness hides eprintln! of passing tests.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "SKIP sentiment_accuracy_matches_manifest: 2,000 texts through MiniLM; run with --release");
        }
        return;
    }
    let Some(dir) = models_dir("sentiment accuracy") else {
        return;
    };
    let man = manifest(&dir);
    let want = &man["metrics"]["movie_sentiment_probe"]["minilm-l6"];
    let (want, want_rho) = (
        want["accuracy"].as_f64().unwrap(),
        want["spearman_margin_vs_human_score"].as_f64().unwrap(),
    );
    let set = SentimentSet::load(&dir).unwrap();
    let probe = Probe::load(&dir).unwrap();
    let model = Model::load(dir.join("minilm-l6/model.onnx")).unwrap();
    let enc = SentenceEncoder::new(
        Session::new(&model, CompileOptions::default()).unwrap(),
        tokenizer(&dir, 256),
    );
    // Batches of 32 in length order, as the reference script.
    let m = set.evaluate(&probe, &eval::encoder_fn(&enc)).unwrap();
    println!(
        "sentiment accuracy {:.4} (onnxruntime: {want:.4}), margin-vs-score Spearman {:.6} (onnxruntime: {want_rho:.6}) over {} snippets",
        m.accuracy, m.margin_spearman, m.examples
    );
    assert_eq!(m.examples, 2000);
    // One snippet is 0.0005: allow one flip of a borderline prediction.
    assert!(
        (m.accuracy - want).abs() <= 0.0005 + 1e-9,
        "accuracy {} vs {want}",
        m.accuracy
    );
    assert!(
        (m.margin_spearman - want_rho).abs() < 1e-4,
        "margin Spearman {} vs {want_rho}",
        m.margin_spearman
    );
}
