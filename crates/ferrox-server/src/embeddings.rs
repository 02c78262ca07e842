//! `POST /v1/embeddings` (OpenAI's shape) and `POST /embeddings`
//! (llama-server's), both behind `--embeddings`.
//!
//! The decision: every input is one engine sequence with
//! [`SeqRequest::embed`] set, so embeddings share the queue, the slots and
//! the batched prefill with completions. A request keeps at most one input
//! per slot in the engine at a time, feeding the next as one finishes: a
//! request of a thousand inputs neither overflows the queue (which would
//! refuse it) nor holds every slot from other clients for its whole length.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use ferrox_core::embed::{l2_normalize, Pooling};
use ferrox_core::generate::FinishReason;
use ferrox_core::sampling::SamplingParams;
use ferrox_core::scheduler::{SeqEvent, SeqRequest, SubmitError};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::openai::{EmbedInput, EmbeddingRequest, MAX_EMBED_INPUTS};
use crate::{count_error, parse_body, submit_error, AppState, ChannelSink, OpenGuard};

/// Which endpoint answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `/v1/embeddings`: `input`, one normalized vector per input, usage.
    OpenAi,
    /// `/embeddings`: `content` (or `input`), a list of vectors per input
    /// (one per token with pooling `none`, raw as llama-server gives them).
    Llama,
}

pub(crate) async fn embeddings_oai(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(st, headers, body, Shape::OpenAi).await
}

pub(crate) async fn embeddings_llama(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(st, headers, body, Shape::Llama).await
}

async fn answer(st: Arc<AppState>, headers: HeaderMap, body: Bytes, shape: Shape) -> Response {
    st.metrics.embeddings.fetch_add(1, Ordering::Relaxed);
    match respond(&st, &headers, &body, shape).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => count_error(&st, e).into_response(),
    }
}

async fn respond(st: &Arc<AppState>, headers: &HeaderMap, body: &Bytes, shape: Shape) -> Result<Value, ApiError> {
    if !st.opts.embeddings {
        return Err(ApiError::not_supported(
            "This server does not support embeddings. Start it with `--embeddings`",
        ));
    }
    let pooling = st.opts.pooling;
    if shape == Shape::OpenAi && pooling == Pooling::None {
        return Err(ApiError::invalid(
            None,
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type \
             (start the server with --pooling mean, cls or last; /embeddings answers one vector per token)",
        ));
    }
    let req: EmbeddingRequest = parse_body(headers, body)?;
    let (input, param) = match (req.input, req.content, shape) {
        (Some(i), _, _) => (i, "input"),
        (None, Some(c), Shape::Llama) => (c, "content"),
        (None, _, Shape::OpenAi) => return Err(ApiError::invalid(Some("input".into()), "`input` is required")),
        (None, None, Shape::Llama) => {
            return Err(ApiError::invalid(Some("content".into()), "`content` (or `input`) is required"))
        }
    };
    let as_base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => return Err(ApiError::out_of_range("encoding_format", format!("{other:?}"), "\"float\" or \"base64\"")),
    };
    let n_embd = st.sched.n_embd();
    if let Some(d) = req.dimensions.filter(|&d| d != n_embd as i64) {
        return Err(ApiError::out_of_range("dimensions", d, &format!("{n_embd} (this model's width; it cannot be changed)")));
    }
    let inputs = tokenize_inputs(st, input, param)?;
    // One vector per token: the answer grows with the tokens, so a request
    // holds at most one slot's worth.
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let n_ctx = st.sched.config().n_ctx;
    if pooling == Pooling::None && n_tokens > n_ctx {
        return Err(ApiError::invalid(
            Some(param.to_string()),
            format!("with pooling none (one vector per token) a request's inputs may hold at most {n_ctx} tokens together; these hold {n_tokens}"),
        )
        .with_code("context_length_exceeded"));
    }
    let vectors = run(st, &inputs, pooling).await?;
    match shape {
        Shape::OpenAi => {
            let data: Vec<Value> = vectors
                .into_iter()
                .enumerate()
                .map(|(i, mut v)| {
                    l2_normalize(&mut v);
                    let embedding = match as_base64 {
                        true => {
                            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                        }
                        false => floats(&v),
                    };
                    json!({"object": "embedding", "index": i, "embedding": embedding})
                })
                .collect();
            Ok(json!({
                "object": "list",
                "data": data,
                "model": req.model.unwrap_or_else(|| st.opts.model_name.clone()),
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }))
        }
        Shape::Llama => {
            let data: Vec<Value> = vectors
                .into_iter()
                .enumerate()
                .map(|(i, mut v)| {
                    let rows: Vec<Value> = match pooling {
                        Pooling::None => v.chunks_exact(n_embd.max(1)).map(floats).collect(),
                        Pooling::Mean | Pooling::Cls | Pooling::Last => {
                            l2_normalize(&mut v);
                            vec![floats(&v)]
                        }
                    };
                    json!({"index": i, "embedding": rows})
                })
                .collect();
            Ok(Value::Array(data))
        }
    }
}

/// A JSON array of `f32` values, each written in the fewest digits that
/// read back as that `f32` (a JSON number is an `f64`: written as one, an
/// `f32` takes 17 digits instead of ~9).
pub(crate) fn floats(v: &[f32]) -> Value {
    Value::Array(v.iter().map(|x| json!(x.to_string().parse::<f64>().unwrap_or(f64::NAN))).collect())
}

/// The inputs as token lists, each checked against the engine's limits.
fn tokenize_inputs(st: &AppState, input: EmbedInput, param: &str) -> Result<Vec<Vec<u32>>, ApiError> {
    let encode = |t: &str, at: String| {
        st.tok.encode(t.as_bytes(), true, true).map_err(|e| ApiError::invalid(Some(at), e.to_string()))
    };
    let many = |n: usize| match n {
        0 => Err(ApiError::invalid(Some(param.to_string()), format!("`{param}` must not be empty"))),
        n if n > MAX_EMBED_INPUTS => Err(ApiError::out_of_range(param, format!("{n} inputs"), "at most 2048 inputs")),
        _ => Ok(()),
    };
    let (lists, single) = match input {
        EmbedInput::Text(t) => (vec![encode(t.as_str(), param.to_string())?], true),
        EmbedInput::Tokens(ids) => (vec![ids], true),
        EmbedInput::Texts(ts) => {
            many(ts.len())?;
            let lists = ts.iter().enumerate().map(|(i, t)| encode(t.as_str(), format!("{param}[{i}]"))).collect::<Result<_, _>>()?;
            (lists, false)
        }
        EmbedInput::TokenLists(ls) => {
            many(ls.len())?;
            (ls, false)
        }
    };
    let n_ctx = st.sched.config().n_ctx;
    let n_vocab = st.tok.n_vocab();
    for (i, ids) in lists.iter().enumerate() {
        let at = if single { param.to_string() } else { format!("{param}[{i}]") };
        if ids.is_empty() {
            return Err(ApiError::invalid(Some(at.clone()), format!("`{at}` is empty: there is nothing to embed")));
        }
        if ids.len() > n_ctx {
            return Err(ApiError::invalid(
                Some(at.clone()),
                format!(
                    "`{at}` is {} tokens, but a slot holds at most {n_ctx} (the server's -c divided by --parallel); shorten it",
                    ids.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        if let Some((j, &t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= n_vocab) {
            return Err(ApiError::invalid(Some(at.clone()), format!("`{at}` token {j} is {t}, outside the vocabulary of {n_vocab}")));
        }
    }
    Ok(lists)
}

/// Runs `inputs` through the engine, at most one per slot at a time, and
/// returns their pooled (not normalized) vectors in order.
pub(crate) async fn run(st: &Arc<AppState>, inputs: &[Vec<u32>], pooling: Pooling) -> Result<Vec<Vec<f32>>, ApiError> {
    if st.shutting_down.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down".into()));
    }
    let _open = OpenGuard::new(st);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let window = st.sched.config().n_slots.max(1);
    let mut out: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
    let (mut next, mut running) = (0, 0);
    loop {
        while next < inputs.len() && running < window {
            let req = SeqRequest {
                prompt: inputs[next].clone(),
                max_tokens: None,
                stop: Vec::new(),
                sampling: SamplingParams::default(),
                ignore_eos: false,
                cache_prompt: true,
                constraint: None,
                draft: None,
                embed: Some(pooling),
                sink: Box::new(ChannelSink { index: next, tx: tx.clone() }),
            };
            match st.sched.submit(req) {
                Ok(()) => {
                    next += 1;
                    running += 1;
                }
                // Others fill the queue: wait for one of ours to finish.
                Err(SubmitError::QueueFull { .. }) if running > 0 => break,
                Err(e) => return Err(submit_error(st, e)),
            }
        }
        if running == 0 {
            break;
        }
        let Some((i, ev)) = rx.recv().await else {
            return Err(ApiError::internal("the engine stopped before the request finished".into()));
        };
        match ev {
            SeqEvent::Embedding(v) => {
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(v);
                }
            }
            SeqEvent::Done(s) if s.finish == FinishReason::Cancelled => {
                return Err(ApiError::unavailable("the server is shutting down".into()));
            }
            SeqEvent::Done(_) => running -= 1,
            SeqEvent::Failed(e) => return Err(ApiError::internal(e)),
            SeqEvent::Started { .. } | SeqEvent::Token(_) => {}
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, v)| v.ok_or_else(|| ApiError::internal(format!("the engine ended input {i} without its embedding"))))
        .collect()
}
