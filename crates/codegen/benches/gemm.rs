fn main() { eprintln!("placeholder: the GEMM benchmark is being written"); }
