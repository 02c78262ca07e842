//! Errors as OpenAI shapes them: a status and
//! `{"error": {"message", "type", "param", "code"}}`, so clients raise the
//! right exception class (`BadRequestError`, `AuthenticationError`,
//! `RateLimitError`, …) with our message in it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type` (`invalid_request_error`, `authentication_error`, …).
    pub kind: &'static str,
    /// What went wrong and what would be accepted.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, …).
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (429/503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: impl Into<Option<String>>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.into(),
            code: None,
            retry_after: None,
        }
    }

    /// A 400 for a field out of range: names it, its value and what is allowed.
    pub fn out_of_range(param: &str, value: impl std::fmt::Display, allowed: &str) -> ApiError {
        ApiError::invalid(
            Some(param.to_string()),
            format!("`{param}` is {value}; allowed: {allowed}"),
        )
    }

    /// With a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: "missing or invalid API key: send `Authorization: Bearer <key>`".into(),
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    /// 429: the queue is full.
    pub fn busy(message: String) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            message,
            param: None,
            code: Some("queue_full"),
            retry_after: Some(1),
        }
    }

    /// 503: shutting down.
    pub fn unavailable(message: String) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            message,
            param: None,
            code: Some("shutting_down"),
            retry_after: Some(5),
        }
    }

    /// 500: the engine failed.
    pub fn internal(message: String) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 501: a feature this server was not started with (llama-server's
    /// `not_supported_error`).
    pub fn not_supported(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            kind: "not_supported_error",
            message: message.into(),
            param: None,
            code: Some("not_supported"),
            retry_after: None,
        }
    }

    /// 404 for an unknown path.
    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            message: format!("no endpoint {path}; see /openapi.json"),
            param: None,
            code: Some("unknown_url"),
            retry_after: None,
        }
    }

    /// 405: a path that exists, asked with a method it does not take.
    pub fn method_not_allowed(method: &str, path: &str, allowed: &'static str) -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            kind: "invalid_request_error",
            message: format!("{path} takes {allowed}, not {method}"),
            param: None,
            code: Some("method_not_allowed"),
            retry_after: None,
        }
    }

    /// The body OpenAI clients parse.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
