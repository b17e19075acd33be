//! wharf-test-support
