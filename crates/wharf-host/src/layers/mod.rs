//! The host's qualities, one file each, applied to every service by
//! `crate::stack`: each part starts with the call and leaves a guard that
//! lives as long as the call's response body, so slots, counters and the
//! in-flight list end when the client has the whole response (or left).

pub mod count;
pub mod throttle;
pub mod trace;
