//! Declutter on the shared ONNX models.

mod common;

use common::{count, histogram_text, models_dir};
use passes::{Pipeline, RunOptions};

fn declutter(rel: &str) -> Option<(ir::Graph, ir::Graph)> {
    let dir = models_dir(rel)?;
    let g0 = frontend_onnx::import_path(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut g = g0.clone();
    Pipeline::declutter()
        .run(&mut g, &mut RunOptions::default())
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    Some((g0, g))
}

#[test]
fn explore() {
    for m in [
        "tiny/bert/model.onnx",
        "tiny/bert-cls/model.onnx",
        "tiny/distilbert/model.onnx",
        "tiny/xlm-roberta/model.onnx",
        "minilm-l6/model.onnx",
    ] {
        let Some((g0, g)) = declutter(m) else { return };
        println!(
            "== {m}\n-- before\n{}-- after\n{}",
            histogram_text(&g0),
            histogram_text(&g)
        );
        let _ = count(&g, "shape");
    }
}

#[test]
fn explore_text() {
    for m in [
        "tiny/bert/model.onnx",
        "tiny/distilbert/model.onnx",
        "tiny/xlm-roberta/model.onnx",
    ] {
        let Some((_, g)) = declutter(m) else { return };
        println!("== {m}\n{}", ir::text::print(&g).unwrap());
    }
}
