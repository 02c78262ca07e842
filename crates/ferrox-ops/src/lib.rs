//! What the engine and every backend crate must agree on, in one place that
//! both import: the op vocabulary (RoPE, attention, activations) and each
//! accelerator's kernel table.
//!
//! The decision: a backend's claims (what `ferrox kernels` prints, what the
//! loader plans) and its launches (what its device crate loads and runs)
//! used to be two hand-copied lists in two crates, and a third, hidden one
//! chose per call. Here the table is data in a leaf crate with no device
//! code, so `ferrox-core` answers "what would CUDA run for this matrix" on a
//! build without CUDA, and `ferrox-cuda` launches by the same answer. What
//! keeps the table honest is a test against the kernel source
//! (`ferrox-core`'s claims⇔launch test), not a second list.

#![deny(missing_docs)]

pub mod cuda;
pub mod metal;
pub mod vulkan;
mod op;

pub use op::{Activation, AttnParams, AttnShape, RopeParams, RopeShape, RopeStyle};

use ferrox_quant::QuantKind;

/// A weight matrix as a backend's device and the engine's plan see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mat {
    /// Its kind.
    pub kind: QuantKind,
    /// Output rows.
    pub rows: usize,
    /// Input width.
    pub cols: usize,
}
