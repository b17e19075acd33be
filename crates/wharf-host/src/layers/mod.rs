//! The host's qualities as tower layers, one file each, applied to every
//! service by [`crate::stack::hosted`].

pub mod count;
pub mod throttle;
pub mod trace;

use std::future::Future;
use std::pin::Pin;

/// The future type of the layers' services.
pub(crate) type CallFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
