//! AMX detection and permission (the kernel follows).

/// CPUID.(EAX=7,ECX=0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8).
pub fn cpuid_has_amx_int8() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let max = std::arch::x86_64::__cpuid(0).eax;
        if max < 7 {
            return false;
        }
        let r = std::arch::x86_64::__cpuid_count(7, 0);
        (r.edx >> 24) & 1 == 1 && (r.edx >> 25) & 1 == 1
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Placeholder until the AMX kernel lands: always refuses.
pub fn request_amx_permission() -> Result<(), super::super::KernelError> {
    Err(super::super::KernelError::Unsupported("amx"))
}
