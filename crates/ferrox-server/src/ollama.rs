//! Ollama's API, so the tools that speak its protocol work against ferrox
//! unchanged: `POST /api/generate`, `POST /api/chat` (NDJSON streams by
//! default, one object with `"stream": false`), `POST /api/embed` and the
//! older `POST /api/embeddings`, `GET /api/tags`, `POST /api/show`,
//! `GET /api/ps`, `GET /api/version`.
//!
//! The decision: a request here is translated into the OpenAI path's terms
//! (`options` into [`Common`], checked by [`openai::validate_sampling`];
//! `format` into a [`ResponseFormat`]; messages through [`render_chat`]) and
//! submitted with [`submit_job`], so sampling, stop strings, JSON mode, the
//! chat template and the scheduler are the same code for both protocols.
//! Only the shaping of the engine's events differs: ollama's field names,
//! durations in nanoseconds, and errors as `{"error": "..."}` with the
//! status the OpenAI path would give.
//!
//! Where the two servers differ by design:
//! - any model name is accepted (the server runs one model); a missing one
//!   is ollama's 400 `model is required`;
//! - defaults are ollama's (top-p 0.9, min-p 0, repeat penalty 1.1 over the
//!   last 64 tokens), not llama-server's, so a request gets what it would
//!   get from ollama;
//! - `/api/embed` needs no `--embeddings`: ollama embeds with any model, and
//!   ferrox's engine runs an embedding as a prefill-only sequence of the same
//!   weights (nothing to set up at start). It pools as `--pooling` (or the
//!   model's GGUF) says, and by the mean where that is `none`, then
//!   normalizes as ollama does;
//! - options ferrox has no use for (`num_ctx`, `num_gpu`, `mirostat`, …) are
//!   ignored, as ollama ignores options a runner does not know.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrox_core::embed::{l2_normalize, Pooling};
use ferrox_core::ftype::Mix;
use ferrox_core::scheduler::{SeqEvent, SeqSummary};
use ferrox_gguf::{GgufFile, Value as Gguf};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::harmony::Harmony;
use crate::tools::Family;
use crate::openai::{self, Common, JsonSchemaFormat, Message, ResponseFormat, Stop};
use crate::{count_error, grammar_of, parse_body, render_chat, submit_job, Api, AppState, Job, OpenGuard, Tagged};

/// The Ollama API version whose shapes these endpoints answer (`/api/version`;
/// clients compare it before using newer fields such as `format` schemas).
pub const OLLAMA_VERSION: &str = "0.9.0";

/// `options`: the Modelfile parameters a request may set.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Options {
    /// Temperature (0..=2; 0 = greedy).
    pub temperature: Option<f64>,
    /// Top-k (0 = off).
    pub top_k: Option<i64>,
    /// Nucleus.
    pub top_p: Option<f64>,
    /// Min-p.
    pub min_p: Option<f64>,
    /// Locally typical sampling (1 = off).
    pub typical_p: Option<f64>,
    /// Seed.
    pub seed: Option<i64>,
    /// Token budget: -1 unbounded, -2 until the context is full, else 1.. .
    pub num_predict: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Repetition penalty.
    pub repeat_penalty: Option<f64>,
    /// The window of the penalties (0 = off, -1 = the whole context).
    pub repeat_last_n: Option<i64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
}

/// `POST /api/generate`.
#[derive(Debug, Clone, Deserialize)]
pub struct GenerateRequest {
    /// The model (required; any name is accepted).
    pub model: Option<String>,
    /// The prompt (empty: the model is "loaded" and nothing generated).
    pub prompt: Option<String>,
    /// Text after the reply (fill-in-the-middle; refused).
    pub suffix: Option<String>,
    /// The system message.
    pub system: Option<String>,
    /// A Go template (refused: ferrox renders the model's own chat template).
    pub template: Option<String>,
    /// Token ids of an earlier reply's `context`, prepended to the prompt.
    pub context: Option<Vec<u32>>,
    /// Stream NDJSON (default true).
    pub stream: Option<bool>,
    /// The prompt as it is, without the chat template.
    pub raw: Option<bool>,
    /// `"json"` or a JSON schema.
    pub format: Option<Value>,
    /// Images (refused: no vision).
    pub images: Option<Vec<String>>,
    /// Sampling options.
    pub options: Option<Options>,
    /// Accepted, unused (the model stays loaded).
    pub keep_alive: Option<Value>,
    /// Thinking: a harmony model (gpt-oss) takes any value and always
    /// thinks; other models take only `false`.
    pub think: Option<Value>,
}

/// One message of `/api/chat`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: Option<String>,
    /// Images (refused: no vision).
    pub images: Option<Vec<String>>,
    /// Calls an assistant turn made (not rendered).
    pub tool_calls: Option<Value>,
    /// The tool a `tool` message answers for (not rendered).
    pub tool_name: Option<String>,
    /// An assistant turn's thinking (rendered by a harmony template as its
    /// analysis; by others not).
    pub thinking: Option<String>,
}

/// `POST /api/chat`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The model (required; any name is accepted).
    pub model: Option<String>,
    /// The conversation (empty: the model is "loaded" and nothing generated).
    pub messages: Option<Vec<ChatMessage>>,
    /// Stream NDJSON (default true).
    pub stream: Option<bool>,
    /// `"json"` or a JSON schema.
    pub format: Option<Value>,
    /// Sampling options.
    pub options: Option<Options>,
    /// Tools (refused on this endpoint).
    pub tools: Option<Vec<Value>>,
    /// Accepted, unused.
    pub keep_alive: Option<Value>,
    /// Thinking (only `false` is accepted).
    pub think: Option<Value>,
}

/// `/api/embed`'s `input`: one text or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    /// One text.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `POST /api/embed` (and the older `POST /api/embeddings`, whose text is `prompt`).
#[derive(Debug, Clone, Deserialize)]
pub struct EmbedRequest {
    /// The model (required; any name is accepted).
    pub model: Option<String>,
    /// What to embed.
    pub input: Option<EmbedInput>,
    /// What to embed (`/api/embeddings`).
    pub prompt: Option<String>,
    /// Cut inputs longer than a slot's context (default true) instead of refusing them.
    pub truncate: Option<bool>,
    /// Keep the first `dimensions` values (renormalized).
    pub dimensions: Option<i64>,
    /// Accepted, unused.
    pub options: Option<Value>,
    /// Accepted, unused.
    pub keep_alive: Option<Value>,
}

/// `POST /api/show`.
#[derive(Debug, Clone, Deserialize)]
pub struct ShowRequest {
    /// The model (`name` is its older spelling).
    pub model: Option<String>,
    /// The older spelling of `model`.
    pub name: Option<String>,
    /// Arrays in `model_info` in full (tokens, merges) instead of empty.
    pub verbose: Option<bool>,
}

/// An error as ollama answers it: the status, and `{"error": message}`.
fn error(st: &AppState, e: ApiError) -> Response {
    let e = count_error(st, e);
    let mut r = (e.status, Json(json!({"error": e.message}))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// A body in ollama's terms: JSON whatever the Content-Type (`curl -d`
/// sends form encoding), a 400 `missing request body` when there is none.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(None, "missing request body"));
    }
    parse_body(&HeaderMap::new(), body)
}

fn require_model(model: &Option<String>) -> Result<String, ApiError> {
    match model.as_deref().map(str::trim) {
        Some(m) if !m.is_empty() => Ok(m.to_string()),
        _ => Err(ApiError::invalid(Some("model".into()), "model is required")),
    }
}

/// `think: true` (or a level) asks for what a thinking model does; ferrox
/// runs none, and says so as ollama does for a model without it.
fn refuse_think(think: &Option<Value>, model: &str) -> Result<(), ApiError> {
    match think {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(_) => Err(ApiError::invalid(Some("think".into()), format!("\"{model}\" does not support thinking"))),
    }
}

/// `format`: absent, `""`, `"json"`, or a JSON schema.
fn format_of(format: &Option<Value>) -> Result<Option<ResponseFormat>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(ResponseFormat::JsonObject)),
        Some(v @ Value::Object(_)) => Ok(Some(ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat { name: None, schema: Some(v.clone()), strict: None },
        })),
        Some(other) => Err(ApiError::invalid(
            Some("format".into()),
            format!("invalid format: {other}; expected \"json\" or a JSON schema object"),
        )),
    }
}

/// `options` (with ollama's defaults) as the engine's parameters, through
/// the OpenAI path's checks.
fn validate_options(st: &AppState, o: &Options, stream: bool) -> Result<openai::Validated, ApiError> {
    let max_tokens = match o.num_predict {
        None | Some(-1) | Some(-2) => None,
        Some(n) if (1..=1 << 20).contains(&n) => Some(n),
        Some(n) => return Err(ApiError::out_of_range("num_predict", n, "-1 (no limit), -2 (until the context is full) or 1..=1048576")),
    };
    let c = Common {
        stream: Some(stream),
        max_tokens,
        temperature: o.temperature.or(Some(0.8)),
        top_p: o.top_p.or(Some(0.9)),
        top_k: o.top_k.or(Some(40)),
        min_p: o.min_p.or(Some(0.0)),
        repeat_penalty: o.repeat_penalty.or(Some(1.1)),
        seed: o.seed,
        stop: o.stop.clone(),
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
        ..Common::default()
    };
    let mut v = openai::validate_sampling(&c, 0, st.tok.n_vocab(), None)?;
    if let Some(t) = o.typical_p {
        if !(t.is_finite() && t > 0.0 && t <= 1.0) {
            return Err(ApiError::out_of_range("typical_p", t, "(0, 1]; 1 = off"));
        }
        v.sampling.typical_p = t as f32;
    }
    v.sampling.repeat_last_n = match o.repeat_last_n {
        None => 64,
        Some(-1) => st.sched.config().n_ctx,
        Some(n) if (0..=1 << 20).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::out_of_range("repeat_last_n", n, "-1 (the whole context), 0 (off) or a token count")),
    };
    Ok(v)
}

/// An OpenAI-path message of `role` and text, built through serde so that
/// fields the OpenAI side adds to [`Message`] take their defaults here.
fn message(role: String, content: Option<String>) -> Result<Message, ApiError> {
    message_with_thinking(role, content, None)
}

fn message_with_thinking(role: String, content: Option<String>, thinking: Option<String>) -> Result<Message, ApiError> {
    serde_json::from_value(json!({"role": role, "content": content, "reasoning_content": thinking}))
        .map_err(|e| ApiError::internal(format!("a message could not be built: {e}")))
}

fn job(st: &AppState, api: Api, prompt: Vec<u32>, v: openai::Validated, format: &Option<Value>) -> Result<Job, ApiError> {
    let grammar = grammar_of(st, &format_of(format)?, &Common::default()).map_err(|e| ApiError { param: Some("format".into()), ..e })?;
    Ok(Job { api, prompt, v, logprobs: None, grammar, tools: None, harmony: false, echo: None, draft: None })
}

pub(crate) async fn generate(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let t0 = Instant::now();
    st.metrics.completions.fetch_add(1, Ordering::Relaxed);
    let r = (|| {
        let req: GenerateRequest = parse(&body)?;
        let model = require_model(&req.model)?;
        refuse_think(&req.think, &model)?;
        if req.images.as_ref().is_some_and(|i| !i.is_empty()) {
            return Err(ApiError::invalid(Some("images".into()), format!("\"{model}\" does not support images")));
        }
        if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid(Some("suffix".into()), format!("\"{model}\" does not support insert (`suffix`)")));
        }
        if req.template.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid(
                Some("template".into()),
                "`template` (a Go template) is not supported: the model's own chat template is used; send `raw: true` with a rendered prompt",
            ));
        }
        let stream = req.stream.unwrap_or(true);
        let prompt = req.prompt.unwrap_or_default();
        let context = req.context.unwrap_or_default();
        if prompt.is_empty() && context.is_empty() {
            return Ok((model, None, stream));
        }
        let v = validate_options(&st, &req.options.unwrap_or_default(), stream)?;
        let n_vocab = st.tok.n_vocab();
        if let Some((i, &t)) = context.iter().enumerate().find(|(_, &t)| t as usize >= n_vocab) {
            return Err(ApiError::invalid(Some("context".into()), format!("`context[{i}]` is {t}, outside the vocabulary of {n_vocab}")));
        }
        let mut ids = context.clone();
        let text = if req.raw.unwrap_or(false) {
            prompt
        } else {
            let mut msgs = Vec::new();
            if let Some(s) = req.system.filter(|s| !s.is_empty()) {
                msgs.push(message("system".into(), Some(s))?);
            }
            msgs.push(message("user".into(), Some(prompt))?);
            let (template, text) = render_chat(&st, &msgs).map_err(|e| ApiError { param: Some("prompt".into()), ..e })?;
            if template.starts_with_bos(&text) && context.is_empty() {
                ids.extend(st.tok.encode(text.as_bytes(), false, true).map_err(|e| ApiError::invalid(Some("prompt".into()), e.to_string()))?);
                return Ok((model, Some(job(&st, Api::Completion, ids, v, &req.format)?), stream));
            }
            text
        };
        ids.extend(
            st.tok
                .encode(text.as_bytes(), context.is_empty(), true)
                .map_err(|e| ApiError::invalid(Some("prompt".into()), e.to_string()))?,
        );
        Ok((model, Some(job(&st, Api::Completion, ids, v, &req.format)?), stream))
    })();
    respond(st, r, Kind::Generate, t0).await
}

pub(crate) async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let t0 = Instant::now();
    st.metrics.chat.fetch_add(1, Ordering::Relaxed);
    let r = (|| {
        let req: ChatRequest = parse(&body)?;
        let model = require_model(&req.model)?;
        // gpt-oss thinks whatever `think` says (its levels are accepted);
        // its analysis channel comes back as `message.thinking`.
        let harmony = st.template.as_ref().is_some_and(|t| Family::detect(t.source()) == Family::Harmony);
        if !harmony {
            refuse_think(&req.think, &model)?;
        }
        if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid(Some("tools".into()), format!("\"{model}\" does not support tools on /api/chat")));
        }
        let stream = req.stream.unwrap_or(true);
        let messages = req.messages.unwrap_or_default();
        if messages.is_empty() {
            return Ok((model, None, stream));
        }
        let mut msgs = Vec::with_capacity(messages.len());
        for (i, m) in messages.into_iter().enumerate() {
            if m.images.as_ref().is_some_and(|im| !im.is_empty()) {
                return Err(ApiError::invalid(Some(format!("messages[{i}].images")), format!("\"{model}\" does not support images")));
            }
            msgs.push(message_with_thinking(m.role, m.content, m.thinking)?);
        }
        let v = validate_options(&st, &req.options.unwrap_or_default(), stream)?;
        let (template, text) = render_chat(&st, &msgs)?;
        let with_bos = !template.starts_with_bos(&text);
        let ids = st
            .tok
            .encode(text.as_bytes(), with_bos, true)
            .map_err(|e| ApiError::invalid(Some("messages".into()), e.to_string()))?;
        let mut job = job(&st, Api::Chat, ids, v, &req.format)?;
        job.harmony = harmony;
        Ok((model, Some(job), stream))
    })();
    respond(st, r, Kind::Chat, t0).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Generate,
    Chat,
}

/// The current time as RFC 3339 in UTC with nanoseconds, as ollama's
/// `created_at` (Go's `time.Time` in JSON).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to a civil date (H. Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// ollama's `done_reason`.
fn done_reason(s: &SeqSummary) -> &'static str {
    use ferrox_core::generate::FinishReason;
    match s.finish {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

/// Shapes one request's events into ollama objects.
struct Shaper {
    kind: Kind,
    model: String,
    t0: Instant,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    /// A harmony reply's parser (gpt-oss on `/api/chat`).
    harmony: Option<Harmony>,
}

impl Shaper {
    fn object(&mut self, text: &str, done: bool) -> Value {
        let mut o = json!({"model": self.model, "created_at": rfc3339(SystemTime::now())});
        match self.kind {
            Kind::Generate => o["response"] = json!(text),
            Kind::Chat => o["message"] = self.message(text, done),
        }
        o["done"] = json!(done);
        o
    }

    /// The assistant message for the next piece of text: under harmony the
    /// analysis channel as `thinking` and the final channel as `content`.
    fn message(&mut self, text: &str, done: bool) -> Value {
        let Some(h) = self.harmony.as_mut() else {
            return json!({"role": "assistant", "content": text});
        };
        let mut d = h.push(text);
        if done {
            let (tail, _) = self.harmony.take().unwrap_or_default().finish();
            d.reasoning.push_str(&tail.reasoning);
            d.content.push_str(&tail.content);
        }
        let mut m = json!({"role": "assistant", "content": d.content});
        if !d.reasoning.is_empty() {
            m["thinking"] = json!(d.reasoning);
        }
        m
    }

    /// The last object: `done`, why, and the counts and durations.
    fn last(&mut self, text: &str, s: &SeqSummary) -> Value {
        let mut o = self.object(text, true);
        o["done_reason"] = json!(done_reason(s));
        if self.kind == Kind::Generate {
            let mut ctx = self.prompt.clone();
            ctx.extend(&self.generated);
            o["context"] = json!(ctx);
        }
        o["total_duration"] = json!(ns(self.t0.elapsed()));
        o["load_duration"] = json!(0);
        o["prompt_eval_count"] = json!(self.prompt.len());
        o["prompt_eval_duration"] = json!(ns(s.time_to_first_token));
        o["eval_count"] = json!(s.n_generated);
        o["eval_duration"] = json!(ns(s.decode_time));
        o
    }

    /// With `-v`: one line on stderr for the finished request, as the
    /// OpenAI endpoints write.
    fn log_done(&self, st: &AppState, s: &SeqSummary) {
        if st.opts.verbose {
            let path = if self.kind == Kind::Chat { "/api/chat" } else { "/api/generate" };
            let rate = if s.decode_time > Duration::ZERO { s.n_generated as f64 / s.decode_time.as_secs_f64() } else { 0.0 };
            eprintln!(
                "ferrox: {path}: prompt {} tokens ({} cached) in {:.1} ms; {} tokens generated in {:.1} ms ({rate:.2} t/s)",
                self.prompt.len(),
                s.n_cached,
                s.time_to_first_token.as_secs_f64() * 1e3,
                s.n_generated,
                s.decode_time.as_secs_f64() * 1e3,
            );
        }
    }

    /// The answer to an empty prompt: the model is loaded, nothing is generated.
    fn loaded(&mut self) -> Value {
        let mut o = self.object("", true);
        o["done_reason"] = json!("load");
        o
    }
}

async fn respond(st: Arc<AppState>, r: Result<(String, Option<Job>, bool), ApiError>, kind: Kind, t0: Instant) -> Response {
    let (model, job, stream) = match r {
        Ok(x) => x,
        Err(e) => return error(&st, e),
    };
    let mut sh = Shaper { kind, model, t0, prompt: Vec::new(), generated: Vec::new(), harmony: None };
    let Some(job) = job else {
        return Json(sh.loaded()).into_response();
    };
    if job.harmony {
        sh.harmony = Some(Harmony::new());
    }
    let rx = match submit_job(&st, &job) {
        Ok(rx) => rx,
        Err(e) => return error(&st, e),
    };
    sh.prompt = job.prompt;
    let open = OpenGuard::new(&st);
    if stream {
        ndjson(st, sh, rx, open)
    } else {
        whole(st, sh, rx).await
    }
}

async fn whole(st: Arc<AppState>, mut sh: Shaper, mut rx: mpsc::UnboundedReceiver<Tagged>) -> Response {
    let mut text = String::new();
    while let Some((_, ev)) = rx.recv().await {
        match ev {
            SeqEvent::Token(t) => {
                text.push_str(&t.text);
                sh.generated.push(t.sampled.token);
            }
            SeqEvent::Done(s) => {
                text.push_str(&s.tail);
                sh.log_done(&st, &s);
                return Json(sh.last(&text, &s)).into_response();
            }
            SeqEvent::Failed(e) => return error(&st, ApiError::internal(e)),
            SeqEvent::Started { .. } | SeqEvent::Embedding(_) => {}
        }
    }
    error(&st, ApiError::internal("the engine stopped before the request finished".into()))
}

/// One JSON object per line (`application/x-ndjson`), each sent as it comes.
fn ndjson(st: Arc<AppState>, sh: Shaper, rx: mpsc::UnboundedReceiver<Tagged>, open: OpenGuard) -> Response {
    let line = |v: Value| {
        let mut s = v.to_string();
        s.push('\n');
        Ok::<Bytes, std::convert::Infallible>(Bytes::from(s))
    };
    let stream = futures_util::stream::unfold(Some((st, sh, rx, open)), move |state| async move {
        let (st, mut sh, mut rx, open) = state?;
        loop {
            match rx.recv().await {
                Some((_, SeqEvent::Token(t))) => {
                    sh.generated.push(t.sampled.token);
                    if !t.text.is_empty() {
                        let v = sh.object(&t.text, false);
                        // Harmony markup settles no text of its own.
                        let m = &v["message"];
                        if sh.harmony.is_none() || m["content"] != "" || m.get("thinking").is_some() {
                            return Some((line(v), Some((st, sh, rx, open))));
                        }
                    }
                }
                Some((_, SeqEvent::Done(s))) => {
                    // Text held back for a stop string that never came goes
                    // in the last object, whose text is otherwise empty.
                    sh.log_done(&st, &s);
                    return Some((line(sh.last(&s.tail, &s)), None));
                }
                Some((_, SeqEvent::Failed(e))) => {
                    let e = count_error(&st, ApiError::internal(e));
                    return Some((line(json!({"error": e.message})), None));
                }
                Some(_) => {}
                None => {
                    return Some((line(json!({"error": "the engine stopped before the request finished"})), None));
                }
            }
        }
    });
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream)).into_response()
}

/// The pooling `/api/embed` uses: the server's, or the mean where that is none.
fn embed_pooling(st: &AppState) -> Pooling {
    match st.opts.pooling {
        Pooling::None => Pooling::Mean,
        p => p,
    }
}

/// Tokenizes `texts` for embedding, cutting each to a slot's context when
/// `truncate`, else refusing one that is longer.
fn embed_tokens(st: &AppState, texts: &[String], truncate: bool) -> Result<Vec<Vec<u32>>, ApiError> {
    let n_ctx = st.sched.config().n_ctx;
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut ids = st.tok.encode(t.as_bytes(), true, true).map_err(|e| ApiError::invalid(Some(format!("input[{i}]")), e.to_string()))?;
            if ids.is_empty() {
                return Err(ApiError::invalid(Some(format!("input[{i}]")), format!("input {i} has no tokens: there is nothing to embed")));
            }
            if ids.len() > n_ctx {
                if !truncate {
                    return Err(ApiError::invalid(Some(format!("input[{i}]")), "the input length exceeds the context length"));
                }
                ids.truncate(n_ctx);
            }
            Ok(ids)
        })
        .collect()
}

/// `POST /api/embed`: `{model, embeddings: [[…]], total_duration, load_duration, prompt_eval_count}`.
pub(crate) async fn embed(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let t0 = Instant::now();
    st.metrics.embeddings.fetch_add(1, Ordering::Relaxed);
    let r = async {
        let req: EmbedRequest = parse(&body)?;
        let model = require_model(&req.model)?;
        let texts = match req.input {
            None => Vec::new(),
            Some(EmbedInput::One(s)) if s.is_empty() => Vec::new(),
            Some(EmbedInput::One(s)) => vec![s],
            Some(EmbedInput::Many(v)) => v,
        };
        if texts.len() > openai::MAX_EMBED_INPUTS {
            return Err(ApiError::out_of_range("input", format!("{} inputs", texts.len()), "at most 2048 inputs"));
        }
        let dims = match req.dimensions {
            None | Some(0) => None,
            Some(d) if d > 0 => Some(d as usize),
            Some(d) => return Err(ApiError::out_of_range("dimensions", d, "a positive width (0: the model's)")),
        };
        let inputs = embed_tokens(&st, &texts, req.truncate.unwrap_or(true))?;
        let n_tokens: usize = inputs.iter().map(Vec::len).sum();
        let vectors = if inputs.is_empty() { Vec::new() } else { crate::embeddings::run(&st, &inputs, embed_pooling(&st)).await? };
        let embeddings: Vec<Value> = vectors
            .into_iter()
            .map(|mut v| {
                l2_normalize(&mut v);
                if let Some(d) = dims.filter(|&d| d < v.len()) {
                    v.truncate(d);
                    l2_normalize(&mut v);
                }
                crate::embeddings::floats(&v)
            })
            .collect();
        Ok(json!({
            "model": model,
            "embeddings": embeddings,
            "total_duration": ns(t0.elapsed()),
            "load_duration": 0,
            "prompt_eval_count": n_tokens,
        }))
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&st, e),
    }
}

/// `POST /api/embeddings` (superseded by `/api/embed`): `{model, prompt}` → `{embedding: […]}`.
pub(crate) async fn embeddings(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    st.metrics.embeddings.fetch_add(1, Ordering::Relaxed);
    let r = async {
        let req: EmbedRequest = parse(&body)?;
        require_model(&req.model)?;
        let prompt = req.prompt.unwrap_or_default();
        if prompt.is_empty() {
            return Ok(json!({"embedding": []}));
        }
        let inputs = embed_tokens(&st, &[prompt], true)?;
        let mut v = crate::embeddings::run(&st, &inputs, embed_pooling(&st)).await?.pop().unwrap_or_default();
        l2_normalize(&mut v);
        Ok(json!({"embedding": crate::embeddings::floats(&v)}))
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&st, e),
    }
}

/// What `/api/tags`, `/api/show` and `/api/ps` say of the model, read once
/// from the model file's metadata.
pub(crate) struct ModelFacts {
    size: u64,
    modified_at: String,
    details: Value,
    /// Scalar metadata, and arrays as their length alone.
    info: serde_json::Map<String, Value>,
}

fn gguf_json(v: &Gguf, full: bool) -> Value {
    use ferrox_gguf::Array;
    match v {
        Gguf::U8(x) => json!(x),
        Gguf::I8(x) => json!(x),
        Gguf::U16(x) => json!(x),
        Gguf::I16(x) => json!(x),
        Gguf::U32(x) => json!(x),
        Gguf::I32(x) => json!(x),
        Gguf::U64(x) => json!(x),
        Gguf::I64(x) => json!(x),
        Gguf::F32(x) => json!(x),
        Gguf::F64(x) => json!(x),
        Gguf::Bool(x) => json!(x),
        Gguf::String(s) => json!(String::from_utf8_lossy(s.as_bytes())),
        Gguf::Array(_) if !full => json!([]),
        Gguf::Array(a) => match a {
            Array::String(s) => json!(s.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect::<Vec<_>>()),
            Array::F32(x) => json!(x),
            Array::I32(x) => json!(x),
            Array::U32(x) => json!(x),
            other => json!(format!("{} values", other.len())),
        },
    }
}

impl ModelFacts {
    fn read(st: &AppState) -> ModelFacts {
        let path = &st.opts.model_path;
        let meta = std::fs::metadata(path).ok();
        let size = meta.as_ref().map_or(0, |m| m.len());
        let modified_at = rfc3339(meta.and_then(|m| m.modified().ok()).unwrap_or(UNIX_EPOCH));
        let file = GgufFile::open(path).ok();
        let get = |k: &str| file.as_ref().and_then(|f| f.get(k));
        let arch = get("general.architecture").and_then(|v| match v {
            Gguf::String(s) => s.as_str().map(String::from),
            _ => None,
        });
        let n_params: u64 = file.as_ref().map_or(0, |f| f.tensors().iter().map(|t| t.n_elements()).sum());
        let quant = get("general.file_type")
            .and_then(Gguf::as_uint)
            .and_then(|ft| Mix::parse(&ft.to_string()))
            .map_or("unknown", Mix::name);
        let details = json!({
            "parent_model": "",
            "format": "gguf",
            "family": arch.clone().unwrap_or_default(),
            "families": arch.iter().collect::<Vec<_>>(),
            "parameter_size": parameter_size(n_params),
            "quantization_level": quant,
        });
        let mut info = serde_json::Map::new();
        if let Some(f) = &file {
            for (k, v) in f.metadata() {
                info.insert(k.clone(), gguf_json(v, false));
            }
            info.insert("general.parameter_count".into(), json!(n_params));
        }
        ModelFacts { size, modified_at, details, info }
    }
}

/// `270.43M`, `7.6B`: ollama's `parameter_size`.
fn parameter_size(n: u64) -> String {
    let n = n as f64;
    match n {
        n if n >= 1e9 => format!("{:.1}B", n / 1e9),
        n if n >= 1e6 => format!("{:.2}M", n / 1e6),
        n => format!("{:.0}", n),
    }
}

fn facts(st: &AppState) -> &ModelFacts {
    st.ollama_facts.get_or_init(|| ModelFacts::read(st))
}

fn model_entry(st: &AppState) -> Value {
    let f = facts(st);
    let name = st.opts.model_name.as_str();
    json!({
        "name": name,
        "model": name,
        "modified_at": f.modified_at,
        "size": f.size,
        "digest": "",
        "details": f.details,
    })
}

/// `GET /api/tags`: the one model this server runs.
pub(crate) async fn tags(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({"models": [model_entry(&st)]})).into_response()
}

/// `GET /api/ps`: the model, loaded until the server stops.
pub(crate) async fn ps(State(st): State<Arc<AppState>>) -> Response {
    let mut m = model_entry(&st);
    m["expires_at"] = json!("9999-12-31T23:59:59Z");
    m["size_vram"] = json!(0);
    m["context_length"] = json!(st.sched.config().n_ctx);
    Json(json!({"models": [m]})).into_response()
}

/// `POST /api/show`: the details, the metadata, the chat template.
pub(crate) async fn show(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let r = (|| {
        let req: ShowRequest = parse(&body)?;
        require_model(&req.model.or(req.name))?;
        let f = facts(&st);
        let mut info = f.info.clone();
        if req.verbose.unwrap_or(false) {
            if let Ok(file) = GgufFile::open(&st.opts.model_path) {
                for (k, v) in file.metadata() {
                    info.insert(k.clone(), gguf_json(v, true));
                }
            }
        }
        // Completion always (raw prompts need no template); embedding
        // because /api/embed serves any model.
        let capabilities = ["completion", "embedding"];
        Ok(json!({
            "modelfile": format!("# Served by ferrox\nFROM {}\n", st.opts.model_path),
            "parameters": "",
            "template": st.template.as_ref().map_or("", |t| t.source()),
            "details": f.details,
            "model_info": info,
            "capabilities": capabilities,
            "modified_at": f.modified_at,
        }))
    })();
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&st, e),
    }
}

/// `GET /api/version`.
pub(crate) async fn version() -> Response {
    Json(json!({"version": OLLAMA_VERSION})).into_response()
}

/// An `/api/*` path not served here (model management: pull, create, copy,
/// delete, …), in ollama's error shape.
pub(crate) fn not_found(path: &str) -> Response {
    let msg = format!("{path} is not served: ferrox runs the one model it was started with (no pull, create, copy or delete)");
    (StatusCode::NOT_FOUND, Json(json!({"error": msg}))).into_response()
}

/// A missing or wrong API key on `/api/*`, in ollama's error shape.
pub(crate) fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, Json(json!({"error": ApiError::unauthorized().message}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/api/chat` under harmony: pieces of a reply become `thinking` and
    /// `content`, markup alone nothing, the held tail comes with `done`.
    #[test]
    fn harmony_pieces_become_thinking_and_content() {
        let mut sh = Shaper { kind: Kind::Chat, model: "m".into(), t0: Instant::now(), prompt: Vec::new(), generated: Vec::new(), harmony: Some(Harmony::new()) };
        let (mut thinking, mut content) = (String::new(), String::new());
        let read = |m: &Value, thinking: &mut String, content: &mut String| {
            thinking.push_str(m["thinking"].as_str().unwrap_or_default());
            content.push_str(m["content"].as_str().unwrap());
        };
        for piece in ["<|channel|>", "analysis", "<|message|>", "Add them", ".<|end|>", "<|start|>assistant<|channel|>final<|message|>", "4 <|"] {
            let o = sh.object(piece, false);
            read(&o["message"], &mut thinking, &mut content);
        }
        assert_eq!((thinking.as_str(), content.as_str()), ("Add them.", "4 "));
        let o = sh.object("", true);
        read(&o["message"], &mut thinking, &mut content);
        assert_eq!(content, "4 <|", "the held tail is flushed at the end");
        assert!(sh.harmony.is_none());
        let mut plain = Shaper { harmony: None, ..sh };
        assert_eq!(plain.object("<|channel|>x", false)["message"]["content"], "<|channel|>x");
    }
}
