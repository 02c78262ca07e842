//! The GGUF container: header, typed metadata, tensor directory, mapped
//! bytes, split files, and a writer that round-trips byte-identically.
//!
//! The key decision: **one parser over a byte slice**, which validates the
//! whole file at open — every count and length against the bytes that
//! remain before allocating, every tensor for alignment, bounds, overlap and
//! whole blocks — and reports each problem as a [`GgufError`] naming the
//! file, the byte offset and what was expected. `open` (mmap) and
//! `from_bytes` (tests, fuzzing) share it, so the fuzzed code is the code
//! that loads models. Little-endian GGUF v2 and v3 only.
//!
//! Layout of a file: `GGUF`, version `u32`, tensor count `u64`, key/value
//! count `u64`, the key/values, the tensor infos (name, `u32` n_dims, `u64`
//! dims ne0 first, `u32` type, `u64` offset relative to the data section),
//! zero padding to the alignment (`general.alignment`, default 32), data.
#![deny(missing_docs)]

mod error;
mod reader;
mod split;
pub mod testing;
mod value;
mod writer;

pub use error::{ErrorKind, GgufError};
pub use reader::{
    GgufFile, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS,
};
pub use split::{
    parse_split_name, split_path, GgufModel, ModelTensor, SPLIT_COUNT_KEY, SPLIT_NO_KEY,
    SPLIT_TENSORS_COUNT_KEY,
};
pub use value::{Array, GgufString, StringArray, Value, ValueType};
pub use writer::GgufWriter;
