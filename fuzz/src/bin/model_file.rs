//! AFL++ target: see [`encore_fuzz::model_file`].
fn main() {
    afl::fuzz!(|data: &[u8]| encore_fuzz::model_file(data));
}
