//! wharf-testbed
