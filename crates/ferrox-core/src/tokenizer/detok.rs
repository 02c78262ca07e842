//! Streaming detokenization: token pieces are bytes, and a character may be
//! spread over several tokens (byte-fallback `<0xF0><0x9F>…`, or a BPE token
//! ending mid-character). The detokenizer hands out only whole characters and
//! holds back an incomplete tail until the next token completes it.

use super::{TokenId, Tokenizer, TokenizerError};

/// Turns a stream of token ids into text without ever splitting a UTF-8
/// character. Bytes that can never form a character become U+FFFD.
pub struct Detokenizer<'t> {
    tok: &'t Tokenizer,
    special: bool,
    pending: Vec<u8>,
}

impl<'t> Detokenizer<'t> {
    /// `special`: whether control tokens print their text (e.g. `<end_of_turn>`).
    pub fn new(tok: &'t Tokenizer, special: bool) -> Self {
        Detokenizer { tok, special, pending: Vec::new() }
    }

    /// Adds one token; returns the text that is now complete (maybe empty).
    pub fn push(&mut self, id: TokenId) -> Result<String, TokenizerError> {
        self.pending.extend_from_slice(self.tok.piece(id, self.special)?);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return Ok(out);
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for more.
                        None => {
                            self.pending.drain(..good);
                            return Ok(out);
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: an incomplete tail comes out as U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
