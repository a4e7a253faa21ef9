//! The runtime's numbers for ops the model tests never reach, against references written out
//! here in f64 from the ONNX definitions (not against another path of the runtime): GELU (tanh
//! form), Softmax over an inner axis, GatherElements with negative indices, the logical and
//! min/max ops with broadcasting, ReduceSum/ReduceMin, Gemm with alpha, beta and transA, and
//! attention without a mask. Each graph runs as imported and through the pipelines.

use runtime::{CompileOptions, Model, Session, TensorValue};

fn run(text: &str, inputs: &[(&str, TensorValue)]) -> Vec<[TensorValue; 2]> {
    let g = ir::text::parse(text, None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let model = Model::from_graph(g).unwrap();
    let outs: Vec<Vec<TensorValue>> = [false, true]
        .into_iter()
        .map(|optimize| {
            let opts = CompileOptions {
                optimize,
                ..CompileOptions::default()
            };
            Session::new(&model, opts)
                .unwrap()
                .run(inputs)
                .unwrap()
                .into_iter()
                .map(|(_, t)| t)
                .collect()
        })
        .collect();
    outs[0]
        .iter()
        .cloned()
        .zip(outs[1].iter().cloned())
        .map(|(a, b)| [a, b])
        .collect()
}

fn close(what: &str, got: &[TensorValue; 2], shape: &[usize], want: &[f64], tol: f64) {
    for (t, optimize) in got.iter().zip([false, true]) {
        assert_eq!(t.shape(), shape, "{what} optimize={optimize}");
        for (i, (g, w)) in t.as_f32().unwrap().iter().zip(want).enumerate() {
            assert!(
                (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
                "{what} optimize={optimize} [{i}]: {g}, want {w}"
            );
        }
    }
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
        })
        .collect()
}

fn f32s(shape: &[usize], v: Vec<f32>) -> TensorValue {
    TensorValue::from_f32(shape.to_vec(), v).unwrap()
}

#[test]
fn gelu_tanh() {
    let x: Vec<f32> = (0..161).map(|i| -8.0 + i as f32 * 0.1).collect();
    let out = run(
        "%0 = input[name=\"x\"] : f32[161]\n%1 = gelu[approx=\"tanh\"](%0) : f32[161]\noutput \"y\" = %1\n",
        &[("x", f32s(&[161], x.clone()))],
    );
    let want: Vec<f64> = x
        .iter()
        .map(|&v| {
            let v = v as f64;
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        })
        .collect();
    close("gelu tanh", &out[0], &[161], &want, 1e-5);
}

#[test]
fn softmax_over_an_inner_axis() {
    let (a, b, c) = (2, 3, 4);
    let x = vals(a * b * c, 1);
    let out = run(
        "%0 = input[name=\"x\"] : f32[2,3,4]\n%1 = softmax[axis=1](%0) : f32[2,3,4]\noutput \"y\" = %1\n",
        &[("x", f32s(&[a, b, c], x.clone()))],
    );
    let mut want = vec![0f64; x.len()];
    for i in 0..a {
        for k in 0..c {
            let at = |j: usize| (i * b + j) * c + k;
            let m = (0..b).map(|j| x[at(j)] as f64).fold(f64::MIN, f64::max);
            let s: f64 = (0..b).map(|j| (x[at(j)] as f64 - m).exp()).sum();
            for j in 0..b {
                want[at(j)] = (x[at(j)] as f64 - m).exp() / s;
            }
        }
    }
    close("softmax axis 1", &out[0], &[a, b, c], &want, 1e-6);
}

#[test]
fn gather_elements_with_negative_indices() {
    let data = vals(6, 2);
    let idx = vec![2i64, -3, 1, -1];
    let out = run(
        "%0 = input[name=\"d\"] : f32[2,3]\n%1 = input[name=\"i\"] : i64[2,2]\n\
         %2 = gather_elements[axis=1](%0, %1) : f32[2,2]\noutput \"y\" = %2\n",
        &[
            ("d", f32s(&[2, 3], data.clone())),
            ("i", TensorValue::from_i64(vec![2, 2], idx.clone()).unwrap()),
        ],
    );
    let want: Vec<f64> = (0..4)
        .map(|p| {
            let (r, k) = (p / 2, idx[p].rem_euclid(3) as usize);
            data[r * 3 + k] as f64
        })
        .collect();
    close("gather_elements", &out[0], &[2, 2], &want, 0.0);
}

#[test]
fn logical_and_min_max_broadcast() {
    let a = vec![true, true, false, false, true, false];
    let b = vec![true, false, true];
    let x = vals(6, 3);
    let y = vals(3, 4);
    let out = run(
        "%0 = input[name=\"a\"] : bool[2,3]\n%1 = input[name=\"b\"] : bool[3]\n\
         %2 = input[name=\"x\"] : f32[2,3]\n%3 = input[name=\"y\"] : f32[3]\n\
         %4 = and(%0, %1) : bool[2,3]\n%5 = or(%0, %1) : bool[2,3]\n%6 = not(%0) : bool[2,3]\n\
         %7 = min(%2, %3) : f32[2,3]\n%8 = max(%2, %3) : f32[2,3]\n\
         output \"and\" = %4\noutput \"or\" = %5\noutput \"not\" = %6\n\
         output \"min\" = %7\noutput \"max\" = %8\n",
        &[
            ("a", TensorValue::from_bool(vec![2, 3], a.clone()).unwrap()),
            ("b", TensorValue::from_bool(vec![3], b.clone()).unwrap()),
            ("x", f32s(&[2, 3], x.clone())),
            ("y", f32s(&[3], y.clone())),
        ],
    );
    let logic = |f: fn(bool, bool) -> bool| {
        TensorValue::from_bool(vec![2, 3], (0..6).map(|i| f(a[i], b[i % 3])).collect()).unwrap()
    };
    for (k, want) in [logic(|p, q| p && q), logic(|p, q| p || q), logic(|p, _| !p)]
        .into_iter()
        .enumerate()
    {
        assert_eq!(out[k], [want.clone(), want], "logical output {k}");
    }
    let mm =
        |f: fn(f32, f32) -> f32| -> Vec<f64> { (0..6).map(|i| f(x[i], y[i % 3]) as f64).collect() };
    close("min", &out[3], &[2, 3], &mm(f32::min), 0.0);
    close("max", &out[4], &[2, 3], &mm(f32::max), 0.0);
}

#[test]
fn reduce_sum_and_min() {
    let x = vals(24, 5);
    let out = run(
        "%0 = input[name=\"x\"] : f32[2,3,4]\n\
         %1 = reduce_sum[axes=[1], keepdims=false](%0) : f32[2,4]\n\
         %2 = reduce_min[axes=[-1], keepdims=true](%0) : f32[2,3,1]\n\
         output \"s\" = %1\noutput \"m\" = %2\n",
        &[("x", f32s(&[2, 3, 4], x.clone()))],
    );
    let at = |i: usize, j: usize, k: usize| x[(i * 3 + j) * 4 + k] as f64;
    let sum: Vec<f64> = (0..8)
        .map(|p| (0..3).map(|j| at(p / 4, j, p % 4)).sum())
        .collect();
    let min: Vec<f64> = (0..6)
        .map(|p| (0..4).map(|k| at(p / 3, p % 3, k)).fold(f64::MAX, f64::min))
        .collect();
    close("reduce_sum", &out[0], &[2, 4], &sum, 1e-6);
    close("reduce_min", &out[1], &[2, 3, 1], &min, 0.0);
}

/// `Y = alpha·Aᵀ·B + beta·C` with A given as [K, M] (transA), C broadcast over rows.
#[test]
fn gemm_alpha_beta_trans_a() {
    let (m, k, n) = (2, 3, 4);
    let a = vals(k * m, 6);
    let b = vals(k * n, 7);
    let c = vals(n, 8);
    let out = run(
        "%0 = input[name=\"a\"] : f32[3,2]\n%1 = input[name=\"b\"] : f32[3,4]\n\
         %2 = input[name=\"c\"] : f32[4]\n\
         %3 = gemm[alpha=0.5, beta=2.0, trans_a=true, trans_b=false](%0, %1, %2) : f32[2,4]\n\
         output \"y\" = %3\n",
        &[
            ("a", f32s(&[k, m], a.clone())),
            ("b", f32s(&[k, n], b.clone())),
            ("c", f32s(&[n], c.clone())),
        ],
    );
    let want: Vec<f64> = (0..m * n)
        .map(|p| {
            let (i, j) = (p / n, p % n);
            let dot: f64 = (0..k)
                .map(|q| a[q * m + i] as f64 * b[q * n + j] as f64)
                .sum();
            0.5 * dot + 2.0 * c[j] as f64
        })
        .collect();
    close("gemm", &out[0], &[m, n], &want, 1e-6);
}

/// Attention with three inputs: every key counts.
#[test]
fn attention_without_a_mask() {
    let (bsz, s, h, heads) = (2, 5, 8, 2);
    let dh = h / heads;
    let q = vals(bsz * s * h, 9);
    let kk = vals(bsz * s * h, 10);
    let v = vals(bsz * s * h, 11);
    let out = run(
        "%0 = input[name=\"q\"] : f32[B,S,8]\n%1 = input[name=\"k\"] : f32[B,S,8]\n\
         %2 = input[name=\"v\"] : f32[B,S,8]\n\
         %3 = attention[num_heads=2, scale=0.5](%0, %1, %2) : f32[B,S,8]\noutput \"y\" = %3\n",
        &[
            ("q", f32s(&[bsz, s, h], q.clone())),
            ("k", f32s(&[bsz, s, h], kk.clone())),
            ("v", f32s(&[bsz, s, h], v.clone())),
        ],
    );
    let at = |t: &[f32], b: usize, i: usize, c: usize| t[(b * s + i) * h + c] as f64;
    let mut want = vec![0f64; bsz * s * h];
    for b in 0..bsz {
        for hd in 0..heads {
            for i in 0..s {
                let scores: Vec<f64> = (0..s)
                    .map(|j| {
                        0.5 * (0..dh)
                            .map(|c| at(&q, b, i, hd * dh + c) * at(&kk, b, j, hd * dh + c))
                            .sum::<f64>()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..dh {
                    want[(b * s + i) * h + hd * dh + c] =
                        (0..s).map(|j| e[j] / z * at(&v, b, j, hd * dh + c)).sum();
                }
            }
        }
    }
    close("attention, no mask", &out[0], &[bsz, s, h], &want, 1e-5);
}
