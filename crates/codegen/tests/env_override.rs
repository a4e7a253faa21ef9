//! `ENCORE_KERNEL` forcing (its own test binary: it sets process environment variables).

use codegen::kernels::select::forced_int8_kernel;
use codegen::kernels::{pick_f32, pick_int8, F32Kernel, Int8Kernel, KernelError};

#[test]
fn encore_kernel_forces_and_validates() {
    // set_var is safe in edition 2021 but racy with concurrent readers; this binary has a
    // single test, so nothing else reads the environment meanwhile.
    std::env::set_var("ENCORE_KERNEL", "scalar");
    assert_eq!(pick_int8(4096, 3072, 768), Int8Kernel::Scalar);
    assert_eq!(pick_f32(), F32Kernel::Scalar);
    if Int8Kernel::Avx2.is_supported() {
        std::env::set_var("ENCORE_KERNEL", "avx2");
        assert_eq!(pick_int8(4096, 3072, 768), Int8Kernel::Avx2);
        assert_eq!(pick_f32(), F32Kernel::Avx2);
    }
    std::env::set_var("ENCORE_KERNEL", "nonsense");
    assert!(matches!(
        forced_int8_kernel(),
        Some(Err(KernelError::UnknownKernel(_)))
    ));
    assert!(
        pick_int8(128, 768, 768).is_supported(),
        "an invalid override falls back to auto"
    );
    if !Int8Kernel::Amx.is_supported() {
        std::env::set_var("ENCORE_KERNEL", "amx");
        assert_eq!(
            forced_int8_kernel(),
            Some(Err(KernelError::Unsupported("amx")))
        );
        assert_ne!(pick_int8(1024, 768, 768), Int8Kernel::Amx);
    }
    std::env::remove_var("ENCORE_KERNEL");
    assert!(forced_int8_kernel().is_none());
}
