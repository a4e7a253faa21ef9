//! AFL++ target: see [`encore_fuzz::onnx_import`].
fn main() {
    afl::fuzz!(|data: &[u8]| encore_fuzz::onnx_import(data));
}
