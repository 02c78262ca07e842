//! `response_format` as constrained decoding: a token may be sampled only if
//! its bytes keep the output a prefix of valid JSON (of the schema, when one
//! is given).
//!
//! The decision: the grammar is a byte-level pushdown automaton
//! ([`JsonState`]) and a token is allowed when feeding each of its bytes
//! succeeds — no grammar compiler, no regex. Testing the whole vocabulary
//! (262144 tokens for Gemma) costs milliseconds, so the allowed set is cached
//! per automaton state: JSON generation revisits a few states (inside a
//! string at some depth, after a value) over and over, and the cache turns
//! most steps into one lookup.
//!
//! What is enforced. `json_object`: the output is one JSON object, nothing
//! after it. `json_schema`, the subset: `type` (one of object, array,
//! string, number, integer, boolean, null), `properties` (only the listed
//! keys, each at most once, in any order), `required` (the object cannot
//! close before they appear), `items`, `enum`, `const`; a schema without a
//! `type` and without `properties` is any JSON value. Not enforced
//! (accepted, ignored): string formats and lengths, numeric ranges, array
//! lengths, `additionalProperties: true` next to `properties`. Refused with
//! a 400: `anyOf`/`oneOf`/`allOf`/`not`/`$ref`, type lists, and more than
//! 64 properties in one object. String contents are not checked for valid
//! UTF-8 across token boundaries (the detokenizer repairs that).

use std::collections::HashMap;
use std::sync::Arc;

use ferrox_core::scheduler::TokenConstraint;
use ferrox_core::tokenizer::Tokenizer;
use serde_json::Value;

/// Whitespace bytes allowed in a row, so a model cannot pad forever.
const MAX_WS_RUN: u8 = 16;
/// Cached allowed sets per request before the cache is cleared.
const MAX_CACHED_STATES: usize = 512;

/// Why a `json_schema` cannot be enforced.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A keyword outside the supported subset.
    #[error("response_format.json_schema: {0} (supported: type object/array/string/number/integer/boolean/null, properties, required, items, enum, const)")]
    Unsupported(String),
    /// A malformed schema.
    #[error("response_format.json_schema: {0}")]
    Invalid(String),
}

/// A compiled schema node.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Any,
    /// Properties as their JSON-encoded key (quotes included) and node;
    /// `required` is a bit per property. No properties: free keys, any values.
    Object {
        props: Vec<(Vec<u8>, usize)>,
        required: u64,
    },
    Array {
        items: usize,
    },
    String,
    Number {
        integer: bool,
    },
    /// Each value's compact JSON text.
    Enum(Vec<Vec<u8>>),
}

const ANY: usize = 0;
const LITERALS: usize = 1;
const ANY_OBJECT: usize = 2;

/// A schema as nodes; the root is `root`.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    nodes: Vec<Node>,
    root: usize,
}

impl Schema {
    fn base() -> Vec<Node> {
        vec![
            Node::Any,
            Node::Enum(vec![b"true".to_vec(), b"false".to_vec(), b"null".to_vec()]),
            Node::Object {
                props: Vec::new(),
                required: 0,
            },
        ]
    }

    /// `json_object`: any JSON object.
    pub fn any_object() -> Schema {
        Schema {
            nodes: Schema::base(),
            root: ANY_OBJECT,
        }
    }

    /// The subset of JSON Schema described in the module docs.
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        let mut nodes = Schema::base();
        let root = compile_node(schema, &mut nodes, 0)?;
        Ok(Schema { nodes, root })
    }
}

fn compile_node(v: &Value, nodes: &mut Vec<Node>, depth: usize) -> Result<usize, SchemaError> {
    if depth > 32 {
        return Err(SchemaError::Unsupported("nesting deeper than 32".into()));
    }
    let obj = match v {
        Value::Bool(true) => return Ok(ANY),
        Value::Object(o) => o,
        other => {
            return Err(SchemaError::Invalid(format!(
                "a schema is an object, got {other}"
            )))
        }
    };
    for k in [
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$ref",
        "if",
        "patternProperties",
    ] {
        if obj.contains_key(k) {
            return Err(SchemaError::Unsupported(format!("`{k}` is not supported")));
        }
    }
    let push = |nodes: &mut Vec<Node>, n: Node| {
        nodes.push(n);
        nodes.len() - 1
    };
    if let Some(c) = obj.get("const") {
        return Ok(push(nodes, Node::Enum(vec![compact(c)])));
    }
    if let Some(e) = obj.get("enum") {
        let Value::Array(vals) = e else {
            return Err(SchemaError::Invalid("`enum` must be an array".into()));
        };
        if vals.is_empty() {
            return Err(SchemaError::Invalid("`enum` must not be empty".into()));
        }
        return Ok(push(nodes, Node::Enum(vals.iter().map(compact).collect())));
    }
    let ty = match obj.get("type") {
        None if obj.contains_key("properties") => "object",
        None => return Ok(ANY),
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Array(_)) => {
            return Err(SchemaError::Unsupported(
                "a list of types is not supported".into(),
            ))
        }
        Some(other) => {
            return Err(SchemaError::Invalid(format!(
                "`type` must be a string, got {other}"
            )))
        }
    };
    let node = match ty {
        "object" => {
            let mut props = Vec::new();
            if let Some(p) = obj.get("properties") {
                let Value::Object(p) = p else {
                    return Err(SchemaError::Invalid(
                        "`properties` must be an object".into(),
                    ));
                };
                if p.len() > 64 {
                    return Err(SchemaError::Unsupported(format!(
                        "{} properties in one object (at most 64)",
                        p.len()
                    )));
                }
                for (name, sub) in p {
                    let id = compile_node(sub, nodes, depth + 1)?;
                    props.push((compact(&Value::String(name.clone())), id));
                }
            }
            let mut required = 0u64;
            if let Some(r) = obj.get("required") {
                let Value::Array(r) = r else {
                    return Err(SchemaError::Invalid("`required` must be an array".into()));
                };
                for name in r {
                    let Value::String(name) = name else {
                        return Err(SchemaError::Invalid("`required` lists strings".into()));
                    };
                    let key = compact(&Value::String(name.clone()));
                    let Some(i) = props.iter().position(|(k, _)| *k == key) else {
                        return Err(SchemaError::Unsupported(format!(
                            "required property {name:?} is not in `properties`"
                        )));
                    };
                    required |= 1 << i;
                }
            }
            if props.is_empty() {
                return Ok(ANY_OBJECT);
            }
            Node::Object { props, required }
        }
        "array" => {
            let items = match obj.get("items") {
                Some(i) => compile_node(i, nodes, depth + 1)?,
                None => ANY,
            };
            Node::Array { items }
        }
        "string" => Node::String,
        "number" => Node::Number { integer: false },
        "integer" => Node::Number { integer: true },
        "boolean" => Node::Enum(vec![b"true".to_vec(), b"false".to_vec()]),
        "null" => Node::Enum(vec![b"null".to_vec()]),
        other => return Err(SchemaError::Invalid(format!("unknown type {other:?}"))),
    };
    Ok(push(nodes, node))
}

fn compact(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Frame {
    /// An object of `node`; `used` has a bit per property already written.
    Obj {
        node: usize,
        used: u64,
    },
    Arr {
        items: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Num {
    fn terminal(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Esc {
    None,
    Backslash,
    Hex(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Mode {
    Value(usize),
    ArrFirst(usize),
    /// Right after `{`: a key, or `}`.
    ObjFirst,
    /// After `,` in an object: a key.
    ObjKey,
    /// A key restricted to the object's properties; the bytes so far.
    Key(Vec<u8>),
    /// `:` then a value of this node.
    Colon(usize),
    Str {
        key: bool,
        esc: Esc,
    },
    Num {
        st: Num,
        integer: bool,
    },
    /// A value from a list; the bytes so far.
    Enum {
        node: usize,
        text: Vec<u8>,
    },
    AfterValue,
    Done,
}

/// Where the automaton is: the open containers and the mode inside the innermost.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonState {
    stack: Vec<Frame>,
    mode: Mode,
    ws: u8,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonState {
    /// The start: one value of `schema`'s root.
    pub fn new(schema: &Schema) -> JsonState {
        JsonState {
            stack: Vec::new(),
            mode: Mode::Value(schema.root),
            ws: 0,
        }
    }

    /// The value is complete and nothing may follow.
    pub fn is_done(&self) -> bool {
        self.mode == Mode::Done
    }

    /// The output could end here (an end-of-generation token is allowed): it
    /// is done, or it is a top-level number or enum value that is complete.
    pub fn can_end(&self, schema: &Schema) -> bool {
        match &self.mode {
            Mode::Done => true,
            Mode::Num { st, .. } => self.stack.is_empty() && st.terminal(),
            Mode::Enum { node, text } => {
                self.stack.is_empty() && enum_opts(schema, *node).iter().any(|o| o == text)
            }
            _ => false,
        }
    }

    fn ws(&mut self) -> bool {
        if self.ws >= MAX_WS_RUN {
            return false;
        }
        self.ws += 1;
        true
    }

    fn value_done(&mut self) {
        self.mode = if self.stack.is_empty() {
            Mode::Done
        } else {
            Mode::AfterValue
        };
    }

    /// Feeds one byte; `false` (and the state unspecified) if it cannot come next.
    pub fn feed(&mut self, b: u8, schema: &Schema) -> bool {
        let ws = is_ws(b);
        if !ws {
            self.ws = 0;
        }
        loop {
            match &mut self.mode {
                Mode::Done => return false,
                Mode::Value(n) => {
                    if ws {
                        return self.ws();
                    }
                    let n = *n;
                    return self.start_value(n, b, schema);
                }
                Mode::ArrFirst(items) => {
                    if ws {
                        return self.ws();
                    }
                    if b == b']' {
                        self.stack.pop();
                        self.value_done();
                        return true;
                    }
                    let items = *items;
                    self.mode = Mode::Value(items);
                }
                Mode::ObjFirst | Mode::ObjKey => {
                    if ws {
                        return self.ws();
                    }
                    let first = self.mode == Mode::ObjFirst;
                    let Some(Frame::Obj { node, used }) = self.stack.last().copied() else {
                        return false;
                    };
                    let Node::Object { props, required } = &schema.nodes[node] else {
                        return false;
                    };
                    if b == b'}' && first && required & !used == 0 {
                        self.stack.pop();
                        self.value_done();
                        return true;
                    }
                    if b != b'"' {
                        return false;
                    }
                    self.mode = if props.is_empty() {
                        Mode::Str {
                            key: true,
                            esc: Esc::None,
                        }
                    } else {
                        Mode::Key(vec![b'"'])
                    };
                    return true;
                }
                Mode::Key(text) => {
                    text.push(b);
                    let Some(Frame::Obj { node, used }) = self.stack.last().copied() else {
                        return false;
                    };
                    let Node::Object { props, .. } = &schema.nodes[node] else {
                        return false;
                    };
                    let mut any = false;
                    for (i, (k, sub)) in props.iter().enumerate() {
                        if used & (1 << i) != 0 || !k.starts_with(text) {
                            continue;
                        }
                        if k.len() == text.len() {
                            if let Some(Frame::Obj { used, .. }) = self.stack.last_mut() {
                                *used |= 1 << i;
                            }
                            self.mode = Mode::Colon(*sub);
                            return true;
                        }
                        any = true;
                    }
                    return any;
                }
                Mode::Colon(n) => {
                    if ws {
                        return self.ws();
                    }
                    if b != b':' {
                        return false;
                    }
                    let n = *n;
                    self.mode = Mode::Value(n);
                    return true;
                }
                Mode::Str { key, esc } => {
                    match *esc {
                        Esc::None => match b {
                            b'"' => {
                                if *key {
                                    self.mode = Mode::Colon(ANY);
                                } else {
                                    self.value_done();
                                }
                            }
                            b'\\' => *esc = Esc::Backslash,
                            0..=0x1f => return false,
                            _ => {}
                        },
                        Esc::Backslash => match b {
                            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                                *esc = Esc::None
                            }
                            b'u' => *esc = Esc::Hex(0),
                            _ => return false,
                        },
                        Esc::Hex(k) => {
                            if !b.is_ascii_hexdigit() {
                                return false;
                            }
                            *esc = if k == 3 { Esc::None } else { Esc::Hex(k + 1) };
                        }
                    }
                    return true;
                }
                Mode::Num { st, integer } => {
                    let next = match (*st, b) {
                        (Num::Minus, b'0') => Some(Num::Zero),
                        (Num::Minus, b'1'..=b'9') => Some(Num::Int),
                        (Num::Int, b'0'..=b'9') => Some(Num::Int),
                        (Num::Zero | Num::Int, b'.') if !*integer => Some(Num::Dot),
                        (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
                        (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') if !*integer => {
                            Some(Num::E)
                        }
                        (Num::E, b'+' | b'-') => Some(Num::ESign),
                        (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Some(Num::Exp),
                        _ => None,
                    };
                    match next {
                        Some(n) => {
                            *st = n;
                            return true;
                        }
                        None if st.terminal() => self.value_done(),
                        None => return false,
                    }
                }
                Mode::Enum { node, text } => {
                    let opts = enum_opts(schema, *node);
                    let mut longer = text.clone();
                    longer.push(b);
                    if opts.iter().any(|o| o.starts_with(&longer)) {
                        let complete = opts.contains(&longer);
                        let extendable = opts
                            .iter()
                            .any(|o| o.len() > longer.len() && o.starts_with(&longer));
                        *text = longer;
                        if complete && !extendable {
                            self.value_done();
                        }
                        return true;
                    }
                    if opts.iter().any(|o| o == text) {
                        self.value_done();
                    } else {
                        return false;
                    }
                }
                Mode::AfterValue => {
                    if ws {
                        return self.ws();
                    }
                    match (self.stack.last().copied(), b) {
                        (Some(Frame::Arr { items }), b',') => self.mode = Mode::Value(items),
                        (Some(Frame::Arr { .. }), b']') => {
                            self.stack.pop();
                            self.value_done();
                        }
                        (Some(Frame::Obj { node, used }), b',' | b'}') => {
                            let Node::Object { props, required } = &schema.nodes[node] else {
                                return false;
                            };
                            if b == b',' {
                                let left = props.is_empty()
                                    || (0..props.len()).any(|i| used & (1 << i) == 0);
                                if !left {
                                    return false;
                                }
                                self.mode = Mode::ObjKey;
                            } else {
                                if required & !used != 0 {
                                    return false;
                                }
                                self.stack.pop();
                                self.value_done();
                            }
                        }
                        _ => return false,
                    }
                    return true;
                }
            }
        }
    }

    fn start_value(&mut self, n: usize, b: u8, schema: &Schema) -> bool {
        let node = &schema.nodes[n];
        match (node, b) {
            (Node::Any | Node::Object { .. }, b'{') => {
                let node = if matches!(node, Node::Any) {
                    ANY_OBJECT
                } else {
                    n
                };
                if self.stack.len() >= 64 {
                    return false;
                }
                self.stack.push(Frame::Obj { node, used: 0 });
                self.mode = Mode::ObjFirst;
            }
            (Node::Any | Node::Array { .. }, b'[') => {
                let items = match node {
                    Node::Array { items } => *items,
                    _ => ANY,
                };
                if self.stack.len() >= 64 {
                    return false;
                }
                self.stack.push(Frame::Arr { items });
                self.mode = Mode::ArrFirst(items);
            }
            (Node::Any | Node::String, b'"') => {
                self.mode = Mode::Str {
                    key: false,
                    esc: Esc::None,
                }
            }
            (Node::Any, b'-' | b'0'..=b'9') | (Node::Number { .. }, b'-' | b'0'..=b'9') => {
                let integer = matches!(node, Node::Number { integer: true });
                let st = match b {
                    b'-' => Num::Minus,
                    b'0' => Num::Zero,
                    _ => Num::Int,
                };
                self.mode = Mode::Num { st, integer };
            }
            (Node::Any, b't' | b'f' | b'n') => {
                self.mode = Mode::Enum {
                    node: LITERALS,
                    text: vec![b],
                }
            }
            (Node::Enum(opts), _) => {
                if !opts.iter().any(|o| o.first() == Some(&b)) {
                    return false;
                }
                let complete = opts.iter().any(|o| o.len() == 1 && o[0] == b);
                let extendable = opts.iter().any(|o| o.len() > 1 && o[0] == b);
                self.mode = Mode::Enum {
                    node: n,
                    text: vec![b],
                };
                if complete && !extendable {
                    self.value_done();
                }
            }
            _ => return false,
        }
        true
    }
}

fn enum_opts(schema: &Schema, node: usize) -> &[Vec<u8>] {
    match &schema.nodes[node] {
        Node::Enum(o) => o,
        _ => &[],
    }
}

/// Every token's bytes and whether it ends generation, computed once per model.
pub struct TokenBytes {
    bytes: Vec<Vec<u8>>,
    eog: Vec<bool>,
}

impl TokenBytes {
    /// The bytes each token decodes to (control tokens: none).
    pub fn new(tok: &Tokenizer) -> TokenBytes {
        let n = tok.n_vocab();
        let bytes = (0..n as u32)
            .map(|id| tok.piece(id, false).map(<[u8]>::to_vec).unwrap_or_default())
            .collect();
        let eog = (0..n as u32).map(|id| tok.is_eog(id)).collect();
        TokenBytes { bytes, eog }
    }

    #[cfg(test)]
    pub(crate) fn from_parts(bytes: Vec<Vec<u8>>, eog: Vec<bool>) -> TokenBytes {
        TokenBytes { bytes, eog }
    }
}

/// The [`TokenConstraint`] for `response_format`.
pub struct JsonConstraint {
    schema: Arc<Schema>,
    vocab: Arc<TokenBytes>,
    state: JsonState,
    scratch: JsonState,
    cache: HashMap<JsonState, Arc<Vec<u64>>>,
}

impl JsonConstraint {
    /// A constraint to one value of `schema`.
    pub fn new(schema: Arc<Schema>, vocab: Arc<TokenBytes>) -> JsonConstraint {
        let state = JsonState::new(&schema);
        JsonConstraint {
            scratch: state.clone(),
            state,
            schema,
            vocab,
            cache: HashMap::new(),
        }
    }

    /// The allowed set for the current state, a bit per token.
    fn allowed(&mut self) -> Arc<Vec<u64>> {
        if let Some(a) = self.cache.get(&self.state) {
            return Arc::clone(a);
        }
        let n = self.vocab.bytes.len();
        let mut bits = vec![0u64; n.div_ceil(64)];
        let can_end = self.state.can_end(&self.schema);
        for id in 0..n {
            let ok = if self.vocab.eog[id] {
                can_end
            } else {
                let bytes = &self.vocab.bytes[id];
                !bytes.is_empty() && {
                    self.scratch.clone_from(&self.state);
                    bytes.iter().all(|&b| self.scratch.feed(b, &self.schema))
                }
            };
            if ok {
                bits[id / 64] |= 1 << (id % 64);
            }
        }
        if self.cache.len() >= MAX_CACHED_STATES {
            self.cache.clear();
        }
        let bits = Arc::new(bits);
        self.cache.insert(self.state.clone(), Arc::clone(&bits));
        bits
    }

    /// The automaton's state (tests).
    pub fn state(&self) -> &JsonState {
        &self.state
    }
}

impl TokenConstraint for JsonConstraint {
    fn mask(&mut self, logits: &mut [f32]) {
        let bits = self.allowed();
        for (id, l) in logits.iter_mut().enumerate() {
            if bits.get(id / 64).is_none_or(|w| w & (1 << (id % 64)) == 0) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    fn accept(&mut self, token: u32) {
        let id = token as usize;
        if self.vocab.eog.get(id).copied().unwrap_or(false) {
            self.state.mode = Mode::Done;
            return;
        }
        if let Some(bytes) = self.vocab.bytes.get(id) {
            for &b in bytes {
                if !self.state.feed(b, &self.schema) {
                    // Only a masked-out token can get here; end rather than
                    // continue from a state that no longer means anything.
                    self.state.mode = Mode::Done;
                    return;
                }
            }
        }
    }

    fn is_complete(&self) -> bool {
        self.state.is_done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn accepts(schema: &Schema, text: &str) -> bool {
        let mut s = JsonState::new(schema);
        text.bytes().all(|b| s.feed(b, schema)) && (s.is_done() || s.can_end(schema))
    }

    #[test]
    fn json_object_mode_accepts_objects_and_refuses_everything_else() {
        let s = Schema::any_object();
        for ok in [
            r#"{}"#,
            r#"{"a": 1, "b": [true, null, -0.5e+3, "x\"\u00e9"], "c": {"d": {}}}"#,
            "{ \"a\" : [ ] }",
        ] {
            assert!(accepts(&s, ok), "{ok}");
        }
        for bad in [
            "[]",
            "\"s\"",
            "{\"a\" 1}",
            "{\"a\":}",
            "{,}",
            "{\"a\":1,}",
            "{\"a\":01}",
            "{\"a\":tru}",
            "{} {}",
            "{\"a\":\"\n\"}",
            "{\"a\":1.}",
        ] {
            assert!(!accepts(&s, bad), "{bad}");
        }
    }

    #[test]
    fn a_schema_restricts_keys_types_and_requires_its_required_properties() {
        let s = Schema::compile(&json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
            "required": ["name", "age"]
        }))
        .unwrap();
        assert!(accepts(&s, r#"{"name": "x", "age": 3}"#));
        assert!(accepts(&s, r#"{"age": 3, "tags": ["a","b"], "name": "y"}"#));
        assert!(!accepts(&s, r#"{"name": "x"}"#), "age is required");
        assert!(
            !accepts(&s, r#"{"name": "x", "age": 3.5}"#),
            "age is an integer"
        );
        assert!(!accepts(&s, r#"{"name": 1, "age": 3}"#), "name is a string");
        assert!(
            !accepts(&s, r#"{"name": "x", "age": 3, "other": 1}"#),
            "only listed keys"
        );
        assert!(
            !accepts(&s, r#"{"name": "x", "name": "y", "age": 3}"#),
            "a key at most once"
        );
        assert!(
            !accepts(&s, r#"{"name": "x", "age": 3, "tags": ["c"]}"#),
            "enum items"
        );
    }

    #[test]
    fn unsupported_schema_keywords_are_refused_not_ignored() {
        assert!(matches!(
            Schema::compile(&json!({"anyOf": [{"type": "string"}]})),
            Err(SchemaError::Unsupported(_))
        ));
        assert!(matches!(
            Schema::compile(&json!({"type": ["string", "null"]})),
            Err(SchemaError::Unsupported(_))
        ));
        assert!(matches!(
            Schema::compile(&json!({"type": "object", "properties": {}, "required": ["x"]})),
            Err(SchemaError::Unsupported(_))
        ));
    }

    #[test]
    fn the_mask_allows_exactly_the_tokens_that_keep_the_output_valid() {
        // tokens: 0 `{`, 1 `{"`, 2 `}`, 3 ` `, 4 `"a":1}`, 5 `x`, 6 EOG, 7 (control, no bytes)
        let bytes: Vec<Vec<u8>> = vec![
            b"{".to_vec(),
            b"{\"".to_vec(),
            b"}".to_vec(),
            b" ".to_vec(),
            b"\"a\":1}".to_vec(),
            b"x".to_vec(),
            vec![],
            vec![],
        ];
        let eog = vec![false, false, false, false, false, false, true, false];
        let vocab = Arc::new(TokenBytes::from_parts(bytes, eog));
        let mut c = JsonConstraint::new(Arc::new(Schema::any_object()), vocab);
        let allowed = |c: &mut JsonConstraint| {
            let mut l = vec![0.0f32; 8];
            c.mask(&mut l);
            (0..8).filter(|&i| l[i] == 0.0).collect::<Vec<_>>()
        };
        assert_eq!(allowed(&mut c), vec![0, 1, 3]);
        c.accept(0);
        assert_eq!(allowed(&mut c), vec![2, 3, 4]);
        c.accept(4);
        assert!(c.is_complete());
        assert_eq!(allowed(&mut c), vec![6]);
    }
}
