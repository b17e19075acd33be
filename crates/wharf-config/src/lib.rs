//! wharf-config
