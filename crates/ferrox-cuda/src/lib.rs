//! The CUDA backend's device layer: kernels as CUDA C compiled at run time,
//! buffers on one stream, nothing CUDA needed to build.
//!
//! The decision: the driver, NVRTC and cuBLAS are `dlopen()`ed at run time
//! (cudarc's dynamic loading), and every kernel is CUDA C in
//! `kernels.cu`, compiled by NVRTC at first use for the device's own
//! architecture and cached on disk. So this crate builds and tests on any
//! machine; [`compile_check`] compiles every kernel for sm_90 with NVRTC
//! alone (no GPU), which is how CI keeps a kernel that does not compile from
//! landing. A [`Device`] is opened explicitly (no hidden global) and owns
//! one stream; every operation is enqueued on it, so ordering is the
//! stream's and only [`Device::read`] waits.
//!
//! This crate imports `ferrox-quant` (for [`QuantKind`]) and never
//! `ferrox-core`: the seam (`ferrox_core::backend::cuda`) sits on top.

#![deny(missing_docs)]

mod compile;
mod device;

pub use compile::{compile_check, kernel_source, nvrtc_present};
pub use device::{
    mmvq_kind, mmvq_quantize_activations, Act, AttnShape, Buf, Device, Graph, IndexView, Indices,
    Kv, MatmulPath, Matrix, RopeShape, GEMM_MIN_TOKENS,
};
use ferrox_quant::QuantKind;

/// Everything that can go wrong on the CUDA side, naming what was attempted.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library is not loadable (no driver, no NVRTC…).
    #[error("the CUDA library {lib} cannot be loaded (is it on LD_LIBRARY_PATH?)")]
    MissingLibrary {
        /// Which one.
        lib: &'static str,
    },
    /// The driver loaded but sees no device (or not the one asked for).
    #[error("no CUDA device {ordinal} ({count} found)")]
    NoDevice {
        /// The device asked for.
        ordinal: usize,
        /// Devices present.
        count: i32,
    },
    /// A driver call failed.
    #[error("CUDA {what}: {source}")]
    Driver {
        /// The operation.
        what: String,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// NVRTC rejected the kernel source.
    #[error("NVRTC cannot compile the kernels for {arch}: {log}")]
    Compile {
        /// Target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS {what}: {source}")]
    Blas {
        /// The operation.
        what: &'static str,
        /// cuBLAS's error.
        source: cudarc::cublas::result::CublasError,
    },
    /// Operands whose sizes disagree.
    #[error("shape mismatch in {op}: {why}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What disagrees.
        why: String,
    },
    /// A kind this backend has no kernel for.
    #[error("no CUDA {op} kernel for {kind}")]
    NoKernel {
        /// The operation.
        op: &'static str,
        /// The weight kind.
        kind: QuantKind,
    },
}

pub(crate) fn drv(
    what: impl Into<String>,
) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    let what = what.into();
    move |source| CudaError::Driver { what, source }
}

/// The launch table: the kernel suffix `kernels.cu` defines for `kind`'s
/// matvec, get_rows and dequantize-to-f16 kernels, or `None`.
///
/// This is what can actually be launched; `ferrox_core`'s capability table
/// (what is *claimed*, compiled without this crate) is tied to it by a test
/// over every kind.
pub fn kernel_suffix(kind: QuantKind) -> Option<&'static str> {
    Some(match kind {
        QuantKind::F32 => "f32",
        QuantKind::F16 => "f16",
        QuantKind::BF16 => "bf16",
        QuantKind::Q4_0 => "q4_0",
        QuantKind::Q4_1 => "q4_1",
        QuantKind::Q5_0 => "q5_0",
        QuantKind::Q5_1 => "q5_1",
        QuantKind::Q8_0 => "q8_0",
        QuantKind::Q4K => "q4_k",
        QuantKind::Q5K => "q5_k",
        QuantKind::Q6K => "q6_k",
        QuantKind::Q2K => "q2_k",
        QuantKind::Q3K => "q3_k",
        QuantKind::IQ4NL => "iq4_nl",
        QuantKind::IQ4XS => "iq4_xs",
        QuantKind::TQ2_0 => "tq2_0",
        QuantKind::MXFP4 => "mxfp4",
        QuantKind::Q8_1 => "q8_1",
        QuantKind::Q8K => "q8_k",
        QuantKind::Q1_0 => "q1_0",
        QuantKind::Q2_0 => "q2_0",
        QuantKind::NVFP4 => "nvfp4",
        QuantKind::TQ1_0 => "tq1_0",
        QuantKind::IQ2XXS => "iq2_xxs",
        QuantKind::IQ2XS => "iq2_xs",
        QuantKind::IQ2S => "iq2_s",
        QuantKind::IQ3XXS => "iq3_xxs",
        QuantKind::IQ3S => "iq3_s",
        QuantKind::IQ1S => "iq1_s",
        QuantKind::IQ1M => "iq1_m",
        _ => return None, // capability table: F64 and the integer kinds are not weight formats
    })
}

/// The architecture CI compiles for (the H200 this backend is measured on).
pub const CHECK_ARCH: &str = "compute_90";
