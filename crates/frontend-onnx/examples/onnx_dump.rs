//! Imports an ONNX model and prints its IR text form, with the import time on stderr.
//!
//! `cargo run --release -p frontend-onnx --example onnx_dump -- model.onnx [--quiet]`

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: onnx_dump MODEL.onnx [--quiet]")?;
    let quiet = args.next().as_deref() == Some("--quiet");
    let t = Instant::now();
    let g = frontend_onnx::import_path(&path)?;
    let elapsed = t.elapsed();
    eprintln!("{path}: {} nodes, imported in {elapsed:?}", g.node_count());
    if !quiet {
        print!("{}", ir::text::print(&g)?);
    }
    Ok(())
}
