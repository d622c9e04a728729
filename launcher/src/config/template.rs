//! A custom engine's `template`: the command split into words like a
//! shell would without expanding anything ([`split_words`]), then each
//! word's `{placeholder}`s ([`parse_template`]).

use toml::de::DeValue;
use xfer::config::toml_reader::{suggest, Val};

use super::{LaunchError, Parser, Piece, Template, VARS};

/// Why a command does not split into words without a shell.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// A `'` is never closed.
    #[error("a ' is never closed")]
    UnclosedSingle,
    /// A `"` is never closed.
    #[error("a \" is never closed")]
    UnclosedDouble,
    /// The command ends with a `\`.
    #[error("it ends with a lone \\")]
    LoneBackslash,
    /// A character only a shell would interpret, outside single quotes.
    #[error("{0:?} needs a shell, but the command runs without one; quote it with '...' for a literal, or write the command as bash -c '...'")]
    NeedsShell(char),
}

/// Why a template's words are not a command with placeholders.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A word opens a `{` it never closes.
    #[error("{0:?} opens a {{ that is never closed; write {{{{ for a literal brace")]
    UnclosedBrace(String),
    /// A word has a `}` that closes nothing.
    #[error("{0:?} has a }} that closes nothing; write }}}} for a literal brace")]
    StrayBrace(String),
    /// Unknown placeholders, each as shown (with the one probably meant).
    #[error("{}", unknown_placeholders(.0))]
    Unknown(Vec<String>),
}

/// "unknown placeholder(s) {a}, {b}; the placeholders are ...".
fn unknown_placeholders(unknown: &[String]) -> String {
    let what = if unknown.len() == 1 {
        "unknown placeholder"
    } else {
        "unknown placeholders"
    };
    let known: Vec<String> = VARS.iter().map(|(n, _)| format!("{{{n}}}")).collect();
    format!(
        "{what} {}; the placeholders are {}",
        unknown.join(", "),
        known.join(", ")
    )
}

impl Parser<'_> {
    /// `template = "COMMAND {rank} ..."` (or a list of words).
    pub(super) fn template(&self, v: &Val) -> Result<Template, LaunchError> {
        let at = v.span().start;
        let words: Vec<String> = match v.get_ref() {
            DeValue::String(s) => {
                split_words(s).map_err(|e| self.err(at, format!("template: {e}")))?
            }
            DeValue::Array(items) => items
                .iter()
                .map(|item| {
                    self.r
                        .string("an item of template", item, "\"--port\"")
                        .map(str::to_string)
                })
                .collect::<Result<_, _>>()?,
            _ => {
                let fix = "write the command as a string with placeholders, like template = \"my-engine --rank {rank} --head {head_ip}\"";
                return Err(self.r.wrong_kind("template", v, fix).into());
            }
        };
        if words.is_empty() {
            return Err(self.err(at, "template is empty; write the command each node runs"));
        }
        parse_template(&words).map_err(|e| self.err(at, format!("template: {e}")))
    }
}

/// Splits a command into words as a POSIX shell would, without expanding
/// anything: blanks separate words, `'...'` keeps everything, `"..."` keeps
/// everything but `\"`, `\\`, `\$` and `` \` ``, and `\` outside quotes
/// keeps the next character. What a shell would expand or interpret (`$`,
/// `` ` ``, `|`, `&`, `;`, `<`, `>`, `(`, `)` outside single quotes) is
/// refused, since the command runs without a shell.
pub fn split_words(s: &str) -> Result<Vec<String>, SplitError> {
    let mut words = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err(SplitError::UnclosedSingle),
                    }
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some('\n') => {}
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err(SplitError::UnclosedDouble),
                        },
                        Some(c @ ('$' | '`')) => return Err(SplitError::NeedsShell(c)),
                        Some(c) => w.push(c),
                        None => return Err(SplitError::UnclosedDouble),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(c) => cur.get_or_insert_with(String::new).push(c),
                None => return Err(SplitError::LoneBackslash),
            },
            '$' | '`' | '|' | '&' | ';' | '<' | '>' | '(' | ')' => {
                return Err(SplitError::NeedsShell(c))
            }
            c => cur.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(w) = cur {
        words.push(w);
    }
    Ok(words)
}

/// Parses the placeholders of each word: `{name}` is a placeholder, `{{`
/// and `}}` are literal braces. Every unknown name is reported at once.
pub fn parse_template(words: &[String]) -> Result<Template, TemplateError> {
    let names: Vec<&str> = VARS.iter().map(|(n, _)| *n).collect();
    let mut unknown: Vec<String> = Vec::new();
    let mut out = Vec::with_capacity(words.len());
    for word in words {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut chars = word.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err(TemplateError::UnclosedBrace(word.clone())),
                        }
                    }
                    match VARS.iter().find(|(n, _)| *n == name) {
                        Some((_, v)) => {
                            if !lit.is_empty() {
                                pieces.push(Piece::Lit(std::mem::take(&mut lit)));
                            }
                            pieces.push(Piece::Var(*v));
                        }
                        None => {
                            let shown = match suggest(&name, &names, &[("ip", "fabric_ip")]) {
                                Some(s) => format!("{{{name}}} (did you mean {{{s}}}?)"),
                                None => format!("{{{name}}}"),
                            };
                            if !unknown.contains(&shown) {
                                unknown.push(shown);
                            }
                        }
                    }
                }
                '}' => return Err(TemplateError::StrayBrace(word.clone())),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(lit));
        }
        out.push(pieces);
    }
    if !unknown.is_empty() {
        return Err(TemplateError::Unknown(unknown));
    }
    Ok(Template { words: out })
}
