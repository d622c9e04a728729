//! The house's layering, checked from the source: every path a module of
//! the `xfer` crate names (`use` trees and inline paths alike, `crate::`,
//! `super::` and `self::` resolved to the file module they land in) must
//! point at its own layer's module or at a layer listed before it in
//! [`LAYERS`] (the order of docs/how-it-works.md "Layers"); the launcher
//! may name only `xfer::config`, `xfer::client` and `xfer::util` of the
//! `xfer` crate ([`LAUNCHER_MAY_USE`]); and no two file modules may import
//! each other, directly or around a longer circle.
//!
//! `#[cfg(test)]` items are not read, nor a file declared
//! `#[cfg(test)] mod x;` (the agent's `sync::life_check` checks a job's
//! life against the operator's `client::status::problems`): a unit test
//! may drive its module through a higher layer end to end, and the shipped
//! crate has no such arrow.
//!
//! Run alone: `cargo test --test suite layers::`. Parsing is `syn`'s, so
//! grouped `use crate::{a::b, c}` trees and paths inside function bodies
//! count like any other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The layers of the `xfer` crate, lowest first: a module may use its own
/// top-level module and the modules of the layers before its layer.
/// Modules that share a layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["util"],
    &["sysinfo", "config"],
    &["engine"],
    &["store"],
    &["hub", "image", "hub_lookalike"],
    &["transport"],
    &["flow"],
    // The node's side and the operator's side of the agents' services:
    // neither uses the other, both speak the wire types.
    &["agent", "client"],
    &["cli"],
    // The crate root and the fuzzing entry points sit on top of it all.
    &["fuzzing"],
];

/// What of the `xfer` crate the launcher may name: the cluster file and
/// credentials, the operator's client of the agents (asks, sync, status,
/// image delivery) and the small parts below everything (progress bars,
/// the terminal's width).
const LAUNCHER_MAY_USE: &[&str] = &["config", "client", "util"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module path of a file below `src`: `a/b.rs` and `a/b/mod.rs` are
/// `["a", "b"]`; `lib.rs` and `main.rs` are the root.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_string());
    }
    parts
}

/// Collects every path a file names, resolved against its module.
struct Paths {
    /// The module the visitor is in (the file's, plus inline `mod`s).
    here: Vec<String>,
    /// Absolute module paths named, as `crate`-relative segments, with the
    /// line they were named on.
    named: Vec<(Vec<String>, usize)>,
    /// The name a path to another crate starts with (`xfer` in the
    /// launcher), and what follows it.
    external: Vec<(Vec<String>, usize)>,
}

impl Paths {
    fn resolve(&mut self, segments: &[String], line: usize) {
        let Some(first) = segments.first() else {
            return;
        };
        let mut at: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.clone(),
            "super" => {
                let mut at = self.here.clone();
                at.pop();
                at
            }
            "xfer" => {
                self.external.push((segments[1..].to_vec(), line));
                return;
            }
            _ => return,
        };
        let mut rest = &segments[1..];
        while rest.first().is_some_and(|s| s == "super") {
            at.pop();
            rest = &rest[1..];
        }
        at.extend(rest.iter().cloned());
        self.named.push((at, line));
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, line: usize) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, line);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.resolve(&prefix.clone(), line);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.resolve(&prefix.clone(), line);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.resolve(&prefix.clone(), line),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t, line);
                }
            }
        }
    }
}

/// `#[cfg(test)]`: code the shipped crate does not contain (unit tests
/// may drive a lower module through a higher one end to end).
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.here.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.here.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.use_token.span.start().line;
        let mut prefix = Vec::new();
        self.use_tree(&mut prefix, &u.tree, line);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            let line = p.segments[0].ident.span().start().line;
            self.resolve(&segments, line);
        }
        syn::visit::visit_path(self, p);
    }
}

fn parse(file: &Path) -> syn::File {
    let text = std::fs::read_to_string(file).unwrap();
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The file modules of the `xfer` crate and, for each, the file modules it
/// names with the first line that names each.
/// A module path, as its segments below the crate root.
type Module = Vec<String>;

/// An import: the module that names, the module named, the first line.
type Edge = (Module, Module, usize);

fn xfer_graph() -> (BTreeMap<Module, PathBuf>, Vec<Edge>) {
    crate_graph("xfer/src")
}

/// [`xfer_graph`] for the crate whose sources are in `dir` (from the repo).
fn crate_graph(dir: &str) -> (BTreeMap<Module, PathBuf>, Vec<Edge>) {
    let src = repo().join(dir);
    let mut modules = BTreeMap::new();
    for file in rust_files(&src) {
        modules.insert(module_of(&src, &file), file);
    }
    let parsed: BTreeMap<&Module, syn::File> = modules.iter().map(|(m, f)| (m, parse(f))).collect();
    // A file declared `#[cfg(test)] mod x;` is a test item like any other:
    // it and the files below it are not read.
    let tests: Vec<Module> = parsed
        .iter()
        .flat_map(|(m, f)| test_only_children(m, f))
        .collect();
    let mut edges = Vec::new();
    for (module, file) in &parsed {
        if tests.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        let mut paths = Paths {
            here: module.to_vec(),
            named: Vec::new(),
            external: Vec::new(),
        };
        paths.visit_file(file);
        let mut seen = BTreeSet::new();
        for (target, line) in paths.named {
            // The longest prefix of the path that is a file module.
            let to = (0..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|m| modules.contains_key(m))
                .unwrap_or_default();
            if &to != *module && seen.insert(to.clone()) {
                edges.push((module.to_vec(), to, line));
            }
        }
    }
    (modules, edges)
}

/// The file modules `file` (module `here`) declares `#[cfg(test)] mod x;`.
fn test_only_children(here: &[String], file: &syn::File) -> Vec<Module> {
    file.items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) if m.content.is_none() && test_only(&m.attrs) => {
                let mut child = here.to_vec();
                child.push(m.ident.to_string());
                Some(child)
            }
            _ => None,
        })
        .collect()
}

fn layer_of(module: &[String]) -> Option<usize> {
    let top = module.first()?;
    LAYERS.iter().position(|l| l.contains(&top.as_str()))
}

#[test]
fn no_module_names_a_module_of_its_own_or_a_higher_layer() {
    let (modules, edges) = xfer_graph();
    let mut wrong = Vec::new();
    for m in modules.keys() {
        if !m.is_empty() && layer_of(m).is_none() {
            wrong.push(format!(
                "xfer/src/{}: top-level module `{}` has no layer: add it to LAYERS here and to docs/how-it-works.md",
                m.join("/"),
                m[0]
            ));
        }
    }
    for (from, to, line) in &edges {
        let (Some(lf), Some(lt)) = (layer_of(from), layer_of(to)) else {
            continue;
        };
        if from[0] == to[0] {
            continue;
        }
        if lt >= lf {
            wrong.push(format!(
                "{}:{line}: `{}` ({}) names `{}` ({}), not a lower layer",
                modules[from]
                    .strip_prefix(repo())
                    .unwrap_or(&modules[from])
                    .display(),
                from.join("::"),
                LAYERS[lf].join("/"),
                to.join("::"),
                LAYERS[lt].join("/"),
            ));
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_two_file_modules_import_each_other() {
    // The wire crate too: its messages are read by both sides, and a
    // circle there is one a reader of either service walks.
    let report: Vec<String> = ["xfer/src", "xfer/proto/src"]
        .into_iter()
        .flat_map(|dir| circles(crate_graph(dir)))
        .collect();
    assert!(report.is_empty(), "import circles:\n{}", report.join("\n"));
}

/// Each circle of file modules importing each other in `graph`, with the
/// lines that close it.
fn circles((modules, edges): (BTreeMap<Module, PathBuf>, Vec<Edge>)) -> Vec<String> {
    // A parent's `mod`/`pub use` of its children is how Rust builds the
    // tree, not an import of theirs: only edges between modules that are
    // not one the ancestor of the other count.
    let mut next: BTreeMap<&Vec<String>, BTreeSet<&Vec<String>>> = BTreeMap::new();
    for (from, to, _) in &edges {
        if to.starts_with(from) || from.starts_with(to) {
            continue;
        }
        next.entry(from).or_default().insert(to);
    }
    // Tarjan's strongly connected components, iteratively small enough to
    // recurse: the crate has a few hundred modules.
    struct Tarjan<'a> {
        next: &'a BTreeMap<&'a Vec<String>, BTreeSet<&'a Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        circles: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Vec<String>) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.next.get(v).into_iter().flatten().copied() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.join("::"));
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.circles.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        circles: Vec::new(),
    };
    for m in modules.keys() {
        if !t.index.contains_key(m) {
            t.visit(m);
        }
    }
    let report: Vec<String> = t
        .circles
        .iter()
        .map(|c| {
            let inside: Vec<String> = edges
                .iter()
                .filter(|(f, to, _)| c.contains(&f.join("::")) && c.contains(&to.join("::")))
                .filter(|(f, to, _)| !(to.starts_with(f) || f.starts_with(to)))
                .map(|(f, to, line)| {
                    format!(
                        "    {}:{line} names {}",
                        modules[f]
                            .strip_prefix(repo())
                            .unwrap_or(&modules[f])
                            .display(),
                        to.join("::")
                    )
                })
                .collect();
            format!("circle: {}\n{}", c.join(", "), inside.join("\n"))
        })
        .collect();
    report
}

#[test]
fn the_launcher_names_only_the_config_the_client_and_util_of_xfer() {
    let src = repo().join("launcher/src");
    let mut wrong = Vec::new();
    let mut named = 0;
    for file in rust_files(&src) {
        let mut paths = Paths {
            here: module_of(&src, &file),
            named: Vec::new(),
            external: Vec::new(),
        };
        paths.visit_file(&parse(&file));
        for (path, line) in paths.external {
            named += 1;
            let joined = path.join("::");
            if !LAUNCHER_MAY_USE
                .iter()
                .any(|ok| joined == *ok || joined.starts_with(&format!("{ok}::")))
            {
                wrong.push(format!(
                    "{}:{line}: names xfer::{joined}; the launcher may use only xfer-proto, xfer::config, xfer::client and xfer::util",
                    file.strip_prefix(repo()).unwrap_or(&file).display()
                ));
            }
        }
    }
    // The check reads something: the launcher does use the client.
    assert!(
        named > 0,
        "no path into the xfer crate found in launcher/src: is the parse broken?"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_a_planted_upward_import() {
    // The visitor resolves every form a real violation takes.
    let text = "mod inner { use super::super::flow::push; fn f() { crate::cli::run(); } }\n\
                use crate::{agent::{client, mod_x}, store::Store};\n\
                use self::deeper::x;\n";
    let file = syn::parse_file(text).unwrap();
    let mut paths = Paths {
        here: vec!["store".into(), "journal".into()],
        named: Vec::new(),
        external: Vec::new(),
    };
    paths.visit_file(&file);
    let named: BTreeSet<String> = paths.named.iter().map(|(p, _)| p.join("::")).collect();
    assert!(
        !named.contains("cli::hidden"),
        "a #[cfg(test)] module counted"
    );
    let decl = syn::parse_file("#[cfg(test)]\nmod checks;\nmod shipped;\n").unwrap();
    let here = vec!["store".to_string()];
    assert_eq!(
        test_only_children(&here, &decl),
        vec![vec!["store".to_string(), "checks".to_string()]],
        "a #[cfg(test)] file module not seen as one"
    );
    for want in [
        "store::flow::push",
        "cli::run",
        "agent::client",
        "agent::mod_x",
        "store::Store",
        "store::journal::deeper::x",
    ] {
        assert!(named.contains(want), "{want} not seen in {named:?}");
    }
}

/// Library files that still name `anyhow` (issue 54 moves each to typed
/// errors, as ripgrep keeps `anyhow` to its binary): this list may only
/// shrink. The binaries' own code (`xfer/src/main.rs`, `xfer/src/cli/`,
/// `launcher/src/main.rs`) may use it.
const ANYHOW_LEFT: &[&str] = &[
    "xfer/src/agent/admin.rs",
    "xfer/src/agent/intake.rs",
    "xfer/src/agent/launch.rs",
    "xfer/src/agent/mod.rs",
    "xfer/src/agent/sync/runner.rs",
    "xfer/src/agent/transfer.rs",
    "xfer/src/hub/http.rs",
    "xfer/src/hub/pull.rs",
    "xfer/src/hub_lookalike/mod.rs",
    "xfer/src/hub_lookalike/repo.rs",
    "xfer/src/image/archive.rs",
    "xfer/src/image/files.rs",
    "xfer/src/image/registry/artifact.rs",
    "xfer/src/image/registry/client.rs",
    "xfer/src/store/mod.rs",
    "xfer/src/store/record.rs",
    "xfer/src/store/scan.rs",
    "xfer/src/store/verify.rs",
    "xfer/src/transport/ask.rs",
    "xfer/src/transport/quic.rs",
    "xfer/src/transport/rdma/link.rs",
    "xfer/src/transport/select.rs",
    // The bridge that carries an untyped lower layer's chain into a
    // typed error; it goes with the last of the others.
    "xfer/src/util/chain.rs",
    "xfer/src/util/metrics.rs",
    "xfer/proto/src/manifest.rs",
];

/// Finds the first line of non-test code that names the `anyhow` crate.
struct NamesAnyhow {
    line: Option<usize>,
}

impl<'ast> Visit<'ast> for NamesAnyhow {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test = match item {
            syn::Item::Mod(m) => test_only(&m.attrs),
            syn::Item::Fn(f) => test_only(&f.attrs),
            syn::Item::Use(u) => test_only(&u.attrs),
            syn::Item::Impl(i) => test_only(&i.attrs),
            _ => false,
        };
        if !test {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let root = match &u.tree {
            syn::UseTree::Path(p) => Some(&p.ident),
            syn::UseTree::Name(n) => Some(&n.ident),
            syn::UseTree::Rename(r) => Some(&r.ident),
            _ => None,
        };
        if root.is_some_and(|i| i == "anyhow") {
            self.line.get_or_insert(u.use_token.span.start().line);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() > 1 && p.segments[0].ident == "anyhow" {
            self.line
                .get_or_insert(p.segments[0].ident.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }
}

/// `path:line` of every library file of `dir` that names `anyhow`.
fn library_files_naming_anyhow(dir: &str, binary: &[&str]) -> Vec<(String, usize)> {
    let src = repo().join(dir);
    let files: Vec<(Module, PathBuf, syn::File)> = rust_files(&src)
        .into_iter()
        .map(|f| (module_of(&src, &f), parse(&f), f))
        .map(|(m, p, f)| (m, f, p))
        .collect();
    let tests: Vec<Module> = files
        .iter()
        .flat_map(|(m, _, f)| test_only_children(m, f))
        .collect();
    let mut out = Vec::new();
    for (module, path, file) in &files {
        let rel = path.strip_prefix(repo()).unwrap().display().to_string();
        if tests.iter().any(|t| module.starts_with(t))
            || binary
                .iter()
                .any(|b| rel == *b || rel.starts_with(&format!("{b}/")))
        {
            continue;
        }
        let mut v = NamesAnyhow { line: None };
        v.visit_file(file);
        if let Some(line) = v.line {
            out.push((rel, line));
        }
    }
    out
}

#[test]
fn anyhow_is_named_only_by_the_binaries_and_the_files_still_listed() {
    let mut found = library_files_naming_anyhow("xfer/src", &["xfer/src/main.rs", "xfer/src/cli"]);
    found.extend(library_files_naming_anyhow("xfer/proto/src", &[]));
    found.extend(library_files_naming_anyhow(
        "launcher/src",
        &["launcher/src/main.rs"],
    ));
    let mut wrong: Vec<String> = found
        .iter()
        .filter(|(f, _)| !ANYHOW_LEFT.contains(&f.as_str()))
        .map(|(f, line)| {
            format!("{f}:{line}: names anyhow in library code; return a typed error (thiserror) that says whether it is permanent")
        })
        .collect();
    wrong.extend(
        ANYHOW_LEFT
            .iter()
            .filter(|f| !found.iter().any(|(g, _)| g == *f))
            .map(|f| {
                format!("{f} no longer names anyhow: strike it from ANYHOW_LEFT in tests/layers.rs")
            }),
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_anyhow_check_sees_a_use_a_path_and_a_macro_but_not_a_test() {
    let text = "fn a() -> Result<(), E> { Ok(()) }\n\
                fn b() { let _ = anyhow::anyhow!(\"x\"); }\n\
                #[cfg(test)] mod t { use anyhow::Result; }\n";
    let mut v = NamesAnyhow { line: None };
    v.visit_file(&syn::parse_file(text).unwrap());
    assert_eq!(v.line, Some(2), "a macro path missed");
    for (text, want) in [
        ("use anyhow::{Context, Result};\n", Some(1)),
        ("#[cfg(test)]\nuse anyhow::Result;\n", None),
        ("fn f() -> anyhow::Result<()> { Ok(()) }\n", Some(1)),
    ] {
        let mut v = NamesAnyhow { line: None };
        v.visit_file(&syn::parse_file(text).unwrap());
        assert_eq!(v.line, want, "{text}");
    }
}
