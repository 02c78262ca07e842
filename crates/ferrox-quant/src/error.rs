//! Errors of the block-format layer.

use crate::QuantKind;

/// What went wrong converting between f32 and a block format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// An element count that is not a whole number of blocks.
    #[error("{kind}: {n_elems} elements is not a whole number of {block_elems}-element blocks")]
    NotWholeBlocks {
        /// The kind.
        kind: QuantKind,
        /// The element count given.
        n_elems: usize,
        /// The kind's block size in elements.
        block_elems: usize,
    },
    /// A byte buffer whose length does not match the element count.
    #[error("{kind}: expected {expected} bytes for {n_elems} elements, got {got}")]
    WrongByteLength {
        /// The kind.
        kind: QuantKind,
        /// Elements the buffer should hold.
        n_elems: usize,
        /// Bytes that many elements take.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// A byte buffer not aligned for the kind's block struct.
    #[error("{kind}: buffer at address {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The kind.
        kind: QuantKind,
        /// The buffer's address.
        addr: usize,
        /// The alignment the block struct needs.
        align: usize,
    },
    /// A kind this crate cannot quantize to (yet), and why.
    #[error("cannot quantize to {kind}: {reason}")]
    CannotQuantize {
        /// The kind.
        kind: QuantKind,
        /// Why not.
        reason: &'static str,
    },
    /// A kind that is not a weight format has no dot product.
    #[error("{kind} has no dot product (it is not a weight format)")]
    NoDot {
        /// The kind.
        kind: QuantKind,
    },
}
