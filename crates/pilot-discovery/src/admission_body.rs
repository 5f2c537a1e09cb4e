//! The body of an AdmissionReview request to 15017 (`/validate`, `/inject`), read up to the
//! webhooks' limit (`webhooks::admission::MAX_REQUEST_BODY_BYTES`), as istiod's `serveValidate`
//! and `serveInject` read it: over the limit is 413, a body that cannot be read is 400.

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use webhooks::admission;

/// The whole body, or the status and message to answer with.
pub async fn read(body: Body) -> Result<Bytes, (StatusCode, String)> {
    axum::body::to_bytes(body, admission::MAX_REQUEST_BODY_BYTES + 1)
        .await
        .map_err(|e| {
            let too_large = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request entity too large: limit is {}",
                        admission::MAX_REQUEST_BODY_BYTES
                    ),
                )
            } else {
                (StatusCode::BAD_REQUEST, format!("reading the request: {e}"))
            }
        })
}
