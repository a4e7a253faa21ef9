//! AFL++ target: see [`encore_fuzz::npy`].
fn main() {
    afl::fuzz!(|data: &[u8]| encore_fuzz::npy(data));
}
