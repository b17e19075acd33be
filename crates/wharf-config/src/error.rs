//! [`ConfigError`]: every problem found in a config file, each with file, line, key and why.

use std::fmt;

/// One thing wrong with a config file.
///
/// Displays as `file:line: key: why`, e.g.
/// `wharf.toml:14: services.proxy.max_ttl: "1dy" is not a duration (e.g. "1d"): ...`;
/// the line is left out when unknown (a file that cannot be read), the key when the problem
/// is not about one key (a TOML syntax error outside a value). A TOML syntax error also gives
/// the column: `wharf.toml:2:16: server.listen: ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file, as given to [`crate::Config::load`] or [`crate::Config::from_toml_str`].
    pub file: String,
    /// 1-based line of the offending key or value, if known.
    pub line: Option<usize>,
    /// 1-based column (in characters) of a TOML syntax error; `None` for other problems.
    pub column: Option<usize>,
    /// Dotted path of the key (`services.proxy.max_ttl`), or empty.
    pub key: String,
    /// Why it is wrong and, where there is one, the fix.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A config file that cannot be used, with every problem found in it.
///
/// Syntax and type errors stop the parse at the first one; the validation that follows
/// (units, ranges, required keys, keys of the wrong service type, cross-key rules) reports
/// all of its problems at once, ordered by line. `Display` writes one problem per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", ProblemLines(&self.problems))]
pub struct ConfigError {
    problems: Vec<Problem>,
}

impl ConfigError {
    /// Wraps a non-empty list of problems, sorting them by line (problems without a line
    /// first, since they concern the whole file).
    pub(crate) fn new(mut problems: Vec<Problem>) -> Self {
        debug_assert!(
            !problems.is_empty(),
            "a ConfigError has at least one problem"
        );
        problems.sort_by_key(|p| p.line);
        ConfigError { problems }
    }

    /// A problem concerning the whole file, e.g. that it cannot be read.
    pub(crate) fn whole_file(file: &str, message: String) -> Self {
        ConfigError::new(vec![Problem {
            file: file.to_owned(),
            line: None,
            column: None,
            key: String::new(),
            message,
        }])
    }

    /// The problems, ordered by line.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }
}

/// Displays problems one per line.
struct ProblemLines<'a>(&'a [Problem]);

impl fmt::Display for ProblemLines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}
