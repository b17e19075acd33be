//! wharf-proxy
