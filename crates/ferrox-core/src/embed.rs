//! Embeddings: how a sequence's final hidden states become one vector.
//!
//! The decision: an embedding is the hidden state after the output norm
//! (what the head would read), as llama.cpp's `t_embd` is for a decoder-only
//! model, pooled over the sequence the way llama.cpp's `build_pooling` pools
//! it. The engine ([`crate::scheduler`]) evaluates an embedding request like
//! a prompt, in chunks through the slot's KV cache (causal attention makes
//! that equal to one pass), and reads the hidden states instead of logits.

use ferrox_gguf::GgufFile;

/// How a sequence's hidden states are reduced (llama.cpp's `--pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// No reduction: one vector per token.
    None,
    /// The mean over all tokens.
    Mean,
    /// The first token's (position 0).
    Cls,
    /// The last token's.
    Last,
}

impl Pooling {
    /// Every mode, in llama.cpp's numbering order.
    pub const ALL: [Pooling; 4] = [Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last];

    /// The name `--pooling` takes.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// The mode of a `--pooling` name.
    pub fn from_name(name: &str) -> Option<Pooling> {
        Pooling::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The model's own pooling: `<arch>.pooling_type` (llama.cpp's
    /// `llama_pooling_type` numbering), or `None` when the file has no such
    /// key, as llama.cpp defaults a generative model. A reranker's `rank`
    /// (4) or an unknown value is an error naming it.
    pub fn from_gguf(meta: &GgufFile, arch: &str) -> Result<Pooling, String> {
        let key = format!("{arch}.pooling_type");
        if meta.get(&key).is_none() {
            return Ok(Pooling::None);
        }
        match meta.get_uint(&key).map_err(|e| format!("{key}: {e}"))? {
            0 => Ok(Pooling::None),
            1 => Ok(Pooling::Mean),
            2 => Ok(Pooling::Cls),
            3 => Ok(Pooling::Last),
            4 => Err(format!("{key} is 4 (rank: a reranker's classification head), which ferrox does not run")),
            v => Err(format!("{key} is {v}, not a pooling type (0 none, 1 mean, 2 cls, 3 last)")),
        }
    }

    /// Whether the hidden state of the token at `pos` of a sequence of `len`
    /// tokens is read.
    pub fn reads(self, pos: usize, len: usize) -> bool {
        match self {
            Pooling::None | Pooling::Mean => true,
            Pooling::Cls => pos == 0,
            Pooling::Last => pos + 1 == len,
        }
    }
}

/// Scales `v` to unit Euclidean length (llama.cpp's `--embd-normalize 2`,
/// what OpenAI returns); a zero vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let sum: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let scale = if sum > 0.0 { 1.0 / sum.sqrt() } else { 0.0 };
    for x in v {
        *x = (f64::from(*x) * scale) as f32;
    }
}

/// The cosine similarity of two vectors of one length (0 when either is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizing_gives_unit_length_and_keeps_direction() {
        let mut v = vec![3.0, 4.0, 0.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8, 0.0]);
        let mut z = vec![0.0; 4];
        l2_normalize(&mut z);
        assert_eq!(z, vec![0.0; 4]);
    }

    /// `<arch>.pooling_type` in llama.cpp's numbering; absent, `none`
    /// (llama.cpp's default for a generative model); a reranker's `rank`
    /// is refused by name.
    #[test]
    fn the_models_pooling_is_read_from_its_metadata() {
        use ferrox_gguf::{GgufFile, Value};
        let with = |v: Option<u32>| {
            let mut w = crate::testing::tiny_arch_model(crate::arch::Arch::Gemma3, 3).unwrap();
            if let Some(v) = v {
                w.set("gemma3.pooling_type", Value::U32(v)).unwrap();
            }
            let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
            Pooling::from_gguf(&f, "gemma3")
        };
        assert_eq!(with(None), Ok(Pooling::None));
        assert_eq!(with(Some(1)), Ok(Pooling::Mean));
        assert_eq!(with(Some(2)), Ok(Pooling::Cls));
        assert_eq!(with(Some(3)), Ok(Pooling::Last));
        assert!(with(Some(4)).unwrap_err().contains("rank"));
        assert!(with(Some(9)).is_err());
    }

    #[test]
    fn cls_reads_the_first_token_and_last_the_last() {
        let read = |p: Pooling| (0..4).filter(|&i| p.reads(i, 4)).collect::<Vec<_>>();
        assert_eq!(read(Pooling::Cls), vec![0]);
        assert_eq!(read(Pooling::Last), vec![3]);
        assert_eq!(read(Pooling::Mean), vec![0, 1, 2, 3]);
        assert_eq!(read(Pooling::None), vec![0, 1, 2, 3]);
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f64.sqrt()).abs() < 1e-12);
        for p in Pooling::ALL {
            assert_eq!(Pooling::from_name(p.name()), Some(p));
        }
    }
}
