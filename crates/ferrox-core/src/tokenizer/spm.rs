//! SentencePiece-style encoding as llama.cpp does it for `llama` vocabs:
//! start from single UTF-8 characters and repeatedly merge the adjacent pair
//! whose concatenation is the highest-*scoring* vocabulary entry (ties: the
//! leftmost), then fall back to `<0xXX>` byte tokens for what stays unknown.
//! This is not Unigram/Viterbi; the two disagree on real vocabularies.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::unicode::utf8_len;
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
    score: f32,
    size: usize,
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
    /// Greater = popped first: higher score, then the smaller left index.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.partial_cmp(&o.score).unwrap_or(Ordering::Equal).then(o.left.cmp(&self.left))
    }
}

/// Encodes already-escaped text (spaces are `▁`) and appends the ids.
pub(super) fn encode(tok: &Tokenizer, text: &[u8], out: &mut Vec<TokenId>) -> Result<(), TokenizerError> {
    let mut syms = Vec::new();
    let mut off = 0;
    while off < text.len() {
        // A truncated sequence at the end becomes a shorter symbol.
        let len = utf8_len(text[off]).min(text.len() - off);
        let i = syms.len();
        syms.push(Symbol { prev: i.checked_sub(1), next: None, start: off, len });
        off += len;
        if off < text.len() {
            syms[i].next = Some(i + 1);
        }
    }
    let mut queue = BinaryHeap::new();
    let try_add = |syms: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: Option<usize>, right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else { return };
        let s = syms[l].start;
        let size = syms[l].len + syms[r].len;
        if let Some(id) = tok.id_of(&text[s..s + size]) {
            queue.push(Bigram { left: l, right: r, score: tok.scores[id as usize], size });
        }
    };
    for i in 1..syms.len() {
        try_add(&syms, &mut queue, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (b.left, b.right);
        // Stale: one side was merged away or grew since this pair was queued.
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != b.size {
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
    let mut cur = if syms.is_empty() { None } else { Some(0) };
    while let Some(i) = cur {
        let s = &syms[i];
        let piece = &text[s.start..s.start + s.len];
        // Every merged symbol is a vocabulary entry, so only single
        // characters can be unknown here: they go out as bytes.
        match tok.id_of(piece) {
            Some(id) => out.push(id),
            None => {
                for &byte in piece {
                    out.push(tok.byte_token(byte)?);
                }
            }
        }
        cur = s.next;
    }
    Ok(())
}
