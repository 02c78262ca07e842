//! Chat templates: a conversation → the prompt text the model was trained on.
//!
//! The key decision: a model file's `tokenizer.chat_template` is *untrusted
//! code*, so it runs in minijinja configured as a sandbox — no loader (a
//! template cannot `include`/`import`/`extend` anything, least of all a
//! file), a fuel budget that bounds both the work and the memory a render can
//! use, minijinja's recursion limit, a cap on the output and on the source —
//! and every way it can fail is a [`TemplateError`], never a panic. Within
//! that box it behaves as Hugging Face transformers' Jinja environment does
//! (`trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`,
//! `strftime_now`, a Python `json.dumps` `tojson`, Python string and dict
//! methods), because that environment is what the templates were written
//! for; `tests.rs` compares renders byte for byte with jinja2's.
//!
//! When a file has no template, [`BuiltinTemplate`] supplies the family's.

mod builtin;
mod pyjson;
mod pystr;
mod strftime;
#[cfg(test)]
mod tests;

use std::io;

use ferrox_gguf::{Array, GgufFile, Value as GgufValue};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

pub use builtin::BuiltinTemplate;

/// The largest template source accepted. Published templates are under
/// 20 KiB; anything near this is not a prompt format.
pub const MAX_SOURCE_BYTES: usize = 256 << 10;

const K_TEMPLATE: &str = "tokenizer.chat_template";
const K_ARCH: &str = "general.architecture";
const K_TOKENS: &str = "tokenizer.ggml.tokens";
const K_BOS: &str = "tokenizer.ggml.bos_token_id";
const K_EOS: &str = "tokenizer.ggml.eos_token_id";
const K_MODEL: &str = "tokenizer.ggml.model";
const TEMPLATE_NAME: &str = "chat_template";

/// A JSON value as a template value (objects keep their key order).
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v)))),
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant" (templates may accept others, e.g. "tool").
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// What a render may consume. The defaults fit every published template and
/// conversations of several megabytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// minijinja fuel: one unit per instruction and per 64 bytes of data a
    /// render creates, so it bounds time *and* memory (about `fuel × 64`
    /// bytes). Exhaustion is [`TemplateError::OutOfFuel`].
    pub fuel: u64,
    /// Nesting depth of macro calls, loops and the like (minijinja counts a
    /// macro call as 4); capped at 500, the most its stack use is known to
    /// allow. Exceeding it is [`TemplateError::RecursionLimit`].
    pub recursion: usize,
    /// Output allowed beyond twice the bytes of the messages themselves
    /// (they are the only thing that justifies a large prompt). Exceeding it
    /// is [`TemplateError::OutputTooLarge`].
    pub max_output_bytes: usize,
}

impl Default for RenderLimits {
    fn default() -> Self {
        // 4M fuel ≈ 4M instructions or 256 MiB of intermediate data.
        RenderLimits {
            fuel: 4_000_000,
            recursion: 500,
            max_output_bytes: 1 << 20,
        }
    }
}

/// Why a template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The source is larger than [`MAX_SOURCE_BYTES`].
    #[error("the chat template is {len} bytes; the limit is {max}")]
    SourceTooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The source does not parse, or uses a construct the sandbox does not
    /// offer (`include`, `import`, `extends` among them).
    #[error("chat template syntax error (line {line}): {detail}")]
    Syntax {
        /// 1-based line in the template source (0 if unknown).
        line: usize,
        /// minijinja's description.
        detail: String,
    },
    /// The template called `raise_exception(msg)` (e.g. roles that do not
    /// alternate).
    #[error("the chat template refused the conversation: {0}")]
    Raised(String),
    /// The render used up its fuel: an endless or huge loop, or too much data.
    #[error("the chat template ran out of fuel ({fuel}): it loops too long or builds too much data (line {line})")]
    OutOfFuel {
        /// The budget.
        fuel: u64,
        /// Where it stopped.
        line: usize,
    },
    /// Macro calls or loops nested deeper than the limit.
    #[error("the chat template nests deeper than the recursion limit {limit} (line {line})")]
    RecursionLimit {
        /// The limit.
        limit: usize,
        /// Where it stopped.
        line: usize,
    },
    /// The rendered prompt grew past the cap.
    #[error("the rendered chat prompt exceeds {max} bytes")]
    OutputTooLarge {
        /// The cap that applied to this render.
        max: usize,
    },
    /// Any other failure while rendering (an undefined attribute, a type
    /// error, a bad filter argument…).
    #[error("the chat template failed (line {line}): {detail}")]
    Render {
        /// 1-based line in the template source (0 if unknown).
        line: usize,
        /// minijinja's description.
        detail: String,
    },
    /// The file has no template and ferrox has none for its architecture.
    #[error("the model has no chat template (tokenizer.chat_template) and ferrox has no built-in one for architecture {arch:?}")]
    NoTemplate {
        /// `general.architecture`, if present.
        arch: Option<String>,
    },
    /// A metadata key the template needs has the wrong type or value.
    #[error("metadata key `{key}` is invalid: {detail}")]
    Metadata {
        /// The key.
        key: &'static str,
        /// What was wrong.
        detail: String,
    },
}

/// A compiled chat template with the BOS/EOS text it renders with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
    builtin: Option<BuiltinTemplate>,
    limits: RenderLimits,
    /// Seconds since the epoch that `strftime_now` reports; `None` = now.
    pinned_time: Option<i64>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("builtin", &self.builtin)
            .field("source_bytes", &self.source.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The error minijinja carries out of `raise_exception`, so the message
/// survives as data instead of being parsed back out of a string.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// Collects output and refuses to grow past `cap`.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.cap {
            self.overflowed = true;
            return Err(io::Error::other("chat template output cap reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// The file's `tokenizer.chat_template`, or the built-in one for its
    /// `general.architecture` (the vocabulary picks Llama 2 vs 3). BOS/EOS
    /// text is the vocabulary's text for `tokenizer.ggml.{bos,eos}_token_id`
    /// (llama.cpp's defaults when absent), or empty when there is none.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate, TemplateError> {
        static NONE: ferrox_gguf::StringArray = ferrox_gguf::StringArray::new();
        let tokens: &ferrox_gguf::StringArray = match file.get(K_TOKENS) {
            None => &NONE,
            Some(GgufValue::Array(Array::String(t))) => t,
            Some(v) => {
                return Err(TemplateError::Metadata {
                    key: K_TOKENS,
                    detail: format!("expected an array of strings, found {}", v.value_type()),
                })
            }
        };
        let (bos, eos) = special_texts(file, tokens)?;
        match file.get(K_TEMPLATE) {
            Some(GgufValue::String(s)) => {
                let source = s.as_str().ok_or(TemplateError::Metadata {
                    key: K_TEMPLATE,
                    detail: "not valid UTF-8".into(),
                })?;
                ChatTemplate::from_source(source, &bos, &eos)
            }
            Some(v) => Err(TemplateError::Metadata {
                key: K_TEMPLATE,
                detail: format!("expected a string, found {}", v.value_type()),
            }),
            None => {
                let arch = match file.get(K_ARCH) {
                    Some(GgufValue::String(s)) => s.as_str(),
                    _ => None,
                };
                let has_token = |text: &str| tokens.iter().any(|t| t == text.as_bytes());
                match arch.and_then(|a| BuiltinTemplate::for_arch(a, has_token)) {
                    Some(family) => Ok(ChatTemplate::builtin(family, &bos, &eos)),
                    None => Err(TemplateError::NoTemplate {
                        arch: arch.map(str::to_string),
                    }),
                }
            }
        }
    }

    /// Compiles `source` (a Jinja chat template) to render with these BOS/EOS
    /// texts. Errors: [`TemplateError::SourceTooLarge`],
    /// [`TemplateError::Syntax`].
    pub fn from_source(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        Self::compile(source, bos_token, eos_token, None)
    }

    /// The built-in template for `family`.
    pub fn builtin(family: BuiltinTemplate, bos: &str, eos: &str) -> ChatTemplate {
        let mut t = Self::empty(family.source(), bos, eos, Some(family));
        // Every built-in compiles (a test checks each through `from_source`);
        // were one not to, its renders would fail with a typed error.
        let _ = t
            .env
            .add_template_owned(TEMPLATE_NAME, family.source().to_string());
        t
    }

    fn compile(
        source: &str,
        bos: &str,
        eos: &str,
        builtin: Option<BuiltinTemplate>,
    ) -> Result<ChatTemplate, TemplateError> {
        if source.len() > MAX_SOURCE_BYTES {
            return Err(TemplateError::SourceTooLarge {
                len: source.len(),
                max: MAX_SOURCE_BYTES,
            });
        }
        let mut t = Self::empty(source, bos, eos, builtin);
        t.env
            .add_template_owned(TEMPLATE_NAME, desugar_generation_tags(source))
            .map_err(|e| syntax_error(&e))?;
        Ok(t)
    }

    /// The sandboxed environment, without the template.
    fn empty(source: &str, bos: &str, eos: &str, builtin: Option<BuiltinTemplate>) -> ChatTemplate {
        let mut env = Environment::new();
        // HF compiles chat templates with trim_blocks and lstrip_blocks, and
        // templates are written against that whitespace behaviour.
        let mut syntax = SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        if let Ok(syntax) = syntax.build() {
            env.set_syntax(syntax);
        }
        env.set_unknown_method_callback(pystr::method_callback);
        env.add_filter("tojson", pyjson::tojson);
        env.add_filter("trim", pystr::trim);
        env.add_test("iterable", pystr::is_iterable);
        env.add_test("sequence", pystr::is_sequence);
        let limits = RenderLimits::default();
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.recursion);
        ChatTemplate {
            env,
            source: source.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
            builtin,
            limits,
            pinned_time: None,
        }
    }

    /// The same template under other limits.
    pub fn with_limits(mut self, limits: RenderLimits) -> ChatTemplate {
        self.env.set_fuel(Some(limits.fuel));
        self.env.set_recursion_limit(limits.recursion);
        self.limits = limits;
        self
    }

    /// The limits renders run under.
    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// Makes `strftime_now` report this instant (seconds since the Unix
    /// epoch, UTC) instead of the current time: reproducible prompts, tests.
    pub fn with_time(mut self, unix_seconds: i64) -> ChatTemplate {
        self.pinned_time = Some(unix_seconds);
        self
    }

    /// Renders `messages`. With `add_generation_prompt` the text ends with
    /// the opening of an assistant turn, ready for the model to continue.
    ///
    /// The result contains the BOS text if the template writes it (most do);
    /// see [`ChatTemplate::starts_with_bos`] before tokenizing with BOS added.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let message_bytes: usize = messages
            .iter()
            .map(|m| m.role.len() + m.content.len())
            .sum();
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        self.render_values(msgs, Value::from(()), message_bytes, add_generation_prompt)
    }

    /// Renders messages of any serializable shape (assistant `tool_calls`,
    /// `tool` turns with `tool_call_id`) with `tools` in the template's
    /// context, as HF's `apply_chat_template(tools=...)` does.
    /// `input_bytes` (the request's size) scales the output cap.
    pub fn render_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        input_bytes: usize,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let msgs: Vec<Value> = messages.iter().map(json_value).collect();
        let tools = tools.map_or(Value::from(()), json_value);
        self.render_values(msgs, tools, input_bytes, add_generation_prompt)
    }

    fn render_values(
        &self,
        msgs: Vec<Value>,
        tools: Value,
        message_bytes: usize,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let cap = self
            .limits
            .max_output_bytes
            .saturating_add(message_bytes.saturating_mul(2));
        let now = self.pinned_time;
        let ctx = Value::from_pairs([
            ("messages", Value::from(msgs)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos.as_str())),
            ("eos_token", Value::from(self.eos.as_str())),
            ("tools", tools),
            ("raise_exception", Value::from_function(raise_exception)),
            (
                "strftime_now",
                Value::from_function(move |fmt: &str| -> Result<String, Error> {
                    let t = now.unwrap_or_else(unix_now);
                    strftime::strftime(fmt, t)
                        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
                }),
            ),
        ]);
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap,
            overflowed: false,
        };
        // minijinja is not expected to panic, but a template is hostile input
        // and a panic in the engine must not take the server down with it.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let tmpl = self.env.get_template(TEMPLATE_NAME)?;
            tmpl.render_captured_to(ctx, &mut out).map(|_| ())
        }));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(_)) if out.overflowed => return Err(TemplateError::OutputTooLarge { max: cap }),
            Ok(Err(e)) => return Err(self.classify(&e)),
            Err(_) => {
                return Err(TemplateError::Render {
                    line: 0,
                    detail: "the template engine panicked".into(),
                })
            }
        }
        String::from_utf8(out.buf).map_err(|_| TemplateError::Render {
            line: 0,
            detail: "the output is not valid UTF-8".into(),
        })
    }

    fn classify(&self, e: &Error) -> TemplateError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
        while let Some(s) = source {
            if let Some(r) = s.downcast_ref::<Raised>() {
                return TemplateError::Raised(r.0.clone());
            }
            source = s.source();
        }
        let line = e.line().unwrap_or(0);
        match e.kind() {
            ErrorKind::OutOfFuel => TemplateError::OutOfFuel {
                fuel: self.limits.fuel,
                line,
            },
            ErrorKind::SyntaxError => syntax_error(e),
            ErrorKind::InvalidOperation if e.detail() == Some("recursion limit exceeded") => {
                TemplateError::RecursionLimit {
                    limit: self.env.recursion_limit(),
                    line,
                }
            }
            _ => TemplateError::Render {
                line,
                detail: describe(e),
            },
        }
    }

    /// Whether this is one of ferrox's built-in templates (the file had none).
    pub fn is_builtin(&self) -> bool {
        self.builtin.is_some()
    }

    /// Which built-in this is, if it is one.
    pub fn builtin_family(&self) -> Option<BuiltinTemplate> {
        self.builtin
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS text templates see as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos
    }

    /// The EOS text templates see as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos
    }

    /// Whether `rendered` already begins with the BOS text. When it does, a
    /// caller tokenizing with special-token parsing must not add BOS again —
    /// or should tokenize [`ChatTemplate::strip_bos`]`(rendered)` with BOS
    /// added, which is the same ids.
    pub fn starts_with_bos(&self, rendered: &str) -> bool {
        !self.bos.is_empty() && rendered.starts_with(&self.bos)
    }

    /// `rendered` without one leading BOS text, if it has one.
    pub fn strip_bos<'a>(&self, rendered: &'a str) -> &'a str {
        if self.starts_with_bos(rendered) {
            &rendered[self.bos.len()..]
        } else {
            rendered
        }
    }
}

fn raise_exception(msg: Value) -> Result<Value, Error> {
    let text = match msg.as_str() {
        Some(s) => s.to_string(),
        None => msg.to_string(),
    };
    Err(Error::new(ErrorKind::InvalidOperation, "raise_exception").with_source(Raised(text)))
}

fn unix_now() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// minijinja's kind and detail, without the template name it prefixes.
fn describe(e: &Error) -> String {
    match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    }
}

fn syntax_error(e: &Error) -> TemplateError {
    TemplateError::Syntax {
        line: e.line().unwrap_or(0),
        detail: describe(e),
    }
}

/// Rewrites HF's `{% generation %}…{% endgeneration %}` (transformers'
/// AssistantTracker extension, which only records where assistant text lies
/// and renders its body unchanged) as `{% if true %}…{% endif %}`, keeping
/// the whitespace-control markers, so templates that use it compile.
fn desugar_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_string();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at + 2]);
        rest = &rest[at + 2..];
        let marker = rest.len() - rest.trim_start_matches(['-', '+']).len();
        let marker = marker.min(1);
        let after_marker = &rest[marker..];
        let ws = after_marker.len() - after_marker.trim_start().len();
        let word = &after_marker[ws..];
        for (tag, replacement) in [("endgeneration", "endif"), ("generation", "if true")] {
            let Some(tail) = word.strip_prefix(tag) else {
                continue;
            };
            let close = tail.trim_start().trim_start_matches(['-', '+']);
            if close.starts_with("%}") {
                out.push_str(&rest[..marker + ws]);
                out.push_str(replacement);
                rest = tail;
            }
            break;
        }
    }
    out.push_str(rest);
    out
}

/// The vocabulary's text for the BOS and EOS ids, with llama.cpp's default
/// ids per tokenizer model; empty when there is no such token.
fn special_texts(
    file: &GgufFile,
    tokens: &ferrox_gguf::StringArray,
) -> Result<(String, String), TemplateError> {
    let (bos_default, eos_default) = match file.get(K_MODEL) {
        Some(GgufValue::String(s)) if s.as_bytes() == b"llama" => (Some(1), Some(2)),
        Some(GgufValue::String(s)) if s.as_bytes() == b"gpt2" => (Some(11), Some(11)),
        _ => (None, None),
    };
    let text = |key: &'static str, default: Option<u64>| -> Result<String, TemplateError> {
        let id = match file.get(key) {
            None => default,
            Some(v) => Some(v.as_uint().ok_or_else(|| TemplateError::Metadata {
                key,
                detail: format!("expected a non-negative integer, found {}", v.value_type()),
            })?),
        };
        // An id outside the vocabulary means "no such token", as in llama.cpp.
        let token = id
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| tokens.get(i));
        match token {
            None => Ok(String::new()),
            Some(t) => std::str::from_utf8(t)
                .ok()
                .map(str::to_string)
                .ok_or_else(|| TemplateError::Metadata {
                    key,
                    detail: "the token text is not valid UTF-8".into(),
                }),
        }
    };
    Ok((text(K_BOS, bos_default)?, text(K_EOS, eos_default)?))
}
