//! The OpenAPI 3.0 document served at `/openapi.json`: what the server
//! accepts, field by field, with the ranges [`crate::openai`] enforces, so a
//! schema-driven fuzzer (schemathesis) can check the two agree.

use serde_json::{json, Value};

fn error_responses() -> Value {
    let err = json!({"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    json!({
        "400": {"description": "Invalid request", "content": err["content"]},
        "401": {"description": "Missing or wrong API key", "content": err["content"]},
        "429": {"description": "Queue full; retry after Retry-After seconds", "content": err["content"]},
        "503": {"description": "Shutting down", "content": err["content"]},
        "500": {"description": "Engine failure", "content": err["content"]},
    })
}

fn common_props() -> Value {
    json!({
        "model": {"type": "string"},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1048576},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 1048576},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "repeat_penalty": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 10},
        "seed": {"type": "integer"},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}]},
        "n": {"type": "integer", "minimum": 1, "maximum": 16},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "logit_bias": {"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
        "ignore_eos": {"type": "boolean"},
        "cache_prompt": {"type": "boolean", "description": "Reuse the cached prefix a slot holds of the prompt (default true, as llama-server). Products over a batch and over one token round differently, so a reused prefix can move a token at a near tie; false evaluates the whole prompt every time."},
        "speculative.n_max": {"type": "integer", "minimum": 0, "maximum": ferrox_core::speculative::MAX_DRAFT, "description": "Most drafted tokens per step (llama-server's; 0: no speculation); a server started with a drafter only."},
        "speculative.n_min": {"type": "integer", "minimum": 0, "maximum": ferrox_core::speculative::MAX_DRAFT, "description": "Fewer drafts than this are not verified; at most speculative.n_max."},
        "user": {"type": "string"},
        "response_format": {"$ref": "#/components/schemas/ResponseFormat"},
        "json_schema": {"type": "object", "description": "llama-server's: the output is a value of this JSON Schema."},
        "grammar": {"type": "string", "description": "llama.cpp's GBNF grammar for the output (Lark when it starts with %llguidance)."},
        "regex": {"type": "string", "description": "A regular expression the whole output matches (alias guided_regex). At most one of response_format, json_schema, grammar, regex."},
    })
}

/// The document.
pub fn document() -> Value {
    let mut chat_props = common_props();
    chat_props["messages"] =
        json!({"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}});
    chat_props["logprobs"] = json!({"type": "boolean"});
    chat_props["top_logprobs"] = json!({"type": "integer", "minimum": 0, "maximum": 20});
    chat_props["tools"] = json!({"type": "array", "items": {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "minLength": 1}, "description": {"type": "string"},
            "parameters": {"type": "object"}, "strict": {"type": "boolean"}}},
    }}});
    chat_props["tool_choice"] = json!({"oneOf": [
        {"type": "string", "enum": ["none", "auto", "required"]},
        {"type": "object", "required": ["function"], "properties": {"type": {"type": "string", "enum": ["function"]}, "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}},
    ]});
    chat_props["parallel_tool_calls"] = json!({"type": "boolean"});
    let mut cmpl_props = common_props();
    cmpl_props["prompt"] = json!({"oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
    ]});
    cmpl_props["logprobs"] = json!({"type": "integer", "minimum": 0, "maximum": 20});
    cmpl_props["echo"] = json!({"type": "boolean"});
    // Optional fields accept null (clients send it for "unset"), as the server does.
    for props in [&mut chat_props, &mut cmpl_props] {
        if let Some(map) = props.as_object_mut() {
            for (name, schema) in map.iter_mut() {
                if name != "messages" && name != "prompt" {
                    schema["nullable"] = json!(true);
                }
            }
        }
    }
    let generation = |props: Value, required: Value, summary: &str| {
        let mut responses = error_responses();
        responses["200"] = json!({
            "description": "The completion (JSON), or server-sent events ending with `data: [DONE]` when `stream` is true",
            "content": {
                "application/json": {"schema": {"type": "object", "required": ["id", "object", "choices"]}},
                "text/event-stream": {"schema": {}},
            }
        });
        json!({"post": {
            "summary": summary,
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": props, "required": required}}}},
            "responses": responses,
        }})
    };
    let err_ref = json!({"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}});
    let utility = |props: Value, required: Value, summary: &str, answer: Value| {
        json!({"post": {
            "summary": summary,
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": props, "required": required}}}},
            "responses": {
                "200": {"description": "The answer", "content": {"application/json": {"schema": answer}}},
                "400": {"description": "Invalid request", "content": err_ref},
                "401": {"description": "Missing or wrong API key", "content": err_ref},
            },
        }})
    };
    let embedding_input = json!({"oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2048},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}, "minItems": 1, "maxItems": 2048},
    ]});
    let embeddings = |props: Value, required: Value, summary: &str, answer: Value| {
        let mut responses = error_responses();
        responses["200"] = json!({"description": "The embeddings", "content": {"application/json": {"schema": answer}}});
        responses["501"] = json!({"description": "The server was started without --embeddings", "content": err_ref});
        json!({"post": {
            "summary": summary,
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": props, "required": required}}}},
            "responses": responses,
        }})
    };
    let embed_props = |field: &str| {
        let mut p = json!({
            "model": {"type": "string", "nullable": true},
            "encoding_format": {"type": "string", "enum": ["float", "base64"], "nullable": true},
            "dimensions": {"type": "integer", "nullable": true, "description": "Only the model's own width"},
            "user": {"type": "string", "nullable": true},
        });
        p[field] = embedding_input.clone();
        p
    };
    json!({
        "openapi": "3.0.3",
        "info": {"title": "ferrox serve", "version": env!("CARGO_PKG_VERSION"), "description": "OpenAI-compatible API of ferrox"},
        "paths": {
            "/v1/chat/completions": generation(chat_props, json!(["messages"]), "Chat completion"),
            "/v1/completions": generation(cmpl_props, json!(["prompt"]), "Text completion"),
            "/v1/models": {"get": {"summary": "The served model", "responses": {
                "200": {"description": "Model list", "content": {"application/json": {"schema": {"type": "object", "required": ["object", "data"]}}}},
                "401": {"description": "Missing or wrong API key"},
            }}},
            "/health": {"get": {"summary": "Liveness", "responses": {
                "200": {"description": "Serving", "content": {"application/json": {"schema": {"type": "object"}}}},
                "503": {"description": "Shutting down", "content": {"application/json": {"schema": {"type": "object"}}}},
            }}},
            "/v1/embeddings": embeddings(embed_props("input"), json!(["input"]), "Embeddings (OpenAI): one L2-normalized vector per input, pooled as --pooling says (not `none`)",
                json!({"type": "object", "required": ["object", "data", "model", "usage"]})),
            "/embeddings": embeddings({
                    let mut p = embed_props("content");
                    p["input"] = embedding_input.clone();
                    p
                }, json!([]), "Embeddings (llama-server): per input a list of vectors, one per token with --pooling none",
                json!({"type": "array", "items": {"type": "object", "required": ["index", "embedding"]}})),
            "/tokenize": utility(json!({
                "content": {"nullable": true, "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}},
                ]},
                "add_special": {"type": "boolean", "nullable": true},
                "parse_special": {"type": "boolean", "nullable": true},
                "with_pieces": {"type": "boolean", "nullable": true},
            }), json!([]), "Token ids of a text (llama-server)", json!({"type": "object", "required": ["tokens"]})),
            "/detokenize": utility(json!({
                "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}, "nullable": true},
            }), json!([]), "The text of token ids (llama-server)", json!({"type": "object", "required": ["content"]})),
            "/apply-template": utility(json!({
                "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
            }), json!(["messages"]), "A conversation through the chat template (llama-server)", json!({"type": "object", "required": ["prompt"]})),
            "/props": {"get": {"summary": "Server and model properties (llama-server)", "responses": {
                "200": {"description": "Properties", "content": {"application/json": {"schema": {"type": "object", "required": ["default_generation_settings", "total_slots", "model_path", "chat_template"]}}}},
                "401": {"description": "Missing or wrong API key"},
            }}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
                "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "401": {"description": "Missing or wrong API key"},
            }}},
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
                "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": "string", "nullable": true}, "code": {"type": "string", "nullable": true},
            }}}},
            "Message": {"type": "object", "required": ["role"], "properties": {
                "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                "content": {"nullable": true, "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "object", "required": ["type", "text"], "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}},
                ]},
                "tool_calls": {"type": "array", "items": {"type": "object", "properties": {
                    "id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
                    "function": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}},
                "tool_call_id": {"type": "string"},
                "name": {"type": "string"},
                "reasoning_content": {"type": "string"},
            }},
            "ResponseFormat": {"oneOf": [
                {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}}},
                {"type": "object", "required": ["type", "json_schema"], "properties": {
                    "type": {"type": "string", "enum": ["json_schema"]},
                    "json_schema": {"type": "object", "properties": {"name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": "boolean"}}},
                }},
            ]},
        }},
    })
}
