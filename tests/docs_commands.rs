//! The commands the documents give a reader to copy still parse. Every line of a `sh` block in
//! README.md, docs/*.md and deploy/README.md that runs `escher`, `escher-head` or
//! `escher-worker`, and every `escher-bench` command of BENCHMARKS.md, is handed to bash as
//! written, with those names bound to functions that run the binary `cargo test` built with the
//! line's arguments and `--help` after them (before a `--`; a command after `--` that is
//! `escher` again is checked the same way). clap parses every argument before it acts on
//! `--help`, so a flag or subcommand that no longer exists, or a value its parser refuses, fails
//! here with the page and the line; `--help` then stops the binary before it does anything. The
//! binaries run with `ESCHER_HEAD` at a port nothing listens on and `ESCHER_HOME` in a
//! temporary directory, so a line whose `--help` were taken as a task's argument could reach no
//! cluster. Every `cargo` command of those pages and of BENCHMARKS.md (in a block or inline)
//! must name packages, examples, benches, tests, binaries and paths that exist (`cargo
//! metadata`); what a `cargo` command does is not run. The documents' `python` blocks run in
//! `python/tests/test_docs.py` and their `rust` blocks as doctests of the root crate.
//! docs/benchmarks-history.md is a record of commands as they were run and is not checked, nor
//! is docs/writing-an-esl.md's `cargo`, whose commands run in an author's own crate. And every
//! relative link of the repository's Markdown leads to a file that exists and, with an anchor,
//! to a heading of it, so that moving a section between pages cannot leave a link behind.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The programs whose command lines in `sh` blocks are checked.
const PROGRAMS: [&str; 3] = ["escher", "escher-head", "escher-worker"];

/// The binaries the checks run (the three above and the benchmark harness).
const BINARIES: [&str; 4] = ["escher", "escher-head", "escher-worker", "escher-bench"];

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
escher-bench() { check "$BIN_DIR/escher-bench" "$@"; }
nice() { while [ "$1" = -n ]; do shift 2; done; "$@"; }
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
    for program in BINARIES {
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

/// The lines of `text`'s `sh` blocks that run one of `programs` (after any `NAME=value`
/// assignments).
fn command_lines(page: &str, text: &str, programs: &[&str]) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut in_sh = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_sh = !in_sh && info.trim() == "sh";
            continue;
        }
        if in_sh && programs.contains(&program(trimmed)) {
            lines.push(Line {
                page: page.to_string(),
                number: index + 1,
                text: trimmed.to_string(),
            });
        }
    }
    lines
}

/// The inline code spans (`like this`, perhaps across a line break) of `text` outside its code
/// blocks that run one of `programs` (after any `NAME=value` assignments and a `nice -n N`).
fn inline_commands(page: &str, text: &str, programs: &[&str]) -> Vec<Line> {
    let mut spans = Vec::new();
    let mut in_block = false;
    // The span being read: the line it started on and its text so far.
    let mut open: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        if open.is_none() && line.trim().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        for (i, piece) in line.split('`').enumerate() {
            if i > 0 {
                match open.take() {
                    Some((number, span)) => {
                        if programs.contains(&program(&span)) {
                            spans.push(Line {
                                page: page.to_string(),
                                number: number + 1,
                                text: span.replace("\\|", "|"),
                            });
                        }
                    }
                    None => open = Some((index, String::new())),
                }
            }
            if let Some((_, span)) = open.as_mut() {
                span.push_str(piece);
            }
        }
        if let Some((_, span)) = open.as_mut() {
            span.push(' ');
        }
    }
    spans
}

/// The program a command line runs: its first word that is neither a `NAME=value`
/// assignment nor `nice` with its `-n N`.
fn program(line: &str) -> &str {
    let mut words = line.split_whitespace().filter(|word| !is_assignment(word));
    loop {
        match words.next() {
            Some("nice") => {
                if words.next() == Some("-n") {
                    words.next();
                }
            }
            Some(word) => return word,
            None => return "",
        }
    }
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
        lines.extend(command_lines(&name, &text, &PROGRAMS));
    }
    let benchmarks = std::fs::read_to_string(root().join("BENCHMARKS.md"))?;
    let harness = inline_commands("BENCHMARKS.md", &benchmarks, &["escher-bench"]);
    assert!(
        harness.len() >= 10,
        "BENCHMARKS.md names {} escher-bench commands; its table gives one per figure",
        harness.len()
    );
    lines.extend(harness);
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

/// The workspace's packages and their targets, from `cargo metadata`.
#[derive(Debug)]
struct Workspace {
    /// The root crate's package, which a `cargo` command without `-p` builds from the root.
    root_package: String,
    packages: BTreeSet<String>,
    /// (package, kind, target): kinds as cargo names them (`example`, `bench`, `test`, `bin`).
    targets: BTreeSet<(String, String, String)>,
}

impl Workspace {
    fn read() -> Result<Self> {
        let output = Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .current_dir(root())
            .output()
            .context("cargo metadata")?;
        if !output.status.success() {
            bail!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let meta: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        let manifest = root().join("Cargo.toml");
        let mut workspace = Workspace {
            root_package: String::new(),
            packages: BTreeSet::new(),
            targets: BTreeSet::new(),
        };
        for package in meta["packages"].as_array().context("packages")? {
            let name = package["name"]
                .as_str()
                .context("a package's name")?
                .to_string();
            if package["manifest_path"].as_str().map(Path::new) == Some(manifest.as_path()) {
                workspace.root_package = name.clone();
            }
            for target in package["targets"].as_array().context("targets")? {
                let target_name = target["name"].as_str().context("a target's name")?;
                for kind in target["kind"].as_array().context("a target's kinds")? {
                    let kind = kind.as_str().context("a kind")?.to_string();
                    workspace
                        .targets
                        .insert((name.clone(), kind, target_name.to_string()));
                }
            }
            workspace.packages.insert(name);
        }
        Ok(workspace)
    }

    /// What `command` (a `cargo` command line, perhaps several joined by `&&`) names that the
    /// workspace does not have: packages (`-p`), examples, benches, tests and binaries (in the
    /// packages named, else in the root crate's), and `--path` directories. Placeholders in
    /// capitals (`--example NAME`) are passed over; nothing after `--` is read.
    fn mistakes(&self, command: &str) -> Vec<String> {
        let mut mistakes = Vec::new();
        for segment in command.split(['&', ';', '|']) {
            let words: Vec<&str> = segment
                .split_whitespace()
                .take_while(|word| *word != "--" && !word.starts_with('#'))
                .collect();
            let Some(at) = words.iter().position(|word| *word == "cargo") else {
                continue;
            };
            let mut packages = Vec::new();
            let mut wanted = Vec::new();
            let mut flags = words[at + 1..].iter().copied();
            while let Some(flag) = flags.next() {
                let kind = match flag {
                    "-p" | "--package" => "package",
                    "--example" => "example",
                    "--bench" => "bench",
                    "--test" => "test",
                    "--bin" => "bin",
                    "--path" => "path",
                    _ => continue,
                };
                let Some(value) = flags.next() else {
                    mistakes.push(format!("{flag} without a value"));
                    continue;
                };
                if value.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                    continue;
                }
                match kind {
                    "package" => packages.push(value),
                    "path" => {
                        if !root().join(value).join("Cargo.toml").is_file() {
                            mistakes.push(format!("--path {value}: no Cargo.toml there"));
                        }
                    }
                    _ => wanted.push((flag, kind, value)),
                }
            }
            for package in &packages {
                if !self.packages.contains(*package) {
                    mistakes.push(format!("-p {package}: no such package"));
                }
            }
            let within: Vec<&str> = if packages.is_empty() {
                vec![self.root_package.as_str()]
            } else {
                packages.clone()
            };
            for (flag, kind, name) in wanted {
                let found = within.iter().any(|package| {
                    self.targets.contains(&(
                        package.to_string(),
                        kind.to_string(),
                        name.to_string(),
                    ))
                });
                if !found {
                    mistakes.push(format!("{flag} {name}: no such {kind} in {within:?}"));
                }
            }
        }
        mistakes
    }
}

#[test]
fn every_documented_cargo_command_names_what_exists() -> Result<()> {
    let workspace = Workspace::read()?;
    let mut commands = Vec::new();
    let mut pages = pages()?;
    pages.push(root().join("BENCHMARKS.md"));
    for page in pages {
        let name = page.strip_prefix(root())?.display().to_string();
        if name == "docs/benchmarks-history.md" || name == "docs/writing-an-esl.md" {
            continue;
        }
        let text = std::fs::read_to_string(&page)?;
        commands.extend(command_lines(&name, &text, &["cargo"]));
        commands.extend(inline_commands(&name, &text, &["cargo"]));
    }
    for expected in [
        "cargo run --release --example quickstart",
        "cargo test --workspace --locked",
    ] {
        assert!(
            commands
                .iter()
                .any(|c| c.page == "README.md" && c.text.starts_with(expected)),
            "the README no longer gives `{expected}`"
        );
    }
    let failed: Vec<String> = commands
        .iter()
        .flat_map(|c| {
            workspace
                .mistakes(&c.text)
                .into_iter()
                .map(move |why| format!("{}:{}: {}\n    {why}", c.page, c.number, c.text))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} documented cargo commands name what does not exist:\n{}",
        failed.len(),
        commands.len(),
        failed.join("\n")
    );
    Ok(())
}

#[test]
fn a_cargo_command_naming_a_missing_target_is_caught() -> Result<()> {
    let workspace = Workspace::read()?;
    assert_eq!(
        workspace.mistakes("cargo run --release --example quickstart && cargo test --workspace"),
        Vec::<String>::new()
    );
    assert_eq!(
        workspace.mistakes("cargo bench -p escher-core --bench scheduler -- dispatch"),
        Vec::<String>::new()
    );
    for (command, why) in [
        (
            "cargo run --example no_such_example",
            "--example no_such_example",
        ),
        (
            "cargo bench -p escher-core --bench no_such_bench",
            "--bench no_such_bench",
        ),
        (
            "cargo test --test no_such_test -- --nocapture",
            "--test no_such_test",
        ),
        ("cargo build -p no-such-package", "-p no-such-package"),
        (
            "cargo install --locked --path no-such-dir",
            "--path no-such-dir",
        ),
    ] {
        let mistakes = workspace.mistakes(command);
        assert!(
            mistakes.iter().any(|m| m.starts_with(why)),
            "`{command}`: {mistakes:?}"
        );
    }
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
fn inline_commands_are_found_across_line_breaks_and_outside_blocks() {
    let text = "Run `cargo run -p a` or `escher-bench w1` and `cargo build\n-p b`; `cat`.\n\
                ```sh\ncargo test -p c\n```\n`nice -n 5 cargo bench`\n";
    let found: Vec<(usize, String)> = inline_commands("p", text, &["cargo"])
        .into_iter()
        .map(|l| (l.number, l.text))
        .collect();
    assert_eq!(
        found,
        [
            (1, "cargo run -p a".to_string()),
            (1, "cargo build -p b".to_string()),
            (6, "nice -n 5 cargo bench".to_string()),
        ]
    );
}

#[test]
fn command_lines_are_found_in_sh_blocks_only() {
    let text = "```sh\nescher status   # a comment\nESCHER_HEAD=x escher nodes &\ncargo build\n```\n\
                ```text\nescher tasks\n```\n  ```sh\n  escher-worker --name a &\n  ```\nescher top\n";
    let found: Vec<(usize, String)> = command_lines("p", text, &PROGRAMS)
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

/// Every Markdown file of the repository, outside build output and virtual environments.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                markdown_files(&path, found)?;
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
    Ok(())
}

/// The anchors of `text`'s headings as GitHub makes them: lower case, spaces to hyphens, every
/// character but letters, digits, `_` and `-` dropped; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        }
        let heading = line.trim_start_matches('#');
        if in_block || heading.len() == line.len() || !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while !anchors.insert(unique.clone()) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
    }
    anchors
}

/// The targets of `text`'s links (`[text](target)`) outside code blocks and code spans, with
/// their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut in_block = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 1 {
                continue;
            }
            for (at, _) in piece.match_indices("](") {
                let target: String = piece[at + 2..]
                    .chars()
                    .take_while(|c| *c != ')' && !c.is_whitespace())
                    .collect();
                links.push((index + 1, target));
            }
        }
    }
    links
}

#[test]
fn every_relative_link_of_the_markdown_leads_somewhere() -> Result<()> {
    let mut files = Vec::new();
    markdown_files(&root(), &mut files)?;
    assert!(
        files.len() >= 15,
        "found only {} Markdown files",
        files.len()
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        let name = file.strip_prefix(root())?.display();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().context("a file's directory")?.join(path)
            };
            if !dest.exists() {
                broken.push(format!("{name}:{line}: {target}: no such file"));
            } else if !anchor.is_empty()
                && dest.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&dest)?).contains(anchor)
            {
                broken.push(format!("{name}:{line}: {target}: no such heading"));
            }
        }
    }
    assert!(checked >= 50, "only {checked} relative links found");
    assert!(
        broken.is_empty(),
        "{} of {checked} relative links are broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
    Ok(())
}

#[test]
fn anchors_and_links_are_read_as_github_reads_them() {
    let page = "# escher\n## The docs/DESIGN.md §8 targets\n```sh\n# not a heading\n```\n\
                ## Astraea on a cluster: `gpu` (`gpu.astraea.*`)\n## Run\n## Run\n#no\n";
    assert_eq!(
        anchors(page),
        BTreeSet::from(
            [
                "escher",
                "the-docsdesignmd-8-targets",
                "astraea-on-a-cluster-gpu-gpuastraea",
                "run",
                "run-1",
            ]
            .map(String::from)
        )
    );
    let text = "See [a](a.md#x) and `[b](b.md)`,\n```\n[c](c.md)\n```\n[d](https://e) [f](#g).";
    assert_eq!(
        links(text),
        [
            (1, "a.md#x".to_string()),
            (5, "https://e".to_string()),
            (5, "#g".to_string()),
        ]
    );
}
