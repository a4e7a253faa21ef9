//! INT8 GEMM (u8 × s8 → i32).

pub mod amx;
