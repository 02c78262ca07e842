//! Hand-assembled GGUF bytes: bad files are built field by field, so each
//! test states exactly which byte is wrong, independent of the writer.
#![allow(dead_code)]

use std::path::PathBuf;

/// A GGUF byte string under construction.
#[derive(Clone, Default)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// `GGUF`, `version`, tensor count, key/value count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default().bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)
    }
    pub fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(self, x: u8) -> Raw {
        self.bytes(&[x])
    }
    pub fn u32(self, x: u32) -> Raw {
        self.bytes(&x.to_le_bytes())
    }
    pub fn u64(self, x: u64) -> Raw {
        self.bytes(&x.to_le_bytes())
    }
    /// A GGUF string: `u64` length, bytes.
    pub fn str(self, s: &[u8]) -> Raw {
        self.u64(s.len() as u64).bytes(s)
    }
    /// A `u32` key/value pair (type id 4).
    pub fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    /// A tensor info.
    pub fn tensor(self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Raw {
        let mut r = self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(type_id).u64(offset)
    }
    /// Zero bytes up to a multiple of `align`.
    pub fn pad(mut self, align: usize) -> Raw {
        while self.0.len() % align != 0 {
            self.0.push(0);
        }
        self
    }
    pub fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

pub fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

/// A fresh empty directory under the target dir for files a test writes.
pub fn scratch_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrox-gguf-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}
