//! Text for a terminal: a line wrapped to a width with its continuation
//! lines indented (a cause is wrapped, never cut), a name elided in the
//! middle, and a table whose columns fit a width. Widths are counted in
//! characters; `None` means no limit (output that is not a terminal).

/// Columns `s` takes (characters; every character counts as one).
pub fn cols(s: &str) -> usize {
    s.chars().count()
}

/// `s` in at most `max` columns: kept whole when it fits, else its head
/// and tail around an ellipsis (`model-000…safetensors`).
pub fn elide(s: &str, max: usize) -> String {
    let n = cols(s);
    if n <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let keep = max - 1;
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let mut out: String = s.chars().take(head).collect();
    out.push('…');
    out.extend(s.chars().skip(n - tail));
    out
}

/// A file's name for a progress bar of `max` columns: whole when it fits;
/// else without its extension; a shard (`model-00001-of-00002`) keeps its
/// number whole (`model 1/2`, `mod…1/2`), since two shards' bars differ
/// only there; anything else elided in the middle.
pub fn file_label(path: &str, max: usize) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    if cols(base) <= max {
        return base.to_string();
    }
    let stem = base.rsplit_once('.').map_or(base, |(s, _)| s);
    let shard = stem.rsplit_once("-of-").and_then(|(head, m)| {
        let (prefix, n) = head.rsplit_once('-')?;
        let digits = |d: &str| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit());
        (digits(n) && digits(m)).then(|| {
            let trim = |d: &str| d.trim_start_matches('0').to_string();
            let (n, m) = (trim(n), trim(m));
            (
                prefix.to_string(),
                format!("{}/{}", if n.is_empty() { "0".into() } else { n }, m),
            )
        })
    });
    match shard {
        Some((prefix, number)) => {
            let whole = format!("{prefix} {number}");
            if cols(&whole) <= max {
                return whole;
            }
            let room = max.saturating_sub(cols(&number) + 1);
            if room == 0 {
                return elide(&number, max);
            }
            let head: String = prefix.chars().take(room).collect();
            format!("{head}…{number}")
        }
        None => elide(stem, max),
    }
}

/// `text` in lines of at most `width` columns, broken at spaces (a word
/// longer than a line is split); every line after the first starts with
/// `hang` spaces. With no `width`, `text` as it is.
pub fn wrap(text: &str, width: Option<usize>, hang: usize) -> String {
    let Some(width) = width else {
        return text.to_string();
    };
    // A hang that leaves no room is cut back so every line carries text.
    let hang = hang.min(width / 2);
    let pad = " ".repeat(hang);
    // Leading spaces (an indented detail) stay on the first line.
    let body = text.trim_start_matches(' ');
    let lead = cols(text) - cols(body);
    let mut lines: Vec<String> = Vec::new();
    let mut line = " ".repeat(lead.min(width / 2));
    let mut used = cols(&line);
    let mut fresh = true;
    let room = |lines: &Vec<String>| {
        if lines.is_empty() {
            width
        } else {
            width - hang
        }
    };
    for word in body.split(' ') {
        let mut word = word.to_string();
        loop {
            let w = cols(&word);
            let sep = usize::from(!fresh);
            if used + sep + w <= room(&lines) {
                if sep == 1 {
                    line.push(' ');
                }
                line.push_str(&word);
                used += sep + w;
                fresh = false;
                break;
            }
            if !fresh {
                lines.push(std::mem::take(&mut line));
                (used, fresh) = (0, true);
                continue;
            }
            // One word wider than the line: split it.
            let r = room(&lines).saturating_sub(used).max(1);
            let head: String = word.chars().take(r).collect();
            word = word.chars().skip(r).collect();
            line.push_str(&head);
            lines.push(std::mem::take(&mut line));
            (used, fresh) = (0, true);
            if word.is_empty() {
                break;
            }
        }
    }
    if !fresh || lines.is_empty() {
        lines.push(line);
    }
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            out.push_str(&pad);
        }
        out.push_str(l.trim_end());
    }
    out
}

/// A table: a head, rows of cells, and under any row a detail line (an
/// error, a fix) that is wrapped and indented rather than widening the
/// table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    head: Vec<String>,
    /// Columns that may be elided to fit (names), in the order they give.
    elastic: Vec<usize>,
    rows: Vec<(Vec<String>, Vec<String>)>,
}

fn cell(r: &[String], i: usize) -> &str {
    r.get(i).map(String::as_str).unwrap_or("")
}

/// The narrowest an elastic column gets before the table stops shrinking.
const MIN_ELASTIC: usize = 8;

impl Table {
    /// A table with this head; `elastic` columns are elided (in the
    /// middle) when the table is wider than its width.
    pub fn new(head: &[&str], elastic: &[usize]) -> Table {
        Table {
            head: head.iter().map(|h| h.to_string()).collect(),
            elastic: elastic.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row, and the detail lines shown under it (each wrapped).
    pub fn row(&mut self, cells: Vec<String>, details: Vec<String>) {
        self.rows.push((cells, details));
    }

    /// The table in at most `width` columns (details indented by 4).
    pub fn render(&self, width: Option<usize>) -> String {
        let n = self.head.len();
        let mut widths: Vec<usize> = (0..n)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|(r, _)| cols(cell(r, i)))
                    .chain([cols(&self.head[i])])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        if let Some(w) = width {
            let total = |ws: &[usize]| ws.iter().sum::<usize>() + 2 * n.saturating_sub(1);
            // Shrink the widest elastic column a column at a time.
            while total(&widths) > w {
                let Some(&i) = self
                    .elastic
                    .iter()
                    .filter(|&&i| widths[i] > MIN_ELASTIC.max(cols(&self.head[i])))
                    .max_by_key(|&&i| widths[i])
                else {
                    break;
                };
                widths[i] -= 1;
            }
        }
        let mut out = String::new();
        let line = |cells: Vec<&str>| {
            let parts: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{:<w$}", elide(c, widths[i]), w = widths[i]))
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        out.push_str(&line(self.head.iter().map(String::as_str).collect()));
        out.push('\n');
        for (r, details) in &self.rows {
            out.push_str(&line((0..n).map(|i| cell(r, i)).collect()));
            out.push('\n');
            for d in details {
                for l in wrap(d, width.map(|w| w.saturating_sub(4).max(20)), 0).lines() {
                    out.push_str("    ");
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shards_label_keeps_its_number_at_any_width() {
        let a = "sub/model-00001-of-00002.safetensors";
        let b = "model-00002-of-00002.safetensors";
        assert_eq!(file_label(a, 40), "model-00001-of-00002.safetensors");
        assert_eq!(file_label(a, 12), "model 1/2");
        assert_eq!(file_label(a, 8), "mode…1/2");
        assert_ne!(
            file_label(a, 8),
            file_label(b, 8),
            "two shards' bars differ"
        );
        assert_eq!(file_label("model-00123-of-00200.safetensors", 8), "123/200");
        assert_eq!(
            file_label("tokenizer.json", 8),
            "tokenizer".chars().take(4).collect::<String>() + "…" + "zer"
        );
        assert!(cols(&file_label("a-very-long-config-name.json", 8)) <= 8);
    }

    #[test]
    fn elide_keeps_head_and_tail() {
        assert_eq!(elide("short", 10), "short");
        let e = elide("model-00001-of-00030.safetensors", 16);
        assert_eq!(cols(&e), 16);
        assert!(e.starts_with("model-00") && e.ends_with("tensors"), "{e}");
    }

    #[test]
    fn wrap_never_drops_a_word() {
        let t = "the agent at 10.0.0.7:7000 refused: no space left on /models (needs 40.0 GiB, has 12.5 GiB); free space or pick another --root";
        let w = wrap(t, Some(40), 4);
        for l in w.lines() {
            assert!(cols(l) <= 40, "{l:?}");
        }
        let back: Vec<&str> = w.split_whitespace().collect();
        assert_eq!(back, t.split_whitespace().collect::<Vec<_>>());
        assert!(w.lines().skip(1).all(|l| l.starts_with("    ")), "{w}");
        assert_eq!(wrap(t, None, 4), t);
        let indented = wrap(&format!("    last error: {t}"), Some(40), 4);
        assert!(
            indented
                .lines()
                .all(|l| l.starts_with("    ") && cols(l) <= 40),
            "{indented}"
        );
        let long = "x".repeat(95);
        assert!(wrap(&long, Some(40), 2).lines().all(|l| cols(l) <= 40));
    }

    #[test]
    fn a_table_fits_and_keeps_its_details() {
        let mut t = Table::new(&["NODE", "MODEL", "STATE"], &[1]);
        t.row(
            vec!["a".into(), "m".repeat(120), "receiving".into()],
            vec![format!("last error: {}", "why ".repeat(40))],
        );
        let s = t.render(Some(60));
        for l in s.lines() {
            assert!(cols(l) <= 60, "{l:?}");
        }
        assert_eq!(s.matches("why").count(), 40, "{s}");
        assert!(s.contains('…'), "{s}");
        // Without a width nothing is elided.
        assert!(t.render(None).contains(&"m".repeat(120)));
    }
}
