//! wharf-cache
