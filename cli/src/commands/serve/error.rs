//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status that fits.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tandem_engine::serve::{RequestError, SubmitError};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about the request (`param`: the field at fault).
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// Another status, with OpenAI's `type` for it.
    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// The error's JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        if e.is_unavailable() {
            let mut a = ApiError::status(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            a.code = Some(match e {
                SubmitError::QueueFull { .. } => "queue_full",
                SubmitError::Unavailable(_) => "model_unavailable",
                _ => "shutting_down",
            });
            return a;
        }
        let mut a = ApiError::invalid(e.to_string(), e.param());
        if let SubmitError::Request(RequestError::PromptTooLong { .. }) = e {
            a.code = Some("context_length_exceeded");
        }
        a
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if retry {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
