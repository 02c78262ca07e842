//! Text ↔ token ids from a GGUF's `tokenizer.ggml.*` metadata, equal to
//! llama.cpp's ids for the same file and text.
//!
//! The key decision: follow llama.cpp's algorithms, not the HF models they
//! came from. A `llama`-model vocab is tokenized by SentencePiece-style
//! *score-ordered pair merging* ([`spm`]), which is not what a Unigram model
//! built from the same scores produces; a `gpt2`-model vocab by rank-ordered
//! merges over llama.cpp's own hand-written pre-tokenizer splitters
//! ([`bpe`], [`unicode`]) with llama.cpp's Unicode tables. Special tokens are
//! cut out of the text first, longest first, as `tokenizer_st_partition` does.
//! Reference ids made by llama.cpp itself pin all of it (`tests.rs`).

mod bpe;
mod detok;
mod spm;
mod unicode;
mod unicode_data;
mod vocab;
#[cfg(test)]
mod tests;

use ferrox_gguf::{Array, GgufFile, Value};

pub use detok::Detokenizer;
pub use unicode::Split;
use vocab::{TextIndex, Texts};

/// A token id (an index into the vocabulary).
pub type TokenId = u32;

/// Why a tokenizer could not be built or could not encode.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required metadata key is absent.
    #[error("tokenizer metadata key `{0}` is missing")]
    MissingKey(&'static str),
    /// A metadata key has the wrong type or an impossible value.
    #[error("tokenizer metadata key `{key}` is invalid: {why}")]
    InvalidKey {
        /// The key.
        key: &'static str,
        /// What was expected.
        why: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer ferrox does not implement.
    #[error("tokenizer model `{0}` (tokenizer.ggml.model) is not supported; supported: llama, gpt2")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer ferrox does not implement.
    #[error("pre-tokenizer `{0}` (tokenizer.ggml.pre) is not supported; supported: llama3 family, qwen2 family, gpt2 family, gpt-4o family")]
    UnsupportedPreTokenizer(String),
    /// The pre-tokenizer's regex did not compile (the regex engine's size
    /// limits; not expected for the built-in pattern).
    #[error("the {split:?} pre-tokenizer failed: {why}")]
    PreTokenizer {
        /// The pre-tokenizer.
        split: Split,
        /// The regex engine's message.
        why: String,
    },
    /// Byte fallback needed a byte token the vocabulary lacks.
    #[error("the vocabulary has no token for byte 0x{0:02X} (needed for byte fallback)")]
    NoByteToken(u8),
    /// The text asked for BOS/EOS but the vocabulary defines none.
    #[error("the model asks to add a {0} token but defines none")]
    NoSpecialToken(&'static str),
    /// A token id outside the vocabulary was given to decode.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    BadTokenId {
        /// The id.
        id: TokenId,
        /// Vocabulary size.
        n_vocab: usize,
    },
}

/// Token attributes as llama.cpp derives them from `tokenizer.ggml.token_type`.
pub mod attr {
    /// `<unk>`-type token.
    pub const UNKNOWN: u32 = 1 << 0;
    /// Marked unused (or a control token whose text says "unused").
    pub const UNUSED: u32 = 1 << 1;
    /// An ordinary piece.
    pub const NORMAL: u32 = 1 << 2;
    /// A control token (`<bos>`, `<start_of_turn>`): matched only with parse_special.
    pub const CONTROL: u32 = 1 << 3;
    /// User-defined: always cut out of text before tokenizing.
    pub const USER_DEFINED: u32 = 1 << 4;
    /// A byte-fallback token `<0xXX>`.
    pub const BYTE: u32 = 1 << 5;
    /// Strip whitespace to the left of this special token.
    pub const LSTRIP: u32 = 1 << 7;
    /// Strip whitespace to the right of this special token.
    pub const RSTRIP: u32 = 1 << 8;
}

/// Which algorithm encodes raw text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `tokenizer.ggml.model = "llama"`: SentencePiece-style score merging.
    Spm,
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE after a pre-tokenizer split.
    Bpe(Split),
}

/// A loaded vocabulary and the rules to encode and decode with it.
///
/// The vocabulary is kept once, compactly (`vocab`: one byte buffer, its
/// offsets and a hash index of ids), not as a `Vec` and a `HashMap` of
/// per-token allocations: ~4 MB rather than ~32 for a 262144-token vocab.
pub struct Tokenizer {
    kind: Kind,
    /// The token texts, and the index from text to id (a later duplicate wins).
    vocab: TextIndex,
    scores: Vec<f32>,
    attrs: Vec<u32>,
    /// `left 0xFF right`, at its rank; 0xFF cannot occur in UTF-8 so the key is unambiguous.
    ranks: TextIndex,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<TokenId>,
    /// What each token decodes to.
    pieces: Texts,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    unk: Option<TokenId>,
    pad: Option<TokenId>,
    eog: Vec<TokenId>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    ignore_merges: bool,
}

const K_MODEL: &str = "tokenizer.ggml.model";
const K_PRE: &str = "tokenizer.ggml.pre";
const K_TOKENS: &str = "tokenizer.ggml.tokens";
const K_SCORES: &str = "tokenizer.ggml.scores";
const K_TYPES: &str = "tokenizer.ggml.token_type";
const K_MERGES: &str = "tokenizer.ggml.merges";

fn get_bool(meta: &GgufFile, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(TokenizerError::InvalidKey { key, why: format!("expected a bool, found {:?}", v.value_type()) }),
    }
}

fn get_id(meta: &GgufFile, key: &'static str) -> Result<Option<u64>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_uint()
            .map(Some)
            .ok_or_else(|| TokenizerError::InvalidKey { key, why: format!("expected an unsigned integer, found {:?}", v.value_type()) }),
    }
}

fn get_str<'a>(meta: &'a GgufFile, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => s
            .as_str()
            .map(Some)
            .ok_or_else(|| TokenizerError::InvalidKey { key, why: "not valid UTF-8".into() }),
        Some(v) => Err(TokenizerError::InvalidKey { key, why: format!("expected a string, found {:?}", v.value_type()) }),
    }
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` name: (split, ignore_merges, default add_bos).
fn pre_tokenizer(name: &str) -> Result<(Split, bool, bool), TokenizerError> {
    const LLAMA3: &[&str] =
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"];
    const QWEN2: &[&str] = &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open"];
    const GPT2: &[&str] = &[
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo", "jais", "trillion",
        "granite-docling",
    ];
    if LLAMA3.contains(&name) {
        Ok((Split::Llama3 { max_digits: 3 }, true, true))
    } else if name == "megrez" {
        Ok((Split::Llama3 { max_digits: 1 }, true, false))
    } else if QWEN2.contains(&name) {
        Ok((Split::Llama3 { max_digits: 1 }, false, false))
    } else if GPT2.contains(&name) {
        Ok((Split::Gpt2, false, false))
    } else if ["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"].contains(&name) {
        // One pattern in llama.cpp (LLAMA_VOCAB_PRE_TYPE_GPT4O, MINIMAX_M2).
        Ok((Split::Gpt4o, false, false))
    } else {
        Err(TokenizerError::UnsupportedPreTokenizer(name.to_string()))
    }
}

/// Texts llama.cpp recognises as end-of-turn and friends when the metadata is
/// silent; it also forces them to be control tokens.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_TEXTS: &[&[&str]] = &[
    &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"],
    &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"],
    &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    &["<|file_sep|>"],
];

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata (for a split model,
    /// the first part: `GgufModel::metadata_file`).
    pub fn from_gguf(meta: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let model = get_str(meta, K_MODEL)?.ok_or(TokenizerError::MissingKey(K_MODEL))?;
        let pre = get_str(meta, K_PRE)?;
        let (kind, ignore_merges, mut add_bos, mut add_space_prefix, defaults) = match model {
            "llama" => (Kind::Spm, false, true, true, [Some(1u64), Some(2), Some(0)]),
            "gpt2" => {
                let (split, ignore, bos) = match pre {
                    // llama.cpp falls back to its generic regex set here, which
                    // needs a full regex engine; refuse rather than differ.
                    None | Some("default") => return Err(TokenizerError::UnsupportedPreTokenizer(pre.unwrap_or("").into())),
                    Some(p) => pre_tokenizer(p)?,
                };
                (Kind::Bpe(split), ignore, bos, false, [Some(11), Some(11), None])
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };

        let tokens = match meta.get(K_TOKENS) {
            None => return Err(TokenizerError::MissingKey(K_TOKENS)),
            Some(Value::Array(Array::String(t))) => t,
            Some(v) => return Err(TokenizerError::InvalidKey { key: K_TOKENS, why: format!("expected an array of strings, found {:?}", v.value_type()) }),
        };
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(TokenizerError::InvalidKey { key: K_TOKENS, why: format!("{n} tokens") });
        }
        let scores: Vec<f32> = match meta.get(K_SCORES) {
            None => vec![0.0; n],
            Some(Value::Array(Array::F32(s))) if s.len() >= n => s[..n].to_vec(),
            Some(Value::Array(Array::I32(s))) if s.len() >= n => s[..n].iter().map(|&x| x as f32).collect(),
            Some(v) => return Err(TokenizerError::InvalidKey { key: K_SCORES, why: format!("expected {n} f32 or i32 scores, found {:?}", v.value_type()) }),
        };
        let mut attrs: Vec<u32> = match meta.get(K_TYPES) {
            None => vec![attr::NORMAL; n],
            Some(Value::Array(Array::I32(t))) if t.len() >= n => t[..n]
                .iter()
                .map(|&ty| match ty {
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => 0,
                })
                .collect(),
            Some(v) => return Err(TokenizerError::InvalidKey { key: K_TYPES, why: format!("expected {n} i32 token types, found {:?}", v.value_type()) }),
        };

        let too_long = || TokenizerError::InvalidKey { key: K_TOKENS, why: "the token texts pass 4 GiB".into() };
        let mut vocab = TextIndex::with_capacity(n, tokens.iter().map(<[u8]>::len).sum());
        for (i, t) in tokens.iter().enumerate() {
            let empty;
            let text = match t {
                [] => {
                    empty = format!("[EMPTY_{i}]");
                    empty.as_bytes()
                }
                b => b,
            };
            // A later duplicate wins, as in llama.cpp's token_to_id map.
            vocab.push(text, true).ok_or_else(too_long)?;
        }
        vocab.shrink();
        let ids = &vocab;

        let mut ranks = TextIndex::default();
        if matches!(kind, Kind::Bpe(_)) {
            let merges = match meta.get(K_MERGES) {
                None => return Err(TokenizerError::MissingKey(K_MERGES)),
                Some(Value::Array(Array::String(m))) => m,
                Some(v) => return Err(TokenizerError::InvalidKey { key: K_MERGES, why: format!("expected an array of strings, found {:?}", v.value_type()) }),
            };
            ranks = TextIndex::with_capacity(merges.len(), merges.iter().map(<[u8]>::len).sum());
            for m in merges.iter() {
                // The separator is the first space after the first byte, so a
                // merge whose left side starts with a space still splits.
                let key = match m.iter().skip(1).position(|&b| b == b' ') {
                    Some(p) => [&m[..p + 1], &[0xFF], &m[p + 2..]].concat(),
                    None => vec![0xFF],
                };
                // Its position is its rank; the first of equal keys keeps it.
                ranks.push(&key, false).ok_or_else(|| TokenizerError::InvalidKey { key: K_MERGES, why: "the merges pass 4 GiB".into() })?;
            }
            ranks.shrink();
        }

        if let Some(p) = get_bool(meta, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = p;
        }
        let in_range = |id: Option<u64>| id.filter(|&i| i < n as u64).map(|i| i as TokenId);
        let special = |key: &'static str, default: Option<u64>| -> Result<Option<TokenId>, TokenizerError> {
            let default = in_range(default);
            // An out-of-range id in the metadata keeps the default, as llama.cpp does.
            Ok(in_range(get_id(meta, key)?).or(default))
        };
        let bos = special("tokenizer.ggml.bos_token_id", defaults[0])?;
        let eos = special("tokenizer.ggml.eos_token_id", defaults[1])?;
        let unk = special("tokenizer.ggml.unknown_token_id", defaults[2])?;
        let mut eot = special("tokenizer.ggml.eot_token_id", None)?;
        let mut eom = special("tokenizer.ggml.eom_token_id", None)?;
        let pad = special("tokenizer.ggml.padding_token_id", None)?;
        if let Some(b) = get_bool(meta, "tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        let add_eos = get_bool(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

        // Text-detected specials: the first in byte order wins, like the
        // sorted std::map llama.cpp walks.
        let detect = |slot: &mut Option<TokenId>, cands: &[&str], attrs: &mut Vec<u32>| {
            if slot.is_some() {
                return;
            }
            let mut found: Vec<&str> = cands.iter().copied().filter(|c| ids.find(c.as_bytes()).is_some()).collect();
            found.sort_unstable();
            if let Some(id) = found.first().and_then(|c| ids.find(c.as_bytes())) {
                *slot = Some(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        };
        detect(&mut eot, EOT_TEXTS, &mut attrs);
        detect(&mut eom, EOM_TEXTS, &mut attrs);
        let mut fim_eog = Vec::new();
        for (i, cands) in FIM_TEXTS.iter().enumerate() {
            let mut slot = None;
            detect(&mut slot, cands, &mut attrs);
            // fim_pad, fim_rep and fim_sep end generation.
            if i >= 3 {
                fim_eog.extend(slot);
            }
        }
        let mut eog: Vec<TokenId> = [eos, eot, eom].into_iter().flatten().chain(fim_eog).collect();
        for text in ["<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<end_of_turn>", "<|end_of_text|>", "<end_of_utterance>"] {
            if let Some(id) = ids.find(text.as_bytes()) {
                if attrs[id as usize] & attr::CONTROL != 0 {
                    eog.push(id);
                }
            }
        }
        eog.sort_unstable();
        eog.dedup();
        // o200k_harmony (gpt-oss), as llama.cpp's vocabulary loader has it:
        // `<|end|>` closes a message (the reasoning channel's too), not the
        // reply, so where `<|return|>` and `<|call|>` end generation it is
        // taken out of the EOG list and printed like text; and the channel
        // markup (`<|start|>`, `<|channel|>`, `<|message|>`,
        // `<|constrain|>`) is always printed, so a client sees the channels.
        let eog_text = |text: &str| ids.find(text.as_bytes()).filter(|id| eog.binary_search(id).is_ok());
        if let (Some(_), Some(_), Some(end)) = (eog_text("<|return|>"), eog_text("<|call|>"), eog_text("<|end|>")) {
            eog.retain(|&id| id != end);
            attrs[end as usize] = attr::USER_DEFINED;
            // Nor is it the end of a turn: llama.cpp leaves it as its EOT
            // id, but `eot()` promises a token that ends generation (the
            // server hands it to llguidance as the end of a turn).
            if eot == Some(end) {
                eot = None;
            }
        }
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = ids.find(text.as_bytes()) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }

        let mut specials: Vec<TokenId> = (0..n as TokenId)
            .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        let texts = vocab.texts();
        specials.sort_by_key(|&a| std::cmp::Reverse(texts.at(a as usize).len()));

        let mut tok = Tokenizer {
            kind,
            vocab,
            scores,
            attrs,
            ranks,
            specials,
            pieces: Texts::default(),
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            ignore_merges,
        };
        let mut pieces = Texts::with_capacity(n, tok.vocab.texts().bytes_len());
        for i in 0..n as TokenId {
            // Mostly no longer than the texts (a `▁` of 3 bytes becomes one
            // space); llama.cpp's `[UNK_BYTE_..]` markers are the exception.
            pieces.push(&tok.make_piece(i)).ok_or_else(too_long)?;
        }
        pieces.shrink();
        tok.pieces = pieces;
        Ok(tok)
    }

    /// Encodes `text` as llama.cpp's `llama_tokenize` does. `add_special`
    /// adds BOS/EOS where the model asks for them; `parse_special` lets
    /// control tokens written in the text (`<start_of_turn>`) become those
    /// tokens. User-defined tokens are always recognised.
    pub fn encode(&self, text: &[u8], add_special: bool, parse_special: bool) -> Result<Vec<TokenId>, TokenizerError> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.push(self.bos.ok_or(TokenizerError::NoSpecialToken("BOS"))?);
        }
        let mut prev_special = true;
        for frag in self.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    match self.kind {
                        Kind::Spm => {
                            let mut s = Vec::with_capacity(t.len() + 3);
                            if self.add_space_prefix && prev_special {
                                s.extend_from_slice("▁".as_bytes());
                            }
                            for &b in t {
                                if b == b' ' {
                                    s.extend_from_slice("▁".as_bytes());
                                } else {
                                    s.push(b);
                                }
                            }
                            spm::encode(self, &s, &mut out)?;
                        }
                        Kind::Bpe(split) => bpe::encode(self, t, split, &mut out)?,
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.push(self.eos.ok_or(TokenizerError::NoSpecialToken("EOS"))?);
        }
        Ok(out)
    }

    /// Cuts special tokens out of the text: each special token in turn
    /// (longest first) splits every remaining text fragment.
    fn partition<'t>(&self, text: &'t [u8], parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
        for &id in &self.specials {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = self.vocab.texts().at(id as usize);
            if !frags.iter().any(|f| matches!(f, Fragment::Text(t) if find(t, needle).is_some())) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut t) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = find(t, needle) {
                    let mut left = &t[..at];
                    if a & attr::LSTRIP != 0 {
                        while let [rest @ .., last] = left {
                            if !is_c_space(*last) {
                                break;
                            }
                            left = rest;
                        }
                    }
                    if !left.is_empty() {
                        next.push(Fragment::Text(left));
                    }
                    next.push(Fragment::Token(id));
                    t = &t[at + needle.len()..];
                    if a & attr::RSTRIP != 0 {
                        while let [first, rest @ ..] = t {
                            if !is_c_space(*first) {
                                break;
                            }
                            t = rest;
                        }
                    }
                }
                if !t.is_empty() {
                    next.push(Fragment::Text(t));
                }
            }
            frags = next;
        }
        frags
    }

    fn make_piece(&self, id: TokenId) -> Vec<u8> {
        let i = id as usize;
        let text = self.vocab.texts().at(i);
        let a = self.attrs[i];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.kind {
                Kind::Spm => replace_all(text, "▁".as_bytes(), b" "),
                Kind::Bpe(_) => bpe::decode_text(text),
            };
        }
        if a & attr::BYTE != 0 {
            return parse_byte_token(text).map(|b| vec![b]).unwrap_or_default();
        }
        Vec::new()
    }

    /// The bytes a token stands for. Control and unknown tokens give their
    /// text only with `special`; otherwise nothing, as in llama.cpp.
    pub fn piece(&self, id: TokenId, special: bool) -> Result<&[u8], TokenizerError> {
        let i = id as usize;
        let a = *self.attrs.get(i).ok_or(TokenizerError::BadTokenId { id, n_vocab: self.n_vocab() })?;
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Ok(&[]);
        }
        Ok(self.pieces.at(i))
    }

    /// Concatenates the pieces of `ids` (bytes: may be cut mid-character;
    /// use [`Detokenizer`] for streaming text).
    pub fn decode(&self, ids: &[TokenId], special: bool) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.piece(id, special)?);
        }
        Ok(out)
    }

    /// Looks a token up by its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.vocab.find(text.as_bytes())
    }

    /// The vocabulary text of a token (with `▁`, `Ġ` spellings intact).
    pub fn token_text(&self, id: TokenId) -> Option<&[u8]> {
        self.vocab.texts().get(id as usize)
    }

    /// The token's attribute bits (see [`attr`]).
    pub fn token_attr(&self, id: TokenId) -> Option<u32> {
        self.attrs.get(id as usize).copied()
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.texts().len()
    }
    /// The algorithm in use.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<TokenId> {
        self.bos
    }
    /// End-of-sequence token.
    pub fn eos(&self) -> Option<TokenId> {
        self.eos
    }
    /// End-of-turn token (e.g. Gemma's `<end_of_turn>`); always one that
    /// ends generation (harmony's `<|end|>`, which does not, is none).
    pub fn eot(&self) -> Option<TokenId> {
        self.eot
    }
    /// End-of-message token.
    pub fn eom(&self) -> Option<TokenId> {
        self.eom
    }
    /// Unknown token.
    pub fn unk(&self) -> Option<TokenId> {
        self.unk
    }
    /// Padding token.
    pub fn pad(&self) -> Option<TokenId> {
        self.pad
    }
    /// Whether generation ends at this token (EOS, EOT, EOM and the
    /// end-looking control tokens llama.cpp also treats so).
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    fn id_of(&self, text: &[u8]) -> Option<TokenId> {
        self.vocab.find(text)
    }

    /// SPM byte fallback: `<0xXX>`, else the byte itself as a token.
    fn byte_token(&self, b: u8) -> Result<TokenId, TokenizerError> {
        let hex = format!("<0x{b:02X}>");
        self.id_of(hex.as_bytes()).or_else(|| self.id_of(&[b])).ok_or(TokenizerError::NoByteToken(b))
    }
}

enum Fragment<'t> {
    Text(&'t [u8]),
    Token(TokenId),
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    if hay.len() < needle.len() {
        return None;
    }
    let last_start = hay.len() - needle.len();
    let mut i = 0;
    while i <= last_start {
        let p = hay[i..=last_start].iter().position(|&b| b == first)?;
        let at = i + p;
        if &hay[at + 1..at + needle.len()] == rest {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

fn replace_all(s: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = find(rest, from) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(to);
        rest = &rest[at + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// `<0xXX>` → the byte; llama.cpp reads the two hex digits at offset 3.
fn parse_byte_token(text: &[u8]) -> Option<u8> {
    let hex = std::str::from_utf8(text.get(3..5)?).ok()?;
    u8::from_str_radix(hex, 16).ok()
}
