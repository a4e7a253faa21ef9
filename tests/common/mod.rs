//! Helpers shared by the end-to-end tests: where the shared models are, and running the CLI.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The shared models folder: `$ENCORE_MODELS`, else `../shared/models` beside the workspace.
/// Returns `None` (after a loud message) when it is missing outside CI; panics in CI, where a
/// missing folder is a failure.
pub fn models_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("ENCORE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/models"));
    if dir.join("manifest.json").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{test}: shared models missing at {} (CI requires them)",
            dir.display()
        );
    }
    {
        // Straight to stderr: the harness hides eprintln! of passing tests.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP {test}: shared models missing at {} (set ENCORE_MODELS)",
            dir.display()
        );
    }
    None
}

/// Runs the `encore` binary with `args`.
pub fn encore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_encore"))
        .args(args)
        .output()
        .expect("the encore binary runs")
}

/// `encore quantize` of `model` on 16 random calibration sequences of 16 tokens (4 held back)
/// into `out`; panics with the CLI's message when it fails.
pub fn quantize_random(model: &std::path::Path, out: &std::path::Path) {
    quantize_random_with(model, out, &[]);
}

/// [`quantize_random`] with more `encore quantize` flags.
pub fn quantize_random_with(model: &std::path::Path, out: &std::path::Path, flags: &[&str]) {
    let mut args = vec![
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--random-calibration",
        "16",
        "--seq",
        "16",
        "--held-back",
        "4",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let o = encore(&args);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A fresh scratch folder under the target directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts the command failed cleanly: non-zero exit, an `error:` message mentioning each of
/// `needles`, and no panic.
pub fn assert_clean_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert_eq!(o.status.code(), Some(1), "exit code; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.starts_with("error: "), "stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks `{n}`: {err}");
    }
}
