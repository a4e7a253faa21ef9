//! AFL++ target: see [`encore_fuzz::session_inputs`].
fn main() {
    afl::fuzz!(|data: &[u8]| encore_fuzz::session_inputs(data));
}
