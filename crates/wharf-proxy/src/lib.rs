//! The caching URL proxy (seed 002's "AJAX proxy"):
//! `GET {path}?url=<absolute URL>&cacheDuration=<seconds>`.
//!
//! A call is parsed ([`request`]), its destination checked before and after
//! name resolution ([`destination`], [`connector`]; checked targets are
//! remembered by raw `url` value, `target.rs`), then served from the
//! memory cache, from a fill in progress (coalesced), from a new fill that
//! streams to the client while it is cached, or passed through. Errors map
//! to statuses in one place ([`error`]).
//!
//! Storage and sharing of bodies belong to `wharf-cache`; listeners and
//! dispatch to `wharf-host`.

mod body;
pub mod connector;
pub mod destination;
pub mod error;
mod fill;
pub mod headers;
mod origin;
pub mod request;
mod response;
mod service;
mod target;

pub use error::ProxyError;
pub use response::CacheResult;
pub use service::ProxyService;
