//! The module graph runs one way: no module of `src/` (nor of the
//! throughput benchmark) imports, directly or through others, a module
//! that imports it, file by file and between the crate's top-level
//! modules. Read from the source text: a module's edges are the paths its
//! `use` declarations and code name (`crate::`, `super::`, `self::` and
//! its children's), each resolved through re-exports (`pub use`) to the
//! module that defines the item. Re-exports themselves, and unit tests
//! (`#[cfg(test)] mod tests`), are not edges. No broker needed.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use support::repo::root;

type ModPath = Vec<String>;

struct Crate {
    /// Every module of the crate and its file.
    files: BTreeMap<ModPath, PathBuf>,
    /// Each module's source, comments and unit tests taken out.
    sources: BTreeMap<ModPath, String>,
}

/// The source without comments, string contents and its unit-test module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            'r' if matches!(chars.peek(), Some('#') | Some('"'))
                && !out.ends_with(|p: char| p.is_alphanumeric() || p == '_') =>
            {
                let mut hashes = 0;
                while chars.peek() == Some(&'#') {
                    chars.next();
                    hashes += 1;
                }
                if chars.next() != Some('"') {
                    continue;
                }
                out.push_str("\"\"");
                // Up to the closing quote followed by as many hashes.
                let mut tail = String::new();
                for c in chars.by_ref() {
                    tail.push(c);
                    if tail.ends_with(&format!("\"{}", "#".repeat(hashes))) {
                        break;
                    }
                }
            }
            '"' => {
                out.push_str("\"\"");
                let mut escaped = false;
                for c in chars.by_ref() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
            }
            '\'' => {
                // A char literal ('"', '\'') or a lifetime ('a): skip a literal whole.
                let mut look = chars.clone();
                let first = look.next();
                let second = look.next();
                let literal = matches!((first, second), (Some('\\'), _) | (Some(_), Some('\'')));
                out.push('\'');
                if literal {
                    while let Some(c) = chars.next() {
                        if c == '\'' {
                            break;
                        }
                        if c == '\\' {
                            chars.next();
                        }
                    }
                    out.push('\'');
                }
            }
            _ => out.push(c),
        }
    }
    out
}

impl Crate {
    fn read(root_file: &Path) -> Self {
        let mut krate = Crate {
            files: BTreeMap::new(),
            sources: BTreeMap::new(),
        };
        krate.scan(root_file, Vec::new());
        krate
    }

    fn scan(&mut self, file: &Path, path: ModPath) {
        let source = code(file);
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().map(Path::to_path_buf),
            _ => file.with_extension("").into(),
        }
        .unwrap_or_default();
        let mut after_path_attribute = false;
        for line in source.lines() {
            let line = line.trim();
            if line.starts_with("#[path") {
                // A module from elsewhere (the benchmark's test kit): not this crate's.
                after_path_attribute = true;
                continue;
            }
            let declared = line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ")
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'));
            match declared {
                Some(name) if after_path_attribute => {
                    self.files.insert(child(&path, name), PathBuf::new());
                }
                Some(name) => {
                    let flat = dir.join(format!("{name}.rs"));
                    let nested = dir.join(name).join("mod.rs");
                    let file = if flat.exists() { flat } else { nested };
                    self.scan(&file, child(&path, name));
                }
                None => {}
            }
            after_path_attribute = false;
        }
        self.files.insert(path.clone(), file.to_path_buf());
        self.sources.insert(path, source);
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.files.contains_key(path)
    }

    fn is_own(&self, path: &[String]) -> bool {
        self.files
            .get(path)
            .is_some_and(|f| !f.as_os_str().is_empty())
    }

    /// The module a path names from `from`, and what follows it; `None`
    /// for a path outside the crate.
    fn resolve(&self, from: &[String], path: &str) -> Option<(ModPath, Vec<String>)> {
        let mut parts: Vec<String> = path.split("::").map(str::to_owned).collect();
        let mut at: ModPath = match parts.first().map(String::as_str) {
            Some("crate") => {
                parts.remove(0);
                Vec::new()
            }
            Some("super") => {
                let mut at = from.to_vec();
                while parts.first().map(String::as_str) == Some("super") {
                    parts.remove(0);
                    at.pop();
                }
                at
            }
            Some("self") => {
                parts.remove(0);
                from.to_vec()
            }
            Some(first) if self.is_module(&child(from, first)) => from.to_vec(),
            _ => return None,
        };
        while let Some(next) = parts.first() {
            let candidate = child(&at, next);
            if !self.is_module(&candidate) {
                break;
            }
            at = candidate;
            parts.remove(0);
        }
        Some((at, parts))
    }

    /// `name`'s defining module when module `at` re-exports it.
    fn defining(&self, at: &[String], rest: &[String], depth: usize) -> ModPath {
        let Some(name) = rest.first() else {
            return at.to_vec();
        };
        if depth > 8 {
            return at.to_vec();
        }
        for reexport in self.reexports(at) {
            let last = reexport.rsplit("::").next().unwrap_or_default();
            let last = last.split(" as ").last().unwrap_or(last).trim();
            if last == name
                && let Some((target, more)) =
                    self.resolve(at, reexport.split(" as ").next().unwrap_or(&reexport))
            {
                return self.defining(&target, &more, depth + 1);
            }
        }
        at.to_vec()
    }

    fn reexports(&self, at: &[String]) -> Vec<String> {
        let Some(source) = self.sources.get(at) else {
            return Vec::new();
        };
        declarations(source)
            .into_iter()
            .filter(|(public, _)| *public)
            .flat_map(|(_, tree)| expand(&tree))
            .collect()
    }

    /// Every module each module depends on.
    fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut edges = BTreeMap::new();
        for (module, source) in &self.sources {
            let mut paths: Vec<String> = declarations(source)
                .into_iter()
                .filter(|(public, _)| !*public)
                .flat_map(|(_, tree)| expand(&tree))
                .map(|p| p.split(" as ").next().unwrap_or(&p).trim().to_owned())
                .collect();
            paths.extend(inline_paths(&without_declarations(source)));
            let mut targets = BTreeSet::new();
            for path in paths {
                let Some((at, rest)) = self.resolve(module, &path) else {
                    continue;
                };
                let target = self.defining(&at, &rest, 0);
                if &target != module && self.is_own(&target) {
                    targets.insert(target);
                }
            }
            edges.insert(module.clone(), targets);
        }
        edges
    }
}

fn child(path: &[String], name: &str) -> ModPath {
    let mut path = path.to_vec();
    path.push(name.to_owned());
    path
}

/// The `use` declarations of a source: whether each is `pub`, and its tree.
fn declarations(source: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = find_word(rest, "use ") {
        let before = rest[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')');
        let tail = &rest[at + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        out.push((
            public,
            tail[..end].split_whitespace().collect::<Vec<_>>().join(" "),
        ));
        rest = &tail[end..];
    }
    out
}

/// The source with its `use` declarations blanked out.
fn without_declarations(source: &str) -> String {
    let mut out = String::new();
    let mut rest = source;
    while let Some(at) = find_word(rest, "use ") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail.find(';').map_or(tail.len(), |e| e + 1);
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Where `word` starts a token in `text`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let starts = at == 0
            || !text[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        if starts {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// A use tree (`a::{b, c::{d, e}}`) as its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    match tree.find('{') {
        None => vec![tree.to_owned()],
        Some(open) => {
            let prefix = tree[..open].trim_end_matches("::");
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut parts = Vec::new();
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(&inner[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parts.push(&inner[start..]);
            parts
                .into_iter()
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .flat_map(|p| {
                    expand(p).into_iter().map(move |q| {
                        if prefix.is_empty() {
                            q
                        } else if q == "self" {
                            prefix.to_owned()
                        } else {
                            format!("{prefix}::{q}")
                        }
                    })
                })
                .collect()
        }
    }
}

/// `a::b::c` paths written in code (calls, types), each from its start.
fn inline_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        if is_ident(bytes[i]) && (i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            let start = i;
            while i < bytes.len()
                && (is_ident(bytes[i]) || (bytes[i] == b':' && bytes.get(i + 1) == Some(&b':')))
            {
                i += if bytes[i] == b':' { 2 } else { 1 };
            }
            let path = code[start..i].trim_end_matches(':');
            if path.contains("::") {
                out.push(path.to_owned());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The cycles of `edges`: strongly connected groups of more than one node.
fn cycles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    // Kosaraju: finish order on the graph, then components on its reverse.
    let nodes: BTreeSet<N> = edges
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a.clone()).chain(bs.iter().cloned()))
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for start in &nodes {
        let mut stack = vec![(start.clone(), false)];
        while let Some((node, done)) = stack.pop() {
            if done {
                order.push(node);
                continue;
            }
            if !seen.insert(node.clone()) {
                continue;
            }
            stack.push((node.clone(), true));
            for next in edges.get(&node).into_iter().flatten() {
                if !seen.contains(next) {
                    stack.push((next.clone(), false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<N, BTreeSet<N>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            reverse.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut groups = Vec::new();
    for node in order.into_iter().rev() {
        if assigned.contains(&node) {
            continue;
        }
        let mut group = Vec::new();
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            if !assigned.insert(n.clone()) {
                continue;
            }
            group.push(n.clone());
            stack.extend(reverse.get(&n).into_iter().flatten().cloned());
        }
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

fn name(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        path.join("::")
    }
}

/// No cycle among `krate`'s files, nor among its top-level modules.
fn assert_acyclic(what: &str, krate: &Crate) {
    let edges = krate.edges();
    let files: Vec<Vec<String>> = cycles(&edges)
        .into_iter()
        .map(|group| group.iter().map(name).collect())
        .collect();
    assert!(
        files.is_empty(),
        "{what}: modules importing each other: {files:?}"
    );
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, bs) in &edges {
        for b in bs {
            let (ta, tb) = (
                name(&a[..a.len().min(1)].to_vec()),
                name(&b[..b.len().min(1)].to_vec()),
            );
            if ta != tb {
                top.entry(ta).or_default().insert(tb);
            }
        }
    }
    let top = cycles(&top);
    assert!(
        top.is_empty(),
        "{what}: top-level modules importing each other: {top:?}"
    );
}

#[test]
fn the_library_imports_one_way() {
    let krate = Crate::read(&root().join("src/lib.rs"));
    assert!(
        krate.files.len() > 30,
        "read the whole crate: {}",
        krate.files.len()
    );
    assert_acyclic("src", &krate);
}

#[test]
fn the_binary_and_the_benchmark_import_one_way() {
    for file in [
        "src/main.rs",
        "benches/throughput/main.rs",
        "benches/http/main.rs",
    ] {
        let krate = Crate::read(&root().join(file));
        assert_acyclic(file, &krate);
    }
}

/// The checker finds a cycle where there is one: a parent whose code uses
/// its child, and a child that uses its parent's item.
#[test]
fn the_check_sees_a_cycle_where_there_is_one() {
    let dir = std::env::temp_dir().join(format!("sy-architecture-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap_or_else(|e| panic!("{e}"));
    let write = |file: &str, text: &str| {
        std::fs::write(dir.join(file), text).unwrap_or_else(|e| panic!("{e}"));
    };
    write("lib.rs", "mod a;\nmod b;\nuse a::One;\npub struct Top;\n");
    write("a/mod.rs", "mod inner;\npub use inner::One;\n");
    write("a/inner.rs", "pub struct One(crate::b::Two);\n");
    write("b.rs", "pub struct Two(Box<crate::a::One>);\n");
    let krate = Crate::read(&dir.join("lib.rs"));
    let edges = krate.edges();
    let groups = cycles(&edges);
    let _ = std::fs::remove_dir_all(&dir);
    let named: Vec<Vec<String>> = groups
        .iter()
        .map(|g| g.iter().map(name).collect())
        .collect();
    assert_eq!(named.len(), 1, "{named:?}");
    let mut group = named[0].clone();
    group.sort();
    assert_eq!(
        group,
        ["a::inner", "b"],
        "through the re-export to the defining file"
    );
}
