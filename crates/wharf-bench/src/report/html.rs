//! `--report FILE.html`: one self-contained page a person can open, no network needed.
//!
//! The page holds the table of [`super::table`] (medians, ratios to the first
//! target), the notes (the client's own load first), the first error of each failing class,
//! the targets' URLs and commands, and inline SVG plots (see `plot`): latency by percentile for
//! each class, and completions over time where the scenario records them. Styles are inline;
//! there are no scripts and no external resources.

use std::fmt::Write as _;
use std::path::Path;

use crate::report::{plot, table, Report};
use crate::BenchError;

/// The page's style sheet.
const STYLE: &str = "\
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222;padding:0 1em}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em}\
table{border-collapse:collapse;font-variant-numeric:tabular-nums}\
th,td{border-bottom:1px solid #ddd;padding:.25em .8em;text-align:left}\
th{background:#f4f4f4}td.label{color:#555}\
.note{background:#fff8e0;border-left:4px solid #e0b000;padding:.4em .8em;margin:.4em 0}\
code{background:#f4f4f4;padding:0 .2em}figure{margin:1em 0}";

/// Escapes text for HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The report as one HTML page with inline SVG plots.
pub fn render(report: &Report) -> Result<String, BenchError> {
    let mut out = String::new();
    let title = escape(&table::title(report));
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\n<h1>{title}</h1>\n"
    );
    out.push_str("<p>");
    for s in &report.settings {
        let _ = write!(
            out,
            "<code>{}={}</code> ",
            escape(&s.name),
            escape(&s.value)
        );
    }
    out.push_str("</p>\n<ul>\n");
    for t in &report.targets {
        let _ = write!(out, "<li><b>{}</b>: ", escape(&t.name));
        let urls: Vec<String> = t
            .urls
            .iter()
            .map(|u| format!("<code>{}</code>", escape(u)))
            .collect();
        out.push_str(&urls.join(" then "));
        if let Some(cmd) = &t.command {
            let _ = write!(out, ", command <code>{}</code>", escape(cmd));
        }
        out.push_str("</li>\n");
    }
    out.push_str("</ul>\n");

    out.push_str("<h2>Results</h2>\n<p>Medians over rounds; after the first target, the ratio to it.</p>\n<table>\n<tr><th></th>");
    for t in &report.targets {
        let _ = write!(out, "<th>{}</th>", escape(&t.name));
    }
    out.push_str("</tr>\n");
    for (label, cells) in table::rows(report) {
        let _ = write!(out, "<tr><td class=\"label\">{}</td>", escape(&label));
        for cell in cells {
            let _ = write!(out, "<td>{}</td>", escape(&cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");

    out.push_str("<h2>Notes</h2>\n");
    for note in &report.notes {
        let _ = writeln!(out, "<div class=\"note\">{}</div>", escape(note));
    }
    let errors = table::first_errors(report);
    if !errors.is_empty() {
        out.push_str("<h2>First errors</h2>\n<ul>\n");
        for e in errors {
            let _ = writeln!(out, "<li>{}</li>", escape(&e));
        }
        out.push_str("</ul>\n");
    }

    out.push_str("<h2>Plots</h2>\n");
    let classes: Vec<&str> = report
        .targets
        .first()
        .map(|t| t.classes.iter().map(|c| c.name.as_str()).collect())
        .unwrap_or_default();
    for class in classes {
        if let Some(svg) = plot::percentiles(report, class)? {
            let _ = writeln!(out, "<figure>{svg}</figure>");
        }
    }
    if let Some(svg) = plot::timeline(report)? {
        let _ = writeln!(out, "<figure>{svg}</figure>");
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

/// Checks that a report can be written to `path`, before a run that may take minutes, so
/// that a wrong path is found at once rather than after the measurements.
///
/// It opens `path` for writing as [`write()`] will, without truncating it: an existing file
/// (an earlier report) is left as it was, and a file this check had to create is removed
/// again, so a run that fails later leaves nothing at `path` that it did not write.
pub fn check_writable(path: &Path) -> Result<(), BenchError> {
    let error = |source| BenchError::Write {
        path: path.display().to_string(),
        source,
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(_) => std::fs::remove_file(path).map_err(error),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .map_err(error),
        Err(e) => Err(error(e)),
    }
}

/// Renders the report and writes it to `path`.
pub fn write(report: &Report, path: &Path) -> Result<(), BenchError> {
    let page = render(report)?;
    std::fs::write(path, page).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unwritable_report_path_is_found_before_any_run() {
        let dir = std::env::temp_dir().join(format!("wharf-bench-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A path that can be written: checked, and nothing is left there.
        let new = dir.join("new.html");
        check_writable(&new).unwrap();
        assert!(!new.exists(), "the check leaves no empty report behind");
        // An earlier report is kept as it was.
        let old = dir.join("old.html");
        std::fs::write(&old, "earlier report").unwrap();
        check_writable(&old).unwrap();
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "earlier report");
        // A missing directory, a directory itself.
        for bad in [dir.join("no-such-dir").join("r.html"), dir.clone()] {
            let error = check_writable(&bad).unwrap_err();
            assert!(
                matches!(error, BenchError::Write { .. }),
                "{bad:?}: {error}"
            );
            assert!(
                error.to_string().contains(&bad.display().to_string()),
                "{error}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
