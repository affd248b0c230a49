//! No import circles between the files of any crate (issue 52): within each workspace member,
//! the graph of which file names which other file is acyclic.
//!
//! Every `.rs` file under a member's `src/` is a module (`lib.rs` and `main.rs` the crate root,
//! `mod.rs` its folder's module; `src/bin/` holds other crates and is left out). A file names a
//! module through `use` trees (`use crate::a::{b, c::d}`, `use super::x`, `use self::y`) and
//! through paths in code (`crate::a::f()`, `super::b::T`); `super` and `self` count from the
//! inline module they appear in. A child named by its bare name (`gemm::task` in `fast.rs`,
//! `pub use child::Item` in a `mod.rs`) is not read, as the issue's `circles.py` does not: a
//! parent re-exporting its children's items is the usual facade.
//! A path stands for the longest file module it starts with; naming oneself or an ancestor
//! (the items a parent gives its children) is no edge. Comments, literals and
//! `#[cfg(test)] mod ... { ... }` blocks are skipped. A strongly connected component of more
//! than one file (Tarjan) is a circle; the test lists each one's files and edges, with the line
//! and path that make each edge.
//!
//! The walk reads the workspace members from the root `Cargo.toml`; std only, milliseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// A module inside its crate: `[]` the crate root, `["fast", "gemm"]` `src/fast/gemm.rs`.
type ModPath = Vec<String>;

#[test]
fn no_import_circles_between_the_files_of_any_crate() {
    let root = workspace_root();
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("the workspace's Cargo.toml");
    let members = expand_members(&root, &workspace_members(&manifest));
    assert!(
        !members.is_empty(),
        "no workspace members read from {}",
        root.display()
    );
    let (mut report, mut found, mut files, mut edges) = (String::new(), 0, 0, 0);
    for member in &members {
        let src = root.join(member).join("src");
        if !src.is_dir() {
            continue;
        }
        let krate = Crate::read(&src);
        let graph = file_graph(&krate);
        files += krate.modules.values().map(Vec::len).sum::<usize>();
        edges += graph.values().map(BTreeMap::len).sum::<usize>();
        for circle in circles(&graph) {
            found += 1;
            report.push_str(&describe(&circle, &krate, &graph, &|p| {
                Path::new(member).join("src").join(p).display().to_string()
            }));
        }
    }
    // A walk that found nothing would pass without checking anything.
    assert!(files > 0 && edges > 0, "read {files} files and {edges} edges");
    assert!(
        found == 0,
        "{found} import circle(s) between the files of a crate:\n{report}"
    );
}

/// The engine's folders in ARCHITECTURE.md's order: each uses only the folders before it, never
/// one after (`checkpoint` knows no model code, `model` no run time, the run time neither the
/// server nor the benchmark). Test modules may reach further, like the circle check allows.
const ENGINE_ORDER: [&str; 6] = ["checkpoint", "tokenizer", "model", "runtime", "bench", "serve"];

#[test]
fn the_engines_folders_use_only_the_folders_above_them() {
    let src = workspace_root().join("engine/src");
    let graph = file_graph(&Crate::read(&src));
    let rank = |m: &ModPath| {
        m.first()
            .and_then(|top| ENGINE_ORDER.iter().position(|f| f == top))
    };
    let (mut report, mut checked) = (String::new(), 0);
    for (from, targets) in &graph {
        let Some(f) = rank(from) else { continue };
        for (to, w) in targets {
            let Some(t) = rank(to) else { continue };
            checked += 1;
            // `bench` and `serve` are side by side: neither may use the other.
            let above = t < f && !(ENGINE_ORDER[t] == "bench" && ENGINE_ORDER[f] == "serve");
            if t != f && !above {
                report.push_str(&format!(
                    "  {} ({}) uses {} ({}) at {}:{}: `{}`\n",
                    from.join("::"),
                    ENGINE_ORDER[f],
                    to.join("::"),
                    ENGINE_ORDER[t],
                    w.file.display(),
                    w.line,
                    w.path
                ));
            }
        }
    }
    assert!(checked > 0, "no edge between the engine's folders was read");
    assert!(
        report.is_empty(),
        "engine folders that use a folder below them (ARCHITECTURE.md: {}):\n{report}",
        ENGINE_ORDER.join(" <- ")
    );
}

/// The folder above this package whose `Cargo.toml` has a `[workspace]` table.
fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| {
            fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|m| m.lines().any(|l| l.trim() == "[workspace]"))
        })
        .expect("a workspace root above the package")
        .to_path_buf()
}

/// The `members` of the `[workspace]` table, as written (std only: no TOML parser).
fn workspace_members(manifest: &str) -> Vec<String> {
    let (mut in_workspace, mut list) = (false, None::<String>);
    for line in manifest.lines() {
        let line = strip_toml_comment(line);
        let t = line.trim();
        if let Some(l) = list.as_mut() {
            l.push_str(t);
        } else if t.starts_with('[') {
            in_workspace = t == "[workspace]";
            continue;
        } else if in_workspace {
            if let Some(rest) = t.strip_prefix("members") {
                if let Some(rest) = rest.trim_start().strip_prefix('=') {
                    list = Some(rest.to_string());
                }
            }
        }
        if list.as_ref().is_some_and(|l| l.contains(']')) {
            break;
        }
    }
    let list = list.unwrap_or_default();
    let list = list.split(']').next().unwrap_or("");
    list.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

fn strip_toml_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Members as folders: `dir/*` globs become the folders under `dir` with a `Cargo.toml`.
fn expand_members(root: &Path, members: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for m in members {
        match m.strip_suffix("/*") {
            Some(dir) => {
                let mut found: Vec<PathBuf> = fs::read_dir(root.join(dir))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.path().join("Cargo.toml").is_file())
                    .map(|e| Path::new(dir).join(e.file_name()))
                    .collect();
                found.sort();
                out.extend(found);
            }
            None => out.push(PathBuf::from(m)),
        }
    }
    out
}

/// One crate's files by module (`lib.rs` and `main.rs` are both the root); paths relative to
/// `src/`.
#[derive(Default)]
struct Crate {
    modules: BTreeMap<ModPath, Vec<(PathBuf, String)>>,
}

impl Crate {
    /// Every `.rs` file under `src`.
    fn read(src: &Path) -> Crate {
        let mut krate = Crate::default();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            let mut entries: Vec<PathBuf> = fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| e.expect("a directory entry").path())
                .collect();
            entries.sort();
            for p in entries {
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|e| e == "rs") {
                    let rel = p.strip_prefix(src).expect("under src").to_path_buf();
                    let text = String::from_utf8_lossy(&fs::read(&p).expect("a source file")).into_owned();
                    krate.add(rel, text);
                }
            }
        }
        krate
    }

    /// Adds the file at `rel` (relative to `src/`), unless it is not a module of the crate.
    fn add(&mut self, rel: PathBuf, text: String) {
        if let Some(m) = module_of(&rel) {
            self.modules.entry(m).or_default().push((rel, text));
        }
    }
}

/// The module a file under `src/` is: `a/b.rs` is `a::b`, `a/mod.rs` is `a`, `lib.rs` and
/// `main.rs` the root; `None` for files of `src/bin/` (crates of their own) and non-Rust files.
fn module_of(rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?.to_string();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let folder_module = stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"));
    if !folder_module {
        parts.push(stem);
    }
    Some(parts)
}

/// Why an edge exists: the first reference that makes it.
#[derive(Clone, Debug)]
struct Witness {
    file: PathBuf,
    line: usize,
    path: String,
}

/// Per module, the other modules it names.
type Graph = BTreeMap<ModPath, BTreeMap<ModPath, Witness>>;

/// The edges between a crate's files.
fn file_graph(krate: &Crate) -> Graph {
    let known: BTreeSet<ModPath> = krate.modules.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, files) in &krate.modules {
        let out = graph.entry(module.clone()).or_default();
        for (file, text) in files {
            for r in references(module, text) {
                let Some(target) = resolve(&r, &known) else {
                    continue;
                };
                // Oneself, or an ancestor (the root included): no edge.
                if module.starts_with(&target) {
                    continue;
                }
                out.entry(target).or_insert_with(|| Witness {
                    file: file.clone(),
                    line: r.line,
                    path: r.path.join("::"),
                });
            }
        }
    }
    graph
}

/// A path named in a file, and the (inline) module it is named in.
#[derive(Clone, Debug, PartialEq)]
struct Reference {
    /// The module the path appears in: the file's, or an inline `mod x { .. }` inside it.
    scope: ModPath,
    /// Its segments: `crate`, `super` or `self` first where it can name a file of the crate.
    path: Vec<String>,
    line: usize,
}

/// The file module a path stands for: the longest one its absolute form starts with, `crate`,
/// `super` and `self` counting from the reference's scope; `None` for other paths.
fn resolve(r: &Reference, known: &BTreeSet<ModPath>) -> Option<ModPath> {
    let first = r.path.first()?.as_str();
    let mut full: ModPath = match first {
        "crate" => r.path[1..].to_vec(),
        "super" | "self" => {
            let mut base = r.scope.clone();
            let mut k = 0;
            while k < r.path.len() && (r.path[k] == "super" || r.path[k] == "self") {
                if r.path[k] == "super" {
                    base.pop()?;
                }
                k += 1;
            }
            base.extend_from_slice(&r.path[k..]);
            base
        }
        _ => return None,
    };
    while !known.contains(&full) {
        full.pop()?;
    }
    Some(full)
}

/// Tokens of Rust source, without comments and literals' contents.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// An identifier or keyword (a raw identifier without its `r#`).
    Ident(String),
    /// `::`.
    PathSep,
    /// One punctuation character.
    Punct(char),
    /// A string, character or number literal.
    Literal,
    /// A lifetime or label.
    Lifetime,
}

/// Splits `src` into tokens with their lines (1-based).
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let s: Vec<char> = src.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let is_start = |c: char| c == '_' || c.is_alphabetic();
    let is_cont = |c: char| c == '_' || c.is_alphanumeric();
    // The index after the character literal whose opening quote is at `i`.
    let char_end = |i: usize| {
        if at(i + 1) == '\\' {
            (i + 3..)
                .find(|&j| j >= s.len() || s[j] == '\'')
                .unwrap_or(s.len())
                + 1
        } else {
            i + 3
        }
    };
    let (mut toks, mut i, mut line) = (Vec::new(), 0, 1);
    // Skips a quoted literal from its opening `"` at `i` (escapes unless `raw`, then `hashes`
    // `#` after the closing quote); returns the index after it and counts its lines.
    let quoted = |mut i: usize, raw: bool, hashes: usize, line: &mut usize| -> usize {
        i += 1;
        while i < s.len() {
            match s[i] {
                '\\' if !raw => i += 1,
                '\n' => *line += 1,
                '"' if (0..hashes).all(|h| at(i + 1 + h) == '#') => return i + 1 + hashes,
                _ => {}
            }
            i += 1;
        }
        i
    };
    while i < s.len() {
        let c = s[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(s[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' {
            let l = line;
            i = quoted(i, false, 0, &mut line);
            toks.push((Tok::Literal, l));
        } else if c == '\'' {
            if at(i + 1) == '\\' || at(i + 2) == '\'' {
                i = char_end(i);
                toks.push((Tok::Literal, line));
            } else {
                i += 1;
                while is_cont(at(i)) {
                    i += 1;
                }
                toks.push((Tok::Lifetime, line));
            }
        } else if c.is_ascii_digit() {
            while is_cont(at(i)) || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
            toks.push((Tok::Literal, line));
        } else if is_start(c) {
            let start = i;
            while is_cont(at(i)) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "b" | "r" | "br" | "c" | "cr");
            let raw = word.ends_with('r');
            if prefix && at(i) == '"' {
                let l = line;
                i = quoted(i, raw, 0, &mut line);
                toks.push((Tok::Literal, l));
            } else if prefix && raw && at(i) == '#' {
                let hashes = (i..).take_while(|&j| at(j) == '#').count();
                if at(i + hashes) == '"' {
                    let l = line;
                    i = quoted(i + hashes, true, hashes, &mut line);
                    toks.push((Tok::Literal, l));
                } else {
                    // A raw identifier, `r#type`.
                    let start = i + 1;
                    i = start;
                    while is_cont(at(i)) {
                        i += 1;
                    }
                    toks.push((Tok::Ident(s[start..i].iter().collect()), line));
                }
            } else if word == "b" && at(i) == '\'' {
                i = char_end(i);
                toks.push((Tok::Literal, line));
            } else {
                toks.push((Tok::Ident(word), line));
            }
        } else if c == ':' && at(i + 1) == ':' {
            toks.push((Tok::PathSep, line));
            i += 2;
        } else {
            toks.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    toks
}

/// The paths a file names, in the file module `module`: leaves of `use` trees (whatever their
/// first segment; only `crate`, `super` and `self` ones resolve) and paths in code that start
/// with `crate`, `super` or `self`. Inline modules (`mod x { .. }`) are tracked as scopes;
/// `#[cfg(test)]` inline modules are skipped.
fn references(module: &[String], src: &str) -> Vec<Reference> {
    let toks = lex(src);
    let tok = |i: usize| toks.get(i).map(|t| &t.0);
    let is = |i: usize, c: char| tok(i) == Some(&Tok::Punct(c));
    let ident = |i: usize| match tok(i) {
        Some(Tok::Ident(w)) => Some(w.as_str()),
        _ => None,
    };
    let mut out = Vec::new();
    // Inline modules around the current token: their names and the brace depth inside them.
    let mut scopes: Vec<(String, usize)> = Vec::new();
    let scope_of = |scopes: &[(String, usize)]| -> ModPath {
        module
            .iter()
            .cloned()
            .chain(scopes.iter().map(|s| s.0.clone()))
            .collect()
    };
    let (mut i, mut depth) = (0, 0usize);
    while i < toks.len() {
        let line = toks[i].1;
        // `#[cfg(test)]`, further attributes, a visibility, then `mod name {`: skip the block.
        if is(i, '#') && is(i + 1, '[') && cfg_test(&toks, i + 2) {
            let mut j = i + 7;
            while is(j, '#') && is(j + 1, '[') {
                j = matching(&toks, j + 1) + 1;
            }
            if ident(j) == Some("pub") {
                j += 1;
                if is(j, '(') {
                    j = matching(&toks, j) + 1;
                }
            }
            if ident(j) == Some("mod") && ident(j + 1).is_some() && is(j + 2, '{') {
                i = matching(&toks, j + 2) + 1;
                continue;
            }
        }
        match &toks[i].0 {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                while scopes.last().is_some_and(|s| s.1 > depth) {
                    scopes.pop();
                }
                i += 1;
            }
            Tok::Ident(w) if w == "mod" && ident(i + 1).is_some() && is(i + 2, '{') => {
                depth += 1;
                scopes.push((ident(i + 1).unwrap_or_default().to_string(), depth));
                i += 3;
            }
            Tok::Ident(w)
                if w == "use"
                    && (matches!(tok(i + 1), Some(Tok::Ident(_) | Tok::PathSep))
                        || is(i + 1, '{')
                        || is(i + 1, '$')) =>
            {
                let mut leaves = Vec::new();
                i = use_tree(&toks, i + 1, Vec::new(), &mut leaves);
                let scope = scope_of(&scopes);
                for (path, line) in leaves {
                    if !path.is_empty() {
                        out.push(Reference {
                            scope: scope.clone(),
                            path,
                            line,
                        });
                    }
                }
            }
            Tok::Ident(w)
                if tok(i + 1) == Some(&Tok::PathSep)
                    && i.checked_sub(1)
                        .is_none_or(|p| !matches!(toks[p].0, Tok::PathSep | Tok::Punct('.'))) =>
            {
                let mut path = vec![w.clone()];
                let mut j = i + 1;
                while tok(j) == Some(&Tok::PathSep) {
                    let Some(next) = ident(j + 1) else {
                        break;
                    };
                    path.push(next.to_string());
                    j += 2;
                }
                if matches!(w.as_str(), "crate" | "super" | "self") {
                    out.push(Reference {
                        scope: scope_of(&scopes),
                        path,
                        line,
                    });
                }
                i = j;
            }
            _ => i += 1,
        }
    }
    out
}

/// Whether the attribute body at `i` (after `#[`) is `cfg(test)]`.
fn cfg_test(toks: &[(Tok, usize)], i: usize) -> bool {
    let want = [
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    toks.len() >= i + want.len() && toks[i..i + want.len()].iter().map(|t| &t.0).eq(want.iter())
}

/// The index of the bracket that closes the one at `open` (`(`, `[` or `{`); the last token
/// where the source is cut short.
fn matching(toks: &[(Tok, usize)], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, (t, _)) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    toks.len().saturating_sub(1)
}

/// Reads the use tree at `i` under `prefix` into `leaves` (each leaf's full path and line;
/// a glob, or `self` in a group, stands for its prefix); returns the index after the tree.
/// A leading `::` (an extern crate) leaves an empty first segment, which never resolves.
fn use_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, usize)>,
) -> usize {
    let line = toks.get(i).map_or(0, |t| t.1);
    let mut path = prefix;
    if toks.get(i).map(|t| &t.0) == Some(&Tok::PathSep) {
        if path.is_empty() {
            path.push(String::new());
        }
        i += 1;
    }
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Punct('$')) => i += 1,
            Some(Tok::Ident(w)) => {
                path.push(w.clone());
                i += 1;
                if toks.get(i).map(|t| &t.0) == Some(&Tok::PathSep) {
                    i += 1;
                } else {
                    break;
                }
            }
            Some(Tok::Punct('*')) => {
                leaves.push((path, line));
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while let Some((t, _)) = toks.get(i) {
                    match t {
                        Tok::Punct('}') => return i + 1,
                        Tok::Punct(',') => i += 1,
                        _ => {
                            let next = use_tree(toks, i, path.clone(), leaves);
                            // Never stall on a token no tree starts with.
                            i = next.max(i + 1);
                        }
                    }
                }
                return i;
            }
            _ => break,
        }
    }
    if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    if toks.get(i).map(|t| &t.0) == Some(&Tok::Ident("as".into())) {
        i += 2;
    }
    leaves.push((path, line));
    i
}

/// The strongly connected components of more than one module (Tarjan), each sorted, in order.
fn circles(graph: &Graph) -> Vec<Vec<ModPath>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g ModPath, (usize, usize)>,
        stack: Vec<&'g ModPath>,
        on_stack: BTreeSet<&'g ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'g>(st: &mut State<'g>, v: &'g ModPath) {
        let graph = st.graph;
        st.index.insert(v, (st.next, st.next));
        st.next += 1;
        st.stack.push(v);
        st.on_stack.insert(v);
        for w in graph.get(v).into_iter().flat_map(BTreeMap::keys) {
            if !st.index.contains_key(w) {
                visit(st, w);
                let low = st.index[w].1.min(st.index[v].1);
                st.index.get_mut(v).expect("visited").1 = low;
            } else if st.on_stack.contains(w) {
                let low = st.index[w].0.min(st.index[v].1);
                st.index.get_mut(v).expect("visited").1 = low;
            }
        }
        if st.index[v].0 == st.index[v].1 {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.out.push(comp);
            }
        }
    }
    let mut st = State {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !st.index.contains_key(v) {
            visit(&mut st, v);
        }
    }
    st.out.sort();
    st.out
}

/// A circle's files and the edges between them, each with the line and path that make it.
fn describe(circle: &[ModPath], krate: &Crate, graph: &Graph, show: &dyn Fn(&Path) -> String) -> String {
    let files = |m: &ModPath| -> Vec<String> { krate.modules[m].iter().map(|(p, _)| show(p)).collect() };
    let names: Vec<String> = circle.iter().flat_map(files).collect();
    let mut s = format!("circle: {}\n", names.join(", "));
    for a in circle {
        for (b, w) in graph.get(a).into_iter().flatten() {
            if circle.contains(b) {
                let _ = writeln!(
                    s,
                    "  {} -> {} (line {}: {})",
                    show(&w.file),
                    files(b).join(" + "),
                    w.line,
                    w.path
                );
            }
        }
    }
    s
}

/// The checker itself, on crates written here.
mod checker {
    use super::*;

    fn krate(files: &[(&str, &str)]) -> Crate {
        let mut k = Crate::default();
        for (p, text) in files {
            k.add(PathBuf::from(p), text.to_string());
        }
        k
    }

    fn m(path: &str) -> ModPath {
        path.split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn edges(k: &Crate) -> BTreeSet<(ModPath, ModPath)> {
        file_graph(k)
            .into_iter()
            .flat_map(|(a, out)| out.into_keys().map(move |b| (a.clone(), b)))
            .collect()
    }

    fn set(pairs: &[(&str, &str)]) -> BTreeSet<(ModPath, ModPath)> {
        pairs.iter().map(|(a, b)| (m(a), m(b))).collect()
    }

    #[test]
    fn files_map_to_modules() {
        assert_eq!(module_of(Path::new("lib.rs")), Some(m("")));
        assert_eq!(module_of(Path::new("main.rs")), Some(m("")));
        assert_eq!(module_of(Path::new("fast.rs")), Some(m("fast")));
        assert_eq!(module_of(Path::new("fast/gemm.rs")), Some(m("fast::gemm")));
        assert_eq!(module_of(Path::new("runtime/mod.rs")), Some(m("runtime")));
        assert_eq!(module_of(Path::new("runtime/lib.rs")), Some(m("runtime::lib")));
        assert_eq!(module_of(Path::new("bin/tool.rs")), None);
        assert_eq!(module_of(Path::new("bin.rs")), Some(m("bin")));
        assert_eq!(module_of(Path::new("shader.wgsl")), None);
    }

    #[test]
    fn a_three_file_circle_is_found_with_its_edges() {
        let k = krate(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::Thing;\n"),
            ("b.rs", "use super::c::Other;\n"),
            ("c.rs", "pub fn f() {\n    crate::a::g();\n}\n"),
        ]);
        let graph = file_graph(&k);
        assert_eq!(circles(&graph), vec![vec![m("a"), m("b"), m("c")]]);
        let text = describe(&circles(&graph)[0], &k, &graph, &|p| p.display().to_string());
        assert!(text.starts_with("circle: a.rs, b.rs, c.rs\n"), "{text}");
        assert!(
            text.contains("  a.rs -> b.rs (line 1: crate::b::Thing)"),
            "{text}"
        );
        assert!(
            text.contains("  b.rs -> c.rs (line 1: super::c::Other)"),
            "{text}"
        );
        assert!(text.contains("  c.rs -> a.rs (line 2: crate::a::g)"), "{text}");
    }

    #[test]
    fn a_dag_passes_whatever_comments_literals_and_tests_name() {
        let k = krate(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub use a::Top;\n"),
            (
                "a.rs",
                "use crate::b::B;\npub struct Top;\nfn f() { crate::c::g(); }\n",
            ),
            ("b.rs", "use super::c::C;\npub struct B;\n"),
            (
                "c.rs",
                r##"//! Not `crate::a::Top`: /* nor crate::b::B /* nested */ crate::a */
pub struct C;
pub fn g() {
    let _ = "crate::a::Top";
    let _ = r#"crate::b::B"#;
    let _ = ('"', '\'', b'x');
    let _: &'static str = "";
    super::helper_in_the_parent_is_no_edge();
}
// crate::a::Top
#[cfg(test)]
#[allow(unused)]
mod tests {
    use crate::a::Top;
    fn t() { crate::b::B; }
}
"##,
            ),
        ]);
        assert_eq!(edges(&k), set(&[("a", "b"), ("a", "c"), ("b", "c")]));
        assert!(circles(&file_graph(&k)).is_empty());
    }

    /// `super::b::helper` from `c.rs` names `b`, a sibling: only the ancestors are free.
    #[test]
    fn naming_a_sibling_through_super_is_an_edge() {
        let k = krate(&[
            ("lib.rs", ""),
            ("b.rs", "use crate::c::C;\n"),
            ("c.rs", "fn g() { super::b::helper(); }\n"),
        ]);
        assert_eq!(circles(&file_graph(&k)), vec![vec![m("b"), m("c")]]);
    }

    #[test]
    fn grouped_uses_resolve_to_the_longest_file_module() {
        let k = krate(&[
            ("lib.rs", ""),
            ("a.rs", ""),
            ("b/mod.rs", ""),
            ("b/c.rs", ""),
            ("d.rs", ""),
            (
                "user.rs",
                r"use crate::{
    a::{X, Y as Z},
    b::{self, c::{W, V}},
    d::*,
};
use ::std::fmt;
use std::io;
",
            ),
        ]);
        assert_eq!(
            edges(&k),
            set(&[("user", "a"), ("user", "b"), ("user", "b::c"), ("user", "d")])
        );
        let refs = references(&m("user"), &k.modules[&m("user")][0].1);
        let paths: Vec<String> = refs.iter().map(|r| r.path.join("::")).collect();
        assert_eq!(
            paths,
            [
                "crate::a::X",
                "crate::a::Y",
                "crate::b",
                "crate::b::c::W",
                "crate::b::c::V",
                "crate::d",
                "::std::fmt",
                "std::io"
            ]
        );
        assert_eq!(refs[3].line, 3);
    }

    /// `super` and `self` count from the inline module they are in (`super::amx` in `fast.rs`'s
    /// `mod scalar` is `fast::amx`); a child named by its bare name is no edge, by `self::` it is.
    #[test]
    fn super_and_self_count_from_inline_modules() {
        let k = krate(&[
            ("lib.rs", "mod fast;\nmod other;\nfn run() { fast::matmul(); }\n"),
            (
                "fast.rs",
                r"mod gemm;
mod amx;
mod scalar {
    use super::*;
    fn f() {
        gemm::unpack();
        self::helper();
        super::amx::x();
    }
}
fn g() { self::gemm::task(); }
",
            ),
            (
                "fast/gemm.rs",
                r"use super::super::other::O;
mod wide {
    use super::super::Kind;
    use self::inner::X;
}
",
            ),
            ("fast/amx.rs", "use super::gemm::store_tile;\n"),
            ("other.rs", ""),
        ]);
        assert_eq!(
            edges(&k),
            set(&[
                ("fast", "fast::amx"),
                ("fast", "fast::gemm"),
                ("fast::gemm", "other"),
                ("fast::amx", "fast::gemm"),
            ])
        );
        let graph = file_graph(&k);
        assert_eq!(graph[&m("fast")][&m("fast::amx")].line, 8);
        // `fast.rs` -> `fast/gemm.rs` -> `other.rs` -> `fast.rs` closes only where `fast.rs`
        // names its child through `self::`.
        for (fast, circle) in [
            ("fn g() { gemm::task(); }\n", false),
            ("fn g() { self::gemm::task(); }\n", true),
        ] {
            let k = krate(&[
                ("lib.rs", ""),
                ("fast.rs", fast),
                ("fast/gemm.rs", "use crate::other::O;\n"),
                ("other.rs", "use crate::fast::Kind;\n"),
            ]);
            let want = if circle {
                vec![vec![m("fast"), m("fast::gemm"), m("other")]]
            } else {
                vec![]
            };
            assert_eq!(circles(&file_graph(&k)), want, "{fast}");
        }
    }

    #[test]
    fn workspace_members_are_read_from_the_manifest() {
        let manifest = r#"[package]
name = "x"

[workspace]
resolver = "2"
members = [
    "a", # the first
    "b/c",
]
default-members = ["a"]
"#;
        assert_eq!(workspace_members(manifest), ["a", "b/c"]);
        assert_eq!(workspace_members("[workspace]\nmembers = [\"one\"]\n"), ["one"]);
    }
}
