//! The writer: the layout llama.cpp's `gguf_write_to_buf` and gguf-py's
//! `GGUFWriter` both produce, so a file either wrote reads back and writes
//! out byte-identically.
//!
//! That layout: header, key/values, tensor infos, zero padding to the
//! alignment, then each tensor's data in directory order, each followed by
//! zero padding to the alignment (the last one too). Tensor offsets are
//! therefore not inputs: they follow from the order and the sizes.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;

use ferrox_quant::QuantKind;

use crate::error::{ErrorKind, GgufError};
use crate::reader::{GgufFile, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::value::{numeric_value_types, Array, GgufString, Value};

/// One tensor to write.
#[derive(Debug, Clone)]
struct WriterTensor<'a> {
    name: String,
    kind: QuantKind,
    dims: Vec<u64>,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF file. Inputs are validated as they are added, so writing
/// can fail only on I/O.
#[derive(Debug, Clone)]
pub struct GgufWriter<'a> {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<WriterTensor<'a>>,
    names: HashSet<String>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty version-3 file.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// A writer holding everything `file` holds, tensor data borrowed:
    /// writing it reproduces `file` byte for byte when `file` has the
    /// canonical layout (see the module doc).
    pub fn from_file(file: &'a GgufFile) -> Result<Self, GgufError> {
        let mut w = GgufWriter::new();
        w.set_version(file.version())?;
        for (k, v) in file.metadata() {
            w.set(k.clone(), v.clone())?;
        }
        for t in file.tensors() {
            w.add_tensor(t.name.clone(), t.kind, &t.dims, file.tensor_data(t)?)?;
        }
        Ok(w)
    }

    /// Sets the format version (2 or 3; they differ only in that number).
    pub fn set_version(&mut self, version: u32) -> Result<(), GgufError> {
        if !(2..=3).contains(&version) {
            return Err(GgufError::bare(ErrorKind::UnwritableVersion {
                found: version,
            }));
        }
        self.version = version;
        Ok(())
    }

    /// The alignment the file will use.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Appends a key/value pair. A key may appear once; `general.alignment`
    /// must be a power-of-two `u32` and then governs the layout.
    pub fn set(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        let key = key.into();
        let value = value.into();
        if self.metadata.iter().any(|(k, _)| *k == key) {
            return Err(GgufError::bare(ErrorKind::DuplicateKey { key }));
        }
        if let Value::Array(a) = &value {
            if array_depth(a) > MAX_ARRAY_DEPTH {
                return Err(GgufError::bare(ErrorKind::NestingTooDeep {
                    limit: MAX_ARRAY_DEPTH,
                }));
            }
        }
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = u64::from(a),
                other => {
                    return Err(GgufError::bare(ErrorKind::BadAlignment {
                        found: format!("{other:?}"),
                    }))
                }
            }
        }
        self.metadata.push((key, value));
        Ok(())
    }

    /// Appends a tensor: `dims` in ggml order (ne0 first), `data` exactly the
    /// bytes that kind and shape take.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        kind: QuantKind,
        dims: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let data = data.into();
        if dims.len() > MAX_DIMS as usize {
            return Err(GgufError::bare(ErrorKind::TooManyDims {
                tensor: name,
                n_dims: dims.len() as u32,
            }));
        }
        let ne0 = dims.first().copied().unwrap_or(1);
        let block_elems = kind.block_elems();
        if ne0 % block_elems as u64 != 0 {
            return Err(GgufError::bare(ErrorKind::NotWholeBlocks {
                tensor: name,
                kind,
                ne0,
                block_elems,
            }));
        }
        let expected = dims
            .iter()
            .try_fold(1u64, |a, &d| {
                if d > i64::MAX as u64 {
                    None
                } else {
                    a.checked_mul(d)
                }
            })
            .and_then(|n| kind.bytes_for(n));
        let Some(expected) = expected else {
            return Err(GgufError::bare(ErrorKind::ShapeOverflow {
                tensor: name,
                dims: dims.to_vec(),
            }));
        };
        if expected != data.len() as u64 {
            return Err(GgufError::bare(ErrorKind::TensorDataLength {
                tensor: name,
                kind,
                dims: dims.to_vec(),
                expected,
                found: data.len() as u64,
            }));
        }
        if !self.names.insert(name.clone()) {
            return Err(GgufError::bare(ErrorKind::DuplicateTensor { name }));
        }
        self.tensors.push(WriterTensor {
            name,
            kind,
            dims: dims.to_vec(),
            data,
        });
        Ok(())
    }

    /// Writes the file to `w`.
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        let put = |w: &mut dyn Write, b: &[u8]| w.write_all(b);
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&self.version.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut head, k.as_bytes());
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut head, t.name.as_bytes());
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.kind.gguf_id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset += pad_to(t.data.len() as u64, self.alignment);
        }
        put(w, &head)?;
        let pad = |w: &mut dyn Write, len: u64| write_zeros(w, pad_to(len, self.alignment) - len);
        pad(w, head.len() as u64)?;
        for t in &self.tensors {
            put(w, &t.data)?;
            pad(w, t.data.len() as u64)?;
        }
        Ok(())
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write(&mut v);
        v
    }

    /// Writes the file to `path`.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let io = |e| GgufError::new(Some(path), None, ErrorKind::Io(e));
        let f = std::fs::File::create(path).map_err(io)?;
        let mut w = io::BufWriter::with_capacity(1 << 20, f);
        self.write(&mut w).map_err(io)?;
        w.flush().map_err(io)
    }
}

/// Levels of array in `a` (1 for an array of scalars); the reader refuses
/// more than [`MAX_ARRAY_DEPTH`], so the writer must not produce them.
fn array_depth(a: &Array) -> usize {
    match a {
        Array::Array(xs) => 1 + xs.iter().map(array_depth).max().unwrap_or(0),
        _ => 1,
    }
}

/// Writes `n` zero bytes without allocating `n` (an alignment may be 2^31).
fn write_zeros(w: &mut dyn Write, mut n: u64) -> io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

fn pad_to(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

fn put_gguf_str(out: &mut Vec<u8>, s: &GgufString) {
    put_str(out, s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    macro_rules! scalar {
        ($(($v:ident, $t:ty, $id:literal)),* $(,)?) => {
            match v {
                $(Value::$v(x) => out.extend_from_slice(&x.to_le_bytes()),)*
                Value::Bool(b) => out.push(u8::from(*b)),
                Value::String(s) => put_gguf_str(out, s),
                Value::Array(a) => put_array(out, a),
            }
        };
    }
    numeric_value_types!(scalar)
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! elements {
        ($(($v:ident, $t:ty, $id:literal)),* $(,)?) => {
            match a {
                $(Array::$v(xs) => xs.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),)*
                Array::Bool(xs) => xs.iter().for_each(|b| out.push(u8::from(*b))),
                Array::String(xs) => xs.iter().for_each(|s| put_str(out, s)),
                Array::Array(xs) => xs.iter().for_each(|x| put_array(out, x)),
            }
        };
    }
    numeric_value_types!(elements)
}
