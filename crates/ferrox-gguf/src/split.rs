//! Split models: `name-00001-of-00003.gguf` … loaded as one model.
//!
//! The file names are the source of truth for how many parts to open
//! (llama.cpp's `llama_split_path` format, `%s-%05d-of-%05d.gguf`); each
//! part's `split.no` / `split.count` / `split.tensors.count` must then agree
//! with the names and with each other, so a stray part from another
//! conversion is caught rather than silently mixed in. Metadata comes from
//! the first part, as llama.cpp reads it; tensors from all parts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{ErrorKind, GgufError};
use crate::reader::{GgufFile, TensorInfo};

/// `split.no`: this part's 0-based index.
pub const SPLIT_NO_KEY: &str = "split.no";
/// `split.count`: how many parts.
pub const SPLIT_COUNT_KEY: &str = "split.count";
/// `split.tensors.count`: tensors across all parts.
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";

/// A tensor of a (possibly split) model, with the part that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensor {
    /// Index into [`GgufModel::parts`].
    pub part: usize,
    /// The tensor's directory entry in that part.
    pub info: TensorInfo,
}

/// One model from one file or from all parts of a split.
#[derive(Debug)]
pub struct GgufModel {
    parts: Vec<GgufFile>,
    tensors: Vec<ModelTensor>,
    index: HashMap<String, usize>,
}

/// `(prefix, part, count)` when `path`'s file name is `prefix-NNNNN-of-MMMMM.gguf`.
pub fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, part) = rest.rsplit_once('-')?;
    let five_digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !five_digits(part) || !five_digits(count) {
        return None;
    }
    Some((prefix.to_string(), part.parse().ok()?, count.parse().ok()?))
}

/// The path of part `part` (1-based) of `count`, beside `dir`.
pub fn split_path(dir: &Path, prefix: &str, part: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{part:05}-of-{count:05}.gguf"))
}

impl GgufModel {
    /// Opens `path`; when its name marks it as one part of a split, opens
    /// every part (whichever part was named).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufModel, GgufError> {
        let path = path.as_ref();
        let Some((prefix, _, count)) = parse_split_name(path) else {
            return GgufModel::from_parts(vec![GgufFile::open(path)?]);
        };
        let dir = path.parent().unwrap_or(Path::new(""));
        let mut parts = Vec::with_capacity(count as usize);
        for part in 1..=count {
            let p = split_path(dir, &prefix, part, count);
            let f = GgufFile::open(&p).map_err(|e| {
                GgufError::new(
                    Some(&p),
                    None,
                    ErrorKind::MissingSplitPart {
                        part,
                        count,
                        source: Box::new(e),
                    },
                )
            })?;
            parts.push(f);
        }
        GgufModel::from_parts(parts)
    }

    /// Joins already-opened parts, in order, checking their split keys. One
    /// part without split keys is a plain single-file model.
    pub fn from_parts(parts: Vec<GgufFile>) -> Result<GgufModel, GgufError> {
        if parts.is_empty() {
            return Err(GgufError::bare(ErrorKind::SplitMismatch {
                what: "number of parts".into(),
                expected: 1,
                found: 0,
            }));
        }
        let n = parts.len() as u64;
        let total: usize = parts.iter().map(|p| p.tensors().len()).sum();
        let single_unsplit = parts.len() == 1 && parts[0].get(SPLIT_COUNT_KEY).is_none();
        if !single_unsplit {
            let mut tensors_count = None;
            for (i, p) in parts.iter().enumerate() {
                let mismatch = |what: &str, expected: u64, found: u64| {
                    GgufError::new(
                        p.path(),
                        None,
                        ErrorKind::SplitMismatch {
                            what: what.to_string(),
                            expected,
                            found,
                        },
                    )
                };
                let no = p.get_uint(SPLIT_NO_KEY)?;
                if no != i as u64 {
                    return Err(mismatch(SPLIT_NO_KEY, i as u64, no));
                }
                let count = p.get_uint(SPLIT_COUNT_KEY)?;
                if count != n {
                    return Err(mismatch(SPLIT_COUNT_KEY, n, count));
                }
                let tc = p.get_uint(SPLIT_TENSORS_COUNT_KEY)?;
                let expected = *tensors_count.get_or_insert(tc);
                if tc != expected {
                    return Err(mismatch(SPLIT_TENSORS_COUNT_KEY, expected, tc));
                }
            }
            if let Some(tc) = tensors_count {
                if tc != total as u64 {
                    return Err(GgufError::new(
                        parts.first().and_then(|p| p.path()),
                        None,
                        ErrorKind::SplitMismatch {
                            what: format!(
                                "{SPLIT_TENSORS_COUNT_KEY} vs tensors found in all parts"
                            ),
                            expected: tc,
                            found: total as u64,
                        },
                    ));
                }
            }
        }
        let mut tensors = Vec::with_capacity(total);
        let mut index = HashMap::with_capacity(total);
        for (part, p) in parts.iter().enumerate() {
            for t in p.tensors() {
                if index.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::new(
                        p.path(),
                        None,
                        ErrorKind::DuplicateTensor {
                            name: t.name.clone(),
                        },
                    ));
                }
                tensors.push(ModelTensor {
                    part,
                    info: t.clone(),
                });
            }
        }
        Ok(GgufModel {
            parts,
            tensors,
            index,
        })
    }

    /// Drops the mapped pages inside `bytes` from memory ([`GgufFile::release_pages`]).
    pub fn release_pages(&self, bytes: &[u8]) -> bool {
        self.parts.iter().any(|p| p.release_pages(bytes))
    }

    /// The parts, in order (one for an unsplit model).
    pub fn parts(&self) -> &[GgufFile] {
        &self.parts
    }

    /// The part holding the model's metadata (the first).
    pub fn metadata_file(&self) -> &GgufFile {
        // Indexing cannot fail: from_parts refuses an empty list.
        &self.parts[0]
    }

    /// Every tensor of every part, part by part in directory order.
    pub fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&ModelTensor> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The data bytes of `t`.
    pub fn tensor_data(&self, t: &ModelTensor) -> Result<&[u8], GgufError> {
        match self.parts.get(t.part) {
            Some(p) => p.tensor_data(&t.info),
            None => Err(GgufError::bare(ErrorKind::SplitMismatch {
                what: format!("part index of tensor {:?}", t.info.name),
                expected: self.parts.len() as u64,
                found: t.part as u64,
            })),
        }
    }
}
