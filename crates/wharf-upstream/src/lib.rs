//! HTTP/1.1 exchanges with upstreams (the proxy's origins, the routes' backends), polled in
//! the task of the call that makes them.
//!
//! hyper's client drives each connection from a task of its own, so every proxied call
//! crosses tasks (and often threads) twice: request out through a channel, response head and
//! every body chunk back through others. Here the call's own task writes the request, reads
//! the response head, and reads the body as the client's side polls it: the upstream's bytes
//! go to the client's socket in the same poll that read them. Memory follows the work: a
//! connection waiting on a slow upstream holds no read buffer, an idle one none at all.
//!
//! - [`Connection`]: one connection, [`Connection::send`] (or [`Exchange`], a request encoded
//!   beforehand) one exchange;
//! - [`ResponseBody`]: the streamed response body, which returns its connection to the pool;
//! - [`IdlePool`] / [`PoolSlot`]: bounded idle keep-alive connections by upstream;
//! - [`UpstreamStream`]: TCP, TLS or Unix socket; [`tls_connector`] for `https://`;
//! - [`NameCache`]: upstream host names, looked up once by concurrent connects, held, and
//!   looked up again in the background (the old answer outlives a failed lookup for a while);
//! - [`UpstreamError`] / [`SendError`]: what broke, and whether a retry is safe.
//!
//! Connecting (the proxy's SSRF checks, timeouts) is the caller's, with addresses from
//! [`NameCache`]: this crate starts from a connected socket. Heads and framing are `wharf-http1`'s (RFC 9112 §6.3:
//! content-length, chunked, close-delimited), strictly: ambiguous framing is an error, and a
//! connection is reused only after a response read exactly to its end.

mod body;
mod connection;
mod error;
mod exchange;
mod names;
mod pool;
mod request;
mod shards;
mod stream;
mod tls;

pub use body::ResponseBody;
pub use connection::Connection;
pub use error::{NoRoom, SendError, UpstreamError};
pub use exchange::Exchange;
pub use names::NameCache;
pub use pool::{Checkout, ConnectPermit, IdlePool, KeepFailure, KeptIdle, PoolLimits, PoolSlot};
pub use request::{EncodedRequest, RequestHead};
pub use shards::PoolShards;
pub use stream::{UpstreamStream, SPLICED_RECEIVE_BUFFER};
pub use tls::tls_connector;
pub use wharf_http1::relay::{HeadFields, Relayed, RelayedFields};
pub use wharf_http1::request::FieldEdits;
pub use wharf_http1::response::{MAX_HEADERS, MAX_HEAD_BYTES};
