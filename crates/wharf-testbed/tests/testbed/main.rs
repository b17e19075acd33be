//! Integration tests: a testbed on `127.0.0.1:0`, driven over real HTTP (hyper-util's legacy
//! client, or raw TCP where the framing itself is under test).
#![allow(clippy::unwrap_used)] // helpers are not covered by allow-unwrap-in-tests (clippy#11119)
#![allow(clippy::disallowed_methods)] // raw TcpStream::connect to look at the framing

mod support;

mod bodies;
mod endpoints;
mod lifecycle;
