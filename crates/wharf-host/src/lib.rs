//! wharf-host
