//! Every Rust snippet of docs/writing-an-esl.md is compiled: each is an excerpt of this
//! template's sources (`src/lib.rs`, `src/tests.rs`, `tests/e2e.rs`), which the crate's build
//! and tests compile. A snippet may leave lines out where it says `// ...` on a line of its
//! own; the parts around it must appear in that order in one file. Indentation is not
//! compared (a snippet may show a method without its `impl`).

use std::path::Path;

/// The template's sources that the guide quotes.
const SOURCES: [&str; 3] = ["src/lib.rs", "src/tests.rs", "tests/e2e.rs"];

/// The guide's fenced blocks of `language`, each as its lines.
fn blocks(markdown: &str, language: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(info)) if info.trim() == language => current = Some(Vec::new()),
            (Some(_), Some(_)) => out.extend(current.take()),
            (Some(lines), None) => lines.push(line.to_string()),
            (None, _) => {}
        }
    }
    out
}

/// `lines` without their indentation and trailing spaces.
fn normal(lines: &[String]) -> Vec<&str> {
    lines.iter().map(|l| l.trim()).collect()
}

/// Where `part` starts in `file` at or after `from`, if it is there line for line.
fn find(file: &[&str], part: &[&str], from: usize) -> Option<usize> {
    (from..=file.len().checked_sub(part.len())?).find(|&i| file[i..i + part.len()] == *part)
}

/// Whether `snippet`'s parts (split at `// ...` lines) appear in `file` in order.
fn quoted_in(snippet: &[&str], file: &[&str]) -> bool {
    let mut from = 0;
    for part in snippet.split(|line| *line == "// ...") {
        let part: Vec<&str> = trim_blank(part);
        if part.is_empty() {
            continue;
        }
        match find(file, &part, from) {
            Some(at) => from = at + part.len(),
            None => return false,
        }
    }
    true
}

fn trim_blank<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    let start = lines
        .iter()
        .position(|l| !l.is_empty())
        .unwrap_or(lines.len());
    let end = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(start, |e| e + 1);
    lines[start..end].to_vec()
}

#[test]
fn every_rust_snippet_of_the_guide_is_quoted_from_compiled_sources() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(here.join("../../docs/writing-an-esl.md"))
        .expect("docs/writing-an-esl.md");
    let sources: Vec<(&str, Vec<String>)> = SOURCES
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(here.join(path)).expect("a template source");
            (*path, text.lines().map(str::to_string).collect())
        })
        .collect();
    let snippets = blocks(&guide, "rust");
    assert!(
        snippets.len() >= 8,
        "the guide has {} Rust snippets",
        snippets.len()
    );
    let mut unquoted = Vec::new();
    for snippet in &snippets {
        let lines = normal(snippet);
        let found = sources
            .iter()
            .any(|(_, file)| quoted_in(&lines, &normal(file)));
        if !found {
            unquoted.push(snippet.join("\n"));
        }
    }
    assert!(
        unquoted.is_empty(),
        "snippets of docs/writing-an-esl.md found in none of {SOURCES:?}:\n\n{}",
        unquoted.join("\n\n----\n\n")
    );
}

#[test]
fn a_snippet_that_differs_from_the_sources_is_found_out() {
    let file: Vec<String> = ["fn a() {", "    let x = 1;", "    x", "}"]
        .map(String::from)
        .to_vec();
    let file = normal(&file);
    assert!(quoted_in(&["let x = 1;", "x"], &file));
    assert!(quoted_in(&["fn a() {", "// ...", "}"], &file));
    // `let cluster` where the source says `let mut cluster`: not a quotation.
    assert!(!quoted_in(&["let mut x = 1;"], &file));
    // Parts out of order.
    assert!(!quoted_in(&["x", "// ...", "let x = 1;"], &file));
}
