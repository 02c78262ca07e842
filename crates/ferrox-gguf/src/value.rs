//! Metadata values.
//!
//! Arrays are stored *typed* (`Array::F32(Vec<f32>)`, not `Vec<Value>`): a
//! 262 144-entry token-score array costs 1 MiB rather than 8, the element type
//! of an empty array survives a round trip, and an array can never mix types,
//! so the writer has nothing to validate. Strings are bytes ([`GgufString`]):
//! the format says UTF-8 but llama.cpp never checks, vocabularies with stray
//! bytes exist, and a byte-identical round trip must not repair them.

use std::fmt;

/// Expands `$mac!` with every fixed-size numeric value type.
///
/// Row: `(Variant, rust_type, gguf_type_id)`. Bool, string and array are not
/// rows: their encodings are not a plain little-endian number.
macro_rules! numeric_value_types {
    ($mac:ident) => {
        $mac! {
            (U8, u8, 0),
            (I8, i8, 1),
            (U16, u16, 2),
            (I16, i16, 3),
            (U32, u32, 4),
            (I32, i32, 5),
            (F32, f32, 6),
            (U64, u64, 10),
            (I64, i64, 11),
            (F64, f64, 12),
        }
    };
}
pub(crate) use numeric_value_types;

/// Type id of a GGUF bool.
const BOOL_ID: u32 = 7;
/// Type id of a GGUF string.
const STRING_ID: u32 = 8;
/// Type id of a GGUF array.
const ARRAY_ID: u32 = 9;

/// A metadata value's type, as the file's type ids name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `u16`.
    U16,
    /// `i16`.
    I16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `f32`.
    F32,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// `f64`.
    F64,
    /// One byte, 0 or 1.
    Bool,
    /// A `u64` length and that many bytes.
    String,
    /// An element type id, a `u64` count, then the elements.
    Array,
}

macro_rules! value_type_ids {
    ($(($v:ident, $t:ty, $id:literal)),* $(,)?) => {
        impl ValueType {
            /// The type id stored in the file.
            pub const fn id(self) -> u32 {
                match self {
                    $(ValueType::$v => $id,)*
                    ValueType::Bool => BOOL_ID,
                    ValueType::String => STRING_ID,
                    ValueType::Array => ARRAY_ID,
                }
            }

            /// The type with file id `id`, or `None` for an id GGUF does not define.
            pub const fn from_id(id: u32) -> Option<ValueType> {
                match id {
                    $($id => Some(ValueType::$v),)*
                    BOOL_ID => Some(ValueType::Bool),
                    STRING_ID => Some(ValueType::String),
                    ARRAY_ID => Some(ValueType::Array),
                    _ => None,
                }
            }

            /// The fewest bytes one value of this type occupies in a file: what
            /// a claimed element count is checked against before allocating.
            pub const fn min_encoded_bytes(self) -> u64 {
                match self {
                    $(ValueType::$v => core::mem::size_of::<$t>() as u64,)*
                    ValueType::Bool => 1,
                    ValueType::String => 8,
                    ValueType::Array => 12,
                }
            }
        }
    };
}
numeric_value_types!(value_type_ids);

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
        };
        f.write_str(s)
    }
}

/// A GGUF string: the bytes exactly as stored (see the module doc for why
/// they are not a `String`).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct GgufString(pub Vec<u8>);

impl GgufString {
    /// The string, if it is valid UTF-8 (as the format requires).
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for GgufString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_str() {
            Some(s) => fmt::Debug::fmt(s, f),
            None => write!(f, "b{:?}", String::from_utf8_lossy(&self.0)),
        }
    }
}

impl fmt::Display for GgufString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl From<&str> for GgufString {
    fn from(s: &str) -> Self {
        GgufString(s.as_bytes().to_vec())
    }
}

impl From<String> for GgufString {
    fn from(s: String) -> Self {
        GgufString(s.into_bytes())
    }
}

/// The strings of a string array, kept compactly: their bytes one after
/// another and where each ends, with no allocation per string. A
/// 262144-token vocabulary costs its ~2 MB of text and 2 MB of offsets,
/// not 6 MB of `GgufString` headers and 262144 heap blocks, for as long as
/// the file is open.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct StringArray {
    bytes: Vec<u8>,
    /// `ends[i]`: where string `i` ends in `bytes` (and `i + 1` starts).
    ends: Vec<usize>,
}

impl StringArray {
    /// An empty array.
    pub const fn new() -> StringArray {
        StringArray { bytes: Vec::new(), ends: Vec::new() }
    }

    /// An empty array with room for `n` strings (their bytes grow as pushed).
    pub fn with_capacity(n: usize) -> StringArray {
        StringArray { bytes: Vec::new(), ends: Vec::with_capacity(n) }
    }

    /// Appends one string's bytes.
    pub fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len());
    }

    /// The number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The bytes of string `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    /// String `i` as UTF-8, if there is one and it is valid UTF-8.
    pub fn get_str(&self, i: usize) -> Option<&str> {
        std::str::from_utf8(self.get(i)?).ok()
    }

    /// Every string's bytes, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// Gives back the capacity that growing left unused.
    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

impl fmt::Debug for StringArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|s| GgufString(s.to_vec()))).finish()
    }
}

impl FromIterator<GgufString> for StringArray {
    fn from_iter<I: IntoIterator<Item = GgufString>>(iter: I) -> StringArray {
        let mut a = StringArray::new();
        iter.into_iter().for_each(|s| a.push(&s.0));
        a
    }
}

impl From<Vec<GgufString>> for StringArray {
    fn from(v: Vec<GgufString>) -> StringArray {
        v.into_iter().collect()
    }
}

macro_rules! define_value_and_array {
    ($(($v:ident, $t:ty, $id:literal)),* $(,)?) => {
        /// One metadata value.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Value {
            $(
                #[doc = concat!("A `", stringify!($t), "`.")]
                $v($t),
            )*
            /// A bool.
            Bool(bool),
            /// A string.
            String(GgufString),
            /// An array (possibly of arrays).
            Array(Array),
        }

        /// A typed array: one variant per element type, so elements cannot
        /// disagree with the declared type.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Array {
            $(
                #[doc = concat!("Elements of type `", stringify!($t), "`.")]
                $v(Vec<$t>),
            )*
            /// Bools.
            Bool(Vec<bool>),
            /// Strings.
            String(StringArray),
            /// Arrays, each with its own element type.
            Array(Vec<Array>),
        }

        impl Value {
            /// This value's type.
            pub fn value_type(&self) -> ValueType {
                match self {
                    $(Value::$v(_) => ValueType::$v,)*
                    Value::Bool(_) => ValueType::Bool,
                    Value::String(_) => ValueType::String,
                    Value::Array(_) => ValueType::Array,
                }
            }

            /// The value as an unsigned integer, if it is an integer of any
            /// width that is not negative. Writers disagree on the integer
            /// type of counts (`u32` here, `i32` there); readers of counts
            /// should not care.
            pub fn as_uint(&self) -> Option<u64> {
                match *self {
                    Value::U8(x) => Some(x.into()),
                    Value::U16(x) => Some(x.into()),
                    Value::U32(x) => Some(x.into()),
                    Value::U64(x) => Some(x),
                    Value::I8(x) => u64::try_from(x).ok(),
                    Value::I16(x) => u64::try_from(x).ok(),
                    Value::I32(x) => u64::try_from(x).ok(),
                    Value::I64(x) => u64::try_from(x).ok(),
                    Value::F32(_) | Value::F64(_) | Value::Bool(_) | Value::String(_)
                    | Value::Array(_) => None,
                }
            }
        }

        impl Array {
            /// The element type.
            pub fn elem_type(&self) -> ValueType {
                match self {
                    $(Array::$v(_) => ValueType::$v,)*
                    Array::Bool(_) => ValueType::Bool,
                    Array::String(_) => ValueType::String,
                    Array::Array(_) => ValueType::Array,
                }
            }

            /// The element count.
            pub fn len(&self) -> usize {
                match self {
                    $(Array::$v(a) => a.len(),)*
                    Array::Bool(a) => a.len(),
                    Array::String(a) => a.len(),
                    Array::Array(a) => a.len(),
                }
            }

            /// Whether the array has no elements.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
        }

        $(
            impl From<$t> for Value {
                fn from(x: $t) -> Self {
                    Value::$v(x)
                }
            }
            impl From<Vec<$t>> for Array {
                fn from(x: Vec<$t>) -> Self {
                    Array::$v(x)
                }
            }
        )*
    };
}
numeric_value_types!(define_value_and_array);

impl From<bool> for Value {
    fn from(x: bool) -> Self {
        Value::Bool(x)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.into())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s.into())
    }
}

impl From<GgufString> for Value {
    fn from(s: GgufString) -> Self {
        Value::String(s)
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Self {
        Value::Array(a)
    }
}

impl From<Vec<bool>> for Array {
    fn from(x: Vec<bool>) -> Self {
        Array::Bool(x)
    }
}

impl From<Vec<GgufString>> for Array {
    fn from(x: Vec<GgufString>) -> Self {
        Array::String(x.into())
    }
}

impl From<StringArray> for Array {
    fn from(x: StringArray) -> Self {
        Array::String(x)
    }
}

impl From<Vec<&str>> for Array {
    fn from(x: Vec<&str>) -> Self {
        Array::String(x.into_iter().map(GgufString::from).collect())
    }
}

impl From<Vec<Array>> for Array {
    fn from(x: Vec<Array>) -> Self {
        Array::Array(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids from the GGUF spec (`gguf_type` in ggml's `gguf.h`).
    #[test]
    fn a_string_array_gives_back_each_string_as_pushed() {
        let words: [&[u8]; 5] = [b"<bos>", b"", b"\xff\x00", "\u{2581}the".as_bytes(), b""];
        let a: StringArray = words.iter().map(|w| GgufString(w.to_vec())).collect();
        assert_eq!(a.len(), 5);
        assert!(a.iter().eq(words.iter().copied()));
        for (i, w) in words.iter().enumerate() {
            assert_eq!(a.get(i), Some(*w), "string {i}");
        }
        assert_eq!(a.get(5), None);
        assert_eq!(a.get_str(0), Some("<bos>"));
        assert_eq!(a.get_str(2), None, "not UTF-8");
        // Printed as the list of `GgufString`s it replaces was.
        let listed: Vec<GgufString> = words.iter().map(|w| GgufString(w.to_vec())).collect();
        assert_eq!(format!("{a:?}"), format!("{listed:?}"));
        assert!(StringArray::new().is_empty());
    }

    #[test]
    fn value_type_ids_match_the_gguf_spec() {
        use ValueType::*;
        let want = [
            (U8, 0),
            (I8, 1),
            (U16, 2),
            (I16, 3),
            (U32, 4),
            (I32, 5),
            (F32, 6),
            (Bool, 7),
            (String, 8),
            (Array, 9),
            (U64, 10),
            (I64, 11),
            (F64, 12),
        ];
        for (t, id) in want {
            assert_eq!(t.id(), id, "{t}");
            assert_eq!(ValueType::from_id(id), Some(t));
        }
        assert_eq!(ValueType::from_id(13), None);
    }
}
