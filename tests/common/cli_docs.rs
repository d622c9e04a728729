//! What the two binaries' documentation promises, checked by their unit
//! tests (each includes this file by path; std, `shlex` and `clap` only):
//! every command line of the README's quick start parses with the binary's
//! own arguments ([`assert_quick_start_parses`], over [`commands`], the
//! command lines of one README section as a reader would copy and paste
//! them), and every argument has help and every command an example
//! ([`undocumented`]).
//!
//! What it understands of the shell: ```` ```sh ```` blocks, `\` line
//! continuations, heredoc bodies (skipped), `#` comments, `export K=V`
//! (kept for the rest of the section), `K=V cmd` prefixes, `sudo`,
//! `sh -c '...'` (read inside), and a command's end at `&`, `&&`, `;`, `|`
//! or a redirection.

/// Parses every `program` command line of the README's quick start with
/// `C`, in the environment its `export`s and `K=V` prefixes give it;
/// panics naming the first line that does not parse, or when fewer than
/// `at_least` are found (the heading moved).
pub fn assert_quick_start_parses<C: clap::Parser>(program: &str, at_least: usize) {
    let text = include_str!("../../README.md");
    let found = commands(text, "## Quick start", program);
    assert!(
        found.len() >= at_least,
        "the quick start has only {} {program} commands; did its heading change?",
        found.len()
    );
    for c in found {
        for (k, v) in &c.env {
            std::env::set_var(k, v);
        }
        let parsed = C::try_parse_from(&c.argv);
        for (k, _) in &c.env {
            std::env::remove_var(k);
        }
        if let Err(e) = parsed {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            assert!(
                matches!(e.kind(), DisplayHelp | DisplayVersion),
                "README.md line {}: `{}` does not parse:\n{e}",
                c.line,
                c.argv.join(" ")
            );
        }
    }
}

/// Every argument of `cmd` and its subcommands that has no help text, and
/// every leaf command without an example naming it, one line each in
/// `out`; `path` is `cmd`'s name as typed (`xfer`, `xfer-launch`).
pub fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for a in cmd.get_arguments() {
        let id = a.get_id().as_str();
        if a.is_hide_set() || id == "help" || id == "version" {
            continue;
        }
        if a.get_help().is_none() && a.get_long_help().is_none() {
            out.push(format!("`{path}` argument {id} has no help text"));
        }
    }
    let subs: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|c| c.get_name() != "help")
        .collect();
    if subs.is_empty() {
        let example = cmd
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        if !example.starts_with("Example:\n") || !example.contains(path) {
            out.push(format!(
                "`{path}` has no example (after_help \"Example:\\n  {path} ...\")"
            ));
        }
    }
    for s in subs {
        undocumented(s, &format!("{path} {}", s.get_name()), out);
    }
}

/// One command line found in the section.
#[derive(Debug, Clone)]
pub struct CommandLine {
    /// Its 1-based line in the README.
    pub line: usize,
    /// The environment it runs with: the `export`s above it, then its own
    /// `K=V` prefixes.
    pub env: Vec<(String, String)>,
    /// The program (as written) and its arguments.
    pub argv: Vec<String>,
}

/// Every command of `program` in the ```` ```sh ```` blocks of the section
/// whose heading line starts with `heading` (up to the next heading of
/// the same or a higher level).
pub fn commands(readme: &str, heading: &str, program: &str) -> Vec<CommandLine> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut out = Vec::new();
    let mut exports: Vec<(String, String)> = Vec::new();
    let mut inside = false;
    let mut in_block = false;
    let mut heredoc: Option<String> = None;
    let mut pending = String::new();
    let mut pending_line = 0;
    for (i, raw) in readme.lines().enumerate() {
        let trimmed = raw.trim();
        if !in_block && trimmed.starts_with('#') {
            let l = trimmed.chars().take_while(|c| *c == '#').count();
            if trimmed.starts_with(heading) {
                inside = true;
                continue;
            } else if inside && l <= level {
                break;
            }
        }
        if !inside {
            continue;
        }
        if trimmed.starts_with("```") {
            in_block = !in_block && (trimmed == "```sh" || trimmed == "```bash");
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(end) = &heredoc {
            if trimmed == end {
                heredoc = None;
            }
            continue;
        }
        if pending.is_empty() {
            pending_line = i + 1;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let text = std::mem::take(&mut pending);
        if let Some(end) = heredoc_end(&text) {
            heredoc = Some(end);
        }
        let Some(words) = shlex::split(strip_comment(&text)) else {
            panic!("README line {pending_line}: unbalanced quotes in {text:?}");
        };
        read_words(words, pending_line, program, &mut exports, &mut out);
    }
    out
}

/// Reads one shell line's words: records `export`s and every command of
/// `program` in it.
fn read_words(
    words: Vec<String>,
    line: usize,
    program: &str,
    exports: &mut Vec<(String, String)>,
    out: &mut Vec<CommandLine>,
) {
    for cmd in split_commands(words) {
        let mut env = exports.clone();
        let mut rest = cmd.as_slice();
        if rest.first().map(String::as_str) == Some("export") {
            for w in &rest[1..] {
                if let Some((k, v)) = w.split_once('=') {
                    exports.push((k.to_string(), v.to_string()));
                }
            }
            continue;
        }
        while let Some(w) = rest.first() {
            match w.split_once('=') {
                Some((k, v)) if !k.is_empty() && k.chars().all(is_name_char) => {
                    env.push((k.to_string(), v.to_string()));
                    rest = &rest[1..];
                }
                _ if w == "sudo" || w == "exec" => rest = &rest[1..],
                _ => break,
            }
        }
        if let Some(i) = rest.iter().position(|w| w == "-c") {
            if i > 0 && (rest[i - 1] == "sh" || rest[i - 1] == "bash") {
                if let Some(inner) = rest.get(i + 1).and_then(|s| shlex::split(s)) {
                    read_words(inner, line, program, exports, out);
                }
                continue;
            }
        }
        let Some(at) = rest.iter().position(|w| w == program) else {
            continue;
        };
        // `unshare ... xfer serve ...`: the program may follow a wrapper.
        if at > 0 && rest[0] != "unshare" {
            continue;
        }
        out.push(CommandLine {
            line,
            env,
            argv: rest[at..].to_vec(),
        });
    }
}

/// Splits a line's words into commands at `&`, `&&`, `||`, `;` and `|`,
/// and drops redirections (`> f`, `2>&1`, `>f`).
fn split_commands(words: Vec<String>) -> Vec<Vec<String>> {
    let mut cmds = vec![Vec::new()];
    let mut skip_next = false;
    for w in words {
        if skip_next {
            skip_next = false;
            continue;
        }
        let w = w.trim_end_matches(';').to_string();
        match w.as_str() {
            "&" | "&&" | "||" | "|" | ";" => cmds.push(Vec::new()),
            ">" | ">>" | "<" | "2>" | "2>>" | "<<" => skip_next = true,
            _ if w.starts_with('>')
                || w.starts_with("2>")
                || w.starts_with('<')
                || w.starts_with("&>") => {}
            _ => cmds.last_mut().expect("one").push(w),
        }
    }
    cmds.retain(|c| !c.is_empty());
    cmds
}

/// The end word of a heredoc the line opens (`<<'EOF'`, `<<EOF`, `<< EOF`).
fn heredoc_end(line: &str) -> Option<String> {
    let at = line.find("<<")?;
    let rest = line[at + 2..].trim_start_matches('-').trim_start();
    let word: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace())
        .filter(|c| *c != '\'' && *c != '"')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// The line without a trailing `# comment` (outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return &line[..i],
            _ => {}
        }
        prev = c;
    }
    line
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# t\n\n## Quick start\n\ntext `xfer no`\n\n```sh\n\
export XFER_CLUSTER=/c.toml\n\
xfer ca init --dir ca   # a comment\n\
HF_TOKEN=x xfer sync a/b \\\n  --wait\n\
cat > c.toml <<'EOF'\nxfer inside heredoc\nEOF\n\
sudo unshare --mount sh -c 'mount --bind /a /b && exec xfer serve --root /b' > a.log 2>&1 &\n\
xfer-launch up\n\
```\n\n## Next\n\n```sh\nxfer later\n```\n";

    #[test]
    fn finds_the_commands_a_reader_would_run() {
        let c = commands(SAMPLE, "## Quick start", "xfer");
        let argv: Vec<String> = c.iter().map(|c| c.argv.join(" ")).collect();
        assert_eq!(
            argv,
            [
                "xfer ca init --dir ca",
                "xfer sync a/b --wait",
                "xfer serve --root /b"
            ]
        );
        assert_eq!(c[1].line, 10);
        assert!(c[1].env.contains(&("HF_TOKEN".into(), "x".into())));
        assert!(c[0]
            .env
            .contains(&("XFER_CLUSTER".into(), "/c.toml".into())));
        let l = commands(SAMPLE, "## Quick start", "xfer-launch");
        assert_eq!(l.len(), 1);
    }
}
