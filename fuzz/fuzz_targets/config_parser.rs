//! `wharf_config::Config::from_toml_str` on arbitrary text: every input gives
//! a `Config` or a `ConfigError` whose `file:line: key: why` message renders;
//! never a panic (line numbers are computed from byte spans, a classic place
//! for a slice off a UTF-8 boundary).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wharf_config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml_str(text, "fuzz.toml") {
        Ok(config) => {
            for service in &config.services {
                assert!(!service.name.is_empty());
                let _ = service.type_name();
            }
            assert_eq!(config.origin, "fuzz.toml");
        }
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.contains("fuzz.toml"),
                "a config error does not name its file: {message}"
            );
        }
    }
});
