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
    let mut column = None;
    // `[[server]]` or `server = [...]`, refused by `raw::Table`: say how a table is written.
    let table_not_array = message == "invalid type: sequence, expected a table";
    let (key, message) = match (span, describe(&message)) {
        (Some(span), Some(kind)) => {
            let is_key = matches!(kind, Described::UnknownKey(_));
            let key = key_path_at(text, span, is_key);
            let message = match kind {
                Described::WrongValue(_) if table_not_array && !key.is_empty() => {
                    format!("expected a table ([{key}]), found an array")
                }
                Described::UnknownKey(m) | Described::WrongValue(m) => m,
            };
            (key, message)
        }
        (None, Some(Described::UnknownKey(m) | Described::WrongValue(m))) => (String::new(), m),
        (Some(span), None) => {
            let (key, message, col) = syntax(text, span.start, &message);
            column = col;
            (key, message)
        }
        (None, None) => (String::new(), message),
    };
    Problem {
        file: file.to_owned(),
        line,
        column,
        key,
        message,
    }
}

/// Locates toml's syntax error `message` at byte `offset`: the key whose value it is in (if
/// any), the message (with the fix for a bare word where a string belongs) and the 1-based
/// column. An integer beyond 64 bits is a bad value rather than bad syntax: it is reworded and
/// reported like one, without a column.
fn syntax(text: &str, offset: usize, message: &str) -> (String, String, Option<usize>) {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..offset].chars().count() + 1;
    let Some(value) = value_at(text, offset) else {
        return (String::new(), message.to_owned(), Some(col));
    };
    let key = value.path.join(".");
    let limit = match message {
        "number too large to fit in target type" => Some(("too large", "at most", i64::MAX)),
        "number too small to fit in target type" => Some(("too small", "at least", i64::MIN)),
        _ => None,
    };
    if let Some((what, bound, limit)) = limit {
        let number: String = text[offset..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-'))
            .collect();
        let message = format!("{number} is {what} for a TOML integer ({bound} {limit})");
        return (key, message, None);
    }
    let message = match quotes_hint(text, &value, offset) {
        Some(hint) => format!("{message}; {hint}"),
        None => message.to_owned(),
    };
    (key, message, Some(col))
}

/// `strings need quotes: listen = "127.0.0.1:1"`, when the statement at `offset` is
/// `key = word` on one line and `word` is not TOML but `"word"` is. Only that clear case:
/// no hint inside arrays or inline tables, for several words, or for `True`.
fn quotes_hint(text: &str, value: &ValueAt, offset: usize) -> Option<String> {
    if !value.top_level || text[value.start..offset].contains('\n') {
        return None;
    }
    let line_end = find_byte(text.as_bytes(), value.start, b'\n');
    let word = text[value.start..line_end].split('#').next()?.trim();
    // A word that reads as yes or no, or a run of digits and letters that is not a
    // duration or a size (`1d`, `64KiB`), is more likely a boolean or a number mistyped
    // (`10k`, `01`) than a string left unquoted (`127.0.0.1:1`): quoting it would only
    // lead to a type error.
    let digits = word.trim_start_matches(|c: char| c.is_ascii_digit());
    let unit_value = digits.len() < word.len()
        && [
            "ms", "s", "m", "h", "d", "b", "kib", "mib", "gib", "tib", "kb", "mb", "gb", "tb",
        ]
        .iter()
        .any(|unit| digits.eq_ignore_ascii_case(unit));
    let number_like = word.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+')
        && word[1..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    let number_or_flag = (number_like && !unit_value)
        || ["true", "false", "yes", "no", "on", "off"]
            .iter()
            .any(|flag| word.eq_ignore_ascii_case(flag));
    let bare = !word.is_empty()
        && !word.contains(|c: char| c.is_whitespace() || "\"'[]{},\\".contains(c))
        && !number_or_flag;
    let parses = |v: &str| toml::from_str::<toml::Table>(&format!("v = {v}")).is_ok();
    if !bare || parses(word) || !parses(&format!("\"{word}\"")) {
        return None;
    }
    let key = text[value.key_start..value.start - 1].trim();
    Some(format!("strings need quotes: {key} = \"{word}\""))
}

/// `unknown key `X`, expected ...` from serde's rest of the message (`` `X`, expected
/// one of `a`, `b` ``), with the nearest expected key first when one is a likely typo of X:
/// the list of a service's keys holds those of every service type, too long to scan by eye.
fn with_suggestion(rest: &str) -> String {
    let unknown = rest.split('`').nth(1).unwrap_or("");
    let expected = rest.split_once(", expected ").map_or("", |(_, list)| list);
    let nearest = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|key| (edit_distance(unknown, key), key))
        .min();
    match nearest {
        // Within two edits, and not most of the word: a typo, not another key.
        Some((distance, key)) if distance <= 2 && distance * 2 < unknown.len().max(1) => {
            format!("unknown key `{unknown}` (did you mean `{key}`?), expected {expected}")
        }
        _ => format!("unknown key {rest}"),
    }
}

/// Levenshtein distance between two short ASCII-ish words (insert, delete, replace: 1 each).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let replaced = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = replaced.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
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
        return Some(Described::UnknownKey(with_suggestion(rest)));
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
    let scan = match scan(text, end) {
        Ok(scan) => scan,
        // The span is in this header: an unknown table name.
        Err(header) => return dotted(text[header..end].trim_start_matches('[')).join("."),
    };
    let bytes = text.as_bytes();
    let at_statement_start =
        scan.in_key && scan.brackets.is_empty() && text[scan.key_start..end].trim().is_empty();
    if !is_key && at_statement_start && bytes.get(end) == Some(&b'[') {
        // The value is a table or array of tables written as a `[header]`.
        let line_end = find_byte(bytes, end, b'\n');
        let header = text[end..line_end].split('#').next().unwrap_or_default();
        return dotted(header.trim().trim_start_matches('[').trim_end_matches(']')).join(".");
    }
    let mut path = scan.table;
    path.extend(scan.parents.into_iter().flatten());
    if is_key {
        path.extend(dotted(&text[scan.key_start.min(end)..end]));
    } else {
        path.extend(scan.current);
    }
    path.join(".")
}

/// The value that `offset` lies in, for a syntax error.
struct ValueAt {
    /// Dotted path of its key.
    path: Vec<String>,
    /// Where its key begins.
    key_start: usize,
    /// Where the value begins (just past the `=`).
    start: usize,
    /// A statement's value, not one inside an array or inline table.
    top_level: bool,
}

/// The value whose text holds `offset`; `None` at a key, a header or between statements.
fn value_at(text: &str, offset: usize) -> Option<ValueAt> {
    if !text.is_char_boundary(offset) {
        return None;
    }
    let scan = scan(text, offset).ok()?;
    if scan.in_key {
        return None;
    }
    let top_level = scan.brackets.is_empty() && scan.parents.is_empty();
    let mut path = scan.table;
    path.extend(scan.parents.into_iter().flatten());
    path.extend(scan.current);
    Some(ValueAt {
        path,
        key_start: scan.key_start,
        start: scan.value_start,
        top_level,
    })
}

/// Where a scan of the document up to an offset stopped.
struct Scan {
    /// The table the statement is in, from the last `[header]`.
    table: Vec<String>,
    /// Keys of the inline tables we are inside, outermost first.
    parents: Vec<Vec<String>>,
    /// The key whose value is being scanned.
    current: Vec<String>,
    /// Where the key being read, or the last one read, began.
    key_start: usize,
    /// Just past the `=` of the last key read.
    value_start: usize,
    /// At a key (or between statements) rather than in a value.
    in_key: bool,
    /// Open `{` and `[` of the value being scanned.
    brackets: Vec<u8>,
}

/// Scans `text` up to `end`; `Err` with the header's start when `end` is in a `[header]`.
fn scan(text: &str, end: usize) -> Result<Scan, usize> {
    let bytes = text.as_bytes();
    let mut s = Scan {
        table: Vec::new(),
        parents: Vec::new(),
        current: Vec::new(),
        key_start: 0,
        value_start: 0,
        in_key: true,
        brackets: Vec::new(),
    };
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
            b'\n' if s.brackets.is_empty() => {
                s.parents.clear();
                s.current.clear();
                s.in_key = true;
                s.key_start = i + 1;
            }
            b'[' if s.in_key && s.brackets.is_empty() && text[s.key_start..i].trim().is_empty() => {
                let line_end = find_byte(bytes, i, b'\n');
                if end <= line_end {
                    return Err(i);
                }
                let header = text[i..line_end].split('#').next().unwrap_or_default();
                s.table = dotted(header.trim().trim_start_matches('[').trim_end_matches(']'));
                i = line_end;
                continue;
            }
            b'=' if s.in_key => {
                s.current = dotted(&text[s.key_start..i]);
                s.in_key = false;
                s.value_start = i + 1;
            }
            b'{' if !s.in_key => {
                s.brackets.push(b'{');
                s.parents.push(std::mem::take(&mut s.current));
                s.in_key = true;
                s.key_start = i + 1;
            }
            b'[' if !s.in_key => s.brackets.push(b'['),
            b']' if s.brackets.last() == Some(&b'[') => {
                s.brackets.pop();
            }
            b'}' if s.brackets.last() == Some(&b'{') => {
                s.brackets.pop();
                s.current = s.parents.pop().unwrap_or_default();
                s.in_key = false;
            }
            b',' if s.brackets.last() == Some(&b'{') => {
                s.current.clear();
                s.in_key = true;
                s.key_start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(s)
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
        assert_eq!(
            reworded("unknown field `cache_max_byte`, expected one of `path`, `cache_max_bytes`, `max_ttl`"),
            "unknown key `cache_max_byte` (did you mean `cache_max_bytes`?), expected one of `path`, `cache_max_bytes`, `max_ttl`"
        );
        assert_eq!(
            reworded("unknown field `tiemout`, expected one of `timeout`, `retries`"),
            "unknown key `tiemout` (did you mean `timeout`?), expected one of `timeout`, `retries`"
        );
        // Two letters away from a two-letter word is not a typo of it.
        assert_eq!(
            reworded("unknown field `ab`, expected `cd` or `type`"),
            "unknown key `ab`, expected `cd` or `type`"
        );
        assert_eq!(reworded("invalid table header"), "<none>");
    }
}
