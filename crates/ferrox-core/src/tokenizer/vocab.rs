//! Byte strings kept compactly: one buffer and their end offsets
//! ([`Texts`]), and a hash index from bytes to position over them
//! ([`TextIndex`]).
//!
//! The key decision: no allocation per string. A 262144-token vocabulary
//! as `Vec<Vec<u8>>` plus a `HashMap<Vec<u8>, u32>` of copies costs ~32 MB
//! (a 24-byte header and a heap block per string, twice, and 32-byte map
//! entries); here it is its bytes, 4 bytes of offset per string and 8
//! bytes of table per string (u32 positions at most half full, linear
//! probing, the hash over the bytes where they lie).

/// Strings one after another in one buffer.
#[derive(Default)]
pub(crate) struct Texts {
    bytes: Vec<u8>,
    /// `ends[i]`: where string `i` ends (and `i + 1` starts).
    ends: Vec<u32>,
}

impl Texts {
    /// Room for `n` strings of `bytes` bytes in all.
    pub(crate) fn with_capacity(n: usize, bytes: usize) -> Texts {
        Texts { bytes: Vec::with_capacity(bytes), ends: Vec::with_capacity(n) }
    }

    /// Appends `s` as string `self.len()`; `None` when the buffer would
    /// pass 4 GiB (offsets are u32).
    pub(crate) fn push(&mut self, s: &[u8]) -> Option<()> {
        let end = u32::try_from(self.bytes.len() + s.len()).ok()?;
        self.bytes.extend_from_slice(s);
        self.ends.push(end);
        Some(())
    }

    /// String `i`, if there is one.
    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some(&self.bytes[start..end])
    }

    /// String `i`; panics past the end (callers index by a checked id).
    pub(crate) fn at(&self, i: usize) -> &[u8] {
        self.get(i).expect("string index inside the list")
    }

    /// Number of strings.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Bytes of all the strings.
    pub(crate) fn bytes_len(&self) -> usize {
        self.bytes.len()
    }

    /// Gives back the unused capacity.
    pub(crate) fn shrink(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

/// [`Texts`] and an index from a string's bytes to its position.
#[derive(Default)]
pub(crate) struct TextIndex {
    texts: Texts,
    /// Open addressing: `position + 1`, 0 for an empty slot; a power-of-two
    /// length at least twice the strings.
    table: Vec<u32>,
}

/// FxHash's step over 8 bytes at a time, then the length: quick on the
/// short strings a tokenizer looks up, and spread enough for a half-full
/// table.
fn hash(s: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = 0u64;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h = (h.rotate_left(5) ^ s.len() as u64).wrapping_mul(K);
    // The table takes the low bits: fold the well-mixed high ones down.
    h ^ (h >> 29)
}

impl TextIndex {
    /// An index over `n` strings of `bytes` bytes in all, filled by `push`.
    pub(crate) fn with_capacity(n: usize, bytes: usize) -> TextIndex {
        TextIndex { texts: Texts::with_capacity(n, bytes), table: vec![0; (2 * n).next_power_of_two().max(2)] }
    }

    /// The slot holding `s`, or the empty slot where it would go.
    fn slot(&self, s: &[u8]) -> usize {
        let mask = self.table.len() - 1;
        let mut i = hash(s) as usize & mask;
        loop {
            match self.table[i] {
                0 => return i,
                p if self.texts.at(p as usize - 1) == s => return i,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Appends `s` as string `self.len()`. When an equal string is already
    /// there, the index keeps the later one with `later_wins` (llama.cpp's
    /// token_to_id map) or the earlier (the first merge's rank). `None`
    /// when the buffer would pass 4 GiB.
    pub(crate) fn push(&mut self, s: &[u8], later_wins: bool) -> Option<()> {
        let pos = self.texts.len();
        self.texts.push(s)?;
        if 2 * self.texts.len() > self.table.len() {
            self.grow(later_wins);
            return Some(()); // the rebuild indexed it
        }
        let i = self.slot(s);
        if self.table[i] == 0 || later_wins {
            self.table[i] = pos as u32 + 1;
        }
        Some(())
    }

    /// Doubles the table and indexes every string again, in order, with
    /// the same rule for duplicates.
    fn grow(&mut self, later_wins: bool) {
        self.table = vec![0; self.table.len() * 2];
        for p in 0..self.texts.len() {
            let i = self.slot(self.texts.at(p));
            if self.table[i] == 0 || later_wins {
                self.table[i] = p as u32 + 1;
            }
        }
    }

    /// The position of `s`, if it is there.
    pub(crate) fn find(&self, s: &[u8]) -> Option<u32> {
        match self.table[self.slot(s)] {
            0 => None,
            p => Some(p - 1),
        }
    }

    /// The strings.
    pub(crate) fn texts(&self) -> &Texts {
        &self.texts
    }

    /// Gives back the unused capacity.
    pub(crate) fn shrink(&mut self) {
        self.texts.shrink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_finds_every_string_and_resolves_duplicates_as_asked() {
        let words: Vec<Vec<u8>> = (0..5000u32).map(|i| format!("w{}", i * 7919 % 4000).into_bytes()).collect();
        for later_wins in [true, false] {
            // Capacity for a tenth: the table grows along the way.
            let mut ix = TextIndex::with_capacity(500, 0);
            let mut t = Texts::default();
            for w in &words {
                ix.push(w, later_wins).unwrap();
                t.push(w).unwrap();
            }
            assert_eq!(ix.texts().len(), words.len());
            for (i, w) in words.iter().enumerate() {
                assert_eq!(ix.texts().at(i), &w[..]);
                assert_eq!(t.get(i), Some(&w[..]));
                let want = if later_wins {
                    words.iter().rposition(|x| x == w)
                } else {
                    words.iter().position(|x| x == w)
                };
                assert_eq!(ix.find(w), want.map(|p| p as u32), "{:?}, later_wins {later_wins}", String::from_utf8_lossy(w));
            }
            assert_eq!(ix.find(b"w4000"), None);
            assert_eq!(ix.find(b""), None);
        }
        assert_eq!(Texts::default().get(0), None);
    }
}
