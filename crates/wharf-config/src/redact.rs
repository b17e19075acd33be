//! How a configured URL that may carry credentials is shown: in validation errors, logs and
//! the errors of the tiers that connect to it (the shared cache's Redis, the queue's NATS).
//! One function, so that every place shows one URL the same way and none shows a secret.

/// `written` with the user information of its authority replaced by `***`
/// (`redis://:secret@h:6379/2` → `redis://***@h:6379/2`, `nats://app:secret@h` →
/// `nats://***@h`). All of it is hidden, the user name too: user information without a
/// password may be a token (`nats://s3cret@h`), and this form also reaches clients (a
/// queue's 503). An `@` in the path, query or fragment is not user information and is left
/// as written; so is a URL without any. Without `scheme://`, the text up to the first `/`,
/// `?` or `#` is taken for the authority, so a mistyped URL is not shown with its secret
/// either.
///
/// ```
/// use wharf_config::redacted_url;
/// assert_eq!(redacted_url("redis://:pw@h/1"), "redis://***@h/1");
/// assert_eq!(redacted_url("nats://token@h:4222"), "nats://***@h:4222");
/// assert_eq!(redacted_url("http://h/a@b"), "http://h/a@b");
/// ```
pub fn redacted_url(written: &str) -> String {
    let authority_start = written.find("://").map_or(0, |at| at + "://".len());
    let (scheme, rest) = written.split_at(authority_start);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // The host follows the last `@`: a password may hold an unescaped `@` of its own.
    let Some((_userinfo, host)) = authority.rsplit_once('@') else {
        return written.to_owned();
    };
    format!("{scheme}***@{host}{tail}")
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
            ("redis://127.0.0.1:6379/99", "redis://127.0.0.1:6379/99"),
            ("not a url", "not a url"),
            ("", ""),
        ] {
            assert_eq!(redacted_url(written), shown, "{written}");
        }
    }
}
