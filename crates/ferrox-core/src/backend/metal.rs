//! The Metal backend at the seam: its capability table (compiled on every
//! build, from `ferrox_ops::metal`) and, with the `metal` feature, the
//! [`DeviceBackend`](super::DeviceBackend) over `ferrox-metal`'s device.
//!
//! The decision (`docs/decisions/0037-metal-backend.md`): the Vulkan
//! backend's design on Apple's API — the whole model resident in the file's
//! block formats (the mapped file wrapped without a copy where its pages
//! allow), activations and the f16 KV cache on the device, launches encoded
//! into one command buffer that is committed when the host reads or writes;
//! every op one kernel launch, the blocks the seam's composition of them.
//! No Apple machine has run any of it: the plan says so
//! ([`BackendCaps::unverified`]).

use ferrox_ops::metal as mtl_ops;
use ferrox_quant::QuantKind;

use super::BackendCaps;
use crate::kernel_registry::Backend;

/// The Metal backend (`ferrox-metal`). Without the `metal` feature it is
/// only a capability table.
pub struct Metal {
    #[cfg(feature = "metal")]
    dev: ferrox_metal::Device,
}

impl BackendCaps for Metal {
    const ID: Backend = Backend::Metal;
    const NAME: &'static str = "Metal";
    const GEMM_FALLBACK: &'static str = "none (every claimed kind has its batched product)";

    /// The product kernel of each kind of `ferrox_ops::metal::KINDS`;
    /// `every_kind_a_compiled_backend_claims_can_actually_be_launched` ties
    /// it to the kernels the MSL source instantiates.
    fn matvec_kernel(kind: QuantKind) -> Option<String> {
        mtl_ops::matmul_kernel(kind).map(|s| format!("metal {s} (unverified)"))
    }

    /// The same kernel takes batches ([`mtl_ops::MATMUL_TILE`] tokens per read of a row).
    fn gemm_supported(kind: QuantKind) -> bool {
        mtl_ops::suffix(kind).is_some()
    }

    /// The attention kernel holds a head in 64 threads of 4 values.
    fn max_head_dim() -> Option<usize> {
        Some(mtl_ops::MAX_HEAD_DIM)
    }

    fn unverified() -> Option<&'static str> {
        Some("every kernel is Metal Shading Language compiled at run time that has never run on Apple hardware (the same logic as the Vulkan shaders, checked on Linux only as C++ through a shim)")
    }

    fn prefill_kernel(kind: QuantKind, cols: usize) -> String {
        let _ = cols;
        match mtl_ops::matmul_kernel(kind) {
            Some(s) => format!("metal {s} ({} tokens per read of a weight row; unverified)", mtl_ops::MATMUL_TILE),
            None => "none".into(),
        }
    }
}
