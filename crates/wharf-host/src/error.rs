//! The one shape of an error response: `{"error": kind, "message": why}`.

use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{full, ResponseBody};

/// Builds a JSON error response: `kind` is a stable machine-readable word
/// (`bad_request`, `forbidden`, `not_found`, `bad_gateway`, ...), `message`
/// says what was wrong and why, for a person.
pub fn json_error(status: StatusCode, kind: &str, message: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({ "error": kind, "message": message }).to_string();
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `error: cause: cause`: an error and its sources on one line, each
/// cause added only when the text so far does not already say it.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn body_is_json_with_kind_and_message() {
        let response = json_error(StatusCode::FORBIDDEN, "forbidden", "no \"quotes\" lost");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["error"], "forbidden");
        assert_eq!(value["message"], "no \"quotes\" lost");
    }
}
