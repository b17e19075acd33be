//! Requests to origins: the pooled client, first-byte deadline, and the
//! error mapping of what comes back before the response head.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use http_body_util::Empty;
use hyper::body::Incoming;
use url::Url;
use wharf_config::ProxyConfig;

use crate::connector::{origin_client, OriginClient};
use crate::destination::DestinationPolicy;
use crate::error::ProxyError;

/// Sent as `user-agent`: no client header is forwarded to origins (no
/// cookies, credentials or encodings), so the origin sees only wharf.
const USER_AGENT: &str = concat!("wharf/", env!("CARGO_PKG_VERSION"));

/// Fetches target URLs over a keep-alive pool of SSRF-checked connections.
#[derive(Clone)]
pub(crate) struct Origin {
    client: OriginClient,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
}

impl Origin {
    pub(crate) fn new(config: &ProxyConfig, policy: Arc<DestinationPolicy>) -> Self {
        Self {
            client: origin_client(policy, config.connect_timeout),
            connect_timeout: config.connect_timeout,
            first_byte_timeout: config.first_byte_timeout,
        }
    }

    /// Sends `GET target` and waits for the response head, at most
    /// `first_byte_timeout` (which includes connecting).
    pub(crate) async fn fetch(&self, target: &Url) -> Result<Response<Incoming>, ProxyError> {
        let origin = origin_label(target);
        let uri: http::Uri = target
            .as_str()
            .parse()
            .map_err(
                |error: http::uri::InvalidUri| ProxyError::OriginUnavailable {
                    origin: origin.clone(),
                    message: format!("url is not a valid request target: {error}"),
                },
            )?;
        let mut request = Request::new(Empty::<Bytes>::new());
        *request.uri_mut() = uri;
        request
            .headers_mut()
            .insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        match tokio::time::timeout(self.first_byte_timeout, self.client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(ProxyError::from_client_error(
                &origin,
                target.host_str().unwrap_or(""),
                self.connect_timeout,
                &error,
            )),
            Err(_elapsed) => Err(ProxyError::OriginTimeout {
                origin,
                what: "no response headers",
                after: self.first_byte_timeout,
            }),
        }
    }
}

/// `scheme://host:port` of a target, for messages and logs.
pub(crate) fn origin_label(target: &Url) -> String {
    format!(
        "{}://{}:{}",
        target.scheme(),
        target.host_str().unwrap_or(""),
        target.port_or_known_default().unwrap_or(0)
    )
}
