//! The reader: one parser over a byte slice, fed by mmap or by owned bytes.
//!
//! Every length and count read from the file is checked against the bytes
//! that remain *before* anything is allocated for it, using the fewest bytes
//! one element can occupy (4 for a `u32`, 8 for a string's length prefix,
//! 24 for a tensor info). So a claimed count of 2^60 fails at once, and the
//! memory the parser allocates is at most a small constant times the file
//! size. The whole tensor directory is validated at open (alignment, bounds,
//! overlap, whole blocks), so later accessors only re-check what a caller
//! could get wrong.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use ferrox_quant::QuantKind;
use memmap2::Mmap;

use crate::error::{ErrorKind, GgufError};
use crate::value::{numeric_value_types, Array, GgufString, StringArray, Value, ValueType};

/// Alignment of the data section and of every tensor when the file has no
/// `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Deepest array-of-arrays nesting accepted; bounds the parser's recursion,
/// which the file size alone would not (each level costs only 12 bytes).
pub const MAX_ARRAY_DEPTH: usize = 16;
/// The key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Most elements reserved up front for a list whose items are parsed one by
/// one. A claimed count is already bounded by the bytes left, but an item in
/// memory is larger than its smallest encoding (an 8-byte string offset for
/// 8 file bytes, an 88-byte `TensorInfo` for 24); reserving a bounded amount
/// and growing as items actually parse keeps memory proportional to what was
/// parsed. Arrays of arrays reserve nothing (see `Cursor::array`).
const PREALLOC_LIMIT: usize = 4096;
/// Fewest bytes a tensor info occupies: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// Fewest bytes a key/value pair occupies: key length, type id, one byte.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its storage type.
    pub kind: QuantKind,
    /// Dimensions in ggml order: `dims[0]` (ne0) is the contiguous one.
    pub dims: Vec<u64>,
    /// Offset of its data relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data, implied by `kind` and `dims`.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (the product of `dims`; 1 for zero dimensions).
    /// Checked not to overflow when the file was opened.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// A 64-byte-aligned chunk, so owned bytes give tensor slices the same
/// alignment guarantees as an mmap (whose base is page-aligned).
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Chunk([u8; 64]);

enum Storage {
    Mmap(Mmap),
    Owned { chunks: Vec<Chunk>, len: usize },
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned { chunks, len } => {
                let all: &[u8] = bytemuck::cast_slice(chunks);
                all.get(..*len).unwrap_or(all)
            }
        }
    }

    fn owned(src: &[u8]) -> Storage {
        let mut chunks = vec![Chunk([0; 64]); src.len().div_ceil(64)];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut chunks);
        dst[..src.len()].copy_from_slice(src);
        Storage::Owned {
            chunks,
            len: src.len(),
        }
    }
}

/// An opened GGUF file: header, metadata in file order, the validated tensor
/// directory, and the bytes (mapped or owned).
pub struct GgufFile {
    path: Option<PathBuf>,
    storage: Storage,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    kv_offsets: Vec<u64>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

macro_rules! numeric_getters {
    ($(($name:ident, $v:ident, $t:ty)),* $(,)?) => {
        $(
            #[doc = concat!("The `", stringify!($t), "` at `key`; an error naming the key if it is missing or of another type.")]
            pub fn $name(&self, key: &str) -> Result<$t, GgufError> {
                match self.require(key)? {
                    Value::$v(x) => Ok(*x),
                    other => Err(self.wrong_type(key, ValueType::$v.to_string(), other)),
                }
            }
        )*
    };
}

impl GgufFile {
    /// Opens and memory-maps `path`, then validates it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |e| GgufError::new(Some(path), None, ErrorKind::Io(e));
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and lives as long as `self`. Another
        // process truncating or rewriting the file while it is mapped is the
        // one thing Rust cannot guard against (SIGBUS or changing bytes); a
        // model file being rewritten under a running engine is outside the
        // contract, as it is for llama.cpp's mmap.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Storage::Mmap(map), Some(path.to_path_buf()))
    }

    /// Parses GGUF bytes held in memory (tests, fuzzing, downloads). The bytes
    /// are copied into 64-byte-aligned storage.
    pub fn from_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::owned(bytes), None)
    }

    fn from_storage(storage: Storage, path: Option<PathBuf>) -> Result<GgufFile, GgufError> {
        let p = parse(storage.bytes(), path.as_deref())?;
        let tensor_index = p
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path,
            storage,
            version: p.version,
            alignment: p.alignment,
            metadata: p.metadata,
            kv_offsets: p.kv_offsets,
            tensors: p.tensors,
            tensor_index,
            data_offset: p.data_offset,
        })
    }

    /// The file this was opened from (`None` for [`GgufFile::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of the data section and of each tensor's offset.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Drops this process's mapping of the whole pages inside `bytes` (a
    /// range of this file's mapping) from memory: a caller that copied them
    /// into another layout keeps resident only that copy. Reading them again
    /// faults them back in from the file, unchanged. Returns whether
    /// anything was released (`false` for owned storage or a foreign range).
    pub fn release_pages(&self, bytes: &[u8]) -> bool {
        let Storage::Mmap(m) = &self.storage else {
            return false;
        };
        let base = m.as_ptr() as usize;
        let (lo, hi) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
        if lo < base || hi > base + m.len() {
            return false;
        }
        const PAGE: usize = 4096;
        let (start, end) = ((lo - base).next_multiple_of(PAGE), (hi - base) / PAGE * PAGE);
        if end <= start {
            return false;
        }
        // SAFETY: the mapping is a read-only private file mapping that
        // nothing ever writes through; MADV_DONTNEED on it only drops pages,
        // and later reads fetch the same bytes from the file. Slices into the
        // range stay valid (the addresses stay mapped).
        unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) }.is_ok()
    }

    /// Absolute file offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Every key/value pair, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value at `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn key_offset(&self, key: &str) -> Option<u64> {
        let i = self.metadata.iter().position(|(k, _)| k == key)?;
        self.kv_offsets.get(i).copied()
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| {
            GgufError::new(
                self.path(),
                None,
                ErrorKind::MissingKey {
                    key: key.to_string(),
                },
            )
        })
    }

    fn wrong_type(&self, key: &str, expected: String, found: &Value) -> GgufError {
        GgufError::new(
            self.path(),
            self.key_offset(key),
            ErrorKind::WrongType {
                key: key.to_string(),
                expected,
                found: found.value_type(),
            },
        )
    }

    numeric_getters! {
        (get_u8, U8, u8), (get_i8, I8, i8), (get_u16, U16, u16), (get_i16, I16, i16),
        (get_u32, U32, u32), (get_i32, I32, i32), (get_f32, F32, f32), (get_u64, U64, u64),
        (get_i64, I64, i64), (get_f64, F64, f64),
    }

    /// The bool at `key`.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(x) => Ok(*x),
            other => Err(self.wrong_type(key, "bool".into(), other)),
        }
    }

    /// The string at `key`, which must be UTF-8.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => s.as_str().ok_or_else(|| {
                GgufError::new(
                    self.path(),
                    self.key_offset(key),
                    ErrorKind::InvalidUtf8 {
                        what: format!("value of {key:?}"),
                        lossy: s.to_string(),
                    },
                )
            }),
            other => Err(self.wrong_type(key, "string".into(), other)),
        }
    }

    /// The array at `key`.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(self.wrong_type(key, "array".into(), other)),
        }
    }

    /// The integer at `key` as a `u64`, whatever its stored width or
    /// signedness, if it is not negative (see [`Value::as_uint`]).
    pub fn get_uint(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_uint()
            .ok_or_else(|| self.wrong_type(key, "non-negative integer".into(), v))
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }

    /// The data bytes of `t` (a tensor of this file). An error, not a panic,
    /// if `t` describes bytes this file does not have.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let bytes = self.as_bytes();
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        let range = match (start, end) {
            (Some(s), Some(e)) => usize::try_from(s).ok().zip(usize::try_from(e).ok()),
            _ => None,
        };
        range.and_then(|(s, e)| bytes.get(s..e)).ok_or_else(|| {
            GgufError::new(
                self.path(),
                None,
                ErrorKind::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len: bytes.len() as u64,
                    full_len: None,
                },
            )
        })
    }
}

/// What [`parse`] extracts.
struct Parsed {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    kv_offsets: Vec<u64>,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

/// A position in the bytes, with the file name for errors.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: Option<&'a Path>,
}

/// `N` little-endian bytes from a slice `chunks_exact(N)` produced.
fn le<const N: usize>(c: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(c);
    a
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn err(&self, at: usize, kind: ErrorKind) -> GgufError {
        GgufError::new(self.path, Some(at as u64), kind)
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        match self.buf.get(self.pos..).and_then(|r| r.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(self.err(
                self.pos,
                ErrorKind::Truncated {
                    what,
                    needed: n as u64,
                    available: self.remaining(),
                },
            )),
        }
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(le(self.take(4, what)?)))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(le(self.take(8, what)?)))
    }

    /// Reads a `u64` count of items each at least `min_each` bytes long and
    /// refuses it unless that many bytes remain.
    fn count(&mut self, what: &'static str, min_each: u64) -> Result<usize, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let min_bytes = n.saturating_mul(min_each);
        let available = self.remaining();
        if min_bytes > available {
            return Err(self.err(
                at,
                ErrorKind::CountExceedsFile {
                    what,
                    count: n,
                    min_bytes,
                    available,
                },
            ));
        }
        // n * min_each <= remaining <= usize::MAX and min_each >= 1.
        Ok(n as usize)
    }

    fn string(&mut self, what: &'static str) -> Result<&'a [u8], GgufError> {
        let n = self.count(what, 1)?;
        self.take(n, what)
    }

    fn utf8(&mut self, what: &'static str) -> Result<String, GgufError> {
        let at = self.pos;
        let b = self.string(what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(self.err(
                at,
                ErrorKind::InvalidUtf8 {
                    what: what.to_string(),
                    lossy: String::from_utf8_lossy(b).into_owned(),
                },
            )),
        }
    }

    fn value_type(&mut self, what: &'static str) -> Result<ValueType, GgufError> {
        let at = self.pos;
        let id = self.u32(what)?;
        ValueType::from_id(id)
            .ok_or_else(|| self.err(at, ErrorKind::UnknownValueType { type_id: id }))
    }

    fn bool(&mut self) -> Result<bool, GgufError> {
        let at = self.pos;
        match self.take(1, "bool")? {
            [0] => Ok(false),
            [1] => Ok(true),
            [b] => Err(self.err(at, ErrorKind::InvalidBool { found: *b })),
            _ => Err(self.err(
                at,
                ErrorKind::Truncated {
                    what: "bool",
                    needed: 1,
                    available: 0,
                },
            )),
        }
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        macro_rules! scalar {
            ($(($v:ident, $t:ty, $id:literal)),* $(,)?) => {
                match ty {
                    $(ValueType::$v => {
                        const N: usize = core::mem::size_of::<$t>();
                        Value::$v(<$t>::from_le_bytes(le::<N>(self.take(N, stringify!($t))?)))
                    })*
                    ValueType::Bool => Value::Bool(self.bool()?),
                    ValueType::String => Value::String(GgufString(self.string("string length")?.to_vec())),
                    ValueType::Array => Value::Array(self.array(depth + 1)?),
                }
            };
        }
        Ok(numeric_value_types!(scalar))
    }

    fn array(&mut self, depth: usize) -> Result<Array, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(
                self.pos,
                ErrorKind::NestingTooDeep {
                    limit: MAX_ARRAY_DEPTH,
                },
            ));
        }
        let ty = self.value_type("array element type")?;
        let n = self.count("array element count", ty.min_encoded_bytes())?;
        macro_rules! elements {
            ($(($v:ident, $t:ty, $id:literal)),* $(,)?) => {
                match ty {
                    $(ValueType::$v => {
                        const N: usize = core::mem::size_of::<$t>();
                        // `count` guaranteed n * N bytes remain.
                        let bytes = self.take(n * N, "array elements")?;
                        Array::$v(bytes.chunks_exact(N).map(|c| <$t>::from_le_bytes(le::<N>(c))).collect())
                    })*
                    ValueType::Bool => {
                        let mut v = Vec::with_capacity(n.min(PREALLOC_LIMIT));
                        for _ in 0..n {
                            v.push(self.bool()?);
                        }
                        Array::Bool(v)
                    }
                    ValueType::String => {
                        // One buffer for all the strings (a vocabulary is
                        // 262144 of them): no allocation per string.
                        let mut v = StringArray::with_capacity(n.min(PREALLOC_LIMIT));
                        for _ in 0..n {
                            v.push(self.string("string length")?);
                        }
                        v.shrink_to_fit();
                        Array::String(v)
                    }
                    ValueType::Array => {
                        // No reservation: each level of a nested array
                        // would reserve for its claimed count before its
                        // children parse, multiplying memory by the depth.
                        let mut v = Vec::new();
                        for _ in 0..n {
                            v.push(self.array(depth + 1)?);
                        }
                        Array::Array(v)
                    }
                }
            };
        }
        Ok(numeric_value_types!(elements))
    }
}

fn parse(buf: &[u8], path: Option<&Path>) -> Result<Parsed, GgufError> {
    let mut c = Cursor { buf, pos: 0, path };

    let magic: [u8; 4] = le(c.take(4, "magic")?);
    match &magic {
        b"GGUF" => {}
        b"FUGG" => return Err(c.err(0, ErrorKind::BigEndian { field: "magic" })),
        _ => return Err(c.err(0, ErrorKind::BadMagic { found: magic })),
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        v if (1..=3).contains(&v.swap_bytes()) => {
            return Err(c.err(4, ErrorKind::BigEndian { field: "version" }))
        }
        v => return Err(c.err(4, ErrorKind::UnsupportedVersion { found: v })),
    }
    let n_tensors = c.count("tensor count", MIN_TENSOR_INFO_BYTES)?;
    let n_kv = c.count("metadata key/value count", MIN_KV_BYTES)?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv.min(PREALLOC_LIMIT));
    let mut kv_offsets = Vec::with_capacity(n_kv.min(PREALLOC_LIMIT));
    let mut seen_keys = std::collections::HashSet::with_capacity(n_kv.min(PREALLOC_LIMIT));
    for _ in 0..n_kv {
        let at = c.pos;
        let key = c.utf8("metadata key")?;
        let ty = c.value_type("metadata value type")?;
        let value = c.value(ty, 0)?;
        if !seen_keys.insert(key.clone()) {
            return Err(c.err(at, ErrorKind::DuplicateKey { key }));
        }
        metadata.push((key, value));
        kv_offsets.push(at as u64);
    }

    let alignment = match metadata.iter().position(|(k, _)| k == ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(i) => match &metadata[i].1 {
            Value::U32(a) if a.is_power_of_two() => u64::from(*a),
            other => {
                return Err(GgufError::new(
                    path,
                    kv_offsets.get(i).copied(),
                    ErrorKind::BadAlignment {
                        found: format!("{other:?}"),
                    },
                ))
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOC_LIMIT));
    let mut info_offsets = Vec::with_capacity(n_tensors.min(PREALLOC_LIMIT));
    let mut seen_names = std::collections::HashSet::with_capacity(n_tensors.min(PREALLOC_LIMIT));
    for _ in 0..n_tensors {
        let at = c.pos;
        let t = tensor_info(&mut c, at, alignment)?;
        if !seen_names.insert(t.name.clone()) {
            return Err(c.err(at, ErrorKind::DuplicateTensor { name: t.name }));
        }
        tensors.push(t);
        info_offsets.push(at);
    }

    let end_of_infos = c.pos as u64;
    let data_offset = end_of_infos.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    let full_len = packed_end(&tensors, alignment).and_then(|e| data_offset.checked_add(e));
    for (t, &at) in tensors.iter().zip(&info_offsets) {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(e) if e <= file_len => {}
            _ => {
                return Err(c.err(
                    at,
                    ErrorKind::TensorOutOfBounds {
                        tensor: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                        full_len: full_len.filter(|&f| f > file_len),
                    },
                ))
            }
        }
    }

    // Disjointness: sort by start; each non-empty tensor must begin at or
    // after the furthest end seen so far.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes > 0)
        .collect();
    order.sort_by_key(|&i| tensors[i].offset);
    let mut furthest: Option<usize> = None;
    for &i in &order {
        let t = &tensors[i];
        if let Some(j) = furthest {
            let o = &tensors[j];
            let o_end = o.offset + o.n_bytes;
            if t.offset < o_end {
                return Err(c.err(
                    info_offsets[i],
                    ErrorKind::TensorOverlap {
                        tensor: t.name.clone(),
                        start: t.offset,
                        end: t.offset + t.n_bytes,
                        other: o.name.clone(),
                        other_end: o_end,
                    },
                ));
            }
        }
        if furthest.is_none_or(|j| t.offset + t.n_bytes > tensors[j].offset + tensors[j].n_bytes) {
            furthest = Some(i);
        }
    }

    Ok(Parsed {
        version,
        alignment,
        metadata,
        kv_offsets,
        tensors,
        data_offset,
    })
}

/// One tensor info, with every check that needs only the info itself.
/// Where the tensor data ends when the tensors lie back to back, each at
/// the aligned end of the one before (as every writer lays them out); `None`
/// for any other layout, or one whose arithmetic overflows. A file shorter
/// than this was cut short, rather than written with a corrupt table.
fn packed_end(tensors: &[TensorInfo], alignment: u64) -> Option<u64> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    let mut end = 0u64;
    for t in order {
        if t.offset != end.checked_next_multiple_of(alignment)? {
            return None;
        }
        end = t.offset.checked_add(t.n_bytes)?;
    }
    Some(end)
}

fn tensor_info(c: &mut Cursor<'_>, at: usize, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = c.utf8("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims > MAX_DIMS {
        return Err(c.err(
            at,
            ErrorKind::TooManyDims {
                tensor: name,
                n_dims,
            },
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let type_at = c.pos;
    let type_id = c.u32("tensor type")?;
    let kind = QuantKind::from_gguf_id(type_id).ok_or_else(|| {
        c.err(
            type_at,
            ErrorKind::UnknownTensorType {
                tensor: name.clone(),
                type_id,
            },
        )
    })?;
    let offset = c.u64("tensor data offset")?;

    // ggml keeps dimensions in int64_t; the byte size must fit a u64.
    let n_elems = dims.iter().try_fold(1u64, |a, &d| {
        if d > i64::MAX as u64 {
            None
        } else {
            a.checked_mul(d)
        }
    });
    let ne0 = dims.first().copied().unwrap_or(1);
    let block_elems = kind.block_elems();
    if ne0 % block_elems as u64 != 0 {
        return Err(c.err(
            at,
            ErrorKind::NotWholeBlocks {
                tensor: name,
                kind,
                ne0,
                block_elems,
            },
        ));
    }
    let Some(n_bytes) = n_elems.and_then(|n| kind.bytes_for(n)) else {
        return Err(c.err(at, ErrorKind::ShapeOverflow { tensor: name, dims }));
    };
    if offset % alignment != 0 {
        return Err(c.err(
            at,
            ErrorKind::MisalignedTensor {
                tensor: name,
                offset,
                alignment,
            },
        ));
    }
    Ok(TensorInfo {
        name,
        kind,
        dims,
        offset,
        n_bytes,
    })
}
