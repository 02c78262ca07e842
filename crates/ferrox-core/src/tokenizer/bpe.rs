//! Byte-level BPE as llama.cpp does it for `gpt2` vocabs: split the text
//! into words with the pre-tokenizer, spell each word's UTF-8 bytes with
//! GPT-2's printable byte alphabet, then merge adjacent pairs by lowest
//! `tokenizer.ggml.merges` rank (ties: leftmost).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use super::unicode::{self, Split};
use super::{TokenId, Tokenizer, TokenizerError};

struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    start: usize,
    len: usize,
}

struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
    /// The pair's text when queued; a pair whose sides changed is stale.
    text: Vec<u8>,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Greater = popped first: lower rank, then the smaller left index.
    fn cmp(&self, o: &Self) -> Ordering {
        o.rank.cmp(&self.rank).then(o.left.cmp(&self.left))
    }
}

fn byte_map() -> &'static [u32; 256] {
    static MAP: OnceLock<[u32; 256]> = OnceLock::new();
    MAP.get_or_init(unicode::byte_to_cpt)
}

/// Splits and byte-encodes `text` into pre-tokenizer words.
pub(super) fn words(text: &[u8], split: Split) -> Result<Vec<Vec<u8>>, TokenizerError> {
    let cpts = unicode::decode_lenient(text);
    let map = byte_map();
    let mut out = Vec::new();
    let mut at = 0;
    let lens = unicode::split(&cpts, split).map_err(|why| TokenizerError::PreTokenizer { split, why })?;
    for len in lens {
        let mut utf8 = Vec::new();
        for &c in &cpts[at..at + len] {
            unicode::encode(c, &mut utf8);
        }
        at += len;
        let mut word = Vec::with_capacity(utf8.len() * 2);
        for b in utf8 {
            unicode::encode(map[b as usize], &mut word);
        }
        out.push(word);
    }
    Ok(out)
}

/// Encodes raw text (a fragment without special tokens) and appends the ids.
pub(super) fn encode(tok: &Tokenizer, text: &[u8], split: Split, out: &mut Vec<TokenId>) -> Result<(), TokenizerError> {
    for word in words(text, split)? {
        let mut syms: Vec<Symbol> = Vec::new();
        if tok.ignore_merges && tok.id_of(&word).is_some() {
            syms.push(Symbol { prev: None, next: None, start: 0, len: word.len() });
        } else {
            let mut off = 0;
            while off < word.len() {
                let len = unicode::utf8_len(word[off]).min(word.len() - off);
                let i = syms.len();
                syms.push(Symbol { prev: i.checked_sub(1), next: None, start: off, len });
                off += len;
                if off < word.len() {
                    syms[i].next = Some(i + 1);
                }
            }
        }
        let piece = |s: &Symbol| &word[s.start..s.start + s.len];
        let mut queue = BinaryHeap::new();
        let try_add = |syms: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: Option<usize>, right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else { return };
            let key = [piece(&syms[l]), &[0xFF], piece(&syms[r])].concat();
            if let Some(rank) = tok.ranks.find(&key) {
                let text = [piece(&syms[l]), piece(&syms[r])].concat();
                queue.push(Bigram { left: l, right: r, rank, text });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (b.left, b.right);
            if syms[l].len == 0 || syms[r].len == 0 {
                continue;
            }
            let lt = piece(&syms[l]);
            let rt = piece(&syms[r]);
            if lt.len() + rt.len() != b.text.len() || b.text[..lt.len()] != *lt || b.text[lt.len()..] != *rt {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if let Some(n) = syms[r].next {
                syms[n].prev = Some(l);
            }
            try_add(&syms, &mut queue, syms[l].prev, Some(l));
            try_add(&syms, &mut queue, Some(l), syms[l].next);
        }
        for s in syms.iter().filter(|s| s.len > 0) {
            let p = piece(s);
            match tok.id_of(p) {
                Some(id) => out.push(id),
                // llama.cpp looks each byte of the encoded spelling up as a
                // one-byte token and drops the ones that have none.
                None => out.extend(p.iter().filter_map(|&b| tok.id_of(&[b]))),
            }
        }
    }
    Ok(())
}

/// A vocabulary spelling back to bytes (GPT-2 alphabet → raw bytes).
pub(super) fn decode_text(text: &[u8]) -> Vec<u8> {
    let map = byte_map();
    let mut out = Vec::with_capacity(text.len());
    for c in unicode::decode_lenient(text) {
        match map.iter().position(|&m| m == c) {
            Some(b) => out.push(b as u8),
            None => {
                // llama.cpp writes an `[UNK_BYTE_0x..]` marker here.
                let mut u = Vec::new();
                unicode::encode(c, &mut u);
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in u {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
    out
}
