//! `ferrox serve`: an OpenAI-compatible HTTP server over the continuous-batching
//! engine.
//!
//! The decision: this crate is the only one that knows HTTP, JSON and the
//! OpenAI schema, and it owns no model state. A handler validates and
//! tokenizes a request, hands one [`SeqRequest`] per choice to the
//! [`Scheduler`] (core's engine thread, which batches every sequence into one
//! forward pass per step) and turns the events coming back over a channel
//! into a JSON body or server-sent events. The channel *is* the cancellation:
//! when a client disconnects, axum drops the response, the receiver goes with
//! it, and the engine frees the slot at its next step.
//!
//! Embeddings (`--embeddings`) go through the same engine as sequences that
//! only prefill; llama-server's utility endpoints (`/tokenize`,
//! `/detokenize`, `/apply-template`, `/props`) answer from the tokenizer and
//! chat template alone.

mod embeddings;
pub mod error;
pub mod constrain;
pub mod harmony;
pub mod ollama;
pub mod tools;
pub mod openai;
mod openapi;
mod page;
mod utility;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferrox_core::chat_template::{ChatMessage, ChatTemplate};
use ferrox_core::embed::Pooling;
use ferrox_core::generate::{FinishReason, GeneratedToken};
use ferrox_core::scheduler::{
    EventSink, Scheduler, SchedulerStats, SeqEvent, SeqRequest, SeqSummary, SubmitError,
    TTFT_BUCKETS_S,
};
use ferrox_core::speculative::DraftParams;
use ferrox_core::tokenizer::Tokenizer;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::constrain::{Grammar, Grammars, Spec};
use crate::tools::{Family, ToolSet};
use crate::embeddings::{embeddings_llama, embeddings_oai};
use crate::openai::{ChatRequest, Common, CompletionRequest, Message, Prompt, ResponseFormat, Validated};
use crate::utility::{apply_template, detokenize, props, tokenize};

/// What the HTTP side needs besides the engine.
pub struct ServerOptions {
    /// The name `/v1/models` reports (any name is accepted in requests).
    pub model_name: String,
    /// Require `Authorization: Bearer <key>` on `/v1/*` and `/metrics`.
    pub api_key: Option<String>,
    /// After SIGTERM, how long running requests may finish before they are cancelled.
    pub shutdown_grace: Duration,
    /// One line on stderr per finished request: tokens, times, and
    /// speculative decoding's drafted and accepted tokens.
    pub verbose: bool,
    /// Serve `/v1/embeddings` and `/embeddings` (llama-server's `--embeddings`).
    pub embeddings: bool,
    /// How an embedding pools the hidden states (llama-server's `--pooling`).
    pub pooling: Pooling,
    /// The model file, as `/props` reports it.
    pub model_path: String,
}

/// Per-endpoint request counters for `/metrics`.
#[derive(Default)]
struct HttpMetrics {
    chat: AtomicU64,
    completions: AtomicU64,
    embeddings: AtomicU64,
    errors_4xx: AtomicU64,
    errors_5xx: AtomicU64,
    rejected_busy: AtomicU64,
}

/// Everything a handler reads.
pub struct AppState {
    sched: Scheduler,
    tok: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    template_error: Option<String>,
    /// The vocabulary's token trie for constrained decoding, or why it
    /// could not be built.
    grammars: Result<Grammars, String>,
    opts: ServerOptions,
    metrics: HttpMetrics,
    shutting_down: AtomicBool,
    /// Responses whose body is not yet complete.
    open_responses: AtomicUsize,
    created: u64,
    next_id: AtomicU64,
    /// What the Ollama endpoints say of the model file, read at first use.
    ollama_facts: std::sync::OnceLock<ollama::ModelFacts>,
}

impl AppState {
    /// The state over a started engine. `template` is the model's chat
    /// template, or why it has none (chat requests then fail with that).
    pub fn new(
        sched: Scheduler,
        tok: Arc<Tokenizer>,
        template: Result<ChatTemplate, String>,
        opts: ServerOptions,
    ) -> Arc<AppState> {
        let grammars = Grammars::new(Arc::clone(&tok)).map_err(|e| e.to_string());
        let (template, template_error) = match template {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e)),
        };
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Arc::new(AppState {
            sched,
            tok,
            template,
            template_error,
            grammars,
            opts,
            metrics: HttpMetrics::default(),
            shutting_down: AtomicBool::new(false),
            open_responses: AtomicUsize::new(0),
            created,
            next_id: AtomicU64::new(0),
            ollama_facts: std::sync::OnceLock::new(),
        })
    }

    /// The engine handle.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }

    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(self.created, |d| d.as_secs())
    }
}

/// The routes. `/health`, `/openapi.json` and the chat page at `/` are
/// open; the rest require the API key when one is set.
pub fn router(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(chat).fallback(only("POST")))
        .route("/v1/completions", post(completions).fallback(only("POST")))
        .route("/v1/models", get(models).fallback(only("GET")))
        .route("/v1/embeddings", post(embeddings_oai).fallback(only("POST")))
        .route("/embeddings", post(embeddings_llama).fallback(only("POST")))
        .route("/tokenize", post(tokenize).fallback(only("POST")))
        .route("/detokenize", post(detokenize).fallback(only("POST")))
        .route("/apply-template", post(apply_template).fallback(only("POST")))
        .route("/props", get(props).fallback(only("GET")))
        .route("/metrics", get(metrics).fallback(only("GET")))
        .route("/api/generate", post(ollama::generate).fallback(only("POST")))
        .route("/api/chat", post(ollama::chat).fallback(only("POST")))
        .route("/api/embed", post(ollama::embed).fallback(only("POST")))
        .route("/api/embeddings", post(ollama::embeddings).fallback(only("POST")))
        .route("/api/tags", get(ollama::tags).fallback(only("GET")))
        .route("/api/show", post(ollama::show).fallback(only("POST")))
        .route("/api/ps", get(ollama::ps).fallback(only("GET")))
        .route("/api/version", get(ollama::version).fallback(only("GET")))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route("/health", get(health).fallback(only("GET")))
        .route("/openapi.json", get(openapi_doc).fallback(only("GET")))
        .route("/", get(page::index).fallback(only("GET")))
        .merge(protected)
        .fallback(|req: Request| async move {
            match req.uri().path() {
                p if p.starts_with("/api/") => ollama::not_found(p),
                p => ApiError::not_found(p).into_response(),
            }
        })
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// A route's answer to a method it does not take: a 405 with an OpenAI
/// error body and the `Allow` header (axum's own 405 has an empty body).
fn only(allowed: &'static str) -> impl Fn(Request) -> std::future::Ready<Response> + Clone + Send + Sync + 'static {
    move |req: Request| {
        let mut r = ApiError::method_not_allowed(req.method().as_str(), req.uri().path(), allowed).into_response();
        r.headers_mut().insert(header::ALLOW, axum::http::HeaderValue::from_static(allowed));
        std::future::ready(r)
    }
}

/// One line on stderr per request: method, path, status, and the time to
/// the response head (a stream goes on after it; its line says so).
async fn log_request(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t0 = std::time::Instant::now();
    let r = next.run(req).await;
    let stream = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream") || v.as_bytes().starts_with(b"application/x-ndjson"));
    eprintln!(
        "ferrox: {method} {path} {} in {:.3}s{}",
        r.status().as_u16(),
        t0.elapsed().as_secs_f64(),
        if stream { " (stream opened)" } else { "" }
    );
    r
}

/// Serves on `listener` until `signal` resolves, then stops taking requests,
/// lets running ones finish for the grace period, cancels what is left, and
/// returns once every connection is closed and the engine has stopped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    signal: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let st = Arc::clone(&state);
    // Responses must be complete before axum's own graceful shutdown starts:
    // it ends the runtime's connection tasks once it returns, cutting any
    // stream still open. So new work is refused first, running responses
    // get the grace period, then the engine cancels what is left.
    let shutdown = async move {
        signal.await;
        st.shutting_down.store(true, Ordering::SeqCst);
        st.sched.drain();
        let open = || st.open_responses.load(Ordering::SeqCst) > 0 || st.sched.in_flight() > 0;
        let t0 = tokio::time::Instant::now();
        while open() && t0.elapsed() < st.opts.shutdown_grace {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        st.sched.shutdown();
        let t1 = tokio::time::Instant::now();
        while st.open_responses.load(Ordering::SeqCst) > 0 && t1.elapsed() < Duration::from_secs(2)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    axum::serve(listener, router(Arc::clone(&state)))
        .with_graceful_shutdown(shutdown)
        .await?;
    state.sched.shutdown();
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn termination_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.opts.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given.map(str::trim) != Some(key.as_str()) {
            st.metrics.errors_4xx.fetch_add(1, Ordering::Relaxed);
            if req.uri().path().starts_with("/api/") {
                return ollama::unauthorized();
            }
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.shutting_down.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting down"})),
        )
            .into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

async fn openapi_doc() -> Response {
    Json(openapi::document()).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let cfg = st.sched.config();
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.opts.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "ferrox",
            "meta": {"n_ctx_per_slot": cfg.n_ctx, "n_slots": cfg.n_slots, "n_vocab": st.tok.n_vocab()}
        }]
    }))
    .into_response()
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let body = render_metrics(&st);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

fn render_metrics(st: &AppState) -> String {
    use std::fmt::Write;
    let s: &SchedulerStats = st.sched.stats();
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut o = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, v: f64| {
        let _ = writeln!(
            o,
            "# HELP ferrox_{name} {help}\n# TYPE ferrox_{name} {kind}\nferrox_{name} {v}"
        );
    };
    metric(
        "requests_chat_total",
        "counter",
        "Chat completion requests received.",
        l(&st.metrics.chat) as f64,
    );
    metric(
        "requests_completions_total",
        "counter",
        "Completion requests received.",
        l(&st.metrics.completions) as f64,
    );
    metric(
        "requests_embeddings_total",
        "counter",
        "Embedding requests received.",
        l(&st.metrics.embeddings) as f64,
    );
    metric(
        "requests_rejected_busy_total",
        "counter",
        "Requests refused because the queue was full.",
        l(&st.metrics.rejected_busy) as f64,
    );
    metric(
        "responses_4xx_total",
        "counter",
        "Requests answered with a client error.",
        l(&st.metrics.errors_4xx) as f64,
    );
    metric(
        "responses_5xx_total",
        "counter",
        "Requests answered with a server error.",
        l(&st.metrics.errors_5xx) as f64,
    );
    metric(
        "sequences_submitted_total",
        "counter",
        "Sequences (choices) accepted by the engine.",
        l(&s.submitted) as f64,
    );
    metric(
        "sequences_finished_total",
        "counter",
        "Sequences that ended.",
        l(&s.finished) as f64,
    );
    metric(
        "sequences_cancelled_total",
        "counter",
        "Sequences cancelled (client gone or shutdown).",
        l(&s.cancelled) as f64,
    );
    metric(
        "sequences_failed_total",
        "counter",
        "Sequences the engine failed on.",
        l(&s.failed) as f64,
    );
    metric(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens of started sequences.",
        l(&s.prompt_tokens) as f64,
    );
    metric(
        "prompt_tokens_cached_total",
        "counter",
        "Prompt tokens reused from a slot's cache.",
        l(&s.cached_prompt_tokens) as f64,
    );
    metric(
        "generated_tokens_total",
        "counter",
        "Tokens generated.",
        l(&s.generated_tokens) as f64,
    );
    metric(
        "engine_steps_total",
        "counter",
        "Forward passes.",
        l(&s.steps) as f64,
    );
    metric(
        "engine_batch_tokens_total",
        "counter",
        "Tokens evaluated in all forward passes.",
        l(&s.batch_tokens) as f64,
    );
    // The parts before the whole: the engine adds a step's busy time
    // first and its parts after it (Release), so parts read here (Acquire)
    // never hold a step the busy time read after them lacks.
    let (forward, sample) = (s.forward_ns.load(Ordering::Acquire), s.sample_ns.load(Ordering::Acquire));
    let busy = l(&s.busy_us) as f64 / 1e6;
    metric(
        "engine_busy_seconds_total",
        "counter",
        "Time the engine spent in forward passes and sampling.",
        busy,
    );
    metric(
        "engine_forward_seconds_total",
        "counter",
        "Of the busy time, the forward passes (logits read back included).",
        forward as f64 / 1e9,
    );
    metric(
        "engine_sample_seconds_total",
        "counter",
        "Of the busy time, drawing the samples of every sequence.",
        sample as f64 / 1e9,
    );
    metric(
        "generation_tokens_per_second",
        "gauge",
        "Generated tokens per second of engine busy time, since start.",
        if busy > 0.0 {
            l(&s.generated_tokens) as f64 / busy
        } else {
            0.0
        },
    );
    metric(
        "engine_rows_selected_total",
        "counter",
        "Logits rows sampled from a top-k selection made on the device (only the selection read back).",
        l(&s.rows_selected) as f64,
    );
    metric(
        "engine_rows_whole_total",
        "counter",
        "Logits rows read back whole and sampled on the host.",
        l(&s.rows_whole) as f64,
    );
    let (drafted, accepted) = (l(&s.draft_tokens), l(&s.draft_tokens_accepted));
    metric(
        "draft_tokens_total",
        "counter",
        "Drafted tokens the target verified (speculative decoding).",
        drafted as f64,
    );
    metric(
        "draft_tokens_accepted_total",
        "counter",
        "Drafted tokens the target kept.",
        accepted as f64,
    );
    metric(
        "draft_acceptance_ratio",
        "gauge",
        "Drafted tokens kept over drafted tokens verified, since start (0 before any).",
        if drafted > 0 {
            accepted as f64 / drafted as f64
        } else {
            0.0
        },
    );
    metric(
        "queue_depth",
        "gauge",
        "Sequences waiting for a slot.",
        l(&s.waiting) as f64,
    );
    metric(
        "slots_active",
        "gauge",
        "Sequences holding a KV slot.",
        l(&s.active) as f64,
    );
    metric(
        "slots_total",
        "gauge",
        "KV slots.",
        st.sched.config().n_slots as f64,
    );
    let held = l(&s.kv_cache_tokens) as f64;
    metric(
        "kv_cache_tokens",
        "gauge",
        "Positions the KV cache holds over every slot (running sequences and kept prefixes).",
        held,
    );
    let cfg = st.sched.config();
    metric(
        "kv_cache_usage_ratio",
        "gauge",
        "Of the KV cache's positions (slots x positions a slot), those held.",
        held / (cfg.n_slots * cfg.n_ctx).max(1) as f64,
    );
    // Only where the model runs on a device of its own (CUDA).
    let device_total = l(&s.device_memory_total);
    if device_total > 0 {
        metric(
            "device_memory_used_bytes",
            "gauge",
            "The device's memory in use (every process's, as its driver counts), read at most once a second.",
            l(&s.device_memory_used) as f64,
        );
        metric("device_memory_total_bytes", "gauge", "The device's memory.", device_total as f64);
    }
    let _ = writeln!(
        o,
        "# HELP ferrox_time_to_first_token_seconds From submission to the first generated token."
    );
    let _ = writeln!(o, "# TYPE ferrox_time_to_first_token_seconds histogram");
    for (b, c) in TTFT_BUCKETS_S.iter().zip(&s.ttft_buckets) {
        let _ = writeln!(
            o,
            "ferrox_time_to_first_token_seconds_bucket{{le=\"{b}\"}} {}",
            l(c)
        );
    }
    let _ = writeln!(
        o,
        "ferrox_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}",
        l(&s.ttft_count)
    );
    let _ = writeln!(
        o,
        "ferrox_time_to_first_token_seconds_sum {}",
        l(&s.ttft_us_sum) as f64 / 1e6
    );
    let _ = writeln!(
        o,
        "ferrox_time_to_first_token_seconds_count {}",
        l(&s.ttft_count)
    );
    o
}

/// Events of one request's choices, tagged with the choice index.
type Tagged = (usize, SeqEvent);

struct ChannelSink {
    index: usize,
    tx: mpsc::UnboundedSender<Tagged>,
}

impl EventSink for ChannelSink {
    fn send(&mut self, event: SeqEvent) -> bool {
        self.tx.send((self.index, event)).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Parses a JSON body into `T`, every failure a 400 naming the problem.
fn parse_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ApiError> {
    if let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        if !ct.starts_with("application/json") {
            return Err(ApiError::invalid(
                None,
                format!("the body must be JSON (Content-Type: application/json), got {ct:?}"),
            ));
        }
    }
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body)).map_err(|e| {
        let mut path = e.path().to_string();
        // Fields of the flattened `Common` lose their path inside serde's
        // flatten buffer: `Common` alone finds which one it was.
        if path == "." {
            if let Err(c) = serde_path_to_error::deserialize::<_, openai::Common>(&mut serde_json::Deserializer::from_slice(body)) {
                path = c.path().to_string();
            }
        }
        let e = e.into_inner();
        match e.classify() {
            serde_json::error::Category::Data => data_error(&path, &e),
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                ApiError::invalid(None, format!("the body is not valid JSON: {e}"))
            }
            serde_json::error::Category::Io => ApiError::invalid(None, format!("the body could not be read: {e}")),
        }
    })
}

/// A well-formed body whose field is missing or of the wrong type: named
/// (as `param` too), in JSON's words rather than Rust's.
fn data_error(path: &str, e: &serde_json::Error) -> ApiError {
    let msg = e.to_string();
    // serde_json appends the position; the field's name says more.
    let msg = msg.rsplit_once(" at line ").map_or(msg.as_str(), |(m, _)| m);
    let at = |field: &str| match path {
        "." | "" => field.to_string(),
        p if field.is_empty() => p.to_string(),
        p => format!("{p}.{field}"),
    };
    if let Some(field) = msg.strip_prefix("missing field `").and_then(|f| f.strip_suffix('`')) {
        let param = at(field);
        return ApiError::invalid(Some(param.clone()), format!("`{param}` is required"));
    }
    let param = at("");
    let what = if let Some((got, want)) = msg.strip_prefix("invalid type: ").and_then(|r| r.split_once(", expected ")) {
        format!("is {}; expected {}", json_value_words(got), json_type_words(want))
    } else if let Some((got, want)) = msg.strip_prefix("invalid value: ").and_then(|r| r.split_once(", expected ")) {
        format!("is {}; expected {}", json_value_words(got), json_type_words(want))
    } else if msg.starts_with("data did not match any variant") {
        "has a shape this endpoint does not take (see /openapi.json)".to_string()
    } else {
        msg.to_string()
    };
    if param.is_empty() || param == "." {
        return ApiError::invalid(None, format!("the body {what}"));
    }
    ApiError::invalid(Some(param.clone()), format!("`{param}` {what}"))
}

/// serde's description of a value found, in JSON's words.
fn json_value_words(got: &str) -> String {
    let strip = |s: &str| s.trim_matches('`').to_string();
    match got.split_once(' ') {
        Some(("string", v)) => format!("the string {v}"),
        Some(("integer" | "floating", v)) => strip(v.trim_start_matches("point ")),
        Some(("boolean", v)) => strip(v),
        _ => match got {
            "map" => "an object".into(),
            "sequence" => "an array".into(),
            "unit value" | "null" => "null".into(),
            other => other.to_string(),
        },
    }
}

/// serde's description of an expected Rust type, in JSON's words.
fn json_type_words(want: &str) -> String {
    match want {
        "f32" | "f64" => "a number".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer".into(),
        "a sequence" => "an array".into(),
        "a map" => "an object".into(),
        w if w.starts_with("struct ") => "an object".into(),
        w => w.to_string(),
    }
}

/// What kind of endpoint a generation answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

/// A request turned into engine terms.
struct Job {
    api: Api,
    prompt: Vec<u32>,
    v: Validated,
    /// `top_logprobs` (chat) / `logprobs` (completions); `None`: no logprobs.
    logprobs: Option<usize>,
    /// The output's constraint (`response_format`, `grammar`, ...).
    grammar: Option<Grammar>,
    /// The functions the reply may call (chat only).
    tools: Option<ToolSet>,
    /// A harmony reply (gpt-oss) whose channels become `reasoning_content`
    /// and `content` (chat only).
    harmony: bool,
    echo: Option<String>,
    /// Draft sizes the request asked for (`None`: the server's).
    draft: Option<DraftParams>,
}

/// The request's output constraint compiled: at most one of
/// `response_format` (JSON), `json_schema`, `grammar` and `regex`; a spec
/// llguidance cannot compile is a 400 on its field.
fn grammar_of(st: &AppState, rf: &Option<ResponseFormat>, c: &Common) -> Result<Option<Grammar>, ApiError> {
    compile_one(st, specs_of(rf, c))
}

/// [`grammar_of`] for a chat reply: under harmony (gpt-oss) a JSON reply
/// is the final channel's message, so the grammar writes its header first,
/// as llama.cpp's gpt-oss grammar does (without the analysis messages it
/// lets come before; see `ToolSet::forced`). Grammars and regexes the
/// request spells out constrain the whole reply, header and all.
fn chat_grammar_of(st: &AppState, rf: &Option<ResponseFormat>, c: &Common, harmony: bool) -> Result<Option<Grammar>, ApiError> {
    let mut specs = specs_of(rf, c);
    if harmony {
        for (_, spec) in specs.iter_mut() {
            let schema = match spec {
                Spec::JsonObject => json!({"type": "object"}),
                Spec::JsonSchema(s) => s.clone(),
                _ => continue,
            };
            let header = serde_json::to_string(harmony::FINAL_HEADER).unwrap_or_default();
            *spec = Spec::Lark(format!("start: {header} %json {}\n", constrain::with_json_options(schema)));
        }
    }
    compile_one(st, specs)
}

fn specs_of<'a>(rf: &Option<ResponseFormat>, c: &Common) -> Vec<(&'a str, Spec)> {
    let mut specs: Vec<(&str, Spec)> = Vec::new();
    match rf {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => specs.push(("response_format", Spec::JsonObject)),
        Some(ResponseFormat::JsonSchema { json_schema }) => specs.push((
            "response_format",
            json_schema.schema.clone().map_or(Spec::JsonObject, Spec::JsonSchema),
        )),
    }
    if let Some(s) = &c.json_schema {
        specs.push(("json_schema", Spec::JsonSchema(s.clone())));
    }
    if let Some(g) = c.grammar.as_ref().filter(|g| !g.trim().is_empty()) {
        specs.push(("grammar", Spec::Gbnf(g.clone())));
    }
    if let Some(r) = &c.regex {
        specs.push(("regex", Spec::Regex(r.clone())));
    }
    specs
}

/// The one spec of `specs` compiled (none: no constraint; several: a 400).
fn compile_one(st: &AppState, mut specs: Vec<(&str, Spec)>) -> Result<Option<Grammar>, ApiError> {
    if specs.len() > 1 {
        let names: Vec<&str> = specs.iter().map(|(n, _)| *n).collect();
        return Err(ApiError::invalid(
            Some(names[1].into()),
            format!("one output constraint per request, got {}", names.join(" and ")),
        ));
    }
    let Some((param, spec)) = specs.pop() else {
        return Ok(None);
    };
    let grammars = st
        .grammars
        .as_ref()
        .map_err(|e| ApiError::invalid(Some(param.into()), format!("constrained decoding is unavailable for this model: {e}")))?;
    grammars
        .compile(&spec)
        .map(Some)
        .map_err(|e| ApiError::invalid(Some(param.into()), format!("{param}: {e}")))
}

/// A conversation through the model's chat template, with the assistant's
/// turn opened: the template and the text.
fn render_chat<'s>(st: &'s AppState, messages: &[Message]) -> Result<(&'s ChatTemplate, String), ApiError> {
    render_chat_tools(st, messages, None)
}

/// [`render_chat`] with the request's tools: the template sees them as
/// `tools` (a template without tool support gets them described in the
/// system turn), and assistant `tool_calls` and `tool` turns as sent.
fn render_chat_tools<'s>(
    st: &'s AppState,
    messages: &[Message],
    tools: Option<&ToolSet>,
) -> Result<(&'s ChatTemplate, String), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            Some("messages".into()),
            "`messages` must not be empty",
        ));
    }
    let mut msgs = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => {
                return Err(ApiError::invalid(
                    Some(format!("messages[{i}].role")),
                    format!("unknown role {other:?} (system, developer, user, assistant, tool)"),
                ))
            }
        };
        msgs.push(ChatMessage::new(role, openai::content_text(m, i)?));
    }
    let with_calls = messages.iter().any(|m| m.tool_calls.is_some() || m.tool_call_id.is_some());
    let template = st.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            Some("messages".into()),
            format!(
                "this model cannot chat: {}; use /v1/completions",
                st.template_error.as_deref().unwrap_or("no template")
            ),
        )
    })?;
    // Reasoning sent back reaches a harmony template (as `thinking`); other
    // templates render a turn's content only, as before.
    let harmony = Family::detect(template.source()) == Family::Harmony;
    let with_reasoning = harmony && messages.iter().any(|m| m.reasoning_content.is_some());
    let text = if tools.is_none() && !with_calls && !with_reasoning {
        template.render(&msgs, true)
    } else {
        let mut values: Vec<Value> = msgs
            .iter()
            .zip(messages)
            .map(|(m, src)| {
                let mut v = json!({"role": m.role, "content": m.content});
                if let Some(calls) = &src.tool_calls {
                    v["tool_calls"] = Value::Array(calls.iter().map(tools::calls_for_template).collect());
                }
                if let Some(id) = &src.tool_call_id {
                    v["tool_call_id"] = json!(id);
                }
                if let Some(n) = &src.name {
                    v["name"] = json!(n);
                }
                // llama.cpp's gpt-oss handling: the template reads the
                // reasoning as `thinking`, and a turn that calls carries
                // it instead of content.
                if let Some(r) = src.reasoning_content.as_ref().filter(|_| harmony) {
                    v["thinking"] = json!(r);
                    if src.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
                        if let Some(o) = v.as_object_mut() {
                            o.remove("content");
                        }
                    }
                }
                v
            })
            .collect();
        if Family::detect(template.source()) == Family::Generic {
            values = tools::generic_turns(values);
        }
        if let Some(t) = tools.filter(|t| t.family == Family::Generic) {
            match values.first_mut().filter(|v| v["role"] == "system") {
                Some(sys) => {
                    let s = format!("{}\n\n{}", sys["content"].as_str().unwrap_or_default(), t.generic_prompt());
                    sys["content"] = json!(s);
                }
                None => values.insert(0, json!({"role": "system", "content": t.generic_prompt()})),
            }
        }
        let size = values.iter().map(|v| v.to_string().len()).sum();
        template.render_with_tools(&values, tools.map(ToolSet::template_tools).as_ref(), size, true)
    }
    .map_err(|e| ApiError::invalid(Some("messages".into()), e.to_string()))?;
    Ok((template, text))
}

async fn chat(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.metrics.chat.fetch_add(1, Ordering::Relaxed);
    let job = (|| {
        let req: ChatRequest = parse_body(&headers, &body)?;
        let family = st.template.as_ref().map_or(Family::Generic, |t| Family::detect(t.source()));
        let tools = tools::validate(req.tools.as_deref(), req.tool_choice.as_ref(), req.parallel_tool_calls, family)?;
        let (template, text) = render_chat_tools(&st, &req.messages, tools.as_ref())?;
        let with_bos = !template.starts_with_bos(&text);
        let prompt = st
            .tok
            .encode(text.as_bytes(), with_bos, true)
            .map_err(|e| ApiError::invalid(Some("messages".into()), e.to_string()))?;
        let top = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
            (_, Some(t)) if !(0..=20).contains(&t) => {
                return Err(ApiError::out_of_range("top_logprobs", t, "0..=20"))
            }
            (false, Some(t)) if t > 0 => {
                return Err(ApiError::invalid(
                    Some("top_logprobs".into()),
                    "`top_logprobs` requires `logprobs: true`",
                ))
            }
            (true, t) => Some(t.unwrap_or(0) as usize),
            (false, _) => None,
        };
        let v = openai::validate_sampling(&req.common, top.unwrap_or(0), st.tok.n_vocab(), None)?;
        Ok(Job {
            api: Api::Chat,
            prompt,
            v,
            logprobs: top,
            grammar: match tools.as_ref().and_then(|t| t.forced(&st.tok)) {
                None => chat_grammar_of(&st, &req.response_format, &req.common, family == Family::Harmony)?,
                Some(forced) => {
                    if grammar_of(&st, &req.response_format, &req.common)?.is_some() {
                        return Err(ApiError::invalid(
                            Some("tool_choice".into()),
                            "a required tool call cannot be combined with response_format, json_schema, grammar or regex",
                        ));
                    }
                    compile_one(&st, vec![("tool_choice", forced)])?
                }
            },
            tools,
            harmony: family == Family::Harmony,
            echo: None,
            draft: openai::validate_draft(&req.common, st.sched.speculative())?,
        })
    })();
    run_job(st, job).await
}

async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.metrics.completions.fetch_add(1, Ordering::Relaxed);
    let job = (|| {
        let req: CompletionRequest = parse_body(&headers, &body)?;
        let one = |n: usize| {
            if n == 1 {
                Ok(())
            } else {
                Err(ApiError::invalid(
                    Some("prompt".into()),
                    format!("one prompt per request is supported, got {n}"),
                ))
            }
        };
        let (text, ids) = match req.prompt {
            Prompt::Text(t) => (Some(t), None),
            Prompt::Texts(mut v) => {
                one(v.len())?;
                (v.pop(), None)
            }
            Prompt::Tokens(ids) => (None, Some(ids)),
            Prompt::TokenLists(mut v) => {
                one(v.len())?;
                (None, v.pop())
            }
        };
        let prompt = match (&text, ids) {
            (Some(t), _) => st
                .tok
                .encode(t.as_bytes(), true, true)
                .map_err(|e| ApiError::invalid(Some("prompt".into()), e.to_string()))?,
            (None, Some(ids)) => ids,
            (None, None) => Vec::new(),
        };
        let logprobs = match req.logprobs {
            None => None,
            Some(n) if (0..=20).contains(&n) => Some(n as usize),
            Some(n) => return Err(ApiError::out_of_range("logprobs", n, "0..=20")),
        };
        let v = openai::validate_sampling(
            &req.common,
            logprobs.unwrap_or(0),
            st.tok.n_vocab(),
            Some(16),
        )?;
        let echo = match req.echo {
            Some(true) => Some(text.unwrap_or_else(|| {
                String::from_utf8_lossy(&st.tok.decode(&prompt, false).unwrap_or_default())
                    .into_owned()
            })),
            _ => None,
        };
        Ok(Job {
            api: Api::Completion,
            prompt,
            v,
            logprobs,
            grammar: grammar_of(&st, &req.response_format, &req.common)?,
            tools: None,
            harmony: false,
            echo,
            draft: openai::validate_draft(&req.common, st.sched.speculative())?,
        })
    })();
    run_job(st, job).await
}

fn submit_error(st: &AppState, e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull { .. } => {
            st.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
            ApiError::busy(e.to_string())
        }
        SubmitError::ShuttingDown => ApiError::unavailable(e.to_string()),
        SubmitError::PromptTooLong { .. } => {
            ApiError::invalid(Some("messages".into()), e.to_string())
                .with_code("context_length_exceeded")
        }
        SubmitError::EmptyPrompt | SubmitError::BadToken { .. } => {
            ApiError::invalid(Some("prompt".into()), e.to_string())
        }
        SubmitError::Sampling(_) => ApiError::invalid(None, e.to_string()),
        SubmitError::Draft { .. } => {
            ApiError::invalid(Some("speculative.n_max".into()), e.to_string())
        }
    }
}

async fn run_job(st: Arc<AppState>, job: Result<Job, ApiError>) -> Response {
    let job = match job {
        Ok(j) => j,
        Err(e) => return count_error(&st, e).into_response(),
    };
    let rx = match submit_job(&st, &job) {
        Ok(rx) => rx,
        Err(e) => return count_error(&st, e).into_response(),
    };
    let id = st.new_id(if job.api == Api::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    });
    let out = Output {
        st: Arc::clone(&st),
        job,
        id,
        created: st.now(),
        _open: OpenGuard::new(&st),
    };
    if out.job.v.stream {
        stream_response(out, rx).into_response()
    } else {
        whole_response(out, rx).await
    }
}

/// Hands a job's sequences (one per choice) to the engine; their events come
/// back on the receiver, tagged with the choice index. Shared by the OpenAI
/// and the Ollama endpoints, which differ only in how they shape the events.
fn submit_job(st: &Arc<AppState>, job: &Job) -> Result<mpsc::UnboundedReceiver<Tagged>, ApiError> {
    if st.shutting_down.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down".into()));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let mut reqs = Vec::with_capacity(job.v.n);
    for i in 0..job.v.n {
        let mut sampling = job.v.sampling.clone();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
        let constraint = job.grammar.as_ref().map(Grammar::constraint);
        reqs.push(SeqRequest {
            prompt: job.prompt.clone(),
            max_tokens: job.v.max_tokens,
            stop: job.v.stop.clone(),
            sampling,
            ignore_eos: job.v.ignore_eos,
            cache_prompt: job.v.cache_prompt,
            constraint,
            draft: job.draft,
            embed: None,
            sink: Box::new(ChannelSink {
                index: i,
                tx: tx.clone(),
            }),
        });
    }
    drop(tx);
    st.sched.submit_all(reqs).map_err(|e| submit_error(st, e))?;
    Ok(rx)
}

fn count_error(st: &AppState, e: ApiError) -> ApiError {
    let c = if e.status.is_server_error() {
        &st.metrics.errors_5xx
    } else {
        &st.metrics.errors_4xx
    };
    c.fetch_add(1, Ordering::Relaxed);
    e
}

/// Counts a response as open until it is dropped (body sent or client gone).
struct OpenGuard(Arc<AppState>);

impl OpenGuard {
    fn new(st: &Arc<AppState>) -> OpenGuard {
        st.open_responses.fetch_add(1, Ordering::SeqCst);
        OpenGuard(Arc::clone(st))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open_responses.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Shapes engine events into OpenAI objects.
struct Output {
    st: Arc<AppState>,
    job: Job,
    id: String,
    created: u64,
    _open: OpenGuard,
}

#[derive(Default)]
struct Choice {
    /// A streamed harmony reply's parser.
    harmony: Option<harmony::Harmony>,
    text: String,
    tokens: Vec<GeneratedToken>,
    summary: Option<SeqSummary>,
    failed: Option<String>,
    started: bool,
}

impl Output {
    fn piece(&self, id: u32) -> String {
        String::from_utf8_lossy(self.st.tok.piece(id, true).unwrap_or_default()).into_owned()
    }

    fn chat_logprob(&self, t: &GeneratedToken) -> Value {
        let entry = |id: u32, lp: f32| {
            let s = self.piece(id);
            json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})
        };
        let mut e = entry(t.sampled.token, t.sampled.logprob);
        e["top_logprobs"] = Value::Array(
            t.sampled
                .top
                .iter()
                .map(|&(id, lp)| entry(id, lp))
                .collect(),
        );
        e
    }

    fn completion_logprobs(&self, tokens: &[GeneratedToken], offset0: usize) -> Value {
        let mut offset = offset0;
        let mut text_offset = Vec::new();
        for t in tokens {
            text_offset.push(offset);
            offset += t.text.len();
        }
        json!({
            "tokens": tokens.iter().map(|t| self.piece(t.sampled.token)).collect::<Vec<_>>(),
            "token_logprobs": tokens.iter().map(|t| t.sampled.logprob).collect::<Vec<_>>(),
            "top_logprobs": tokens.iter().map(|t| {
                t.sampled.top.iter().map(|&(id, lp)| (self.piece(id), json!(lp))).collect::<serde_json::Map<_, _>>()
            }).collect::<Vec<_>>(),
            "text_offset": text_offset,
        })
    }

    fn usage(&self, choices: &[Choice]) -> Value {
        let prompt = self.job.prompt.len();
        let cached = choices
            .iter()
            .filter_map(|c| c.summary.as_ref())
            .map(|s| s.n_cached)
            .max()
            .unwrap_or(0);
        let completion: usize = choices
            .iter()
            .map(|c| c.summary.as_ref().map_or(c.tokens.len(), |s| s.n_generated))
            .sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    /// llama-server's `timings` over the choices that ended: prompt tokens
    /// evaluated (not cached) and the time to the first token, tokens
    /// generated and the decode time (the slowest choice's times), and with
    /// speculative decoding the tokens drafted and kept.
    fn timings<'s>(&self, summaries: impl Iterator<Item = &'s SeqSummary>) -> Value {
        let (mut cached, mut generated, mut drafted, mut accepted) = (0, 0, 0, 0);
        let (mut ttft, mut decode) = (Duration::ZERO, Duration::ZERO);
        for s in summaries {
            cached = cached.max(s.n_cached);
            generated += s.n_generated;
            drafted += s.n_drafted;
            accepted += s.n_draft_accepted;
            ttft = ttft.max(s.time_to_first_token);
            decode = decode.max(s.decode_time);
        }
        let prompt_n = self.job.prompt.len().saturating_sub(cached);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per = |n: usize, d: Duration| if n > 0 { ms(d) / n as f64 } else { 0.0 };
        let rate = |n: usize, d: Duration| {
            if d > Duration::ZERO {
                n as f64 / d.as_secs_f64()
            } else {
                0.0
            }
        };
        let mut t = json!({
            "prompt_n": prompt_n,
            "prompt_ms": ms(ttft),
            "prompt_per_token_ms": per(prompt_n, ttft),
            "prompt_per_second": rate(prompt_n, ttft),
            "predicted_n": generated,
            "predicted_ms": ms(decode),
            "predicted_per_token_ms": per(generated, decode),
            "predicted_per_second": rate(generated, decode),
        });
        if self.st.sched.speculative().is_some() {
            t["draft_n"] = json!(drafted);
            t["draft_n_accepted"] = json!(accepted);
        }
        t
    }

    /// With `-v`: one line on stderr for the finished request.
    fn log_done(&self, choices: &[Choice]) {
        if !self.st.opts.verbose {
            return;
        }
        let t = self.timings(choices.iter().filter_map(|c| c.summary.as_ref()));
        let n = |k: &str| t[k].as_u64().unwrap_or(0);
        let f = |k: &str| t[k].as_f64().unwrap_or(0.0);
        let mut line = format!(
            "ferrox: {}: prompt {} tokens ({} evaluated) in {:.1} ms; {} tokens generated in {:.1} ms ({:.2} t/s)",
            self.id,
            self.job.prompt.len(),
            n("prompt_n"),
            f("prompt_ms"),
            n("predicted_n"),
            f("predicted_ms"),
            f("predicted_per_second"),
        );
        if t.get("draft_n").is_some() {
            let (d, a) = (n("draft_n"), n("draft_n_accepted"));
            let pct = if d > 0 { 100.0 * a as f64 / d as f64 } else { 0.0 };
            line.push_str(&format!("; speculative: {d} drafted, {a} accepted ({pct:.1}%)"));
        }
        eprintln!("{line}");
    }

    /// A reply under `tools` or harmony: the assistant message (its calls
    /// and channels parsed out of the text) and the finish reason
    /// (`tool_calls` when it calls).
    fn tool_message(&self, choice: usize, text: &str, fin: &'static str) -> (Value, &'static str) {
        if self.job.harmony {
            let r = harmony::Harmony::parse(text);
            return self.harmony_message(choice, r.reasoning, r.content, r.calls, fin);
        }
        let Some(set) = &self.job.tools else {
            return (json!({"role": "assistant", "content": text, "refusal": null}), fin);
        };
        let (content, calls) = set.parse(text);
        if calls.is_empty() {
            return (json!({"role": "assistant", "content": text, "refusal": null}), fin);
        }
        self.message_with_calls(choice, content, &calls, fin)
    }

    fn message_with_calls(&self, choice: usize, content: String, calls: &[tools::Call], fin: &'static str) -> (Value, &'static str) {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                json!({"id": format!("call_{}_{choice}_{k}", self.id), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        let content = if content.is_empty() { Value::Null } else { json!(content) };
        let fin = if fin == "stop" { "tool_calls" } else { fin };
        (json!({"role": "assistant", "content": content, "refusal": null, "tool_calls": calls}), fin)
    }

    /// A harmony reply's message: `reasoning_content` (when the analysis
    /// channel said anything, as llama-server), `content`, and the calls to
    /// offered tools (calls to others, and any without `tools`, dropped).
    fn harmony_message(
        &self,
        choice: usize,
        reasoning: String,
        content: String,
        raw: Vec<harmony::RawCall>,
        fin: &'static str,
    ) -> (Value, &'static str) {
        let calls = self.job.tools.as_ref().map(|t| t.harmony_calls(raw)).unwrap_or_default();
        let (mut m, fin) = if calls.is_empty() {
            (json!({"role": "assistant", "content": content, "refusal": null}), fin)
        } else {
            self.message_with_calls(choice, content, &calls, fin)
        };
        if !reasoning.is_empty() {
            m["reasoning_content"] = json!(reasoning);
        }
        (m, fin)
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.job.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completion, _) => "text_completion",
        }
    }
}

/// OpenAI's finish reasons, and `cancelled` for a reply the server cut
/// (shutdown past its grace period): a client must not take a cut reply for
/// a finished one. (A client that went away reads nothing.)
fn finish_reason(s: &SeqSummary) -> &'static str {
    match s.finish {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

async fn whole_response(out: Output, mut rx: mpsc::UnboundedReceiver<Tagged>) -> Response {
    let n = out.job.v.n;
    let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
    while let Some((i, ev)) = rx.recv().await {
        let Some(c) = choices.get_mut(i) else {
            continue;
        };
        match ev {
            SeqEvent::Started { .. } => c.started = true,
            SeqEvent::Token(t) => {
                c.text.push_str(&t.text);
                c.tokens.push(t);
            }
            SeqEvent::Done(s) => {
                c.text.push_str(&s.tail);
                c.summary = Some(s);
            }
            SeqEvent::Failed(e) => c.failed = Some(e),
            SeqEvent::Embedding(_) => {}
        }
    }
    if let Some(e) = choices.iter().find_map(|c| c.failed.clone()) {
        return count_error(&out.st, ApiError::internal(e)).into_response();
    }
    if choices.iter().any(|c| c.summary.is_none()) {
        return count_error(
            &out.st,
            ApiError::internal("the engine stopped before the request finished".into()),
        )
        .into_response();
    }
    let body_choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let fin = c.summary.as_ref().map_or("stop", finish_reason);
            match out.job.api {
                Api::Chat if out.job.tools.is_some() || out.job.harmony => {
                    let (message, fin) = out.tool_message(i, &c.text, fin);
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": out.job.logprobs.map(|_| json!({"content": c.tokens.iter().map(|t| out.chat_logprob(t)).collect::<Vec<_>>(), "refusal": null})),
                        "finish_reason": fin,
                    })
                }
                Api::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": c.text, "refusal": null},
                    "logprobs": out.job.logprobs.map(|_| json!({"content": c.tokens.iter().map(|t| out.chat_logprob(t)).collect::<Vec<_>>(), "refusal": null})),
                    "finish_reason": fin,
                }),
                Api::Completion => {
                    let echo = out.job.echo.clone().unwrap_or_default();
                    json!({
                        "index": i,
                        "text": format!("{echo}{}", c.text),
                        "logprobs": out.job.logprobs.map(|_| out.completion_logprobs(&c.tokens, echo.len())),
                        "finish_reason": fin,
                    })
                }
            }
        })
        .collect();
    out.log_done(&choices);
    Json(json!({
        "id": out.id,
        "object": out.object(false),
        "created": out.created,
        "model": out.st.opts.model_name,
        "system_fingerprint": "ferrox",
        "choices": body_choices,
        "usage": out.usage(&choices),
        "timings": out.timings(choices.iter().filter_map(|c| c.summary.as_ref())),
    }))
    .into_response()
}

/// The state of one SSE stream: pending lines, and what is left to say.
struct StreamState {
    out: Output,
    rx: mpsc::UnboundedReceiver<Tagged>,
    choices: Vec<Choice>,
    queued: VecDeque<String>,
    done: bool,
}

impl StreamState {
    /// The end of a choice whose reply was parsed whole (tool calls,
    /// harmony): what is left of its text (`delta`) with the parsed calls,
    /// indexed, as one chunk where there is any, then the chunk carrying the
    /// finish reason and the timings.
    fn finish_parsed(&mut self, i: usize, mut delta: Value, message: &Value, fin: &'static str, s: SeqSummary) {
        if let Some(calls) = message["tool_calls"].as_array() {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let mut c = c.clone();
                    c["index"] = json!(k);
                    c
                })
                .collect();
            delta["tool_calls"] = Value::Array(calls);
        }
        if delta != json!({}) {
            let c = json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": null});
            let line = self.chunk(vec![c]);
            self.queued.push_back(line);
        }
        let c = json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": fin});
        let mut line = self.chunk_value(vec![c]);
        line["timings"] = self.out.timings(std::iter::once(&s));
        self.queued.push_back(line.to_string());
        self.choices[i].summary = Some(s);
    }

    fn chunk(&self, choices: Vec<Value>) -> String {
        self.chunk_value(choices).to_string()
    }

    fn chunk_value(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.out.id,
            "object": self.out.object(true),
            "created": self.out.created,
            "model": self.out.st.opts.model_name,
            "system_fingerprint": "ferrox",
            "choices": choices,
        })
    }

    fn text_choice(
        &self,
        i: usize,
        text: &str,
        token: Option<&GeneratedToken>,
        finish: Option<&str>,
    ) -> Value {
        match self.out.job.api {
            Api::Chat => {
                let delta = match (finish, text.is_empty()) {
                    (Some(_), true) => json!({}),
                    _ => json!({"content": text}),
                };
                json!({
                    "index": i,
                    "delta": delta,
                    "logprobs": match (self.out.job.logprobs, token) {
                        (Some(_), Some(t)) => json!({"content": [self.out.chat_logprob(t)], "refusal": null}),
                        _ => Value::Null,
                    },
                    "finish_reason": finish,
                })
            }
            Api::Completion => json!({
                "index": i,
                "text": text,
                "logprobs": match (self.out.job.logprobs, token) {
                    (Some(_), Some(t)) => self.out.completion_logprobs(std::slice::from_ref(t), 0),
                    _ => Value::Null,
                },
                "finish_reason": finish,
            }),
        }
    }

    /// Turns one engine event into the SSE lines it causes.
    fn on_event(&mut self, i: usize, ev: SeqEvent) {
        if i >= self.choices.len() {
            return;
        }
        match ev {
            SeqEvent::Started { .. } => {
                self.choices[i].started = true;
                if self.out.job.api == Api::Chat {
                    let c = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                    let s = self.chunk(vec![c]);
                    self.queued.push_back(s);
                } else if let Some(echo) = self.out.job.echo.clone() {
                    let c = self.text_choice(i, &echo, None, None);
                    let s = self.chunk(vec![c]);
                    self.queued.push_back(s);
                }
            }
            SeqEvent::Token(t) if self.out.job.harmony => {
                // Channels stream as they settle; calls wait for the end.
                let d = self.choices[i].harmony.get_or_insert_with(harmony::Harmony::new).push(&t.text);
                if !d.is_empty() || self.out.job.logprobs.is_some() {
                    let mut c = self.text_choice(i, "", Some(&t), None);
                    c["delta"] = harmony_delta(d);
                    let s = self.chunk(vec![c]);
                    self.queued.push_back(s);
                }
                self.choices[i].tokens.push(t);
            }
            SeqEvent::Done(s) if self.out.job.harmony => {
                let mut h = self.choices[i].harmony.take().unwrap_or_default();
                let mut d = h.push(&s.tail);
                let (tail, raw) = h.finish();
                d.reasoning.push_str(&tail.reasoning);
                d.content.push_str(&tail.content);
                let (message, fin) = self.out.harmony_message(i, String::new(), String::new(), raw, finish_reason(&s));
                let delta = harmony_delta(d);
                self.finish_parsed(i, delta, &message, fin, s);
            }
            SeqEvent::Token(t) if self.out.job.tools.is_some() => {
                // A reply that may call tools is parsed whole: its text
                // waits for the end.
                self.choices[i].text.push_str(&t.text);
                self.choices[i].tokens.push(t);
            }
            SeqEvent::Done(s) if self.out.job.tools.is_some() => {
                let mut text = std::mem::take(&mut self.choices[i].text);
                text.push_str(&s.tail);
                let (message, fin) = self.out.tool_message(i, &text, finish_reason(&s));
                let mut delta = json!({});
                if !message["content"].is_null() {
                    delta["content"] = message["content"].clone();
                }
                self.finish_parsed(i, delta, &message, fin, s);
            }
            SeqEvent::Token(t) => {
                if !t.text.is_empty() || self.out.job.logprobs.is_some() {
                    let c = self.text_choice(i, &t.text, Some(&t), None);
                    let s = self.chunk(vec![c]);
                    self.queued.push_back(s);
                }
                self.choices[i].tokens.push(t);
            }
            SeqEvent::Done(s) => {
                if !s.tail.is_empty() {
                    let c = self.text_choice(i, &s.tail, None, None);
                    let line = self.chunk(vec![c]);
                    self.queued.push_back(line);
                }
                let c = self.text_choice(i, "", None, Some(finish_reason(&s)));
                // The choice's last chunk carries its timings, as llama-server's does.
                let mut line = self.chunk_value(vec![c]);
                line["timings"] = self.out.timings(std::iter::once(&s));
                self.queued.push_back(line.to_string());
                self.choices[i].summary = Some(s);
            }
            SeqEvent::Embedding(_) => {}
            SeqEvent::Failed(e) => {
                self.choices[i].failed = Some(e.clone());
                let err = ApiError::internal(e);
                count_error(&self.out.st, err.clone());
                self.queued.push_back(err.body().to_string());
            }
        }
    }

    fn finish(&mut self) {
        self.out.log_done(&self.choices);
        if self.out.job.v.include_usage {
            let mut c = json!({
                "id": self.out.id,
                "object": self.out.object(true),
                "created": self.out.created,
                "model": self.out.st.opts.model_name,
                "system_fingerprint": "ferrox",
                "choices": [],
            });
            c["usage"] = self.out.usage(&self.choices);
            self.queued.push_back(c.to_string());
        }
        self.queued.push_back("[DONE]".into());
        self.done = true;
    }
}

/// A streamed harmony delta: `reasoning_content` and `content`, each when
/// it has text.
fn harmony_delta(d: harmony::Delta) -> Value {
    let mut v = json!({});
    if !d.reasoning.is_empty() {
        v["reasoning_content"] = json!(d.reasoning);
    }
    if !d.content.is_empty() {
        v["content"] = json!(d.content);
    }
    v
}

fn stream_response(out: Output, rx: mpsc::UnboundedReceiver<Tagged>) -> impl IntoResponse {
    let n = out.job.v.n;
    let state = StreamState {
        out,
        rx,
        choices: (0..n).map(|_| Choice::default()).collect(),
        queued: VecDeque::new(),
        done: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(line) = s.queued.pop_front() {
                return Some((Ok::<Event, Infallible>(Event::default().data(line)), s));
            }
            if s.done {
                return None;
            }
            match s.rx.recv().await {
                Some((i, ev)) => s.on_event(i, ev),
                None => s.finish(),
            }
        }
    });
    Sse::new(stream)
}
