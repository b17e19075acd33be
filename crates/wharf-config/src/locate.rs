//! Turning byte offsets into lines and key paths, and serde's messages into ours.
//!
//! toml reports a parse or type error with a byte span but without the path of the key it
//! concerns (the path it tracks is private). [`key_path_at`] recovers the path by scanning the
//! document up to the span with a small TOML-aware lexer: table headers, dotted and quoted
//! keys, inline tables, arrays, strings and comments. It serves error messages only.

use std::ops::Range;

use crate::error::Problem;

/// 1-based line number of a byte offset.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The problem behind a toml parse error: its line, the key it concerns (when it is about a
/// key rather than the syntax) and a message in the crate's own words.
pub(crate) fn problem_from_toml(err: &toml::de::Error, text: &str, file: &str) -> Problem {
    let message = err.message().trim_end().replace('\n', "; ");
    let span = err.span();
    let line = span.as_ref().map(|span| line_of(text, span.start));
    let (key, message) = match (span, describe(&message)) {
        (Some(span), Some(kind)) => {
            let is_key = matches!(kind, Described::UnknownKey(_));
            let key = key_path_at(text, span, is_key);
            let message = match kind {
                Described::UnknownKey(m) | Described::WrongValue(m) => m,
            };
            (key, message)
        }
        (None, Some(Described::UnknownKey(m) | Described::WrongValue(m))) => (String::new(), m),
        (_, None) => (String::new(), message),
    };
    Problem {
        file: file.to_owned(),
        line,
        key,
        message,
    }
}

/// A serde error about one key, reworded.
enum Described {
    /// `unknown field ...`: the span covers the key.
    UnknownKey(String),
    /// `invalid type ...`/`invalid value ...`: the span covers the value.
    WrongValue(String),
}

/// Rewords serde's messages; `None` for anything else (TOML syntax errors).
fn describe(message: &str) -> Option<Described> {
    if let Some(rest) = message.strip_prefix("unknown field ") {
        return Some(Described::UnknownKey(format!("unknown key {rest}")));
    }
    let (negative_ok, rest) = if let Some(rest) = message.strip_prefix("invalid type: ") {
        (true, rest)
    } else if let Some(rest) = message.strip_prefix("invalid value: ") {
        (false, rest)
    } else {
        return None;
    };
    let (found, expected) = rest.rsplit_once(", expected ")?;
    let expected = match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" if negative_ok => "an integer",
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer",
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        "a map" => "a table",
        "a sequence" => "an array",
        e if e.starts_with("struct ") => "a table",
        e => e,
    };
    let found = match found {
        "sequence" => "an array",
        "map" => "a table",
        found => found,
    };
    Some(Described::WrongValue(format!(
        "expected {expected}, found {found}"
    )))
}

/// The dotted path of the key whose key (`is_key`) or value starts at `span`.
///
/// Best effort: an empty string when the span is not at a character boundary.
pub(crate) fn key_path_at(text: &str, span: Range<usize>, is_key: bool) -> String {
    let end = if is_key { span.end } else { span.start }.min(text.len());
    if !text.is_char_boundary(end) {
        return String::new();
    }
    let bytes = text.as_bytes();
    // The table the statement is in, from the last `[header]`.
    let mut table: Vec<String> = Vec::new();
    // Keys of the inline tables we are inside, outermost first.
    let mut parents: Vec<Vec<String>> = Vec::new();
    // The key whose value is being scanned.
    let mut current: Vec<String> = Vec::new();
    // Where the key being read began; valid while `in_key`.
    let mut key_start = 0;
    let mut in_key = true;
    // Open `{` and `[` of the value being scanned.
    let mut brackets: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < end {
        match bytes[i] {
            b'#' => {
                i = find_byte(bytes, i, b'\n');
                continue;
            }
            quote @ (b'"' | b'\'') => {
                i = skip_string(bytes, i, quote);
                continue;
            }
            b'\n' if brackets.is_empty() => {
                parents.clear();
                current.clear();
                in_key = true;
                key_start = i + 1;
            }
            b'[' if in_key && brackets.is_empty() && text[key_start..i].trim().is_empty() => {
                let line_end = find_byte(bytes, i, b'\n');
                if end <= line_end {
                    // The span is in this header: an unknown table name.
                    return dotted(text[i..end].trim_start_matches('[')).join(".");
                }
                let header = text[i..line_end].split('#').next().unwrap_or_default();
                table = dotted(header.trim().trim_start_matches('[').trim_end_matches(']'));
                i = line_end;
                continue;
            }
            b'=' if in_key => {
                current = dotted(&text[key_start..i]);
                in_key = false;
            }
            b'{' if !in_key => {
                brackets.push(b'{');
                parents.push(std::mem::take(&mut current));
                in_key = true;
                key_start = i + 1;
            }
            b'[' if !in_key => brackets.push(b'['),
            b']' if brackets.last() == Some(&b'[') => {
                brackets.pop();
            }
            b'}' if brackets.last() == Some(&b'{') => {
                brackets.pop();
                current = parents.pop().unwrap_or_default();
                in_key = false;
            }
            b',' if brackets.last() == Some(&b'{') => {
                current.clear();
                in_key = true;
                key_start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let at_statement_start =
        in_key && brackets.is_empty() && text[key_start..end].trim().is_empty();
    if !is_key && at_statement_start && bytes.get(end) == Some(&b'[') {
        // The value is a table or array of tables written as a `[header]`.
        let line_end = find_byte(bytes, end, b'\n');
        let header = text[end..line_end].split('#').next().unwrap_or_default();
        return dotted(header.trim().trim_start_matches('[').trim_end_matches(']')).join(".");
    }
    let mut path = table;
    path.extend(parents.into_iter().flatten());
    if is_key {
        path.extend(dotted(&text[key_start.min(end)..end]));
    } else {
        path.extend(current);
    }
    path.join(".")
}

/// Index of the next `byte` at or after `from`, or the end of the text.
fn find_byte(bytes: &[u8], from: usize, byte: u8) -> usize {
    bytes[from..]
        .iter()
        .position(|&b| b == byte)
        .map_or(bytes.len(), |p| from + p)
}

/// Index just past the string opening at `start` (basic, literal, or either multi-line form).
fn skip_string(bytes: &[u8], start: usize, quote: u8) -> usize {
    let triple = [quote; 3];
    if bytes[start..].starts_with(&triple) {
        let body = start + 3;
        return bytes[body..]
            .windows(3)
            .position(|w| w == triple)
            .map_or(bytes.len(), |p| body + p + 3);
    }
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quote == b'"' => i += 2,
            b if b == quote || b == b'\n' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Splits a dotted key (`services."my svc".type`) into its unquoted parts.
fn dotted(key: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut quote = None;
    for c in key.chars() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '.') => parts.push(std::mem::take(&mut part)),
            (None, c) if c.is_whitespace() => {}
            (_, c) => part.push(c),
        }
    }
    parts.push(part);
    parts.retain(|p| !p.is_empty());
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Path of the key or value at the first occurrence of `needle`.
    /// For keys, the span ends at the first space of `needle` (`"c = {"` points at `c`).
    fn path(text: &str, needle: &str, is_key: bool) -> String {
        let start = text.find(needle).expect("needle in text");
        let len = match is_key {
            true => needle.find(' ').unwrap_or(needle.len()),
            false => needle.len(),
        };
        key_path_at(text, start..start + len, is_key)
    }

    #[test]
    fn key_paths() {
        let doc = r#"
# a comment with = and [brackets]
top = 1
[server]
listen = "x=y" # trailing = comment
max_connections = "lots"
[services."my-svc"]
type = "proxy"
hosts = [
  "a",
  99,
]
inline = { a = "1", "x-b" = 2, c = { d = 3 } }
services.z.deep = 4
[services.other.bogus]
"#;
        assert_eq!(path(doc, "top", true), "top");
        assert_eq!(path(doc, "\"lots\"", false), "server.max_connections");
        assert_eq!(path(doc, "listen", true), "server.listen");
        assert_eq!(path(doc, "\"proxy\"", false), "services.my-svc.type");
        assert_eq!(path(doc, "99", false), "services.my-svc.hosts");
        assert_eq!(path(doc, "2,", false), "services.my-svc.inline.x-b");
        assert_eq!(path(doc, "c = {", true), "services.my-svc.inline.c");
        assert_eq!(path(doc, "3 }", false), "services.my-svc.inline.c.d");
        assert_eq!(path(doc, "deep", true), "services.my-svc.services.z.deep");
        assert_eq!(path(doc, "bogus", true), "services.other.bogus");
        assert_eq!(path(doc, "[services.\"my", false), "services.my-svc");
    }

    #[test]
    fn lines() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 4), 3);
        assert_eq!(line_of("a", 99), 1);
    }

    #[test]
    fn serde_messages_reworded() {
        let reworded = |m: &str| match describe(m) {
            Some(Described::UnknownKey(m) | Described::WrongValue(m)) => m,
            None => String::from("<none>"),
        };
        assert_eq!(
            reworded(r#"invalid type: string "lots", expected u64"#),
            r#"expected an integer, found string "lots""#
        );
        assert_eq!(
            reworded("invalid value: integer `-1`, expected u64"),
            "expected a non-negative integer, found integer `-1`"
        );
        assert_eq!(
            reworded("invalid type: integer `5`, expected struct RawServer"),
            "expected a table, found integer `5`"
        );
        assert_eq!(
            reworded("unknown field `bogus`, expected `a` or `b`"),
            "unknown key `bogus`, expected `a` or `b`"
        );
        assert_eq!(reworded("invalid table header"), "<none>");
    }
}
