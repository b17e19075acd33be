//! How a configured URL that may carry credentials is shown: in validation errors, and in
//! the logs and errors of the shared cache's Redis tier. One function, so that every place
//! shows one URL the same way and none shows a secret. (A queue's `nats_url` is kept
//! without its credentials once loaded, so the queue shows it as it is.)

/// `written` with everything between `scheme://` (or the start) and its last `@` replaced
/// by `***` (`redis://:secret@h:6379/2` → `redis://***@h:6379/2`, `nats://app:secret@h` →
/// `nats://***@h`).
///
/// All of the user information is hidden, the user name too: user information without a
/// password may be a token (`nats://s3cret@h`). And it is hidden up to the *last* `@` of
/// all, not the last of the authority a parser finds: a secret holding an unescaped `/`,
/// `?` or `#` (`nats://abc/def==@h`, a base64 token) makes a parser end the authority
/// inside it, and such a URL is exactly the one an error message shows. An `@` in a path or query is thus
/// hidden with what precedes it (`http://h/a@b` → `http://***@b`): hiding too much in a
/// message costs nothing, hiding too little shows a secret. Text without `@` is returned as
/// written.
///
/// ```
/// use wharf_config::redacted_url;
/// assert_eq!(redacted_url("redis://:pw@h/1"), "redis://***@h/1");
/// assert_eq!(redacted_url("nats://token@h:4222"), "nats://***@h:4222");
/// assert_eq!(redacted_url("nats://abc/def==@h:4222"), "nats://***@h:4222");
/// assert_eq!(redacted_url("redis://h:6379/0"), "redis://h:6379/0");
/// ```
pub fn redacted_url(written: &str) -> String {
    let Some(last_at) = written.rfind('@') else {
        return written.to_owned();
    };
    let authority_start = scheme_end(written).filter(|&start| start <= last_at);
    let scheme = &written[..authority_start.unwrap_or(0)];
    format!("{scheme}***{}", &written[last_at..])
}

/// Where the authority of `written` starts, if it opens with `scheme://` (RFC 3986 §3.1: a
/// letter, then letters, digits, `+`, `-` or `.`).
fn scheme_end(written: &str) -> Option<usize> {
    let colon = written.find("://")?;
    let scheme = &written[..colon];
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(colon + "://".len())
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn no_credential_is_ever_shown() {
        for (written, shown) in [
            ("redis://:secret@h:6379/2", "redis://***@h:6379/2"),
            ("redis://user:secret@h", "redis://***@h"),
            ("nats://user:secret@h:4222", "nats://***@h:4222"),
            ("http://u:p@ss@h/x?y", "http://***@h/x?y"),
            // A lone user name may be a token.
            ("nats://s3cret@h:4222", "nats://***@h:4222"),
            ("redis://token@h:1", "redis://***@h:1"),
            ("redis://@h", "redis://***@h"),
            ("redis://:pw@[::1]:6379/0", "redis://***@[::1]:6379/0"),
            // Secrets holding what ends an authority, which a parser would cut inside.
            ("nats://abc/def==@host:4222", "nats://***@host:4222"),
            ("redis://:a@b/c@h:6379", "redis://***@h:6379"),
            ("nats://u:p@ss/w@h", "nats://***@h"),
            ("redis://:abc/def@h:6379", "redis://***@h:6379"),
            ("nats://u:a?b#c@h", "nats://***@h"),
            ("redis://u:p\\@h", "redis://***@h"),
            // Mistyped or scheme-less.
            ("s3cret@h:4222", "***@h:4222"),
            ("u:pw@h", "***@h"),
            ("redis:/:pw@h", "***@h"),
            ("redis:///:pw@h", "redis://***@h"),
            ("x?a=http://u:p@h", "***@h"),
            // An `@` in a path, query or fragment is hidden with what precedes it.
            ("http://h:80/a@b", "http://***@b"),
            ("redis://h/0?x=a@b", "redis://***@b"),
            // Without `@`, as written.
            ("redis://127.0.0.1:6379/99", "redis://127.0.0.1:6379/99"),
            ("not a url", "not a url"),
            ("", ""),
        ] {
            assert_eq!(redacted_url(written), shown, "{written}");
        }
    }
}
