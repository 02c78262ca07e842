//! The OpenAI request bodies ferrox accepts, and their validation into
//! engine terms.
//!
//! The decision: bodies deserialize into typed structs where every field is
//! optional and unknown fields are ignored (clients send fields we do not
//! use), but a known field of the wrong type or out of range is a 400 naming
//! the field — serde reports the type, [`validate_sampling`] the range.
//! Defaults for what a request leaves out are llama-server's (temperature
//! 0.8, top-k 40, top-p 0.95, min-p 0.05), so the two servers answer the same
//! request alike.

use std::collections::BTreeMap;

use ferrox_core::sampling::{SamplingParams, MAX_TOP_LOGPROBS};
use ferrox_core::speculative::{DraftParams, MAX_DRAFT};
use serde::Deserialize;

use crate::error::ApiError;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// A message's `content`: a string, or a list of parts of which the text
/// parts are used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    /// `text` (other kinds are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant`, `tool`.
    pub role: String,
    /// The text (may be null for an assistant turn with tool calls).
    pub content: Option<Content>,
    /// An assistant turn's calls, as OpenAI returned them.
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool turn: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// A tool turn: the function's name.
    pub name: Option<String>,
    /// An assistant turn's reasoning, as ferrox and llama-server return it
    /// (a harmony template reads it as `thinking`).
    pub reasoning_content: Option<String>,
}

/// A function a tool offers.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDef {
    /// Its name, unique among `tools`.
    pub name: String,
    /// What it does (shown to the model).
    pub description: Option<String>,
    /// Its arguments' JSON Schema (default: any object).
    pub parameters: Option<serde_json::Value>,
    /// OpenAI's strict mode (forced calls always follow the schema).
    pub strict: Option<bool>,
}

/// One of `tools`.
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    /// `function` (the only kind).
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: Option<FunctionDef>,
}

/// `tool_choice.function`.
#[derive(Debug, Clone, Deserialize)]
pub struct NamedFunction {
    /// The function to call.
    pub name: String,
}

/// `tool_choice`: `none`, `auto`, `required`, or one named function.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// `{"type": "function", "function": {"name": ..}}`.
    Named {
        /// `function`.
        #[serde(rename = "type")]
        kind: Option<String>,
        /// The function.
        function: NamedFunction,
    },
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    pub include_usage: Option<bool>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name (unused).
    pub name: Option<String>,
    /// The schema.
    pub schema: Option<serde_json::Value>,
    /// Accepted; the subset that is enforced is always enforced strictly.
    pub strict: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// One JSON object.
    JsonObject,
    /// JSON following a schema.
    JsonSchema {
        /// The schema.
        json_schema: JsonSchemaFormat,
    },
}

/// Fields chat and completions share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// The model name (any value is accepted: the server runs one model).
    pub model: Option<String>,
    /// Stream as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Token budget.
    pub max_tokens: Option<i64>,
    /// Token budget (chat's newer name; wins over `max_tokens`).
    pub max_completion_tokens: Option<i64>,
    /// Temperature (0..=2).
    pub temperature: Option<f64>,
    /// Nucleus (0..=1).
    pub top_p: Option<f64>,
    /// Top-k (llama-server extension; 0 = off).
    pub top_k: Option<i64>,
    /// Min-p (llama-server extension).
    pub min_p: Option<f64>,
    /// Repetition penalty (llama-server extension).
    pub repeat_penalty: Option<f64>,
    /// Seed; choice `i` of `n` uses `seed + i`.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Choices.
    pub n: Option<i64>,
    /// Presence penalty (-2..=2).
    pub presence_penalty: Option<f64>,
    /// Frequency penalty (-2..=2).
    pub frequency_penalty: Option<f64>,
    /// Token id (as a string) → bias (-100..=100; -100 bans).
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Keep going past end-of-generation tokens (llama-server extension).
    pub ignore_eos: Option<bool>,
    /// Reuse the cached prefix a slot holds of the prompt (llama-server
    /// extension, default true); false evaluates the whole prompt.
    pub cache_prompt: Option<bool>,
    /// Most drafted tokens per step (llama-server's `speculative.n_max`;
    /// 0: this request decodes plainly).
    #[serde(rename = "speculative.n_max")]
    pub speculative_n_max: Option<i64>,
    /// Fewer drafts than this are not verified (llama-server's `speculative.n_min`).
    #[serde(rename = "speculative.n_min")]
    pub speculative_n_min: Option<i64>,
    /// Free-form end-user id (accepted, unused).
    pub user: Option<String>,
    /// llama.cpp's GBNF grammar for the output (Lark when it starts with `%llguidance`).
    pub grammar: Option<String>,
    /// llama-server's JSON Schema for the output.
    pub json_schema: Option<serde_json::Value>,
    /// A regular expression the whole output matches (vLLM's `guided_regex`).
    #[serde(alias = "guided_regex")]
    pub regex: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Return log-probabilities of the output tokens.
    pub logprobs: Option<bool>,
    /// Alternatives per token (0..=20, with `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Output format.
    pub response_format: Option<ResponseFormat>,
    /// Functions the model may call.
    pub tools: Option<Vec<Tool>>,
    /// Whether and which function the model must call.
    pub tool_choice: Option<ToolChoice>,
    /// Several calls in one reply (default true).
    pub parallel_tool_calls: Option<bool>,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
}

/// Text or token ids, one or a list of either: a completion's `prompt` (whose lists
/// must hold one element) and an embedding request's `input`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TextsOrTokens {
    /// One text.
    Text(String),
    /// One input as token ids.
    Tokens(Vec<u32>),
    /// Several texts.
    Texts(Vec<String>),
    /// Several inputs as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// A completion's `prompt` (a list must hold one element).
pub type Prompt = TextsOrTokens;

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Alternatives per token (0..=5 as OpenAI; up to 20 here).
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the output.
    pub echo: Option<bool>,
    /// Output format (extension: as chat's).
    pub response_format: Option<ResponseFormat>,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
}

/// The most choices one request may ask for.
pub const MAX_N: usize = 16;
/// The most stop strings.
pub const MAX_STOP: usize = 16;

/// What the engine needs from a request's shared fields.
#[derive(Debug, Clone)]
pub struct Validated {
    /// Sampling of choice 0 (choice `i` adds `i` to the seed).
    pub sampling: SamplingParams,
    /// Token budget.
    pub max_tokens: Option<usize>,
    /// Stop strings (empty ones dropped).
    pub stop: Vec<String>,
    /// Choices.
    pub n: usize,
    /// Streaming.
    pub stream: bool,
    /// A usage chunk at the end of the stream.
    pub include_usage: bool,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Reuse a slot's cached prefix of the prompt.
    pub cache_prompt: bool,
}

fn finite(param: &str, v: f64) -> Result<f64, ApiError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ApiError::out_of_range(param, v, "a finite number"))
    }
}

/// Checks every shared field's range and builds the engine's parameters.
/// `default_max` is the budget when the request gives none.
pub fn validate_sampling(
    c: &Common,
    top_logprobs: usize,
    n_vocab: usize,
    default_max: Option<usize>,
) -> Result<Validated, ApiError> {
    let mut p = SamplingParams::default();
    if let Some(t) = c.temperature {
        let t = finite("temperature", t)?;
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::out_of_range("temperature", t, "0..=2"));
        }
        p.temperature = t as f32;
    }
    if let Some(v) = c.top_p {
        let v = finite("top_p", v)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(ApiError::out_of_range("top_p", v, "0..=1"));
        }
        // top_p = 0 keeps only the most likely token: greedy.
        if v == 0.0 {
            p.temperature = 0.0;
        } else {
            p.top_p = v as f32;
        }
    }
    if let Some(k) = c.top_k {
        if !(0..=n_vocab as i64).contains(&k) {
            return Err(ApiError::out_of_range(
                "top_k",
                k,
                "0 (off) up to the vocabulary size",
            ));
        }
        p.top_k = k as usize;
    }
    if let Some(v) = c.min_p {
        let v = finite("min_p", v)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(ApiError::out_of_range("min_p", v, "0..=1"));
        }
        p.min_p = v as f32;
    }
    if let Some(v) = c.repeat_penalty {
        let v = finite("repeat_penalty", v)?;
        if !(v > 0.0 && v <= 10.0) {
            return Err(ApiError::out_of_range(
                "repeat_penalty",
                v,
                "(0, 10]; 1 = off",
            ));
        }
        p.repeat_penalty = v as f32;
    }
    for (name, v, dst) in [
        (
            "presence_penalty",
            c.presence_penalty,
            &mut p.presence_penalty,
        ),
        (
            "frequency_penalty",
            c.frequency_penalty,
            &mut p.frequency_penalty,
        ),
    ] {
        if let Some(v) = v {
            let v = finite(name, v)?;
            if !(-2.0..=2.0).contains(&v) {
                return Err(ApiError::out_of_range(name, v, "-2..=2"));
            }
            *dst = v as f32;
        }
    }
    if let Some(bias) = &c.logit_bias {
        if bias.len() > 1024 {
            return Err(ApiError::out_of_range(
                "logit_bias",
                format!("{} entries", bias.len()),
                "at most 1024 entries",
            ));
        }
        for (k, &v) in bias {
            let id: u32 = k
                .parse()
                .ok()
                .filter(|&id: &u32| (id as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::invalid(
                        Some("logit_bias".into()),
                        format!("logit_bias key {k:?} is not a token id below {n_vocab}"),
                    )
                })?;
            let v = finite("logit_bias", v)?;
            if !(-100.0..=100.0).contains(&v) {
                return Err(ApiError::out_of_range(
                    "logit_bias",
                    format!("{v} for token {id}"),
                    "-100..=100 (-100 bans the token)",
                ));
            }
            p.logit_bias.push((
                id,
                if v <= -100.0 {
                    f32::NEG_INFINITY
                } else {
                    v as f32
                },
            ));
        }
    }
    if top_logprobs > MAX_TOP_LOGPROBS {
        return Err(ApiError::out_of_range(
            "top_logprobs",
            top_logprobs,
            "0..=20",
        ));
    }
    p.top_logprobs = top_logprobs.min(n_vocab);
    p.seed = c.seed.map(|s| s as u64);
    let max = match c.max_completion_tokens.or(c.max_tokens) {
        None => default_max,
        Some(m) if (1..=1 << 20).contains(&m) => Some(m as usize),
        Some(m) => {
            let name = if c.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::out_of_range(name, m, "1..=1048576"));
        }
    };
    let n = match c.n {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::out_of_range("n", n, "1..=16")),
    };
    let stop: Vec<String> = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP {
        return Err(ApiError::out_of_range(
            "stop",
            format!("{} strings", stop.len()),
            "at most 16 strings",
        ));
    }
    let stream = c.stream.unwrap_or(false);
    // `stream_options` without streaming is ignored, as llama-server does.
    Ok(Validated {
        sampling: p,
        max_tokens: max,
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        n,
        stream,
        include_usage: c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        cache_prompt: c.cache_prompt.unwrap_or(true),
    })
}

/// A request's draft sizes over the server's `defaults` (`None` when the
/// request names none, or the server does not speculate: the fields are
/// then checked and otherwise ignored, as llama-server ignores them).
pub fn validate_draft(
    c: &Common,
    defaults: Option<DraftParams>,
) -> Result<Option<DraftParams>, ApiError> {
    let field = |name: &str, v: Option<i64>| match v {
        None => Ok(None),
        Some(n) if (0..=MAX_DRAFT as i64).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::out_of_range(
            name,
            n,
            &format!("0..={MAX_DRAFT} (a verify pass stays below the CPU GEMM's batch)"),
        )),
    };
    let max = field("speculative.n_max", c.speculative_n_max)?;
    let min = field("speculative.n_min", c.speculative_n_min)?;
    if max.is_none() && min.is_none() {
        return Ok(None);
    }
    let base = defaults.unwrap_or(DraftParams {
        max: MAX_DRAFT,
        min: 0,
    });
    let max = max.unwrap_or(base.max);
    // The server's fewest, where the request lowers the most below it, follows.
    let p = DraftParams {
        max,
        min: min.unwrap_or(base.min.min(max)),
    };
    if p.min > p.max {
        return Err(ApiError::out_of_range(
            "speculative.n_min",
            p.min,
            &format!("0..=speculative.n_max ({})", p.max),
        ));
    }
    Ok(defaults.map(|_| p))
}

/// The text of a message's content.
pub fn content_text(m: &Message, index: usize) -> Result<String, ApiError> {
    match &m.content {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s.clone()),
        Some(Content::Parts(parts)) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => out.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            Some(format!("messages[{index}].content[{j}]")),
                            format!("content part of type {kind:?} is not supported (only text parts with a `text` field)"),
                        ))
                    }
                }
            }
            Ok(out)
        }
    }
}

/// An embeddings `input`.
pub type EmbedInput = TextsOrTokens;

/// `POST /v1/embeddings` (and llama-server's `POST /embeddings`).
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    /// What to embed (OpenAI's field).
    pub input: Option<EmbedInput>,
    /// What to embed (llama-server's field on `/embeddings`).
    pub content: Option<EmbedInput>,
    /// The model name (any value is accepted; echoed back).
    pub model: Option<String>,
    /// `float` (default) or `base64` (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Output width; only the model's own is possible.
    pub dimensions: Option<i64>,
    /// Free-form end-user id (accepted, unused).
    pub user: Option<String>,
}

/// The most inputs one embeddings request may hold (OpenAI's limit).
pub const MAX_EMBED_INPUTS: usize = 2048;

/// One element of `/tokenize`'s `content` list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TextOrToken {
    /// A token id, taken as it is.
    Token(u32),
    /// Text to tokenize.
    Text(String),
}

/// `/tokenize`'s `content`: a text, or texts and token ids mixed.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TokenizeContent {
    /// A text.
    Text(String),
    /// Texts and ids, in order.
    Mixed(Vec<TextOrToken>),
}

/// `POST /tokenize` (llama-server's).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// What to tokenize (absent: no tokens).
    pub content: Option<TokenizeContent>,
    /// Add BOS/EOS as the model asks (to the first text only); default false.
    pub add_special: Option<bool>,
    /// Read control tokens written in the text; default true.
    pub parse_special: Option<bool>,
    /// Answer `{id, piece}` objects instead of ids.
    pub with_pieces: Option<bool>,
}

/// `POST /detokenize` (llama-server's).
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// Token ids (absent: empty text).
    pub tokens: Option<Vec<u32>>,
}

/// `POST /apply-template` (llama-server's): a chat request's messages.
#[derive(Debug, Clone, Deserialize)]
pub struct ApplyTemplateRequest {
    /// The conversation.
    pub messages: Vec<Message>,
}
