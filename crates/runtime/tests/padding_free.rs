//! Padding-free execution (the `pack` pipeline) against padded execution of the same model:
//! every real token's values bit for bit, zeros at the padding, on batches whose sequences have
//! very different lengths (one of them all padding), FP32 and INT8 (per-token dynamic and
//! static activations), 1 and 2 threads.

mod common;

use common::*;
use runtime::quantize::{quantize, CalibrationBatch, QuantizeOptions};
use runtime::{Model, Session, TensorValue};

fn ops(session: &Session) -> Vec<&'static str> {
    let g = session.graph();
    g.node_ids().map(|id| g.node(id).op.name()).collect()
}

/// Packed and padded sessions of `model` agree at every real token, bit for bit, and the packed
/// one leaves zeros at the padding of per-token outputs.
fn check(what: &str, model: &Model) {
    for threads in [1, 2] {
        let packed = Session::builder(model).threads(threads).build().unwrap();
        let padded = Session::builder(model)
            .threads(threads)
            .padding_free(false)
            .build()
            .unwrap();
        assert!(ops(&packed).contains(&"pack_rows"), "{what}: not packed");
        assert!(ops(&packed).contains(&"attention_packed"), "{what}");
        assert!(!ops(&padded).contains(&"pack_rows"), "{what}");
        for lengths in [&[19usize, 3, 0, 11, 1, 19][..], &[2], &[9, 8], &[0, 0]] {
            let f = length_feeds(&packed, lengths);
            let a = packed.run(&as_refs(&f)).unwrap();
            let b = padded.run(&as_refs(&f)).unwrap();
            let seq = padded_len(lengths);
            let real = |b: usize, s: usize| s < lengths[b];
            for ((name, x), (_, y)) in a.iter().zip(&b) {
                let ctx = format!("{what} threads={threads} lengths={lengths:?} {name}");
                assert_eq!(x.shape(), y.shape(), "{ctx}");
                let (x, y) = (x.as_f32().unwrap(), y.as_f32().unwrap());
                let per_token = a
                    .iter()
                    .find(|(n, _)| n == name)
                    .is_some_and(|(_, t)| t.rank() >= 2 && t.shape()[..2] == [lengths.len(), seq]);
                if !per_token {
                    // A pooled output: one row per sequence, from its first token.
                    let row = x.len() / lengths.len();
                    for bi in (0..lengths.len()).filter(|&bi| lengths[bi] > 0) {
                        let (p, q) = (&x[bi * row..][..row], &y[bi * row..][..row]);
                        assert!(
                            p.iter().zip(q).all(|(u, v)| u.to_bits() == v.to_bits()),
                            "{ctx}: sequence {bi} differs"
                        );
                    }
                    continue;
                }
                let row = x.len() / (lengths.len() * seq);
                for bi in 0..lengths.len() {
                    for s in 0..seq {
                        let at = (bi * seq + s) * row;
                        let (p, q) = (&x[at..][..row], &y[at..][..row]);
                        if real(bi, s) {
                            let same = p.iter().zip(q).all(|(u, v)| u.to_bits() == v.to_bits());
                            assert!(
                                same,
                                "{ctx}: token ({bi}, {s}) differs: {:?} vs {:?}",
                                &p[..3],
                                &q[..3]
                            );
                        } else {
                            assert!(
                                p.iter().all(|&u| u == 0.0),
                                "{ctx}: padding ({bi}, {s}) not zero"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fp32_models_packed_equal_padded_at_real_tokens() {
    for id in FP32_ENCODERS {
        if let Some(m) = load_model("padding_free", id) {
            check(id, &m);
        }
    }
}

#[test]
fn int8_minilm_packed_equals_padded_at_real_tokens() {
    let Some(fp32) = load_model("padding_free", "minilm-l6") else {
        return;
    };
    let (dynamic, _) = quantize(&fp32, None, &QuantizeOptions::default()).unwrap();
    check("minilm-l6 int8 dynamic", &dynamic);
    let probe = Session::builder(&fp32).build().unwrap();
    let batches: Vec<CalibrationBatch> = [&[12usize, 5, 9][..], &[7, 16]]
        .iter()
        .map(|l| CalibrationBatch::from_feeds(length_feeds(&probe, l)))
        .collect();
    let fixed = quantize_static(&fp32, &batches);
    // Static activations: attention writes the bytes its output projection reads (`out_u8`),
    // packed and padded alike.
    let session = Session::builder(&fixed).build().unwrap();
    let text = ir::text::print(session.graph()).unwrap();
    assert!(
        text.contains("out_smooth=true]("),
        "attention does not quantize its output:\n{text}"
    );
    check("minilm-l6 int8 static", &fixed);
    // 8-bit attention products: q and k come quantized per head from the QKV GEMM's
    // `quant_heads` epilogue, into packed and padded attention alike.
    let int8_attention = QuantizeOptions {
        attention: ir::AttnProducts::Int8,
        ..QuantizeOptions::default()
    };
    let (heads, _) = quantize(&fp32, None, &int8_attention).unwrap();
    let session = Session::builder(&heads).build().unwrap();
    let text = ir::text::print(session.graph()).unwrap();
    assert!(text.contains("quant_heads 12)"), "no quant_heads:\n{text}");
    check("minilm-l6 int8 dynamic, int8 attention", &heads);
}

/// Packed attention leaves the padded keys out, which is exact only when the mask bias hides
/// them: a bias of −100 at the padding (not enough to zero a softmax weight) is refused by name
/// at run time, −10⁴ runs and matches padded execution.
#[test]
fn packed_attention_refuses_a_bias_that_does_not_hide_padding() {
    let graph = |big: f32| {
        let text = format!(
            "%0 = input[name=\"x\"] : f32[B,S,12]\n\
             %1 = input[name=\"attention_mask\"] : i64[B,S]\n\
             %2 = unsqueeze[axes=[1, 2]](%1) : i64[B,1,1,S]\n\
             %3 = cast[to=f32](%2) : f32[B,1,1,S]\n\
             %4 = const[value=f32[]{{1.0}}] : f32[]\n\
             %5 = sub(%4, %3) : f32[B,1,1,S]\n\
             %6 = const[value=f32[]{{{big:?}}}] : f32[]\n\
             %7 = mul(%5, %6) : f32[B,1,1,S]\n\
             %8 = attention_qkv[num_heads=2, scale=0.5](%0, %7) : f32[B,S,4]  # attn\n\
             output \"y\" = %8\n"
        );
        Model::from_graph(ir::text::parse(&text, None).unwrap()).unwrap()
    };
    let x: Vec<f32> = (0..2 * 3 * 12)
        .map(|i| ((i * 37) % 11) as f32 * 0.25 - 1.0)
        .collect();
    let feeds = [
        ("x", TensorValue::from_f32(vec![2, 3, 12], x).unwrap()),
        (
            "attention_mask",
            TensorValue::from_i64(vec![2, 3], vec![1, 1, 0, 1, 1, 1]).unwrap(),
        ),
    ];
    let weak = Session::builder(&graph(-100.0)).threads(1).build().unwrap();
    assert!(ops(&weak).contains(&"attention_packed"));
    let err = weak.run(&feeds).unwrap_err().to_string();
    assert!(
        err.contains("attn") && err.contains("does not hide it"),
        "{err}"
    );

    let strong = graph(-10000.0);
    let packed = Session::builder(&strong).threads(1).build().unwrap();
    let padded = Session::builder(&strong)
        .threads(1)
        .padding_free(false)
        .build()
        .unwrap();
    let (a, b) = (packed.run(&feeds).unwrap(), padded.run(&feeds).unwrap());
    let (a, b) = (a[0].1.as_f32().unwrap(), b[0].1.as_f32().unwrap());
    for (t, real) in [true, true, false, true, true, true]
        .into_iter()
        .enumerate()
    {
        let (p, q) = (&a[t * 4..][..4], &b[t * 4..][..4]);
        if real {
            assert!(
                p.iter().zip(q).all(|(u, v)| u.to_bits() == v.to_bits()),
                "{t}: {p:?} {q:?}"
            );
        } else {
            assert_eq!(p, &[0.0; 4]);
        }
    }
}
