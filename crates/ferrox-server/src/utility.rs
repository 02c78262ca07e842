//! llama-server's utility endpoints, answered as it answers them:
//! `POST /tokenize`, `POST /detokenize`, `POST /apply-template`, `GET /props`.
//! None touches the engine: the tokenizer and the chat template answer, so
//! they stay quick while every slot is busy.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrox_core::sampling::SamplingParams;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai::{ApplyTemplateRequest, DetokenizeRequest, TextOrToken, TokenizeContent, TokenizeRequest};
use crate::{count_error, parse_body, render_chat, AppState};

fn reply(st: &AppState, r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => count_error(st, e).into_response(),
    }
}

/// `{"content", "add_special" (false), "parse_special" (true), "with_pieces"
/// (false)}` → `{"tokens": [ids]}`, or `[{"id", "piece"}]` with pieces (a
/// piece that is not UTF-8 by itself as its byte values). `content` may mix
/// texts and token ids; only a first text gets BOS (llama-server's
/// `tokenize_mixed`).
pub(crate) async fn tokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        let req: TokenizeRequest = parse_body(&headers, &body)?;
        let add_special = req.add_special.unwrap_or(false);
        let parse_special = req.parse_special.unwrap_or(true);
        let encode = |t: &str, special: bool, at: String| {
            st.tok.encode(t.as_bytes(), special, parse_special).map_err(|e| ApiError::invalid(Some(at), e.to_string()))
        };
        let n_vocab = st.tok.n_vocab();
        let ids = match req.content {
            None => Vec::new(),
            Some(TokenizeContent::Text(t)) => encode(t.as_str(), add_special, "content".into())?,
            Some(TokenizeContent::Mixed(items)) => {
                let mut ids = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    match item {
                        TextOrToken::Text(t) => ids.extend(encode(t.as_str(), add_special && i == 0, format!("content[{i}]"))?),
                        TextOrToken::Token(id) if (*id as usize) < n_vocab => ids.push(*id),
                        TextOrToken::Token(id) => {
                            return Err(ApiError::out_of_range(&format!("content[{i}]"), id, &format!("a token id below {n_vocab}")))
                        }
                    }
                }
                ids
            }
        };
        let tokens: Vec<Value> = match req.with_pieces.unwrap_or(false) {
            false => ids.iter().map(|&id| json!(id)).collect(),
            true => ids
                .iter()
                .map(|&id| {
                    let bytes = st.tok.piece(id, true).unwrap_or_default();
                    let piece = match std::str::from_utf8(bytes) {
                        Ok(s) => json!(s),
                        Err(_) => json!(bytes),
                    };
                    json!({"id": id, "piece": piece})
                })
                .collect(),
        };
        Ok(json!({"tokens": tokens}))
    })();
    reply(&st, r)
}

/// `{"tokens": [ids]}` → `{"content": text}` (control tokens written out,
/// as llama-server does; bytes that are not UTF-8 replaced).
pub(crate) async fn detokenize(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        let req: DetokenizeRequest = parse_body(&headers, &body)?;
        let bytes = st
            .tok
            .decode(req.tokens.as_deref().unwrap_or_default(), true)
            .map_err(|e| ApiError::invalid(Some("tokens".into()), e.to_string()))?;
        Ok(json!({"content": String::from_utf8_lossy(&bytes)}))
    })();
    reply(&st, r)
}

/// `{"messages": [...]}` → `{"prompt": text}`: the conversation through the
/// model's chat template with the assistant's turn opened — the text
/// `/v1/chat/completions` would tokenize.
pub(crate) async fn apply_template(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        let req: ApplyTemplateRequest = parse_body(&headers, &body)?;
        let (_, text) = render_chat(&st, &req.messages)?;
        Ok(json!({"prompt": text}))
    })();
    reply(&st, r)
}

/// llama-server's `/props`: the defaults a request gets, the slots, the
/// model and its template. Fields llama-server reports for features ferrox
/// has not (vision, its web UI) are reported off.
pub(crate) async fn props(State(st): State<Arc<AppState>>) -> Response {
    let cfg = st.sched.config();
    let p = SamplingParams::default();
    let token_text = |id: Option<u32>| {
        id.and_then(|id| st.tok.token_text(id)).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()
    };
    Json(json!({
        "default_generation_settings": {
            "n_ctx": cfg.n_ctx,
            "params": {
                "n_predict": -1,
                "max_tokens": -1,
                "seed": u32::MAX,
                "temperature": p.temperature,
                "top_k": p.top_k,
                "top_p": p.top_p,
                "min_p": p.min_p,
                "typical_p": p.typical_p,
                "repeat_last_n": p.repeat_last_n,
                "repeat_penalty": p.repeat_penalty,
                "presence_penalty": p.presence_penalty,
                "frequency_penalty": p.frequency_penalty,
                "ignore_eos": false,
                "stream": false,
                "stop": [],
                "n_probs": 0,
            },
        },
        "total_slots": cfg.n_slots,
        "model_alias": st.opts.model_name,
        "model_path": st.opts.model_path,
        "modalities": {"vision": false, "audio": false, "video": false},
        "endpoint_slots": false,
        "endpoint_props": false,
        "endpoint_metrics": true,
        "chat_template": st.template.as_ref().map_or("", |t| t.source()),
        "bos_token": token_text(st.tok.bos()),
        "eos_token": token_text(st.tok.eos()),
        "build_info": format!("ferrox {}", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
        "embeddings": st.opts.embeddings,
        "pooling": st.opts.pooling.name(),
        "n_queue": cfg.queue_capacity,
        "n_batch": cfg.n_batch,
    }))
    .into_response()
}
