//! The backend a queue delivers to: one POST per attempt over a keep-alive pool, and what
//! its outcome means for the message.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use wharf_host::error::error_chain;

/// Response body bytes read (then dropped) so the connection can be reused.
const DRAIN_LIMIT: usize = 64 * 1024;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How one delivery attempt ended.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// A 2xx answer: acknowledge.
    Delivered,
    /// An answer other than 2xx: an attempt used up.
    Rejected(StatusCode),
    /// No answer within the attempt's bound: an attempt used up.
    Timeout(Duration),
    /// The request failed after connecting (reset, malformed answer): an attempt used up.
    Failed(String),
    /// Could not connect at all: the backend is down; hold the message, no attempt used.
    Unreachable(String),
}

impl Attempt {
    /// Why the attempt failed, for logs and the dead-letter reason.
    pub(crate) fn reason(&self) -> String {
        match self {
            Attempt::Delivered => "delivered".to_owned(),
            Attempt::Rejected(status) => format!("backend answered {}", status.as_u16()),
            Attempt::Timeout(after) => format!("no answer from the backend after {after:?}"),
            Attempt::Failed(why) => format!("request failed: {why}"),
            Attempt::Unreachable(why) => format!("backend unreachable: {why}"),
        }
    }
}

/// The backend's URL and connection pool.
pub(crate) struct Backend {
    client: HttpsClient,
    /// The request target, or why `deliver.backend` is not one (then every attempt counts
    /// as the backend being unreachable: messages are held, never dead-lettered for it).
    uri: Result<Uri, String>,
}

impl Backend {
    /// A pool for `url` (http or https: rustls with ring and the webpki roots). A connect
    /// that takes longer than `connect_timeout` counts as the backend being unreachable.
    pub(crate) fn new(url: &str, connect_timeout: Duration) -> Self {
        let uri = url.parse::<Uri>().map_err(|error| {
            tracing::error!(url, error = %error, "deliver.backend is not a request URI; messages are held");
            format!("deliver.backend {url:?} is not a request URI: {error}")
        });
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .expect("the ring provider supports rustls' default protocol versions")
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Self { client, uri }
    }

    /// POSTs `body` with `headers`; the whole exchange is bounded by `timeout`.
    pub(crate) async fn post(&self, body: Bytes, headers: HeaderMap, timeout: Duration) -> Attempt {
        let uri = match &self.uri {
            Ok(uri) => uri.clone(),
            Err(why) => return Attempt::Unreachable(why.clone()),
        };
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        let exchange = async {
            let response = match self.client.request(request).await {
                Ok(response) => response,
                Err(error) if error.is_connect() => {
                    return Attempt::Unreachable(error_chain(&error));
                }
                Err(error) => return Attempt::Failed(error_chain(&error)),
            };
            let status = response.status();
            // Read a little of the answer so the connection goes back to the pool.
            let _ = Limited::new(response.into_body(), DRAIN_LIMIT)
                .collect()
                .await;
            if status.is_success() {
                Attempt::Delivered
            } else {
                Attempt::Rejected(status)
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Attempt::Timeout(timeout))
    }
}
