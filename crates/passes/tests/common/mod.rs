//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod interp;

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The shared models folder: `$ENCORE_MODELS`, else `../shared/models` next to the workspace.
/// `None` (after a loud SKIP line) when it is absent; a panic instead when `CI` is set.
pub fn models_dir(test: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("ENCORE_MODELS") {
        Some(d) => PathBuf::from(d),
        None => {
            let manifest = std::fs::canonicalize(env!("CARGO_MANIFEST_DIR"))
                .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
            manifest.join("../../../shared/models")
        }
    };
    if dir.join("manifest.json").exists() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{test}: shared models not found at {} (set ENCORE_MODELS)",
            dir.display()
        );
    }
    {
        // Straight to stderr: the harness hides eprintln! of passing tests.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP {test}: shared models not found at {} (set ENCORE_MODELS)",
            dir.display()
        );
    }
    None
}

/// Op name → count.
pub fn op_histogram(g: &ir::Graph) -> BTreeMap<&'static str, usize> {
    let mut h = BTreeMap::new();
    for id in g.node_ids() {
        *h.entry(g.node(id).op.name()).or_insert(0) += 1;
    }
    h
}

pub fn count(g: &ir::Graph, op: &str) -> usize {
    op_histogram(g).get(op).copied().unwrap_or(0)
}

pub fn histogram_text(g: &ir::Graph) -> String {
    op_histogram(g)
        .iter()
        .map(|(k, v)| format!("{k}: {v}\n"))
        .collect()
}
