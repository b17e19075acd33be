//! How a configured URL that may carry credentials is shown: in validation errors, logs and
//! the errors of the tiers that connect to it (the shared cache's Redis, the queue's NATS).
//! One function, so that every place shows one URL the same way and none shows a secret.

/// `written` with the user information of its authority replaced by `***`
/// (`redis://:secret@h:6379/2` → `redis://***@h:6379/2`, `nats://app:secret@h` →
/// `nats://***@h`). All of it is hidden, the user name too: user information without a
/// password may be a token (`nats://s3cret@h`), and this form also reaches clients (a
/// queue's 503). An `@` in the path, query or fragment of a URL is not user information and
/// is left as written; so is a URL without any.
///
/// Text that is not a URL with a host (a mistyped one, or a password holding an unescaped
/// `/`, `?` or `#`, as in `redis://:abc/def@h`) has no authority a parser agrees on: there,
/// everything from after `scheme://` (or from the start) to the last `@` is hidden, since
/// hiding too much in an error costs nothing and hiding too little shows a secret.
///
/// ```
/// use wharf_config::redacted_url;
/// assert_eq!(redacted_url("redis://:pw@h/1"), "redis://***@h/1");
/// assert_eq!(redacted_url("nats://token@h:4222"), "nats://***@h:4222");
/// assert_eq!(redacted_url("http://h/a@b"), "http://h/a@b");
/// assert_eq!(redacted_url("redis://:abc/def@h"), "redis://***@h");
/// ```
pub fn redacted_url(written: &str) -> String {
    if !written.contains('@') {
        return written.to_owned();
    }
    let authority_start = scheme_end(written).unwrap_or(0);
    let (scheme, rest) = written.split_at(authority_start);
    let parsed = url::Url::parse(written)
        .ok()
        .filter(|url| url.host().is_some() && authority_start > 0);
    let last_at = rest.rfind('@').unwrap_or(0);
    let hidden_to = match parsed {
        Some(url) if url.username().is_empty() && url.password().is_none() => {
            return written.to_owned();
        }
        // A parser found user information: it ends at the last `@` before the end of the
        // authority (a password may hold an unescaped `@` of its own), or, should the text
        // say otherwise, at the last `@` of all.
        Some(_) => {
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            rest[..authority_end].rfind('@').unwrap_or(last_at)
        }
        // No host a parser agrees on: up to the last `@` of all.
        None => last_at,
    };
    format!("{scheme}***{}", &rest[hidden_to..])
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
    fn no_credential_is_ever_shown_and_nothing_else_is_hidden() {
        for (written, shown) in [
            ("redis://:secret@h:6379/2", "redis://***@h:6379/2"),
            ("redis://user:secret@h", "redis://***@h"),
            ("nats://user:secret@h:4222", "nats://***@h:4222"),
            ("http://u:p@ss@h/x?y", "http://***@h/x?y"),
            // A lone user name may be a token.
            ("nats://s3cret@h:4222", "nats://***@h:4222"),
            ("redis://token@h:1", "redis://***@h:1"),
            // Without a scheme, as a mistyped URL may be written.
            ("s3cret@h:4222", "***@h:4222"),
            ("u:pw@h", "***@h"),
            // An `@` after the authority is not user information.
            ("http://h:80/a@b", "http://h:80/a@b"),
            ("redis://h/0?x=a@b", "redis://h/0?x=a@b"),
            ("nats://h#a@b", "nats://h#a@b"),
            ("redis://***@[::1]:6379/0", "redis://***@[::1]:6379/0"),
            ("redis://:pw@[::1]:6379/0", "redis://***@[::1]:6379/0"),
            ("redis://@h", "redis://@h"),
            ("redis://u:p\\@h", "redis://***@h"),
            ("http://u:p\\@h", "http://***@h"),
            // No host a parser agrees on: hidden to the last `@`.
            ("redis://:abc/def@h:6379", "redis://***@h:6379"),
            ("nats://u:a?b#c@h", "nats://***@h"),
            ("redis:/:pw@h", "***@h"),
            ("redis:///:pw@h", "redis://***@h"),
            ("x?a=http://u:p@h", "***@h"),
            ("redis://127.0.0.1:6379/99", "redis://127.0.0.1:6379/99"),
            ("not a url", "not a url"),
            ("", ""),
        ] {
            assert_eq!(redacted_url(written), shown, "{written}");
        }
    }
}
