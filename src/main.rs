//! wharf: parse the command line, start logging, dispatch.
fn main() {}
