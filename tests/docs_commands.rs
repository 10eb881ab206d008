//! The commands the documents give a reader to copy still parse. Every line of a `sh` block in
//! README.md, docs/*.md and deploy/README.md that runs `escher`, `escher-head` or
//! `escher-worker` is handed to bash as written, with those three names bound to functions that
//! run the binary `cargo test` built with the line's arguments and `--help` after them (before
//! a `--`; a command after `--` that is `escher` again is checked the same way). clap parses
//! every argument before it acts on `--help`, so a flag or subcommand that no longer exists, or
//! a value its parser refuses, fails here with the page and the line; `--help` then stops the
//! binary before it does anything. The binaries run with `ESCHER_HEAD` at a port nothing
//! listens on and `ESCHER_HOME` in a temporary directory, so a line whose `--help` were taken
//! as a task's argument could reach no cluster. The documents' `python` blocks run in
//! `python/tests/test_docs.py` and their `rust` blocks as doctests of the root crate.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The programs whose command lines are checked.
const PROGRAMS: [&str; 3] = ["escher", "escher-head", "escher-worker"];

/// The bash functions the lines run with: each program's name runs `check` on its binary.
const SHIMS: &str = r#"
check() {
    local bin=$1; shift
    local args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    if ! "$bin" "${args[@]}" --help >/dev/null 2>"$ERR_FILE"; then
        echo "$(basename "$bin") ${args[*]} --help: $(cat "$ERR_FILE")" >&2
        exit 1
    fi
    if [ "$1" = -- ] && [ "$2" = escher ]; then shift 2; escher "$@"; fi
}
escher() { check "$BIN_DIR/escher" "$@"; }
escher-head() { check "$BIN_DIR/escher-head" "$@"; }
escher-worker() { check "$BIN_DIR/escher-worker" "$@"; }
"#;

/// What follows the line: a line that ends in `&` ran its command in the background, whose
/// status is then the line's.
const BACKGROUND: &str = r#"status=$?
if [ -n "$!" ]; then wait "$!" || exit $?; fi
exit $status"#;

/// One command line of a document.
#[derive(Debug)]
struct Line {
    page: String,
    number: usize,
    text: String,
}

/// The repository's root (this test's package is the root crate).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory `cargo test` puts the workspace's binaries in (`target/<profile>`).
fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the test binary lies in <target>/<profile>/deps")?
        .to_path_buf();
    for program in PROGRAMS {
        if !dir.join(program).is_file() {
            bail!(
                "{} is not built in {}: `cargo test --workspace` builds it (or `cargo build \
                 --workspace --bins`)",
                program,
                dir.display()
            );
        }
    }
    Ok(dir)
}

/// The pages checked: the README, every page under docs/, and deploy/README.md.
fn pages() -> Result<Vec<PathBuf>> {
    let mut pages = vec![root().join("README.md"), root().join("deploy/README.md")];
    for entry in std::fs::read_dir(root().join("docs"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    Ok(pages)
}

/// The lines of `text`'s `sh` blocks that run one of [`PROGRAMS`] (after any `NAME=value`
/// assignments).
fn command_lines(page: &str, text: &str) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut in_sh = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_sh = !in_sh && info.trim() == "sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let program = trimmed
            .split_whitespace()
            .find(|word| !is_assignment(word))
            .unwrap_or("");
        if PROGRAMS.contains(&program) {
            lines.push(Line {
                page: page.to_string(),
                number: index + 1,
                text: trimmed.to_string(),
            });
        }
    }
    lines
}

/// Whether `word` is a shell assignment (`NAME=value`) rather than a program.
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Runs `line` through bash with the shims; the shims' complaint on failure.
fn check(line: &str, bins: &Path, scratch: &Path) -> Result<std::result::Result<(), String>> {
    let output = Command::new("bash")
        .arg("-c")
        .arg(format!("{SHIMS}\n{line}\n{BACKGROUND}"))
        .env("BIN_DIR", bins)
        .env("ERR_FILE", scratch.join("stderr"))
        .env("ESCHER_HOME", scratch.join("home"))
        .env("ESCHER_HEAD", "http://127.0.0.1:1")
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_ACCESS_FILE")
        .current_dir(scratch)
        .output()
        .context("bash")?;
    if output.status.success() {
        Ok(Ok(()))
    } else {
        Ok(Err(String::from_utf8_lossy(&output.stderr)
            .trim()
            .to_string()))
    }
}

#[test]
fn every_documented_command_line_parses() -> Result<()> {
    let bins = bin_dir()?;
    let scratch = tempfile::tempdir()?;
    let mut lines = Vec::new();
    for page in pages()? {
        let text = std::fs::read_to_string(&page)
            .with_context(|| format!("reading {}", page.display()))?;
        let name = page.strip_prefix(root())?.display().to_string();
        lines.extend(command_lines(&name, &text));
    }
    // The pages that show commands must still be found, or this test would check nothing.
    for page in [
        "README.md",
        "docs/cli.md",
        "docs/gpus.md",
        "docs/operations.md",
        "docs/security.md",
    ] {
        assert!(
            lines.iter().any(|l| l.page == page),
            "no command line found in {page}'s sh blocks"
        );
    }
    for program in PROGRAMS {
        assert!(
            lines
                .iter()
                .any(|l| l.text.split_whitespace().any(|w| w == program)),
            "no documented line runs {program}"
        );
    }
    let mut failed = Vec::new();
    for line in &lines {
        if let Err(why) = check(&line.text, &bins, scratch.path())? {
            failed.push(format!(
                "{}:{}: {}\n    {why}",
                line.page, line.number, line.text
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} documented command lines do not parse:\n{}",
        failed.len(),
        lines.len(),
        failed.join("\n")
    );
    Ok(())
}

#[test]
fn a_flag_that_does_not_exist_fails_the_check() -> Result<()> {
    let bins = bin_dir()?;
    let scratch = tempfile::tempdir()?;
    for line in [
        "escher submit --no-such-flag 1 -- true",
        "escher no-such-command",
        "escher-head --no-such-flag &  # in the background",
        "escher-worker --resources cpu=4 --no-such-flag",
        "escher submit --resources cpu=1 -- escher no-such-command",
    ] {
        let why = check(line, &bins, scratch.path())?
            .err()
            .with_context(|| format!("`{line}` passed the check"))?;
        assert!(
            why.contains("--help"),
            "`{line}` failed without naming the command: {why}"
        );
    }
    Ok(())
}

#[test]
fn command_lines_are_found_in_sh_blocks_only() {
    let text = "```sh\nescher status   # a comment\nESCHER_HEAD=x escher nodes &\ncargo build\n```\n\
                ```text\nescher tasks\n```\n  ```sh\n  escher-worker --name a &\n  ```\nescher top\n";
    let found: Vec<(usize, String)> = command_lines("p", text)
        .into_iter()
        .map(|l| (l.number, l.text))
        .collect();
    assert_eq!(
        found,
        [
            (2, "escher status   # a comment".to_string()),
            (3, "ESCHER_HEAD=x escher nodes &".to_string()),
            (10, "escher-worker --name a &".to_string()),
        ]
    );
}
