//! The proxy's response cache: what is stored, how it is bounded, and how
//! an origin response being fetched right now is shared with every reader.
//!
//! - [`MemoryCache`] holds committed responses, bounded in bytes (not
//!   entries), evicting with quick_cache's CLOCK-Pro policy and expiring by
//!   each entry's own TTL.
//! - [`Fill`] is one origin body in flight: a [`FillWriter`] appends chunks as
//!   they arrive and any number of [`FillReader`]s stream them from the first
//!   byte. A fill either ends complete (and may then be committed) or failed,
//!   and every reader sees which: a failed fill never looks like a clean end.
//! - [`SealedFile`] keeps a stored body of [`SEALED_FROM`] bytes and more in a
//!   sealed in-memory file, which the host sends to a socket without a copy.
//! - [`FillRegistry`] finds the fill in progress for a key, so concurrent
//!   misses coalesce onto one origin request.
//! - [`SharedTier`] ([`shared`]) is the optional second tier in Redis, shared
//!   by several wharf instances: chunked entries, write-through, and a lease
//!   so that instances missing one key make one origin request between them.
//!
//! Fetching, header policy and the decision whether a response may be
//! cached are the proxy's job; this crate only stores and shares bytes.

mod entry;
mod fill;
mod memory;
mod registry;
mod sealed;
pub mod shared;

pub use entry::{CachedResponse, ResponseHead, StoredBody, COMPACT_UP_TO};
pub use fill::{
    Abandoned, Fill, FillFailure, FillReader, FillWriter, PushOutcome, UNSHARED_WINDOW,
};
pub use memory::MemoryCache;
pub use registry::{FillRegistry, Joined};
pub use sealed::{SealedFile, MAX_SEALED_FILES, SEALED_FROM};
pub use shared::{EntryLimits, LeaseOutcome, SharedTier, SharedTierConfig, WaitOutcome};
