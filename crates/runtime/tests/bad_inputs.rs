//! Bad inputs give typed errors, never a panic or a silent answer.

mod common;

use common::*;
use runtime::{CompileOptions, DType, Error, Model, Session, TensorValue};

fn session(id: &str, optimize: bool, max_batch: Option<usize>) -> Option<Session> {
    let dir = models_dir(&format!("bad inputs on {id}"))?;
    let man = manifest(&dir);
    let entry = model_entry(&man, id);
    let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
    Some(
        Session::new(
            &model,
            CompileOptions {
                optimize,
                max_batch,
                ..Default::default()
            },
        )
        .unwrap(),
    )
}

fn ids(b: usize, s: usize, f: impl Fn(usize, usize) -> i64) -> TensorValue {
    TensorValue::from_i64(vec![b, s], (0..b * s).map(|i| f(i / s, i % s)).collect()).unwrap()
}

fn bert_feeds(b: usize, s: usize) -> Vec<(&'static str, TensorValue)> {
    vec![
        ("input_ids", ids(b, s, |_, j| 5 + j as i64)),
        ("attention_mask", ids(b, s, |_, _| 1)),
        ("token_type_ids", ids(b, s, |_, _| 0)),
    ]
}

fn replace(
    mut f: Vec<(&'static str, TensorValue)>,
    name: &str,
    t: TensorValue,
) -> Vec<(&'static str, TensorValue)> {
    f.iter_mut().find(|(n, _)| *n == name).unwrap().1 = t;
    f
}

/// Runs `check` on `id` as imported and optimized; tiny BERT also in its three int8 forms
/// (static QDQ S8S8 and U8S8, dynamic), which take the same inputs and must refuse the same
/// bad ones.
fn for_both(id: &str, check: impl Fn(&Session)) {
    let ids: &[&str] = if id == "tiny-bert" {
        &[
            "tiny-bert",
            "tiny-bert-qdq",
            "tiny-bert-qdq-u8s8",
            "tiny-bert-dynamic",
        ]
    } else {
        &[id]
    };
    for id in ids {
        for optimize in [false, true] {
            if let Some(s) = session(id, optimize, None) {
                check(&s);
            }
        }
    }
}

#[test]
fn good_input_runs() {
    for_both("tiny-bert", |s| {
        let out = s.run(&bert_feeds(2, 128)).unwrap();
        assert_eq!(out[0].1.shape(), &[2, 128, 128]);
    });
}

#[test]
fn wrong_dtype() {
    for_both("tiny-bert", |s| {
        let f = TensorValue::from_f32(vec![1, 4], vec![5.0; 4]).unwrap();
        let e = s
            .run(&replace(bert_feeds(1, 4), "input_ids", f))
            .unwrap_err();
        assert!(
            matches!(&e, Error::InputDType { name, expected: DType::I64, actual: DType::F32 } if name == "input_ids"),
            "{e}"
        );
    });
}

#[test]
fn wrong_rank() {
    for_both("tiny-bert", |s| {
        let t = TensorValue::from_i64(vec![4], vec![5; 4]).unwrap();
        let e = s
            .run(&replace(bert_feeds(1, 4), "attention_mask", t))
            .unwrap_err();
        assert!(
            matches!(&e, Error::InputRank { name, expected: 2, .. } if name == "attention_mask"),
            "{e}"
        );
    });
}

#[test]
fn mismatched_batch_and_sequence() {
    for_both("tiny-bert", |s| {
        let e = s
            .run(&replace(
                bert_feeds(2, 4),
                "attention_mask",
                ids(3, 4, |_, _| 1),
            ))
            .unwrap_err();
        assert!(
            matches!(&e, Error::InputShape { name, dim: 0, actual: 3, .. } if name == "attention_mask"),
            "{e}"
        );
        let e = s
            .run(&replace(
                bert_feeds(2, 4),
                "token_type_ids",
                ids(2, 5, |_, _| 0),
            ))
            .unwrap_err();
        assert!(
            matches!(&e, Error::InputShape { name, dim: 1, actual: 5, .. } if name == "token_type_ids"),
            "{e}"
        );
    });
}

#[test]
fn missing_unknown_duplicate() {
    for_both("tiny-bert", |s| {
        let mut f = bert_feeds(1, 4);
        f.pop();
        let e = s.run(&f).unwrap_err();
        assert!(
            matches!(&e, Error::MissingInput { name } if name == "token_type_ids"),
            "{e}"
        );
        let mut f = bert_feeds(1, 4);
        f.push(("position_ids", ids(1, 4, |_, j| j as i64)));
        let e = s.run(&f).unwrap_err();
        assert!(
            matches!(&e, Error::UnknownInput { name, .. } if name == "position_ids"),
            "{e}"
        );
        let mut f = bert_feeds(1, 4);
        f.push(("input_ids", ids(1, 4, |_, _| 7)));
        let e = s.run(&f).unwrap_err();
        assert!(
            matches!(&e, Error::DuplicateInput { name } if name == "input_ids"),
            "{e}"
        );
    });
}

#[test]
fn token_out_of_vocab() {
    for_both("tiny-bert", |s| {
        for bad in [1000, 1 << 40, -1, i64::MIN] {
            let e = s
                .run(&replace(
                    bert_feeds(2, 4),
                    "input_ids",
                    ids(2, 4, |i, j| if (i, j) == (1, 2) { bad } else { 5 }),
                ))
                .unwrap_err();
            match &e {
                Error::TokenOutOfVocab {
                    input,
                    token_id,
                    vocab_size: 1000,
                    node,
                } => {
                    assert_eq!((input.as_str(), *token_id), ("input_ids", bad));
                    assert!(!node.is_empty());
                }
                _ => panic!("{bad}: {e}"),
            }
        }
        let e = s
            .run(&replace(
                bert_feeds(1, 4),
                "token_type_ids",
                ids(1, 4, |_, _| 2),
            ))
            .unwrap_err();
        assert!(
            matches!(&e, Error::TokenOutOfVocab { input, token_id: 2, vocab_size: 2, .. } if input == "token_type_ids"),
            "{e}"
        );
    });
}

/// Padding-free sessions look up only the real tokens' ids: an id out of the vocabulary at a
/// padded position changes nothing there (the padded program, unoptimized, still refuses it; so
/// does tiny-bert-dynamic, whose whole-tensor dynamic quantization keeps the batch padded).
#[test]
fn an_id_at_a_padded_position_is_not_looked_up() {
    const BAD: i64 = 1 << 40;
    for id in ["tiny-bert", "minilm-l6"] {
        let padded = |bad: i64| {
            let f = replace(
                bert_feeds(2, 4),
                "attention_mask",
                ids(2, 4, |i, j| i64::from((i, j) != (1, 3))),
            );
            replace(
                f,
                "input_ids",
                ids(2, 4, |i, j| if (i, j) == (1, 3) { bad } else { 5 }),
            )
        };
        let Some(packed) = session(id, true, None) else {
            return;
        };
        let good = packed.run(&padded(5)).unwrap();
        let out = packed.run(&padded(BAD)).unwrap();
        for ((name, a), (_, b)) in good.iter().zip(&out) {
            assert_eq!(a.as_f32().unwrap(), b.as_f32().unwrap(), "{id} {name}");
        }
        let plain = session(id, false, None).unwrap();
        assert!(
            matches!(
                plain.run(&padded(BAD)),
                Err(Error::TokenOutOfVocab { token_id: BAD, .. })
            ),
            "{id}: the padded program looks the id up"
        );
    }
}

#[test]
fn sequence_too_long_bert() {
    for_both("tiny-bert", |s| {
        let e = s.run(&bert_feeds(1, 129)).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::SequenceTooLong {
                    len: 129,
                    max_positions: 128,
                    ..
                }
            ),
            "{e}"
        );
        println!("{e}");
    });
}

#[test]
fn sequence_too_long_xlm_roberta() {
    // Positions are cumsum(ids != pad) + pad: 130 rows hold 128 tokens.
    for_both("tiny-xlm-roberta", |s| {
        let f = |n: usize| {
            vec![
                ("input_ids", ids(1, n, |_, j| 5 + j as i64)),
                ("attention_mask", ids(1, n, |_, _| 1)),
            ]
        };
        assert!(s.run(&f(128)).is_ok());
        let e = s.run(&f(129)).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::SequenceTooLong {
                    len: 129,
                    max_positions: 128,
                    ..
                }
            ),
            "{e}"
        );
        println!("{e}");
    });
}

#[test]
fn batch_too_large() {
    let Some(s) = session("tiny-distilbert", false, Some(2)) else {
        return;
    };
    let f = |b: usize| {
        vec![
            ("input_ids", ids(b, 4, |_, _| 5)),
            ("attention_mask", ids(b, 4, |_, _| 1)),
        ]
    };
    assert!(s.run(&f(2)).is_ok());
    let e = s.run(&f(3)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BatchTooLarge {
                batch: 3,
                max_batch: 2
            }
        ),
        "{e}"
    );
}

/// Pinned: an empty batch runs and gives empty outputs of the right shape (as onnxruntime);
/// an empty sequence on a model with a pooler is the typed error of the pooler's Gather of
/// token 0, which does not exist (onnxruntime also refuses it), naming the node.
#[test]
fn empty_batch_runs_empty_sequence_is_an_error() {
    for_both("tiny-bert", |s| {
        let out = s.run(&bert_feeds(0, 4)).unwrap();
        let shapes: Vec<(&str, &[usize])> =
            out.iter().map(|(n, t)| (n.as_str(), t.shape())).collect();
        assert_eq!(
            shapes,
            [
                ("last_hidden_state", &[0usize, 4, 128][..]),
                ("pooler_output", &[0, 128][..])
            ]
        );
        match s.run(&bert_feeds(1, 0)) {
            Err(Error::Op { node, message, .. }) => {
                assert_eq!(node, "/model/pooler/Gather");
                assert!(message.contains("out of range"), "{message}");
            }
            other => panic!("[1, 0]: want Error::Op at the pooler, got {other:?}"),
        }
    });
}

#[test]
fn sequence_too_long_distilbert_and_minilm() {
    if let Some(s) = session("tiny-distilbert", true, None) {
        let f = |n: usize| {
            vec![
                ("input_ids", ids(1, n, |_, _| 5)),
                ("attention_mask", ids(1, n, |_, _| 1)),
            ]
        };
        assert!(s.run(&f(128)).is_ok());
        let e = s.run(&f(129)).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::SequenceTooLong {
                    len: 129,
                    max_positions: 128,
                    ..
                }
            ),
            "{e}"
        );
    }
    if let Some(s) = session("minilm-l6", true, None) {
        let e = s.run(&bert_feeds(1, 513)).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::SequenceTooLong {
                    len: 513,
                    max_positions: 512,
                    ..
                }
            ),
            "{e}"
        );
        println!("{e}");
        let e = s
            .run(&replace(
                bert_feeds(1, 4),
                "input_ids",
                ids(1, 4, |_, _| 30522),
            ))
            .unwrap_err();
        assert!(
            matches!(
                &e,
                Error::TokenOutOfVocab {
                    token_id: 30522,
                    vocab_size: 30522,
                    ..
                }
            ),
            "{e}"
        );
    }
}
