//! Constrained decoding: `response_format`, `json_schema`, `grammar`,
//! `regex` and forced tool calls, as a [`TokenConstraint`] over llguidance.
//!
//! The decision (docs/decisions/0031): llguidance compiles JSON Schema, Lark
//! and regex into an Earley parser over a lexer of derivative-based regexes
//! and walks the model's token trie to compute each step's mask — the engine
//! llama.cpp, vLLM and mistral.rs use. ferrox builds the trie once per model
//! from its own tokenizer: every token's bytes, control tokens as
//! `0xFF` + their text (llguidance's marker for special tokens, so grammars
//! can never produce them by accident), and every end-of-generation token as
//! an EOS the grammar may allow once it accepts.
//!
//! GBNF (llama.cpp's `grammar` field) is translated to Lark by [`gbnf_to_lark`]:
//! the two differ in spelling only (`::=`, rule names with dashes, bare
//! character classes). A grammar that starts with `%llguidance` is Lark
//! already, as llama.cpp treats it.

use std::sync::Arc;

use ferrox_core::scheduler::TokenConstraint;
use ferrox_core::tokenizer::{attr, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// Any JSON object.
    JsonObject,
    /// A value of this JSON Schema.
    JsonSchema(Value),
    /// llama.cpp's GBNF (or Lark, when it starts with `%llguidance`).
    Gbnf(String),
    /// Lark, as llguidance reads it.
    Lark(String),
    /// A whole-output regular expression (Rust `regex` syntax).
    Regex(String),
}

/// A spec llguidance cannot compile: the message names the keyword or the
/// grammar's error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

/// JSON layout the schema compiler enforces: one space after `,` and `:`, no
/// other whitespace (so a model cannot pad forever), and `oneOf` read as
/// `anyOf` (llguidance cannot prove alternatives disjoint; a value that
/// matches several is the model's to avoid).
fn json_options() -> Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "coerce_one_of": true,
    })
}

/// A JSON Schema with ferrox's layout options (unless it carries its own
/// `x-guidance`), and objects closed where they list `properties` without
/// saying `additionalProperties` — llama-server's default, which keeps a
/// model from inventing keys forever.
pub fn with_json_options(mut schema: Value) -> Value {
    close_objects(&mut schema, 0);
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(json_options);
    }
    schema
}

/// Adds `additionalProperties: false` to every (sub)schema with
/// `properties` and neither `additionalProperties` nor `patternProperties`.
fn close_objects(schema: &mut Value, depth: usize) {
    let Value::Object(o) = schema else { return };
    if depth > 64 {
        return;
    }
    if o.get("properties").is_some_and(Value::is_object)
        && !o.contains_key("additionalProperties")
        && !o.contains_key("patternProperties")
    {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, v) in o.iter_mut() {
        match (k.as_str(), v) {
            ("properties" | "$defs" | "definitions", Value::Object(m)) => {
                m.values_mut().for_each(|s| close_objects(s, depth + 1));
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(a)) => {
                a.iter_mut().for_each(|s| close_objects(s, depth + 1));
            }
            ("items" | "additionalProperties" | "additionalItems", s) => close_objects(s, depth + 1),
            _ => {}
        }
    }
}

/// The model's vocabulary as llguidance sees it.
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Bytes the grammar forces, split greedily over the trie: the
        // model's own tokenizer may add a prefix space (SPM's `▁`), which
        // would force bytes the grammar never asked for.
        self.trie.greedy_tokenize(s)
    }
}

/// Compiles specs for one model (the token trie and lexer slices are built
/// once, in [`Grammars::new`]).
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The trie of `tok`'s vocabulary.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Grammars, SpecError> {
        let n = tok.n_vocab();
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let a = tok.token_attr(id).unwrap_or(0);
            let w = if a & (attr::CONTROL | attr::UNKNOWN | attr::UNUSED) != 0 || tok.is_eog(id) {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tok.token_text(id).unwrap_or_default());
                w
            } else {
                tok.piece(id, false).map(<[u8]>::to_vec).unwrap_or_default()
            };
            words.push(w);
        }
        let eogs: Vec<TokenId> = (0..n as u32).filter(|&id| tok.is_eog(id)).collect();
        let eos = tok.eos().or_else(|| eogs.first().copied()).unwrap_or(0);
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tok.bos();
        info.tok_end_of_turn = tok.eot();
        let mut trie = TokTrie::from(&info, &words);
        if !eogs.is_empty() {
            trie = trie.with_eos_tokens(&eogs);
        }
        let env: TokEnv = Arc::new(Env { trie });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| SpecError(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A fresh matcher for `spec`, or why it cannot be compiled.
    pub fn compile(&self, spec: &Spec) -> Result<Grammar, SpecError> {
        let top = match spec {
            Spec::JsonObject => TopLevelGrammar::from_json_schema(with_json_options(
                serde_json::json!({"type": "object"}),
            )),
            Spec::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_json_options(s.clone())),
            Spec::Gbnf(g) if g.trim_start().starts_with("%llguidance") => {
                TopLevelGrammar::from_lark(g.clone())
            }
            Spec::Gbnf(g) => TopLevelGrammar::from_lark(gbnf_to_lark(g)?),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| SpecError(describe(&e.to_string())))?;
        let m = Matcher::new(Ok(parser));
        match m.get_error() {
            Some(e) => Err(SpecError(describe(&e))),
            None => Ok(Grammar(m)),
        }
    }
}

/// llguidance's message, with an unsupported JSON Schema keyword named
/// first.
fn describe(e: &str) -> String {
    match e.find("Unimplemented keys: ") {
        Some(at) => {
            let keys = e[at + "Unimplemented keys: ".len()..]
                .split(']')
                .next()
                .unwrap_or_default()
                .trim_start_matches('[')
                .replace('"', "");
            format!("unsupported JSON Schema keyword(s): {keys}")
        }
        None => e.lines().next().unwrap_or(e).to_string(),
    }
}

/// A compiled spec, not yet advanced; each sequence gets its own copy.
#[derive(Clone)]
pub struct Grammar(Matcher);

impl Grammar {
    /// A constraint starting at the grammar's beginning.
    pub fn constraint(&self) -> Box<dyn TokenConstraint> {
        Box::new(Constraint(self.0.deep_clone()))
    }
}

/// The [`TokenConstraint`] over one llguidance matcher.
pub struct Constraint(Matcher);

impl TokenConstraint for Constraint {
    fn mask(&mut self, logits: &mut [f32]) {
        // A matcher in error (only after a token it did not allow) allows
        // nothing but EOS: the sequence ends.
        let mask = self.0.compute_mask_or_eos().ok();
        let words = mask.as_ref().map_or(&[][..], |m| m.as_slice());
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    fn accept(&mut self, token: u32) {
        // An error leaves the matcher stopped (see `is_complete`).
        let _ = self.0.consume_token(token);
    }

    fn is_complete(&self) -> bool {
        self.0.is_stopped()
    }
}

/// llama.cpp's GBNF as llguidance's Lark: `name ::= ...` becomes
/// `name: ...` with the name made a Lark rule name, character classes and
/// `.` become regexes, literals are re-quoted as JSON strings; `root` is the
/// start rule. Repetitions (`*`, `+`, `?`, `{m,n}`), groups and alternatives
/// are spelled alike.
pub fn gbnf_to_lark(src: &str) -> Result<String, SpecError> {
    let toks = gbnf_tokens(src)?;
    let mut names: Vec<String> = Vec::new();
    let mut out = String::new();
    let mut has_root = false;
    let mut i = 0;
    while i < toks.len() {
        match (&toks[i], toks.get(i + 1)) {
            (G::Name(n), Some(G::Define)) => {
                if n == "root" {
                    has_root = true;
                }
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&rule_name(n, &mut names));
                out.push(':');
                i += 2;
                continue;
            }
            _ if out.is_empty() => {
                return Err(SpecError("grammar: expected a rule (`name ::= ...`)".into()))
            }
            (G::Name(n), _) => {
                out.push(' ');
                out.push_str(&rule_name(n, &mut names));
            }
            (G::Define, _) => return Err(SpecError("grammar: `::=` without a rule name".into())),
            (G::Lit(s), _) => {
                out.push(' ');
                out.push_str(&serde_json::to_string(s).unwrap_or_default());
            }
            (G::Class { neg, ranges }, _) => {
                out.push_str(" /[");
                if *neg {
                    out.push('^');
                }
                for &(a, b) in ranges {
                    out.push_str(&format!("\\x{{{:x}}}", a as u32));
                    if b != a {
                        out.push_str(&format!("-\\x{{{:x}}}", b as u32));
                    }
                }
                out.push_str("]/");
            }
            (G::Any, _) => out.push_str(" /(?s:.)/"),
            (G::Punct(p), _) => {
                out.push(' ');
                out.push_str(p);
            }
        }
        i += 1;
    }
    if !has_root {
        return Err(SpecError("grammar: no `root` rule".into()));
    }
    Ok(format!("start: {}\n{out}\n", rule_name("root", &mut names)))
}

/// A GBNF rule name as a Lark rule name (lowercase, unique per name).
fn rule_name(n: &str, names: &mut Vec<String>) -> String {
    let i = names.iter().position(|x| x == n).unwrap_or_else(|| {
        names.push(n.to_string());
        names.len() - 1
    });
    let clean: String = n
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .collect();
    format!("r{i}_{clean}")
}

/// A GBNF token.
#[derive(Debug, PartialEq)]
enum G {
    Name(String),
    Define,
    Lit(String),
    Class { neg: bool, ranges: Vec<(char, char)> },
    Any,
    /// `( ) | * + ?` or a `{m,n}` repetition, spelled as in Lark.
    Punct(String),
}

fn gbnf_tokens(src: &str) -> Result<Vec<G>, SpecError> {
    let err = |m: &str| SpecError(format!("grammar: {m}"));
    let cs: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        match c {
            _ if c.is_whitespace() => i += 1,
            '#' => {
                while i < cs.len() && cs[i] != '\n' {
                    i += 1;
                }
            }
            ':' if cs.get(i + 1) == Some(&':') && cs.get(i + 2) == Some(&'=') => {
                out.push(G::Define);
                i += 3;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                out.push(G::Punct(c.to_string()));
                i += 1;
            }
            '{' => {
                let end = cs[i..].iter().position(|&x| x == '}').ok_or_else(|| err("unclosed `{`"))?;
                let body: String = cs[i + 1..i + end].iter().filter(|c| !c.is_whitespace()).collect();
                if body.is_empty() || !body.chars().all(|c| c.is_ascii_digit() || c == ',') {
                    return Err(err(&format!("bad repetition {{{body}}}")));
                }
                out.push(G::Punct(format!("{{{body}}}")));
                i += end + 1;
            }
            '.' => {
                out.push(G::Any);
                i += 1;
            }
            '"' => {
                i += 1;
                let mut s = String::new();
                loop {
                    match cs.get(i) {
                        None => return Err(err("unclosed string")),
                        Some('"') => break,
                        Some('\\') => {
                            let (ch, n) = gbnf_escape(&cs[i..]).ok_or_else(|| err("bad escape in a string"))?;
                            s.push(ch);
                            i += n;
                        }
                        Some(&ch) => {
                            s.push(ch);
                            i += 1;
                        }
                    }
                }
                i += 1;
                out.push(G::Lit(s));
            }
            '[' => {
                i += 1;
                let neg = cs.get(i) == Some(&'^');
                if neg {
                    i += 1;
                }
                let mut ranges = Vec::new();
                let one = |i: &mut usize| -> Result<char, SpecError> {
                    match cs.get(*i) {
                        None => Err(err("unclosed `[`")),
                        Some('\\') => {
                            let (ch, n) = gbnf_escape(&cs[*i..]).ok_or_else(|| err("bad escape in a character class"))?;
                            *i += n;
                            Ok(ch)
                        }
                        Some(&ch) => {
                            *i += 1;
                            Ok(ch)
                        }
                    }
                };
                while cs.get(i) != Some(&']') {
                    let a = one(&mut i)?;
                    let b = if cs.get(i) == Some(&'-') && cs.get(i + 1).is_some_and(|&c| c != ']') {
                        i += 1;
                        one(&mut i)?
                    } else {
                        a
                    };
                    if b < a {
                        return Err(err(&format!("character range {a:?}-{b:?} is reversed")));
                    }
                    ranges.push((a, b));
                }
                i += 1;
                out.push(G::Class { neg, ranges });
            }
            _ if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '-' || cs[i] == '_') {
                    i += 1;
                }
                out.push(G::Name(cs[start..i].iter().collect()));
            }
            other => return Err(err(&format!("unexpected {other:?}"))),
        }
    }
    Ok(out)
}

/// A GBNF escape at `s[0] == '\\'`: the character and the length read.
fn gbnf_escape(s: &[char]) -> Option<(char, usize)> {
    let hex = |n: usize| -> Option<(char, usize)> {
        let digits: String = s.get(2..2 + n)?.iter().collect();
        let v = u32::from_str_radix(&digits, 16).ok()?;
        Some((char::from_u32(v)?, 2 + n))
    };
    match s.get(1)? {
        'n' => Some(('\n', 2)),
        'r' => Some(('\r', 2)),
        't' => Some(('\t', 2)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        &c => Some((c, 2)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbnf_becomes_lark_with_the_same_structure() {
        let lark = gbnf_to_lark(
            "root ::= answer-word (\", \" answer-word){0,2} # comment\nanswer-word ::= \"yes\" | [a-c\\n] .\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: r0_root\nr0_root: r1_answer_word ( \", \" r1_answer_word ) {0,2}\nr1_answer_word: \"yes\" | /[\\x{61}-\\x{63}\\x{a}]/ /(?s:.)/\n"
        );
        assert!(gbnf_to_lark("rule ::= \"x\"").is_err(), "no root");
        assert!(gbnf_to_lark("root ::= [z-a]").is_err(), "reversed range");
        assert!(gbnf_to_lark("root ::= \"open").is_err(), "unclosed string");
    }

    #[test]
    fn unsupported_keywords_are_named() {
        assert_eq!(
            describe("Unimplemented keys: [\"not\", \"x\"]"),
            "unsupported JSON Schema keyword(s): not, x"
        );
    }
}
