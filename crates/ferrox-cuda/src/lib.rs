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

pub use compile::{compile_check, defined_kernels, kernel_source, nvrtc_present};
pub use device::{
    mmvq_quantize_activations, Act, AttnShape, Buf, Device, Graph, IndexView, Indices, Kv,
    MatmulPath, Matrix, RopeShape,
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

/// The kind table (suffixes, int8 kinds) and the per-shape matvec choice
/// live in `ferrox_ops::cuda`, where the engine's plan reads them too.
pub use ferrox_ops::cuda::{int8_kind as mmvq_kind, kernel_suffix, GEMM_MIN_TOKENS};

/// The architecture CI compiles for (the H200 this backend is measured on).
pub const CHECK_ARCH: &str = "compute_90";
