//! One error type: where (file, byte offset) plus what ([`ErrorKind`]).
//!
//! Location is kept apart from the kind so every kind gets a file and an
//! offset for free, and tests can match on the kind alone.

use std::fmt;
use std::path::{Path, PathBuf};

use ferrox_quant::QuantKind;

use crate::value::ValueType;

/// What went wrong reading or writing a GGUF file, and where.
#[derive(Debug)]
pub struct GgufError {
    /// The file, when the bytes came from one.
    pub path: Option<PathBuf>,
    /// The byte offset in that file where the offending item starts, when
    /// the error is about a place in the file.
    pub offset: Option<u64>,
    /// What was wrong, and what was expected instead.
    pub kind: ErrorKind,
}

impl GgufError {
    pub(crate) fn new(path: Option<&Path>, offset: Option<u64>, kind: ErrorKind) -> Self {
        GgufError {
            path: path.map(Path::to_path_buf),
            offset,
            kind,
        }
    }

    /// An error with no file position (writer input, a missing key).
    pub(crate) fn bare(kind: ErrorKind) -> Self {
        GgufError {
            path: None,
            offset: None,
            kind,
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}", p.display())?,
            None => f.write_str("<gguf bytes>")?,
        }
        if let Some(o) = self.offset {
            write!(f, ": byte {o}")?;
        }
        write!(f, ": {}", self.kind)
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// The kinds of [`GgufError`]; each message states what was expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Opening, mapping or writing the file failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The file ends inside a fixed-size field.
    #[error("truncated: the file ends inside {what}, which takes {needed} bytes; {available} remain")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field takes.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A count or length read from the file that the rest of the file cannot
    /// possibly hold; checked before anything is allocated for it.
    #[error(
        "truncated or corrupt: {what} is {count}, which needs at least {min_bytes} bytes, but only {available} remain"
    )]
    CountExceedsFile {
        /// Which count or length.
        what: &'static str,
        /// The value read.
        count: u64,
        /// The fewest bytes that many items occupy (saturating).
        min_bytes: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: it starts with {:?}, where a GGUF file starts with \"GGUF\"", String::from_utf8_lossy(found))]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A byte-swapped magic or version: a big-endian GGUF file.
    #[error("this is a big-endian GGUF file (byte-swapped {field}); only little-endian files are supported")]
    BigEndian {
        /// `"magic"` or `"version"`.
        field: &'static str,
    },
    /// A version other than 2 or 3.
    #[error("GGUF version {found} is not supported: expected 2 or 3{}", if *found == 1 { " (version 1 used 32-bit counts and was superseded in 2023; re-convert the model)" } else { "" })]
    UnsupportedVersion {
        /// The version read.
        found: u32,
    },
    /// A metadata value type id GGUF does not define.
    #[error("unknown metadata value type id {type_id}: expected 0..=12")]
    UnknownValueType {
        /// The id read.
        type_id: u32,
    },
    /// Bytes that must be UTF-8 and are not.
    #[error("{what} is not valid UTF-8: {lossy:?}")]
    InvalidUtf8 {
        /// Which string (`"metadata key"`, `"tensor name"`, a key's value).
        what: String,
        /// The bytes, lossily decoded, to show what was there.
        lossy: String,
    },
    /// A bool byte other than 0 or 1.
    #[error("expected a bool (0 or 1), found {found}")]
    InvalidBool {
        /// The byte read.
        found: u8,
    },
    /// Arrays nested deeper than the reader allows.
    #[error("arrays nested more than {limit} deep")]
    NestingTooDeep {
        /// The limit.
        limit: usize,
    },
    /// A metadata key that appears twice.
    #[error("duplicate metadata key {key:?}: expected each key once")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// `general.alignment` that is not a power-of-two `u32`.
    #[error("general.alignment must be a non-zero power-of-two u32, found {found}")]
    BadAlignment {
        /// The value found, described.
        found: String,
    },
    /// A tensor with more dimensions than ggml has.
    #[error("tensor {tensor:?} has {n_dims} dimensions: expected at most 4")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// The count read.
        n_dims: u32,
    },
    /// A tensor type id no [`QuantKind`] has.
    #[error("tensor {tensor:?} has unknown type id {type_id}: expected one of ferrox's kinds (F32=0, F16=1, Q4_0=2, ...)")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The id read.
        type_id: u32,
    },
    /// Dimensions whose product (or byte size) overflows.
    #[error("tensor {tensor:?} has shape {dims:?}, whose size overflows: expected each dimension below 2^63 and a total below 2^64 bytes")]
    ShapeOverflow {
        /// The tensor.
        tensor: String,
        /// The dimensions read.
        dims: Vec<u64>,
    },
    /// A first dimension that is not whole blocks of the tensor's kind.
    #[error("tensor {tensor:?} is {kind} with first dimension {ne0}: expected a multiple of the {block_elems}-element block")]
    NotWholeBlocks {
        /// The tensor.
        tensor: String,
        /// Its kind.
        kind: QuantKind,
        /// Its first (innermost) dimension.
        ne0: u64,
        /// Elements per block of `kind`.
        block_elems: usize,
    },
    /// A tensor offset not a multiple of the file's alignment.
    #[error("tensor {tensor:?} has data offset {offset}: expected a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Tensor data extending past the end of the file; a well-formed file
    /// cut short (a partial download) says so, with the size it should have.
    #[error("{}", match full_len {
        Some(full) => format!("truncated: {file_len} of {full} bytes (tensor {tensor:?} ends at byte {end}); the file was cut short: download or copy it again"),
        None => format!("tensor {tensor:?} occupies bytes {start}..{end} of the file: expected it to end within the file's {file_len} bytes"),
    })]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Absolute start (saturating).
        start: u64,
        /// Absolute end (saturating).
        end: u64,
        /// The file's length.
        file_len: u64,
        /// The length the file would have, when its tensors are laid out
        /// back to back as writers lay them (so the file was cut short,
        /// rather than its tensor table being corrupt).
        full_len: Option<u64>,
    },
    /// Two tensors whose data ranges overlap.
    #[error("tensor {tensor:?} (data bytes {start}..{end}) overlaps tensor {other:?}, which ends at {other_end}: expected disjoint data")]
    TensorOverlap {
        /// The later-starting tensor.
        tensor: String,
        /// Its data start, relative to the data section.
        start: u64,
        /// Its data end, relative to the data section.
        end: u64,
        /// The tensor it overlaps.
        other: String,
        /// That tensor's data end.
        other_end: u64,
    },
    /// A tensor name that appears twice.
    #[error("duplicate tensor name {name:?}: expected each tensor once")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// A key a getter asked for is absent.
    #[error("metadata key {key:?} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A key a getter asked for has another type.
    #[error("metadata key {key:?} is {found}: expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The type asked for (or a description, e.g. "unsigned integer").
        expected: String,
        /// The type found.
        found: ValueType,
    },
    /// Writer input: tensor bytes that do not match kind and shape.
    #[error("tensor {tensor:?}: {kind} with shape {dims:?} takes {expected} bytes, {found} given")]
    TensorDataLength {
        /// The tensor.
        tensor: String,
        /// Its kind.
        kind: QuantKind,
        /// Its dimensions.
        dims: Vec<u64>,
        /// Bytes that shape takes.
        expected: u64,
        /// Bytes given.
        found: u64,
    },
    /// The quantizer refused a tiny model's tensor.
    #[error("tensor {tensor:?}: {source}")]
    Quant {
        /// The tensor.
        tensor: String,
        /// The quantizer's error.
        source: ferrox_quant::QuantError,
    },
    /// Writer input: a version other than 2 or 3.
    #[error("cannot write GGUF version {found}: expected 2 or 3")]
    UnwritableVersion {
        /// The version asked for.
        found: u32,
    },
    /// A split model whose part file does not exist or cannot be opened.
    #[error("split part {part} of {count} cannot be opened: {source}")]
    MissingSplitPart {
        /// 1-based part number.
        part: u32,
        /// Parts expected.
        count: u32,
        /// Why it could not be opened.
        source: Box<GgufError>,
    },
    /// Split metadata disagreeing with the file names or with each other.
    #[error("split {what}: expected {expected}, found {found}")]
    SplitMismatch {
        /// What disagrees (`"split.no"`, `"split.count"`, `"split.tensors.count"`, ...).
        what: String,
        /// The value the file names or first part imply.
        expected: u64,
        /// The value found.
        found: u64,
    },
}
