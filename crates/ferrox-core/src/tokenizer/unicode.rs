//! The pieces of llama.cpp's `unicode.cpp` the BPE path needs, with its exact
//! quirks: lenient UTF-8 decoding (a bad byte becomes U+FFFD, overlong forms
//! decode), its own category table, the hand-written pre-tokenizer
//! splitters it uses instead of a regex engine for gpt2, llama3 and qwen2,
//! and, for the pre-tokenizers it runs as a regex (`gpt-4o`), its
//! "collapsed" text: each code point reduced to one character for its
//! category, matched by the pattern rewritten over those characters.

use std::sync::OnceLock;

use super::unicode_data::{RANGE_FLAGS, WHITESPACE};

const NUMBER: u16 = 0x0002;
const LETTER: u16 = 0x0004;
const WHITESPACE_FLAG: u16 = 0x0100;
const MAX_CODEPOINTS: u32 = 0x11_0000;

/// Category flags of one code point; out-of-range code points get no
/// category bits but are not "nothing" (llama.cpp marks them undefined).
#[derive(Clone, Copy, Default)]
pub(super) struct Flags(u16);

const UNDEFINED: u16 = 0x0001;

impl Flags {
    fn of(cpt: u32) -> Flags {
        if cpt >= MAX_CODEPOINTS {
            return Flags(UNDEFINED);
        }
        let i = RANGE_FLAGS.partition_point(|&(start, _)| start <= cpt);
        let mut f = if i == 0 { 0 } else { RANGE_FLAGS[i - 1].1 };
        if WHITESPACE.binary_search(&cpt).is_ok() {
            f |= WHITESPACE_FLAG;
        }
        Flags(f)
    }
    fn letter(self) -> bool {
        self.0 & LETTER != 0
    }
    fn number(self) -> bool {
        self.0 & NUMBER != 0
    }
    fn whitespace(self) -> bool {
        self.0 & WHITESPACE_FLAG != 0
    }
    /// Any flag at all: llama.cpp's "past the end of the word" is all-zero.
    fn any(self) -> bool {
        self.0 != 0
    }
    /// The category bits alone (llama.cpp's `category_flag()`).
    fn category(self) -> u16 {
        self.0 & 0x00FF
    }
}

/// Byte length a UTF-8 lead byte announces (1 for continuation bytes), as
/// both llama.cpp tokenizers cut text into symbols.
pub(super) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

/// Decodes like llama.cpp's `unicode_cpts_from_utf8`: continuation bits are
/// checked but not overlong forms or surrogates; a byte that starts no valid
/// sequence becomes U+FFFD and decoding resumes at the next byte.
pub(super) fn decode_lenient(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let cont = |j: usize| bytes.get(j).is_some_and(|b| b & 0xC0 == 0x80);
    while i < bytes.len() {
        let b = bytes[i] as u32;
        let (cpt, n) = if b & 0x80 == 0 {
            (Some(b), 1)
        } else if b & 0x40 == 0 {
            (None, 1)
        } else if b & 0x20 == 0 {
            if cont(i + 1) {
                (Some(((b & 0x1F) << 6) | (bytes[i + 1] as u32 & 0x3F)), 2)
            } else {
                (None, 1)
            }
        } else if b & 0x10 == 0 {
            if cont(i + 1) && cont(i + 2) {
                let c = ((b & 0x0F) << 12) | ((bytes[i + 1] as u32 & 0x3F) << 6) | (bytes[i + 2] as u32 & 0x3F);
                (Some(c), 3)
            } else {
                (None, 1)
            }
        } else if b & 0x08 == 0 {
            if cont(i + 1) && cont(i + 2) && cont(i + 3) {
                let c = ((b & 0x07) << 18)
                    | ((bytes[i + 1] as u32 & 0x3F) << 12)
                    | ((bytes[i + 2] as u32 & 0x3F) << 6)
                    | (bytes[i + 3] as u32 & 0x3F);
                (Some(c), 4)
            } else {
                (None, 1)
            }
        } else {
            (None, 1)
        };
        match cpt {
            Some(c) => {
                out.push(c);
                i += n;
            }
            None => {
                out.push(0xFFFD);
                i += 1;
            }
        }
    }
    out
}

/// Encodes one code point as UTF-8 the way llama.cpp does, which also
/// writes surrogates and code points the decoder let through.
pub(super) fn encode(cpt: u32, out: &mut Vec<u8>) {
    if cpt < 0x80 {
        out.push(cpt as u8);
    } else if cpt < 0x800 {
        out.extend([0xC0 | (cpt >> 6) as u8, 0x80 | (cpt & 0x3F) as u8]);
    } else if cpt < 0x1_0000 {
        out.extend([0xE0 | (cpt >> 12) as u8, 0x80 | ((cpt >> 6) & 0x3F) as u8, 0x80 | (cpt & 0x3F) as u8]);
    } else {
        out.extend([
            0xF0 | ((cpt >> 18) & 0x07) as u8,
            0x80 | ((cpt >> 12) & 0x3F) as u8,
            0x80 | ((cpt >> 6) & 0x3F) as u8,
            0x80 | (cpt & 0x3F) as u8,
        ]);
    }
}

/// GPT-2's byte→code point table: printable Latin-1 bytes map to themselves,
/// the rest to U+0100 onwards, so every byte has a visible vocab spelling.
pub(super) fn byte_to_cpt() -> [u32; 256] {
    let mut map = [u32::MAX; 256];
    for b in (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF) {
        map[b] = b as u32;
    }
    let mut n = 0;
    for m in map.iter_mut() {
        if *m == u32::MAX {
            *m = 256 + n;
            n += 1;
        }
    }
    map
}

/// The pre-tokenizer splitters ferrox implements (llama.cpp's custom ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// llama3's regex; `max_digits` is 3 for llama3 (`\p{N}{1,3}`), 1 for qwen2.
    Llama3 {
        /// Longest run of digits one word may hold.
        max_digits: usize,
    },
    /// The `gpt-4o` (o200k) pattern, as llama.cpp has it in `llama-vocab.cpp`
    /// ([`GPT4O`]): a regex over the collapsed text.
    Gpt4o,
}

/// llama.cpp's `gpt-4o` pre-tokenizer pattern, character for character
/// (`llama-vocab.cpp`, `LLAMA_VOCAB_PRE_TYPE_GPT4O`; the tokenizer.json
/// original's `\p{Lu}\p{Lt}..` classes written there as lookaheads, and its
/// `(?i:'s|..)` spelled out).
pub(super) const GPT4O: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// The stand-in characters of llama.cpp's collapsed text (there bytes
/// 0xD0..0xD5 in a `std::string`; here the code points of those values).
const COLLAPSED_OTHER: char = '\u{D0}';
const COLLAPSED: [(u16, char); 5] =
    [(NUMBER, '\u{D1}'), (LETTER, '\u{D2}'), (0x0020, '\u{D3}'), (0x0010, '\u{D4}'), (0x0040, '\u{D5}')];

/// llama.cpp's collapsed text: code points below 128 stay, other whitespace
/// becomes U+000B (which `\s` matches), the rest one stand-in for its
/// category (number, letter, punctuation, mark, symbol, or none of these).
/// So every non-ASCII letter is both "not a-z" and "not A-Z", i.e. upper
/// and lower case at once, and a combining mark is no letter.
fn collapse(cpts: &[u32]) -> String {
    cpts.iter()
        .map(|&c| {
            if c < 128 {
                return char::from(c as u8);
            }
            let f = Flags::of(c);
            if f.whitespace() {
                return '\u{0B}';
            }
            COLLAPSED.iter().find(|&&(cat, _)| cat == f.category()).map_or(COLLAPSED_OTHER, |&(_, s)| s)
        })
        .collect()
}

/// Rewrites a pattern over llama.cpp's categories into one over the
/// collapsed text, as `unicode_regex_split` does: `\p{L}` and `\p{N}` become
/// their stand-in plus the ASCII members (`[\x{D2}A-Za-z]`, bare inside a
/// class). `\s`/`\S` become the C locale's `isspace` set, which is what
/// llama.cpp's `std::regex` matches on its `char` text.
fn collapse_pattern(expr: &str) -> String {
    const SPACE: &str = r"\t\n\x0B\x0C\r ";
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut rest = expr;
    while let Some(c) = rest.chars().next() {
        let (add, used): (String, usize) = if rest.starts_with(r"\p{L}") {
            let body = r"\x{D2}A-Za-z";
            (if inside { body.into() } else { format!("[{body}]") }, 5)
        } else if rest.starts_with(r"\p{N}") {
            let body = r"\x{D1}0-9";
            (if inside { body.into() } else { format!("[{body}]") }, 5)
        } else if rest.starts_with(r"\s") {
            (if inside { SPACE.into() } else { format!("[{SPACE}]") }, 2)
        } else if rest.starts_with(r"\S") && !inside {
            (format!("[^{SPACE}]"), 2)
        } else if rest.starts_with('\\') && rest.len() > 1 {
            // Any other escape passes through whole (`\r`, `\[`).
            let n = 1 + rest[1..].chars().next().map_or(0, char::len_utf8);
            (rest[..n].into(), n)
        } else {
            if c == '[' {
                inside = true;
            } else if c == ']' {
                inside = false;
            }
            (c.into(), c.len_utf8())
        };
        out.push_str(&add);
        rest = &rest[used..];
    }
    out
}

/// GPT4O's last two alternatives. The first is a lookahead, which the
/// `regex` crate (linear time, no backtracking stack to run out of on a long
/// run of one class) does not have; [`regex_split`] gets its effect from the
/// second.
const SPACE_TAIL: &str = r"|\s+(?!\S)|\s+";

/// GPT4O without lookaheads: a one-character lookahead before a
/// one-character class is the classes' intersection, and the whitespace
/// tail is cut to `\s+` (see [`regex_split`]).
fn gpt4o_without_lookaheads() -> Result<String, String> {
    let body = GPT4O.strip_suffix(SPACE_TAIL).ok_or("the gpt-4o pattern does not end in its whitespace alternatives")?;
    let p = body
        .replace(r"(?=[\p{L}])([^a-z])", r"[\p{L}&&[^a-z]]")
        .replace(r"(?=[\p{L}])([^A-Z])", r"[\p{L}&&[^A-Z]]");
    if p.contains("(?=") || p.contains("(?!") {
        return Err("the gpt-4o pattern has a lookahead ferrox does not rewrite".into());
    }
    Ok(format!(r"{p}|\s+"))
}

fn gpt4o_regex() -> &'static Result<regex::Regex, String> {
    static RE: OnceLock<Result<regex::Regex, String>> = OnceLock::new();
    RE.get_or_init(|| regex::Regex::new(&collapse_pattern(&gpt4o_without_lookaheads()?)).map_err(|e| e.to_string()))
}

/// Splits like llama.cpp's `unicode_regex_split_stl`: each match is a word,
/// and so is each stretch between matches (there is none with GPT4O).
///
/// `\s+(?!\S)|\s+` is matched as `\s+` and then cut: a match of spaces
/// alone (no `\r`/`\n`, else `\s*[\r\n]+` would have matched, and nothing
/// else in the pattern matches only spaces) runs to the end of its run, so
/// when a non-space follows and it is longer than one, `\s+(?!\S)` would
/// have backed off one, leaving the last space to the next word.
fn regex_split(cpts: &[u32], re: &regex::Regex) -> Vec<usize> {
    let text = collapse(cpts);
    let cpt_len = |a: usize, b: usize| text[a..b].chars().count();
    let spaces_only = |s: &str| s.bytes().all(|b| matches!(b, b'\t' | 0x0B | 0x0C | b' '));
    let mut words = Vec::new();
    let mut at = 0;
    while let Some(m) = re.find_at(&text, at) {
        let (start, mut end) = (m.start(), m.end());
        if end == start {
            // The pattern matches no empty string; never loop on one.
            break;
        }
        if end < text.len() && end - start > 1 && spaces_only(&text[start..end]) {
            end -= 1;
        }
        if start > at {
            words.push(cpt_len(at, start));
        }
        words.push(cpt_len(start, end));
        at = end;
    }
    if at < text.len() {
        words.push(cpt_len(at, text.len()));
    }
    words
}

/// Splits code points into words; returns each word's length in code
/// points, or why the pattern would not compile.
pub(super) fn split(cpts: &[u32], how: Split) -> Result<Vec<usize>, String> {
    match how {
        Split::Gpt4o => match gpt4o_regex() {
            Ok(re) => Ok(regex_split(cpts, re)),
            Err(e) => Err(e.clone()),
        },
        Split::Gpt2 => Ok(split_custom(cpts, None)),
        Split::Llama3 { max_digits } => Ok(split_custom(cpts, Some(max_digits))),
    }
}

/// llama.cpp's hand-written splitters (`unicode_regex_split_custom_*`):
/// gpt2's, or llama3's with `llama3` holding its `max_digits`.
fn split_custom(cpts: &[u32], llama3: Option<usize>) -> Vec<usize> {
    let mut words = Vec::new();
    let end = cpts.len();
    let cpt_at = |p: usize| if p < end { cpts[p] } else { u32::MAX };
    let flags_at = |p: usize| if p < end { Flags::of(cpts[p]) } else { Flags::default() };
    let mut prev = 0usize;
    let mut add = |to: usize, words: &mut Vec<usize>| -> usize {
        let len = to - prev;
        if len > 0 {
            words.push(len);
        }
        prev = to;
        len
    };
    let lower = |c: u32| if (b'A' as u32..=b'Z' as u32).contains(&c) { c + 32 } else { c };
    let mut pos = 0;
    while pos < end {
        let cpt = cpt_at(pos);
        let flags = flags_at(pos);
        let case_fold = llama3.is_some();
        if cpt == '\'' as u32 && pos + 1 < end {
            let n = if case_fold { lower(cpt_at(pos + 1)) } else { cpt_at(pos + 1) };
            if [b's', b't', b'm', b'd'].iter().any(|&c| n == c as u32) {
                pos += add(pos + 2, &mut words);
                continue;
            }
            if pos + 2 < end {
                let nn = if case_fold { lower(cpt_at(pos + 2)) } else { cpt_at(pos + 2) };
                let pair = |a: u8, b: u8| n == a as u32 && nn == b as u32;
                if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
                    pos += add(pos + 3, &mut words);
                    continue;
                }
            }
        }
        match llama3 {
            None => {
                let mut f2 = if cpt == ' ' as u32 { flags_at(pos + 1) } else { flags };
                if f2.letter() || f2.number() {
                    let want_letter = f2.letter();
                    pos += usize::from(cpt == ' ' as u32);
                    while if want_letter { f2.letter() } else { f2.number() } {
                        pos += 1;
                        f2 = flags_at(pos);
                    }
                    add(pos, &mut words);
                    continue;
                }
                let other = |f: Flags| !(f.whitespace() || f.letter() || f.number()) && f.any();
                if other(f2) {
                    pos += usize::from(cpt == ' ' as u32);
                    while other(f2) {
                        pos += 1;
                        f2 = flags_at(pos);
                    }
                    add(pos, &mut words);
                    continue;
                }
            }
            Some(max_digits) => {
                let cr_lf = |c: u32| c == '\r' as u32 || c == '\n' as u32;
                if !(cr_lf(cpt) || flags.number()) && (flags.letter() || flags_at(pos + 1).letter()) {
                    pos += 1;
                    while flags_at(pos).letter() {
                        pos += 1;
                    }
                    add(pos, &mut words);
                    continue;
                }
                if flags.number() {
                    let mut ini = pos;
                    while flags_at(pos).number() {
                        pos += 1;
                        if pos - ini >= max_digits {
                            add(pos, &mut words);
                            ini = pos;
                        }
                    }
                    add(pos, &mut words);
                    continue;
                }
                let mut f2 = if cpt == ' ' as u32 { flags_at(pos + 1) } else { flags };
                let other = |f: Flags| !(f.whitespace() || f.letter() || f.number());
                // The first test reads `flags`, the loop `f2`: llama.cpp's
                // splitter does so, and a space before a letter still fails.
                if other(f2) && flags.any() {
                    pos += usize::from(cpt == ' ' as u32);
                    while other(f2) && f2.any() {
                        pos += 1;
                        f2 = flags_at(pos);
                    }
                    while cr_lf(cpt_at(pos)) {
                        pos += 1;
                    }
                    add(pos, &mut words);
                    continue;
                }
                let mut n_ws = 0;
                let mut last_cr_lf = 0;
                while flags_at(pos + n_ws).whitespace() {
                    if cr_lf(cpt_at(pos + n_ws)) {
                        last_cr_lf = pos + n_ws + 1;
                    }
                    n_ws += 1;
                }
                if last_cr_lf > 0 {
                    pos = last_cr_lf;
                    add(pos, &mut words);
                    continue;
                }
            }
        }
        let mut n_ws = 0;
        while flags_at(pos + n_ws).whitespace() {
            n_ws += 1;
        }
        if n_ws > 1 && pos + n_ws < end {
            pos += n_ws - 1;
            add(pos, &mut words);
            continue;
        }
        if n_ws > 0 {
            pos += n_ws;
            add(pos, &mut words);
            continue;
        }
        pos += 1;
        add(pos, &mut words);
    }
    words
}
