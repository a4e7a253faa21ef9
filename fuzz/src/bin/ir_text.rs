//! AFL++ target: see [`encore_fuzz::ir_text`].
fn main() {
    afl::fuzz!(|data: &[u8]| encore_fuzz::ir_text(data));
}
