//! Ops on small graphs written in the IR text form: the recognised ops against their
//! decompositions, and the ONNX corner cases (broadcasting, negative indices, clamping).

use runtime::{CompileOptions, Error, Model, Session, TensorValue};

fn session(text: &str) -> Session {
    let g = ir::text::parse(text, None).unwrap();
    Session::new(
        &Model::from_graph(g).unwrap(),
        CompileOptions {
            optimize: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn run1(s: &Session, inputs: &[(&str, TensorValue)]) -> TensorValue {
    s.run(inputs).unwrap().remove(0).1
}

/// Deterministic pseudo-random values in [-1, 1).
fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn max_diff(a: &TensorValue, b: &TensorValue) -> f32 {
    assert_eq!(a.shape(), b.shape());
    a.as_f32()
        .unwrap()
        .iter()
        .zip(b.as_f32().unwrap())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The attention op against matmul/softmax over heads split by reshape/transpose, for a mask
/// per key (padded keys skipped), a mask per query and key (no skipping), and no mask; with
/// heads narrower than the kernel's 32 columns and fewer queries than a register block (copied
/// through scratch), and with 32-wide heads and 13 queries (read and written in place, plus a
/// partial block).
#[test]
fn attention_matches_decomposition() {
    check_attention(3, 5, 8, 2, [5, 2, 1]);
    check_attention(3, 13, 64, 2, [13, 9, 1]);
}

fn check_attention(b: usize, s: usize, h: usize, heads: usize, lens: [usize; 3]) {
    let dh = h / heads;
    let fused = session(&format!(
        "%0 = input[name=\"q\"] : f32[B,S,{h}]\n\
         %1 = input[name=\"k\"] : f32[B,S,{h}]\n\
         %2 = input[name=\"v\"] : f32[B,S,{h}]\n\
         %3 = input[name=\"m\"] : f32[*]\n\
         %4 = attention[num_heads={heads}, scale=0.5](%0, %1, %2, %3) : f32[B,S,{h}]\n\
         output \"y\" = %4\n",
    ));
    let reference = session(&format!(
        "%0 = input[name=\"q\"] : f32[B,S,{h}]\n\
         %1 = input[name=\"k\"] : f32[B,S,{h}]\n\
         %2 = input[name=\"v\"] : f32[B,S,{h}]\n\
         %3 = input[name=\"m\"] : f32[*]\n\
         %4 = const[value=i64[4]{{0, 0, {heads}, {dh}}}] : i64[4]\n\
         %5 = reshape[allowzero=false](%0, %4) : f32[*]\n\
         %6 = transpose[perm=[0, 2, 1, 3]](%5) : f32[*]\n\
         %7 = reshape[allowzero=false](%1, %4) : f32[*]\n\
         %8 = transpose[perm=[0, 2, 3, 1]](%7) : f32[*]\n\
         %9 = reshape[allowzero=false](%2, %4) : f32[*]\n\
         %10 = transpose[perm=[0, 2, 1, 3]](%9) : f32[*]\n\
         %11 = matmul(%6, %8) : f32[*]\n\
         %12 = const[value=f32[]{{0.5}}] : f32[]\n\
         %13 = mul(%11, %12) : f32[*]\n\
         %14 = add(%13, %3) : f32[*]\n\
         %15 = softmax[axis=-1](%14) : f32[*]\n\
         %16 = matmul(%15, %10) : f32[*]\n\
         %17 = transpose[perm=[0, 2, 1, 3]](%16) : f32[*]\n\
         %18 = const[value=i64[3]{{0, 0, {h}}}] : i64[3]\n\
         %19 = reshape[allowzero=false](%17, %18) : f32[*]\n\
         output \"y\" = %19\n",
    ));
    let t = |seed| TensorValue::from_f32(vec![b, s, h], rand_vec(b * s * h, seed)).unwrap();
    let per_key: Vec<f32> = (0..b * s)
        .map(|i| if i % s < lens[i / s] { 0.0 } else { -3.4028e38 })
        .collect();
    let masks = [
        TensorValue::from_f32(vec![b, 1, 1, s], per_key).unwrap(),
        TensorValue::from_f32(vec![b, 1, s, s], rand_vec(b * s * s, 9)).unwrap(),
        TensorValue::from_f32(vec![1], vec![0.0]).unwrap(),
        // Every key of batch 1 masked: softmax over equal scores, as the decomposition gives.
        TensorValue::from_f32(
            vec![b, 1, 1, s],
            (0..b * s)
                .map(|i| if i / s == 1 { -3.4028e38 } else { 0.0 })
                .collect(),
        )
        .unwrap(),
    ];
    for m in masks {
        let feeds = [("q", t(1)), ("k", t(2)), ("v", t(3)), ("m", m.clone())];
        let d = max_diff(&run1(&fused, &feeds), &run1(&reference, &feeds));
        assert!(d < 1e-6, "h {h}, s {s}, mask {:?}: {d}", m.shape());
    }
}

#[test]
fn layer_norm_and_gelu_match_decomposition() {
    let fused = session(
        "%0 = input[name=\"x\"] : f32[N,6]\n\
         %1 = const[value=f32[6]{1.0, 0.5, 2.0, 1.5, 1.0, 0.25}] : f32[6]\n\
         %2 = const[value=f32[6]{0.0, 0.1, -0.1, 0.2, 0.0, 0.3}] : f32[6]\n\
         %3 = layer_norm[axis=-1, epsilon=1e-5](%0, %1, %2) : f32[N,6]\n\
         %4 = gelu[approx=\"erf\"](%3) : f32[N,6]\n\
         output \"y\" = %4\n",
    );
    let reference = session(
        "%0 = input[name=\"x\"] : f32[N,6]\n\
         %1 = const[value=f32[6]{1.0, 0.5, 2.0, 1.5, 1.0, 0.25}] : f32[6]\n\
         %2 = const[value=f32[6]{0.0, 0.1, -0.1, 0.2, 0.0, 0.3}] : f32[6]\n\
         %3 = reduce_mean[axes=[-1], keepdims=true](%0) : f32[N,1]\n\
         %4 = sub(%0, %3) : f32[N,6]\n\
         %5 = const[value=f32[]{2.0}] : f32[]\n\
         %6 = pow(%4, %5) : f32[N,6]\n\
         %7 = reduce_mean[axes=[-1], keepdims=true](%6) : f32[N,1]\n\
         %8 = const[value=f32[]{1e-5}] : f32[]\n\
         %9 = add(%7, %8) : f32[N,1]\n\
         %10 = sqrt(%9) : f32[N,1]\n\
         %11 = div(%4, %10) : f32[N,6]\n\
         %12 = mul(%11, %1) : f32[N,6]\n\
         %13 = add(%12, %2) : f32[N,6]\n\
         %14 = const[value=f32[]{1.4142135}] : f32[]\n\
         %15 = div(%13, %14) : f32[N,6]\n\
         %16 = erf(%15) : f32[N,6]\n\
         %17 = const[value=f32[]{1.0}] : f32[]\n\
         %18 = add(%16, %17) : f32[N,6]\n\
         %19 = mul(%13, %18) : f32[N,6]\n\
         %20 = const[value=f32[]{0.5}] : f32[]\n\
         %21 = mul(%19, %20) : f32[N,6]\n\
         output \"y\" = %21\n",
    );
    let x = TensorValue::from_f32(
        vec![7, 6],
        rand_vec(42, 5).iter().map(|v| v * 4.0).collect(),
    )
    .unwrap();
    let d = max_diff(
        &run1(&fused, &[("x", x.clone())]),
        &run1(&reference, &[("x", x)]),
    );
    assert!(d < 2e-6, "{d}");
}

#[test]
fn onnx_corner_cases() {
    // Gather with a negative index, Where broadcasting, Cast float→int truncation, Concat.
    let s = session(
        "%0 = input[name=\"x\"] : f32[2,3]\n\
         %1 = const[value=i64[2]{-1, 0}] : i64[2]\n\
         %2 = gather[axis=1](%0, %1) : f32[2,2]\n\
         %3 = const[value=bool[2]{true, false}] : bool[2]\n\
         %4 = const[value=f32[]{9.0}] : f32[]\n\
         %5 = where(%3, %2, %4) : f32[2,2]\n\
         %6 = cast[to=i64](%5) : i64[2,2]\n\
         %7 = const[value=i64[2,1]{7, 8}] : i64[2,1]\n\
         %8 = concat[axis=-1](%6, %7) : i64[2,3]\n\
         output \"y\" = %8\n",
    );
    let x = TensorValue::from_f32(vec![2, 3], vec![1.5, 2.5, -3.7, 4.0, 5.0, 6.9]).unwrap();
    assert_eq!(
        run1(&s, &[("x", x)]).as_i64().unwrap(),
        &[-3, 9, 7, 6, 9, 8]
    );
}

#[test]
fn op_errors_name_the_node() {
    let s = session(
        "%0 = input[name=\"a\"] : f32[*]\n\
         %1 = input[name=\"b\"] : f32[*]\n\
         %2 = add(%0, %1) : f32[*]  # my/add\n\
         output \"y\" = %2\n",
    );
    let a = TensorValue::from_f32(vec![2], vec![1.0, 2.0]).unwrap();
    let b = TensorValue::from_f32(vec![3], vec![1.0, 2.0, 3.0]).unwrap();
    match s.run(&[("a", a), ("b", b)]) {
        Err(Error::Op { node, op, .. }) => assert_eq!((node.as_str(), op), ("my/add", "add")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn session_is_send_sync_and_runs_concurrently() {
    fn is<T: Send + Sync>() {}
    is::<Session>();
    let s = session(
        "%0 = input[name=\"x\"] : f32[N,4]\n\
         %1 = relu(%0) : f32[N,4]\n\
         output \"y\" = %1\n",
    );
    std::thread::scope(|sc| {
        for t in 0..4 {
            let s = &s;
            sc.spawn(move || {
                for _ in 0..50 {
                    let x =
                        TensorValue::from_f32(vec![1, 4], vec![t as f32, -1.0, 2.0, -3.0]).unwrap();
                    assert_eq!(
                        run1(s, &[("x", x)]).as_f32().unwrap(),
                        &[t as f32, 0.0, 2.0, 0.0]
                    );
                }
            });
        }
    });
}

/// `less_or_equal` / `greater_or_equal` broadcast and give bool, equality included, for f32
/// and i64.
#[test]
fn comparisons_with_equality() {
    let s = session(
        "%0 = input[name=\"a\"] : f32[2,3]\n\
         %1 = input[name=\"b\"] : f32[3]\n\
         %2 = less_or_equal(%0, %1) : bool[2,3]\n\
         %3 = greater_or_equal(%0, %1) : bool[2,3]\n\
         %4 = input[name=\"i\"] : i64[2,1]\n\
         %5 = const[value=i64[2]{3, 4}] : i64[2]\n\
         %6 = greater_or_equal(%4, %5) : bool[2,2]\n\
         output \"le\" = %2\n\
         output \"ge\" = %3\n\
         output \"ige\" = %6\n",
    );
    let a = TensorValue::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 0.0, 5.0, -1.0]).unwrap();
    let b = TensorValue::from_f32(vec![3], vec![1.0, 0.0, 4.0]).unwrap();
    let i = TensorValue::from_i64(vec![2, 1], vec![3, 5]).unwrap();
    let out = s.run(&[("a", a), ("b", b), ("i", i)]).unwrap();
    let get = |n: &str| &out.iter().find(|(k, _)| k == n).unwrap().1;
    assert_eq!(get("le").shape(), &[2, 3]);
    assert_eq!(
        get("le").as_bool().unwrap(),
        &[true, false, true, true, false, true]
    );
    assert_eq!(
        get("ge").as_bool().unwrap(),
        &[true, true, false, false, true, false]
    );
    assert_eq!(get("ige").as_bool().unwrap(), &[true, false, true, true]);
}

/// `clip` with both bounds, min only, max only (min = -inf, as the importer writes it), on
/// i64, and NaN passing through; a bound with two elements is an error naming the node.
#[test]
fn clip_bounds() {
    let s = session(
        "%0 = input[name=\"x\"] : f32[5]\n\
         %1 = const[value=f32[]{-1.0}] : f32[]\n\
         %2 = const[value=f32[1]{2.0}] : f32[1]\n\
         %3 = clip(%0, %1, %2) : f32[5]\n\
         %4 = clip(%0, %1) : f32[5]\n\
         %5 = const[value=f32[]{-inf}] : f32[]\n\
         %6 = clip(%0, %5, %2) : f32[5]\n\
         %7 = input[name=\"i\"] : i64[3]\n\
         %8 = const[value=i64[]{0}] : i64[]\n\
         %9 = const[value=i64[]{4}] : i64[]\n\
         %10 = clip(%7, %8, %9) : i64[3]\n\
         output \"both\" = %3\n\
         output \"min\" = %4\n\
         output \"max\" = %6\n\
         output \"int\" = %10\n",
    );
    let x = TensorValue::from_f32(vec![5], vec![-3.0, 0.5, 7.0, f32::NAN, 2.0]).unwrap();
    let i = TensorValue::from_i64(vec![3], vec![-5, 3, 9]).unwrap();
    let out = s.run(&[("x", x), ("i", i)]).unwrap();
    let get = |n: &str| &out.iter().find(|(k, _)| k == n).unwrap().1;
    let f = |n: &str| format!("{:?}", get(n).as_f32().unwrap());
    assert_eq!(f("both"), "[-1.0, 0.5, 2.0, NaN, 2.0]");
    assert_eq!(f("min"), "[-1.0, 0.5, 7.0, NaN, 2.0]");
    assert_eq!(f("max"), "[-3.0, 0.5, 2.0, NaN, 2.0]");
    assert_eq!(get("int").as_i64().unwrap(), &[0, 3, 4]);

    let s = session(
        "%0 = input[name=\"x\"] : f32[*]\n\
         %1 = input[name=\"lo\"] : f32[*]\n\
         %2 = clip(%0, %1) : f32[*]  # my/clip\n\
         output \"y\" = %2\n",
    );
    let x = TensorValue::from_f32(vec![2], vec![1.0, 2.0]).unwrap();
    let lo = TensorValue::from_f32(vec![2], vec![0.0, 0.0]).unwrap();
    match s.run(&[("x", x), ("lo", lo)]) {
        Err(Error::Op { node, op, message }) => {
            assert_eq!((node.as_str(), op), ("my/clip", "clip"));
            assert!(message.contains("one element"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// `split` by sizes (one empty piece), by the even rule with a smaller last piece, on i64;
/// sizes that do not sum to the axis are an error naming the node.
#[test]
fn split_pieces() {
    let s = session(
        "%0 = input[name=\"x\"] : f32[2,5]\n\
         %1 = const[value=i64[3]{2, 0, 3}] : i64[3]\n\
         %2 = split[axis=1, num_outputs=3](%0, %1) : (f32[2,2], f32[2,0], f32[2,3])\n\
         %3 = split[axis=-1, num_outputs=2](%0) : (f32[2,3], f32[2,2])\n\
         %4 = input[name=\"i\"] : i64[3,2]\n\
         %5 = split[axis=0, num_outputs=3](%4) : (i64[1,2], i64[1,2], i64[1,2])\n\
         output \"a\" = %2\n\
         output \"b\" = %2.1\n\
         output \"c\" = %2.2\n\
         output \"d\" = %3\n\
         output \"e\" = %3.1\n\
         output \"f\" = %5.2\n",
    );
    let x = TensorValue::from_f32(vec![2, 5], (0..10).map(|v| v as f32).collect()).unwrap();
    let i = TensorValue::from_i64(vec![3, 2], vec![1, 2, 3, 4, 5, 6]).unwrap();
    let out = s.run(&[("x", x), ("i", i)]).unwrap();
    let get = |n: &str| &out.iter().find(|(k, _)| k == n).unwrap().1;
    let f = |n: &str| (get(n).shape().to_vec(), get(n).as_f32().unwrap().to_vec());
    assert_eq!(f("a"), (vec![2, 2], vec![0.0, 1.0, 5.0, 6.0]));
    assert_eq!(f("b"), (vec![2, 0], vec![]));
    assert_eq!(f("c"), (vec![2, 3], vec![2.0, 3.0, 4.0, 7.0, 8.0, 9.0]));
    assert_eq!(f("d"), (vec![2, 3], vec![0.0, 1.0, 2.0, 5.0, 6.0, 7.0]));
    assert_eq!(f("e"), (vec![2, 2], vec![3.0, 4.0, 8.0, 9.0]));
    assert_eq!(get("f").shape(), &[1, 2]);
    assert_eq!(get("f").as_i64().unwrap(), &[5, 6]);

    let s = session(
        "%0 = input[name=\"x\"] : f32[*]\n\
         %1 = input[name=\"sizes\"] : i64[2]\n\
         %2 = split[axis=0, num_outputs=2](%0, %1) : (f32[*], f32[*])  # my/split\n\
         output \"a\" = %2\n\
         output \"b\" = %2.1\n",
    );
    let x = TensorValue::from_f32(vec![4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let sizes = TensorValue::from_i64(vec![2], vec![1, 2]).unwrap();
    match s.run(&[("x", x), ("sizes", sizes)]) {
        Err(Error::Op { node, op, message }) => {
            assert_eq!((node.as_str(), op), ("my/split", "split"));
            assert!(message.contains("summing to the size 4"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// `tile` on every axis (including a zero count) and on i64; repeats of the wrong length are
/// an error naming the node.
#[test]
fn tile_repeats() {
    let s = session(
        "%0 = input[name=\"x\"] : f32[2,2]\n\
         %1 = const[value=i64[2]{2, 3}] : i64[2]\n\
         %2 = tile(%0, %1) : f32[4,6]\n\
         %3 = const[value=i64[2]{0, 1}] : i64[2]\n\
         %4 = tile(%0, %3) : f32[0,2]\n\
         %5 = input[name=\"i\"] : i64[3]\n\
         %6 = const[value=i64[1]{2}] : i64[1]\n\
         %7 = tile(%5, %6) : i64[6]\n\
         output \"a\" = %2\n\
         output \"b\" = %4\n\
         output \"c\" = %7\n",
    );
    let x = TensorValue::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let i = TensorValue::from_i64(vec![3], vec![7, 8, 9]).unwrap();
    let out = s.run(&[("x", x), ("i", i)]).unwrap();
    let get = |n: &str| &out.iter().find(|(k, _)| k == n).unwrap().1;
    assert_eq!(get("a").shape(), &[4, 6]);
    #[rustfmt::skip]
    let want = [
        1.0, 2.0, 1.0, 2.0, 1.0, 2.0,
        3.0, 4.0, 3.0, 4.0, 3.0, 4.0,
        1.0, 2.0, 1.0, 2.0, 1.0, 2.0,
        3.0, 4.0, 3.0, 4.0, 3.0, 4.0,
    ];
    assert_eq!(get("a").as_f32().unwrap(), &want);
    assert_eq!(get("b").shape(), &[0, 2]);
    assert_eq!(get("c").as_i64().unwrap(), &[7, 8, 9, 7, 8, 9]);

    let s = session(
        "%0 = input[name=\"x\"] : f32[*]\n\
         %1 = const[value=i64[1]{2}] : i64[1]\n\
         %2 = tile(%0, %1) : f32[*]  # my/tile\n\
         output \"y\" = %2\n",
    );
    let x = TensorValue::from_f32(vec![1, 2], vec![1.0, 2.0]).unwrap();
    match s.run(&[("x", x)]) {
        Err(Error::Op { node, op, .. }) => assert_eq!((node.as_str(), op), ("my/tile", "tile")),
        other => panic!("{other:?}"),
    }
}
