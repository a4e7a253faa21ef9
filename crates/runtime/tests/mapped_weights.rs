//! A session gives back the resident pages of the weights it packed from a memory-mapped model
//! file: they are not resident twice (the packed copy and the file's pages).

use ir::{DType, Dim, Graph, Op, Outlet, Tensor, TensorType};
use runtime::{CompileOptions, Model, Session, TensorValue};

/// Resident kilobytes of this process's mappings of `path` (`/proc/self/smaps`).
fn resident_kib_of(path: &std::path::Path) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let name = path.to_str()?;
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            inside = line.ends_with(name);
        } else if inside && first == "Rss:" {
            total += line.split_whitespace().nth(1)?.parse::<usize>().ok()?;
        }
    }
    Some(total)
}

#[test]
fn packed_weights_leave_their_file_pages() {
    if !cfg!(target_os = "linux") {
        eprintln!("SKIP packed_weights_leave_their_file_pages: /proc/self/smaps is Linux's");
        return;
    }
    let (k, n) = (512, 1024);
    let mut g = Graph::new();
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, vec![Dim::sym("B"), Dim::fixed(k)]),
    );
    let w: Vec<f32> = (0..k * n)
        .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
        .collect();
    let wc = g.add_const("w", Tensor::from_vec(vec![k, n], w.clone()));
    let y = g
        .add_node(
            Op::MatMul,
            "mm",
            &[x, wc],
            vec![TensorType::new(
                DType::F32,
                vec![Dim::sym("B"), Dim::fixed(n)],
            )],
        )
        .unwrap();
    g.set_output("y", Outlet::new(y, 0));
    let path = std::env::temp_dir().join(format!(
        "encore-mapped-weights-{}.encore",
        std::process::id()
    ));
    Model::from_graph(g).unwrap().save(&path).unwrap();
    let model = Model::load(&path).unwrap();
    let weight_kib = k * n * 4 / 1024;
    let session = Session::new(&model, CompileOptions::default()).unwrap();
    let resident = resident_kib_of(&path).expect("the model file is mapped");
    // The packed copy lives on the heap; of the 2 MiB weight read from the file, at most the
    // two partial pages at its ends stay resident, besides the header.
    assert!(
        resident < weight_kib / 8,
        "{resident} KiB of the model file still resident after packing a {weight_kib} KiB weight"
    );
    // The results are those of the weight as written.
    let xs: Vec<f32> = (0..2 * k).map(|i| (i % 13) as f32 / 13.0).collect();
    let out = session
        .run(&[("x", TensorValue::from_f32(vec![2, k], xs.clone()).unwrap())])
        .unwrap();
    let got = out[0].1.as_f32().unwrap();
    for (r, c) in [(0, 0), (1, 777), (0, n - 1)] {
        let want: f64 = (0..k)
            .map(|i| xs[r * k + i] as f64 * w[i * n + c] as f64)
            .sum();
        assert!((got[r * n + c] as f64 - want).abs() < 1e-3, "({r}, {c})");
    }
    drop(session);
    drop(model);
    let _ = std::fs::remove_file(&path);
}
