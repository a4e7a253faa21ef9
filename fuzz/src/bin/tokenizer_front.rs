//! AFL++ target: see [`encore_fuzz::tokenizer_front`].
fn main() {
    afl::fuzz!(|data: &[u8]| encore_fuzz::tokenizer_front(data));
}
