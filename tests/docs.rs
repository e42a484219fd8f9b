//! The documentation in the repository stands alone and stays true to the
//! code: every configuration key of `src/config/raw.rs` has a row in
//! `docs/configuration.md` (and no row names a key that does not exist), the
//! examples there and in `docs/http-ingress.md` load, every status the HTTP
//! ingress answers has its row there, the `check` output quoted there is
//! what `check` prints, every test file has its row in `docs/tests.md`,
//! and the Markdown files link only to files and headings the repository
//! has. No broker needed.

use crate::support;

use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use support::harness::clean_command;
use support::repo::root;
use switchyard::config::load_str;

const CONFIGURATION: &str = "docs/configuration.md";
const HTTP_INGRESS: &str = "docs/http-ingress.md";

/// The Markdown a reader of a clone can open.
const MARKDOWN: &[&str] = &[
    "README.md",
    "docs/configuration.md",
    "docs/operations.md",
    "docs/guarantees.md",
    "docs/http-ingress.md",
    "docs/sessions.md",
    "docs/journal-and-tracing.md",
    "docs/tests.md",
    "docker/README.md",
    "bench/README.md",
    "BENCHMARKS.md",
];

fn read(path: impl AsRef<Path>) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A struct of `raw.rs` and its keys as serde reads them: field name, or
/// its `rename`, with the field's type.
fn raw_structs() -> BTreeMap<String, Vec<(String, String)>> {
    let field = Regex::new(r"^\s*pub (\w+): (.+),$").unwrap();
    let rename = Regex::new(r#"rename = "(\w+)""#).unwrap();
    let start = Regex::new(r"^pub struct (Raw\w+) \{$").unwrap();
    let mut structs = BTreeMap::new();
    let mut current: Option<(String, Vec<(String, String)>)> = None;
    let mut renamed: Option<String> = None;
    // The raw types are in raw.rs, but for the tables whose compiler keeps
    // its own raw type beside it.
    let text = ["src/config/raw.rs", "src/config/control.rs"]
        .map(read)
        .join("\n");
    for line in text.lines() {
        if let Some(c) = start.captures(line) {
            current = Some((c[1].to_owned(), Vec::new()));
            continue;
        }
        let Some((_, fields)) = current.as_mut() else {
            continue;
        };
        if line == "}" {
            let (name, fields) = current.take().unwrap();
            structs.insert(name, fields);
        } else if let Some(c) = rename.captures(line) {
            renamed = Some(c[1].to_owned());
        } else if let Some(c) = field.captures(line) {
            let key = renamed.take().unwrap_or_else(|| c[1].to_owned());
            fields.push((key, c[2].to_owned()));
        }
    }
    structs
}

/// `## heading` -> the section's text, in order.
fn sections(markdown: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        match line.strip_prefix("## ") {
            Some(heading) if !fenced => out.push((heading.to_owned(), String::new())),
            _ => {
                if let Some((_, text)) = out.last_mut() {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
    }
    out
}

fn section(markdown: &str, heading: &str) -> String {
    sections(markdown)
        .into_iter()
        .find(|(h, _)| h == heading)
        .map(|(_, text)| text)
        .unwrap_or_else(|| panic!("no section \"## {heading}\""))
}

/// The keys in the first column of a section's tables.
fn documented_keys(text: &str) -> BTreeSet<String> {
    let row = Regex::new(r"(?m)^\| `([a-z_]+)` \|").unwrap();
    row.captures_iter(text).map(|c| c[1].to_owned()).collect()
}

/// The bodies of the ```toml blocks in `text`.
fn toml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line) {
            (None, "```toml") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some(block), line) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_configuration_key_is_documented_and_every_documented_key_exists() {
    let doc = read(CONFIGURATION);
    let structs = raw_structs();
    let headings: Vec<String> = sections(&doc).into_iter().map(|(h, _)| h).collect();
    let by_section = [
        ("RawInbound", "`[inbound]`"),
        ("RawDeadLetter", "`[dead_letter]`"),
        ("RawBroker", "`[brokers.NAME]`"),
        ("RawEndpoint", "`[endpoints.NAME]`"),
        ("RawFilter", "`[filters.NAME]`"),
        ("RawFilterEntry", "`[[filter_table]]`"),
        ("RawSessions", "`[sessions]`"),
        ("RawAdmin", "`[admin]`"),
        ("RawHttpIngress", "`[ingress.http]`"),
        ("RawJournal", "`[journal]`"),
        ("RawOtlp", "`[telemetry.otlp]`"),
        ("RawControl", "`[control]`"),
    ];
    // A filter is one struct per kind, and `type`, which picks the kind.
    let filter_kinds: Vec<&String> = structs
        .keys()
        .filter(|s| s.ends_with("Filter") && s.as_str() != "RawFilter")
        .collect();
    assert!(
        filter_kinds.len() >= 7,
        "the filter kinds' structs: {filter_kinds:?}"
    );
    let mut filter_keys: Vec<(String, String)> = vec![("type".to_owned(), "String".to_owned())];
    for kind in &filter_kinds {
        filter_keys.extend(structs[*kind].iter().cloned());
    }
    let mut structs = structs.clone();
    let kinds: Vec<String> = filter_kinds.into_iter().cloned().collect();
    for kind in &kinds {
        structs.remove(kind);
    }
    structs.insert("RawFilter".to_owned(), filter_keys);
    let mut checked: BTreeSet<&str> = BTreeSet::new();
    for (name, heading) in by_section {
        let keys: BTreeSet<String> = structs
            .get(name)
            .unwrap_or_else(|| panic!("raw.rs has no {name}"))
            .iter()
            .map(|(k, _)| k.clone())
            .collect();
        assert!(!keys.is_empty(), "{name} has no fields");
        let documented = documented_keys(&section(&doc, heading));
        assert_eq!(
            documented, keys,
            "the rows of \"## {heading}\" in {CONFIGURATION} must be exactly the keys of {name}"
        );
        checked.insert(name);
    }

    // `[ingress]` holds one table per kind of ingress, each with a section.
    for (key, _) in structs.get("RawIngress").expect("raw.rs has RawIngress") {
        let marker = format!("[ingress.{key}]");
        assert!(
            headings.iter().any(|h| h.contains(&marker)),
            "{CONFIGURATION} has no section for {marker}"
        );
    }
    checked.insert("RawIngress");

    // `[telemetry]` holds one table per kind of telemetry, each with a section.
    for (key, _) in structs
        .get("RawTelemetry")
        .expect("raw.rs has RawTelemetry")
    {
        let marker = format!("[telemetry.{key}]");
        assert!(
            headings.iter().any(|h| h.contains(&marker)),
            "{CONFIGURATION} has no section for {marker}"
        );
    }
    checked.insert("RawTelemetry");

    // The top level: scalar keys have rows, tables have sections.
    let top = structs.get("RawConfig").expect("raw.rs has RawConfig");
    let documented = documented_keys(&section(&doc, "Top level"));
    let mut scalars = BTreeSet::new();
    for (key, ty) in top {
        let ty = ty
            .strip_prefix("Option<")
            .and_then(|t| t.strip_suffix('>'))
            .unwrap_or(ty);
        let table = ty.starts_with("Raw") || ty.starts_with("BTreeMap") || ty.starts_with("Vec");
        if table {
            let marker = format!("[{key}");
            assert!(
                headings.iter().any(|h| h.contains(&marker)),
                "{CONFIGURATION} has no section for [{key}]"
            );
        } else {
            scalars.insert(key.clone());
        }
    }
    assert_eq!(
        documented, scalars,
        "the rows of \"## Top level\" must be the top-level keys"
    );
    checked.insert("RawConfig");

    let unchecked: Vec<&String> = structs
        .keys()
        .filter(|s| !checked.contains(s.as_str()))
        .collect();
    assert!(
        unchecked.is_empty(),
        "raw.rs structs without a documented section: {unchecked:?}"
    );
}

#[test]
fn the_full_example_is_valid() {
    let doc = read(CONFIGURATION);
    let blocks = toml_blocks(&section(&doc, "A full example"));
    assert_eq!(blocks.len(), 1, "one example in \"## A full example\"");
    let settings =
        load_str(&blocks[0], "full example").unwrap_or_else(|e| panic!("the full example: {e}"));
    assert_eq!(
        settings.routing.branch_names().collect::<Vec<_>>(),
        ["service", "logging", "audit", "unmatched"]
    );
    assert_eq!(settings.endpoints.len(), 7);
    assert_eq!(settings.brokers.len(), 2);
    assert!(settings.admin_listen.is_some());
    assert!(
        settings.http.is_some(),
        "the full example has an HTTP ingress"
    );
}

/// The seed configuration without its own `[ingress.http]` table (the
/// last table of the file), for examples of that table to stand in.
fn seed_without_ingress() -> String {
    let seed = read("config/switchyard.toml");
    let at = seed
        .find("\n[ingress.http]")
        .expect("the seed configuration has an [ingress.http] table");
    assert!(
        !seed[at + 1..].contains("\n["),
        "[ingress.http] is the seed configuration's last table"
    );
    seed[..at + 1].to_owned()
}

#[test]
fn every_ingress_example_loads() {
    let base = seed_without_ingress();
    let mut examples = toml_blocks(&section(&read(CONFIGURATION), "`[ingress.http]`"));
    examples.extend(toml_blocks(&read(HTTP_INGRESS)));
    assert!(examples.len() >= 2, "examples: {examples:?}");
    for example in &examples {
        // A whole configuration stands alone; a table joins the seed's.
        let toml = if example.contains("[brokers.") {
            example.clone()
        } else {
            format!("{base}\n{example}")
        };
        let settings = load_str(&toml, "example.toml")
            .unwrap_or_else(|e| panic!("{e}\nin the example:\n{example}"));
        if example.contains("[ingress.http]") {
            assert!(settings.http.is_some(), "{example}");
        }
        if !example.contains("[inbound]") && example.contains("[brokers.") {
            assert!(settings.queue().is_none(), "HTTP alone: {example}");
        }
    }
}

/// `(code, outcome)` of every status `src/ingress/answer.rs` names in its
/// `outcome` words.
fn answered_statuses() -> Vec<(u16, String)> {
    let source = read("src/ingress/answer.rs");
    let arm = Regex::new(r#"(?m)^\s*((?:\d{3}(?: \| )?)+) => "([a-z-]+)","#).unwrap();
    let mut out = Vec::new();
    for c in arm.captures_iter(&source) {
        for code in c[1].split(" | ") {
            out.push((code.trim().parse().unwrap(), c[2].to_owned()));
        }
    }
    out
}

#[test]
fn every_status_the_ingress_answers_has_its_row() {
    let doc = read(HTTP_INGRESS);
    let table = section(&doc, "Answers");
    let statuses = answered_statuses();
    assert!(
        statuses.len() >= 14,
        "statuses read from answer.rs: {statuses:?}"
    );
    let row = Regex::new(r"(?m)^\| `(\d{3}) [A-Za-z ]+` \| ([^|]+) \|").unwrap();
    let rows: BTreeMap<u16, String> = row
        .captures_iter(&table)
        .map(|c| (c[1].parse().unwrap(), c[2].trim().to_owned()))
        .collect();
    for (code, outcome) in &statuses {
        let Some(documented) = rows.get(code) else {
            panic!("{HTTP_INGRESS}: no row for status {code} in \"## Answers\"");
        };
        assert!(
            *documented == format!("`{outcome}`"),
            "{HTTP_INGRESS}: status {code} has outcome `{outcome}`, the row says {documented}"
        );
    }
    let answered: BTreeSet<u16> = statuses.iter().map(|(c, _)| *c).collect();
    for code in rows.keys() {
        assert!(
            answered.contains(code),
            "{HTTP_INGRESS}: a row for {code}, which the ingress never answers"
        );
    }
}

#[test]
fn every_filter_example_compiles() {
    let doc = read(CONFIGURATION);
    let examples = toml_blocks(&section(&doc, "`[filters.NAME]`"));
    let defined = Regex::new(r"(?m)^\[filters\.(\w+)\]$").unwrap();
    let names: Vec<String> = examples
        .iter()
        .flat_map(|e| defined.captures_iter(e).map(|c| c[1].to_owned()))
        .collect();
    let base = r#"
[inbound]
broker = "main"
queue = "work.in"

[dead_letter]
exchange = "work.dlx"
routing_key = "work.dlq"

[brokers.main]
uri = "amqp://guest:guest@127.0.0.1:5672/%2f"

[endpoints.out]
broker = "main"
routing_key = "out"
"#;
    let mut toml = format!("{base}\n{}", examples.join("\n"));
    for name in &names {
        toml.push_str(&format!(
            "\n[[filter_table]]\nname = \"{name}\"\nfilter = \"{name}\"\nendpoint = \"out\"\n"
        ));
    }
    let settings =
        load_str(&toml, "filter examples").unwrap_or_else(|e| panic!("filter examples: {e}"));
    assert_eq!(settings.routing.branch_names().count(), names.len());
    for kind in [
        "match_all",
        "header",
        "property",
        "routing_key",
        "json",
        "xpath",
        "and",
        "or",
        "not",
    ] {
        assert!(
            examples
                .iter()
                .any(|e| e.contains(&format!("type = \"{kind}\""))),
            "no example of a {kind} filter"
        );
    }
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, other
/// punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#').trim()));
        }
    }
    out
}

#[test]
fn links_resolve_inside_the_repository() {
    let link = Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    for file in MARKDOWN {
        let text = read(file);
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        for c in link.captures_iter(&text) {
            let target = &c[1];
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target, None),
            };
            let linked = if path.is_empty() {
                PathBuf::from(file)
            } else {
                dir.join(path)
            };
            let absolute = root().join(&linked);
            assert!(
                absolute.exists(),
                "{file}: link to {target}, which is not in the repository"
            );
            if let Some(anchor) = anchor {
                let headings = anchors(&read(&linked));
                assert!(
                    headings.contains(anchor),
                    "{file}: link to {target}: no such heading in {}",
                    linked.display()
                );
            }
        }
    }
}

#[test]
fn the_documentation_names_nothing_a_clone_lacks() {
    let outside = Regex::new(r"\bSPEC\b|shared/").unwrap();
    for file in MARKDOWN.iter().chain(&["config/spec-example.toml"]) {
        for (n, line) in read(file).lines().enumerate() {
            assert!(
                !outside.is_match(line),
                "{file}:{}: refers to a document outside the repository: {line}",
                n + 1
            );
        }
    }
    assert!(
        root().join("LICENSE").is_file(),
        "Cargo.toml names a LICENSE"
    );
}

/// The lines of the `console` block of `markdown` that starts with
/// `$ COMMAND`: what the document says the command prints.
fn console_output(markdown: &str, command: &str) -> String {
    console_block(markdown, &format!("```console\n$ {command}\n"))
}

/// `switchyard ARGS` run in `dir`, clean of the test's environment.
fn switchyard_in(dir: &Path, args: &[&str]) -> std::process::Output {
    clean_command()
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("switchyard {args:?}: {e}"))
}

#[test]
fn the_check_samples_are_what_check_prints() {
    let doc = read(CONFIGURATION);
    let command = "switchyard check --config config/switchyard.toml";
    let out = switchyard_in(&root(), &command.split(' ').skip(1).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(0), "{command}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        console_output(&doc, command),
        "{CONFIGURATION}: the output of `{command}`"
    );

    // `bad.toml` and `typo.toml` are the seed file with one misspelling
    // each, as the text says.
    let seed = read("config/switchyard.toml");
    let misspelt = [
        (
            "bad.toml",
            "endpoint = \"primaryServiceQueue\"",
            "endpoint = \"primarySrviceQueue\"",
        ),
        (
            "typo.toml",
            "routing_key = \"service.primary\"",
            "routingkey = \"service.primary\"",
        ),
    ];
    let dir = std::env::temp_dir().join(format!("docs-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for (file, right, wrong) in misspelt {
        let bad = seed.replacen(right, wrong, 1);
        assert_ne!(bad, seed, "the seed file has {right}");
        std::fs::write(dir.join(file), bad).unwrap_or_else(|e| panic!("{file}: {e}"));
        let command = format!("switchyard check --config {file}");
        let out = switchyard_in(&dir, &command.split(' ').skip(1).collect::<Vec<_>>());
        assert_eq!(out.status.code(), Some(2), "{command}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            console_output(&doc, &command),
            "{CONFIGURATION}: the error of `{command}`"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_test_file_has_its_row() {
    let doc = read("docs/tests.md");
    let dir = root().join("tests");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut missing = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".rs") && !doc.contains(&format!("| `tests/{name}` |")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/tests.md has no row for {missing:?}"
    );
}

/// With `autotests = false`, a file of `tests/` that no binary names would
/// never run: each is a `[[test]]` of its own in `Cargo.toml` or a module
/// of one group binary (a `[[test]]` whose path is `tests/NAME/main.rs`),
/// and only one.
#[test]
fn every_test_file_is_in_one_test_binary() {
    let manifest = read("Cargo.toml");
    let group = Regex::new(r#"path = "(tests/\w+/main\.rs)""#).unwrap();
    let groups: Vec<String> = group
        .captures_iter(&manifest)
        .map(|c| read(&c[1]))
        .collect();
    assert!(!groups.is_empty(), "Cargo.toml names no group binary");
    let dir = root().join("tests");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut wrong = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        let module = format!("#[path = \"../{name}\"]\nmod {stem};");
        let binaries = usize::from(manifest.contains(&format!("path = \"tests/{name}\"")))
            + groups.iter().filter(|g| g.contains(&module)).count();
        if binaries != 1 {
            wrong.push((name, binaries));
        }
    }
    assert!(
        wrong.is_empty(),
        "test files not in exactly one binary (file, binaries): {wrong:?}"
    );
}

#[test]
fn the_readme_pictures_the_seed_file() {
    let readme = read("README.md");
    let start = readme
        .find("## The seed scenario in one picture")
        .unwrap_or_else(|| panic!("README.md: no picture of the seed scenario"));
    let picture = console_block(&readme[start..], "```text\n");
    let seed = read("config/switchyard.toml");
    let name = Regex::new(r"\b(?:[a-z]+\.[a-z]+|[a-z]+[A-Z][A-Za-z]+)\b").unwrap();
    let names: Vec<&str> = name.find_iter(&picture).map(|m| m.as_str()).collect();
    assert!(
        names.len() >= 10,
        "the picture names the seed's queues and endpoints: {names:?}"
    );
    for name in names {
        assert!(
            seed.contains(&format!("\"{name}\"")) || seed.contains(&format!("[endpoints.{name}]")),
            "README.md pictures {name:?}, which config/switchyard.toml does not name"
        );
    }
}

/// The body of the first block of `markdown` opened by `fence`.
fn console_block(markdown: &str, fence: &str) -> String {
    let start = markdown
        .find(fence)
        .unwrap_or_else(|| panic!("no block opened by {fence:?}"))
        + fence.len();
    let body = &markdown[start..];
    body[..body.find("```").unwrap_or(body.len())].to_owned()
}
