//! The one reader of TOML files that people write by hand (the cluster
//! file and its `[launch]` table): [`TomlReader`] walks a table's entries
//! in file order, types values (`string`, `integer`, `table`, `array`),
//! turns byte offsets into `FILE:LINE:COL:` [`TomlError`]s, and words
//! unknown keys with the key probably meant ("did you mean").

use std::path::{Path, PathBuf};

use toml::de::{DeInteger, DeTable, DeValue};
use toml::Spanned;

/// A value as parsed, with its span in the text.
pub type Val<'i> = Spanned<DeValue<'i>>;

/// A mistake at a place in a file: `FILE:LINE:COL: what; the fix`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{col}: {message}", path.display())]
pub struct TomlError {
    /// The file, as named to the reader.
    pub path: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    /// What is wrong and the fix.
    pub message: String,
}

/// A checked value and the byte offset where it was written.
#[derive(Clone, Debug)]
pub struct At<T> {
    /// The value.
    pub v: T,
    /// Where it is written.
    pub at: usize,
}

/// One `key = value` of a table.
pub struct Entry<'t, 'i> {
    /// The key as written (unquoted).
    pub key: &'t str,
    /// Where the key is written.
    pub key_at: usize,
    /// The value.
    pub value: &'t Val<'i>,
    /// Where the value is written.
    pub at: usize,
}

/// A TOML text and the path that names it in messages.
#[derive(Clone, Copy)]
pub struct TomlReader<'a> {
    /// The whole file.
    pub text: &'a str,
    /// Its name in messages.
    pub path: &'a Path,
}

impl<'a> TomlReader<'a> {
    /// A reader of `text`, named `path` in messages.
    pub fn new(text: &'a str, path: &'a Path) -> Self {
        TomlReader { text, path }
    }

    /// Parses the text; a syntax error becomes one line ending in "fix the
    /// TOML syntax (see `example`)", a duplicate key names the key.
    pub fn parse(&self, example: &str) -> Result<Spanned<DeTable<'a>>, TomlError> {
        DeTable::parse(self.text).map_err(|e| self.syntax(&e, example))
    }

    fn syntax(&self, e: &toml::de::Error, example: &str) -> TomlError {
        let at = e.span().map_or(0, |s| s.start);
        let what = e.message().trim().replace('\n', "; ");
        let what = what.strip_suffix(", expected nothing").unwrap_or(&what);
        if what == "duplicate key" {
            let key = e.span().and_then(|s| self.text.get(s)).unwrap_or("");
            let key = key.trim_matches(|c| c == '"' || c == '\'');
            return self.err(at, format!("duplicate key {key:?}; keep one of them"));
        }
        self.err(at, format!("{what}; fix the TOML syntax (see {example})"))
    }

    /// The mistake `message` at byte offset `at`.
    pub fn err(&self, at: usize, message: impl Into<String>) -> TomlError {
        let (line, col) = line_col(self.text, at);
        self.at_line(line, col, message)
    }

    /// The mistake `message` at `line`, column `col` (both 1-based).
    pub fn at_line(&self, line: usize, col: usize, message: impl Into<String>) -> TomlError {
        TomlError {
            path: self.path.to_path_buf(),
            line,
            col,
            message: message.into(),
        }
    }

    /// The 1-based line of byte offset `at`.
    pub fn line(&self, at: usize) -> usize {
        line_col(self.text, at).0
    }

    /// A string value: else "`what` is an integer; write a quoted string,
    /// like `like`".
    pub fn string<'v>(&self, what: &str, v: &'v Val, like: &str) -> Result<&'v str, TomlError> {
        match v.get_ref() {
            DeValue::String(s) => Ok(s),
            other => Err(self.err(
                v.span().start,
                format!(
                    "{what} is {}; write a quoted string, like {like}",
                    kind(other)
                ),
            )),
        }
    }

    /// A whole number (beyond `i128` it reads as `i128::MAX`, out of every
    /// range anyway): else "`key` is ...; write a whole number, like `key` =
    /// `example`".
    pub fn integer(&self, key: &str, v: &Val, example: &str) -> Result<i128, TomlError> {
        match v.get_ref() {
            DeValue::Integer(i) => Ok(int_value(i)),
            other => Err(self.err(
                v.span().start,
                format!(
                    "{key} is {}; write a whole number, like {key} = {example}",
                    kind(other)
                ),
            )),
        }
    }

    /// A table value: else "`key` is ...; `fix`".
    pub fn table<'v, 'i>(
        &self,
        key: &str,
        v: &'v Val<'i>,
        fix: &str,
    ) -> Result<&'v DeTable<'i>, TomlError> {
        match v.get_ref() {
            DeValue::Table(t) => Ok(t),
            _ => Err(self.wrong_kind(key, v, fix)),
        }
    }

    /// "`what` is an integer; `fix`": a value of the wrong type, at it.
    pub fn wrong_kind(&self, what: &str, v: &Val, fix: &str) -> TomlError {
        let message = format!("{what} is {}; {fix}", kind(v.get_ref()));
        self.err(v.span().start, message)
    }

    /// An array value: else "`key` is ...; `fix`".
    pub fn array<'v, 'i>(
        &self,
        key: &str,
        v: &'v Val<'i>,
        fix: &str,
    ) -> Result<&'v [Val<'i>], TomlError> {
        match v.get_ref() {
            DeValue::Array(a) => Ok(&a[..]),
            _ => Err(self.wrong_kind(key, v, fix)),
        }
    }

    /// "unknown key "K" in `table`; did you mean "X"?" (a listed alias or
    /// the closest of `known`), else "...; `otherwise`", at the key.
    pub fn unknown_key(
        &self,
        entry: &Entry,
        table: &str,
        known: &[&str],
        aliases: &[(&str, &str)],
        otherwise: impl FnOnce() -> String,
    ) -> TomlError {
        let key = entry.key;
        let hint = did_you_mean(key, known, aliases).unwrap_or_else(otherwise);
        self.err(
            entry.key_at,
            format!("unknown key {key:?} in {table}; {hint}"),
        )
    }
}

/// A table's entries in the order they appear in the file.
pub fn entries<'t, 'i>(table: &'t DeTable<'i>) -> Vec<Entry<'t, 'i>> {
    let mut v: Vec<Entry> = table
        .iter()
        .map(|(k, v)| Entry {
            key: k.get_ref(),
            key_at: k.span().start,
            value: v,
            at: v.span().start,
        })
        .collect();
    v.sort_by_key(|e| e.key_at);
    v
}

/// Where the value of `key` is written in `table`.
pub fn value_at(table: &DeTable, key: &str) -> Option<usize> {
    table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v.span().start)
}

/// The value of a TOML integer (beyond `i128`: `i128::MAX`).
pub fn int_value(i: &DeInteger) -> i128 {
    i128::from_str_radix(i.as_str(), i.radix()).unwrap_or(i128::MAX)
}

/// `did you mean "X"?` for the known word `word` was probably meant to be.
pub fn did_you_mean(word: &str, known: &[&str], aliases: &[(&str, &str)]) -> Option<String> {
    suggest(word, known, aliases).map(|s| format!("did you mean {s:?}?"))
}

/// How messages name the type of a value.
pub fn kind(v: &DeValue) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
pub fn line_col(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// The known word `word` was probably meant to be: a listed alias, or the
/// closest known word within a third of its length in edits (at least one).
pub fn suggest<'k>(word: &str, known: &[&'k str], aliases: &[(&str, &str)]) -> Option<&'k str> {
    let lower = word.to_ascii_lowercase();
    if let Some(&(_, to)) = aliases.iter().find(|(from, _)| *from == lower) {
        if let Some(k) = known.iter().find(|k| **k == to) {
            return Some(k);
        }
    }
    let limit = (word.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (edit_distance(&lower, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Edit distance counting insertions, deletions, substitutions and swaps of
/// adjacent characters (optimal string alignment).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// `a, b and c`.
pub fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}
