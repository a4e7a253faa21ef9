//! `examples/semantic_search.rs` kept from rotting: its core (quantize MiniLM, embed the Lee
//! documents, search) runs here, and the built example binary, when present, fails cleanly on a
//! missing models folder.

#[path = "../examples/semantic_search.rs"]
#[allow(dead_code)]
mod example;

mod common;

/// A document's own opening words find that document first, through the INT8 model; the INT8
/// model saved and loaded again as `.encore` gives the same ranking.
#[test]
fn the_example_finds_a_document_by_its_opening_words() {
    if cfg!(debug_assertions) {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP the_example_finds_a_document_by_its_opening_words: MiniLM calibration and 50 documents; run with --release"
        );
        return;
    }
    let Some(dir) = common::models_dir("semantic search example") else {
        return;
    };
    let saved = std::env::temp_dir().join(format!("semantic-search-{}.encore", std::process::id()));
    let index = example::build_index(&dir, None, Some(&saved)).unwrap();
    assert_eq!(index.documents.len(), 50);
    assert!(index
        .encoder
        .session()
        .graph()
        .node_ids()
        .any(|id| matches!(
            index.encoder.session().graph().node(id).op,
            ir::Op::QLinear { .. }
        )));
    let queries: Vec<(usize, String)> = [8usize, 17, 31]
        .into_iter()
        .map(|d| {
            let words: Vec<&str> = index.documents[d]
                .text
                .split_whitespace()
                .take(15)
                .collect();
            (d, words.join(" "))
        })
        .collect();
    let mut rankings = Vec::new();
    for (d, q) in &queries {
        let hits = index.search(q, 5).unwrap();
        assert_eq!(hits.len(), 5);
        assert_eq!(hits[0].document, *d, "query {q:?}: {hits:?}");
        assert!(
            hits.windows(2).all(|w| w[0].score >= w[1].score),
            "{hits:?}"
        );
        assert!(hits[0].score > 0.5 && hits[0].score <= 1.001, "{hits:?}");
        rankings.push(hits);
    }
    let again = example::build_index(&dir, Some(&saved), None).unwrap();
    for ((_, q), want) in queries.iter().zip(&rankings) {
        assert_eq!(
            &again.search(q, 5).unwrap(),
            want,
            "{q:?} after save and load"
        );
    }
    std::fs::remove_file(&saved).ok();
}

/// No models folder: a message that names it, and exit status 2 (from the binary when cargo
/// built it for this test run; from `check_models` always).
#[test]
fn a_missing_models_folder_is_a_clear_error() {
    let missing = std::path::Path::new("/nonexistent/encore-models");
    let e = example::check_models(missing).unwrap_err();
    assert!(e.contains("/nonexistent/encore-models"), "{e}");
    assert!(e.contains("ENCORE_MODELS"), "{e}");
    assert!(example::build_index(missing, None, None).is_err());
    // target/<profile>/deps/this-test → target/<profile>/examples/semantic_search
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("examples/semantic_search"));
    if let Some(bin) = bin.filter(|b| b.is_file()) {
        let out = std::process::Command::new(&bin)
            .args(["--models", "/nonexistent/encore-models", "floods"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("/nonexistent/encore-models"), "{err}");
    }
}
