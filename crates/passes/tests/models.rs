//! Declutter on the shared ONNX models: what is recognised, what is left, and the dumps.
//! Skips loudly when the models are absent (fails under `CI`).

mod common;

use common::{count, histogram_text, models_dir};
use passes::{DumpSpec, Pipeline, RunOptions};

fn import(rel: &str) -> Option<ir::Graph> {
    let dir = models_dir(rel)?;
    Some(frontend_onnx::import_path(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

fn declutter(rel: &str) -> Option<(ir::Graph, ir::Graph)> {
    let g0 = import(rel)?;
    let mut g = g0.clone();
    Pipeline::declutter()
        .run(&mut g, &mut RunOptions::default())
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    Some((g0, g))
}

/// The decluttered dump without its constant lines: the structure, readable in a review.
fn structure(g: &ir::Graph) -> String {
    ir::text::print(g)
        .unwrap()
        .lines()
        .filter(|l| !l.contains(" = const["))
        .map(|l| format!("{l}\n"))
        .collect()
}

struct Expect {
    layers: usize,
    linear: usize,
    shape: usize,
}

fn check(rel: &str, e: Expect) -> Option<ir::Graph> {
    let (g0, g) = declutter(rel)?;
    let t = structure(&g);
    assert_eq!(count(&g, "attention"), e.layers, "{rel}: attention\n{t}");
    assert_eq!(count(&g, "gelu"), e.layers, "{rel}: gelu\n{t}");
    assert_eq!(
        count(&g, "layer_norm"),
        2 * e.layers + 1,
        "{rel}: layer_norm\n{t}"
    );
    assert_eq!(count(&g, "linear"), e.linear, "{rel}: linear\n{t}");
    for gone in [
        "matmul",
        "gemm",
        "softmax",
        "erf",
        "transpose",
        "concat",
        "div",
    ] {
        assert_eq!(count(&g, gone), 0, "{rel}: {gone} left\n{t}");
    }
    assert_eq!(count(&g, "shape"), e.shape, "{rel}: shape\n{t}");
    // Every value is typed, and no dim had to be invented.
    for id in g.node_ids() {
        for ty in &g.node(id).outputs {
            let s = ty
                .shape
                .as_ref()
                .unwrap_or_else(|| panic!("{rel}: {} untyped", g.node(id).name));
            assert!(
                s.iter()
                    .all(|d| d.symbols().iter().all(|x| !x.starts_with("unk"))),
                "{rel}: {} has {ty}",
                g.node(id).name
            );
        }
    }
    // The dump is the stable text form: it parses back to the same text.
    let text = ir::text::print(&g).unwrap();
    let back = ir::text::parse(&text, None).unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert_eq!(
        ir::text::print(&back).unwrap(),
        text,
        "{rel}: dump round trip"
    );
    // The pipeline is at a fixpoint: a second run changes nothing.
    let mut again = g.clone();
    let report = Pipeline::declutter()
        .run(&mut again, &mut RunOptions::default())
        .unwrap();
    assert!(
        report.runs.iter().all(|r| !r.changed),
        "{rel}: {:?}",
        report.runs
    );
    insta::assert_snapshot!(
        format!("{}-histogram", rel.replace('/', "-")),
        format!(
            "--- import\n{}--- declutter\n{}",
            histogram_text(&g0),
            histogram_text(&g)
        )
    );
    Some(g)
}

#[test]
fn tiny_bert() {
    let Some(g) = check(
        "tiny/bert/model.onnx",
        Expect {
            layers: 2,
            linear: 13,
            shape: 1,
        },
    ) else {
        return;
    };
    insta::assert_snapshot!("tiny-bert-declutter", structure(&g));
}

#[test]
fn tiny_bert_cls() {
    check(
        "tiny/bert-cls/model.onnx",
        Expect {
            layers: 2,
            linear: 14,
            shape: 1,
        },
    );
}

#[test]
fn tiny_distilbert() {
    let Some(g) = check(
        "tiny/distilbert/model.onnx",
        Expect {
            layers: 2,
            linear: 12,
            shape: 1,
        },
    ) else {
        return;
    };
    insta::assert_snapshot!("tiny-distilbert-declutter", structure(&g));
}

#[test]
fn tiny_xlm_roberta() {
    let Some(g) = check(
        "tiny/xlm-roberta/model.onnx",
        Expect {
            layers: 2,
            linear: 12,
            shape: 2,
        },
    ) else {
        return;
    };
    insta::assert_snapshot!("tiny-xlm-roberta-declutter", structure(&g));
}

#[test]
fn minilm_l6() {
    check(
        "minilm-l6/model.onnx",
        Expect {
            layers: 6,
            linear: 36,
            shape: 1,
        },
    );
}

/// The quantized variants go through declutter without error; their QDQ MatMuls stay (the
/// quantize pipeline owns them).
#[test]
fn quantized_variants() {
    for rel in [
        "tiny/bert/model.qdq.onnx",
        "tiny/bert/model.qdq-u8s8.onnx",
        "tiny/bert/model.dynamic.onnx",
        "minilm-l6/model.qdq.onnx",
    ] {
        let Some((g0, g)) = declutter(rel) else {
            return;
        };
        insta::assert_snapshot!(
            format!("{}-histogram", rel.replace('/', "-")),
            format!(
                "--- import\n{}--- declutter\n{}",
                histogram_text(&g0),
                histogram_text(&g)
            )
        );
    }
}

#[test]
fn dumps_and_stop_after() {
    let Some(g0) = import("tiny/bert/model.onnx") else {
        return;
    };
    let mut names = Vec::new();
    let mut sizes = Vec::new();
    let mut cb = |pass: &str, text: &str| {
        names.push(pass.to_string());
        sizes.push(text.lines().count());
    };
    let mut g = g0.clone();
    let mut opts = RunOptions {
        dump_after: DumpSpec::All,
        dump: Some(&mut cb),
        ..RunOptions::default()
    };
    Pipeline::declutter().run(&mut g, &mut opts).unwrap();
    let first: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
    assert_eq!(
        first,
        [
            "import",
            "ShapeInference",
            "ConstantFolding",
            "DeadCodeElimination",
            "RecognizeLinear",
            "RecognizeLayerNorm",
            "RecognizeGelu",
            "RecognizeAttention"
        ]
    );
    assert_eq!(sizes[0], ir::text::print(&g0).unwrap().lines().count());
    assert_eq!(
        *sizes.last().unwrap(),
        ir::text::print(&g).unwrap().lines().count()
    );

    let mut g = g0.clone();
    let mut dumped = Vec::new();
    let mut cb = |pass: &str, _: &str| dumped.push(pass.to_string());
    let mut opts = RunOptions {
        stop_after: Some("ConstantFolding".into()),
        dump_after: DumpSpec::Named(vec!["ConstantFolding".into(), "RecognizeLinear".into()]),
        dump: Some(&mut cb),
        context: Default::default(),
    };
    let report = Pipeline::declutter().run(&mut g, &mut opts).unwrap();
    assert!(report.stopped);
    assert_eq!(dumped, ["ConstantFolding"]);
    assert_eq!(count(&g, "linear"), 0);
    assert_eq!(count(&g, "matmul"), 16);

    let err = Pipeline::declutter()
        .run(
            &mut g0.clone(),
            &mut RunOptions {
                stop_after: Some("Nope".into()),
                ..RunOptions::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("pipeline `declutter` has no pass named `Nope`"),
        "{err}"
    );
    let err = Pipeline::declutter()
        .run(
            &mut g0.clone(),
            &mut RunOptions {
                dump_after: DumpSpec::parse("import,RecognizeGelus"),
                ..RunOptions::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "pipeline `declutter` has no pass named `RecognizeGelus` (it has: import, ShapeInference, \
         ConstantFolding, DeadCodeElimination, RecognizeLinear, RecognizeLayerNorm, RecognizeGelu, \
         RecognizeAttention)"
    );
}
