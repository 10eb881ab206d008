//! `escher new esl NAME`: writes a scheduling library (ESL) crate of its own, outside any
//! workspace, from the template `examples/custom-esl` (docs/writing-an-esl.md).
//!
//! The template's sources are compiled into this binary; its manifest is written here, with
//! the keys the template inherits from escher's workspace written out, the dependencies on
//! escher's crates as paths into a checkout (or as versions of a registry), the profile
//! that keeps an author's debug builds small, and the features that keep gRPC and the local
//! cluster out of its default build: `grpc` (the network client as its `ClusterApi`) and
//! `cluster` (the end-to-end test).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use crate::ctx::Ctx;

/// Create a crate from a template.
#[derive(Debug, Clone, Subcommand)]
pub enum NewCommand {
    /// A scheduling library (ESL) of your own: the template's policy and its unit tests on the
    /// in-memory cluster, ready for `cargo test`, and an end-to-end test on a local cluster
    /// (`cargo test --features cluster`)
    Esl(NewEslArgs),
}

/// Options of `escher new esl`.
#[derive(Debug, Clone, Args)]
pub struct NewEslArgs {
    /// The package's name (`my-esl`; the crate is `my_esl`)
    pub name: String,
    /// Where to write it (default: ./NAME); must not exist, or be empty
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Depend on escher's crates by path, in this checkout (default: the checkout this binary
    /// was built from, while it is there)
    #[arg(long, conflicts_with = "escher_version")]
    pub escher_path: Option<PathBuf>,
    /// Depend on escher's crates by version, from a registry
    #[arg(long)]
    pub escher_version: Option<String>,
}

/// The template's files other than its manifest, as this binary was built with them.
const FILES: [(&str, &str); 3] = [
    (
        "src/lib.rs",
        include_str!("../../examples/custom-esl/src/lib.rs"),
    ),
    (
        "src/tests.rs",
        include_str!("../../examples/custom-esl/src/tests.rs"),
    ),
    (
        "tests/e2e.rs",
        include_str!("../../examples/custom-esl/tests/e2e.rs"),
    ),
];

/// The template's package name, replaced by the author's.
const TEMPLATE_PACKAGE: &str = "escher-custom-esl";

/// Where escher's crates come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A checkout: its root.
    Path(PathBuf),
    /// A registry: this version requirement.
    Version(String),
}

impl Source {
    /// The dependency on escher's crate in `dir` of the checkout (`""`: the facade).
    fn dependency(&self, dir: &str, extra: &str) -> String {
        match self {
            Source::Path(root) => {
                let path = if dir.is_empty() {
                    root.clone()
                } else {
                    root.join(dir)
                };
                // A TOML basic string: backslashes and quotes escaped.
                let path = path.display().to_string();
                let path = path.replace('\\', "\\\\").replace('"', "\\\"");
                format!("{{ path = \"{path}\"{extra} }}")
            }
            Source::Version(v) => format!("{{ version = \"{v}\"{extra} }}"),
        }
    }
}

/// Why a name cannot be the new package's.
fn check_name(name: &str) -> anyhow::Result<()> {
    let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    if !first_ok
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        bail!(
            "{name:?} is not a package name: a letter, then letters, digits, `-` or `_` \
             (for example my-esl)"
        );
    }
    let taken = [
        "escher",
        "escher-esl",
        "escher-client",
        "escher-proto",
        "escher-core",
        "tokio",
        "test",
    ];
    if taken.contains(&name.replace('_', "-").as_str()) {
        bail!("{name:?} is the name of one of the crate's dependencies; choose another");
    }
    Ok(())
}

/// The new crate's `Cargo.toml`.
pub fn manifest(name: &str, source: &Source) -> String {
    let esl = source.dependency("esl", ", default-features = false");
    let esl_tests = source.dependency(
        "esl",
        r#", default-features = false, features = ["in-memory"]"#,
    );
    let client = source.dependency("client", ", default-features = false");
    let proto = source.dependency("proto", ", default-features = false");
    let facade = source.dependency("", ", optional = true");
    format!(
        r#"# A scheduling library (ESL) written by `escher new esl` from escher's template
# (docs/writing-an-esl.md walks through it).
[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
rust-version = "1.89"
publish = false

[features]
# The network client as a `ClusterApi` (`escher_client::Client`): what an application needs to
# run this library's policies on a real cluster. Off by default, so that the policies and
# their unit tests on the in-memory cluster compile no gRPC (tonic, hyper, h2, rustls).
grpc = ["escher-esl/grpc", "escher-client/grpc"]
# The end-to-end test (tests/e2e.rs) on the facade's `LocalCluster`, a real head and real
# workers in-process: `cargo test --features cluster`.
cluster = ["grpc", "dep:escher"]

[dependencies]
# The `ClusterApi` seam, `ResourceSpec`, `Policy`, `Domain`, and `escher_esl::testing`.
escher-esl = {esl}
# `Task`, the builder that `ResourceSpec::apply` adds a policy's requirements to.
escher-client = {client}
# The types of the API (names, amounts, capacities, statuses, events).
escher-proto = {proto}
# The follower's background task and its lock.
tokio = {{ version = "1", features = ["rt", "sync"] }}
# The facade, for the end-to-end test alone (feature `cluster`).
escher = {facade}

[dev-dependencies]
# The unit tests' `InMemoryCluster`: the head's state machine (escher-core) with simulated
# workers, no network.
escher-esl = {esl_tests}
tokio = {{ version = "1", features = ["rt-multi-thread", "macros", "time", "test-util"] }}

[[test]]
name = "e2e"
# A real head and workers in this process: built and run by `cargo test --features cluster`.
required-features = ["cluster"]

# Debug builds: line tables for this crate (a backtrace names its files and lines) and no debug
# information for the dependencies. With cargo's defaults every test binary carries the full
# debug information of every crate it links (the end-to-end test's was 281 MB).
[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false

[lints.rust]
unsafe_code = "deny"
missing_debug_implementations = "warn"
rust_2018_idioms = {{ level = "warn", priority = -1 }}
"#
    )
}

/// The checkout this binary was built from, if it is still there.
fn built_from() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    root.join("esl/Cargo.toml")
        .is_file()
        .then(|| root.to_path_buf())
}

impl NewEslArgs {
    /// Where escher's crates come from, checked.
    fn source(&self) -> anyhow::Result<Source> {
        if let Some(version) = &self.escher_version {
            return Ok(Source::Version(version.clone()));
        }
        let root = match &self.escher_path {
            Some(path) => path.clone(),
            None => built_from().context(
                "the checkout this escher was built from is gone: \
                 give --escher-path CHECKOUT or --escher-version VERSION",
            )?,
        };
        let root = root
            .canonicalize()
            .with_context(|| format!("--escher-path {}", root.display()))?;
        if !root.join("esl/Cargo.toml").is_file() {
            bail!(
                "{} is not an escher checkout (it has no esl/Cargo.toml)",
                root.display()
            );
        }
        Ok(Source::Path(root))
    }

    /// Writes the crate; what was written, for people.
    pub fn write(&self) -> anyhow::Result<String> {
        check_name(&self.name)?;
        let source = self.source()?;
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&self.name));
        if dir.exists() {
            let empty = std::fs::read_dir(&dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .next()
                .is_none();
            if !empty {
                bail!("{} exists and is not empty: nothing written", dir.display());
            }
        }
        let crate_name = self.name.replace('-', "_");
        let template_crate = TEMPLATE_PACKAGE.replace('-', "_");
        let mut files = vec![("Cargo.toml", manifest(&self.name, &source))];
        files.push((".gitignore", "/target\n".to_string()));
        for (path, text) in FILES {
            let text = text
                .replace(&template_crate, &crate_name)
                .replace(TEMPLATE_PACKAGE, &self.name);
            files.push((path, text));
        }
        for (path, text) in &files {
            let file = dir.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        }
        let from = match &source {
            Source::Path(root) => format!("escher's crates from {}", root.display()),
            Source::Version(v) => format!("escher's crates {v} from the registry"),
        };
        Ok(format!(
            "wrote the ESL crate {} in {} ({from})\n\
             next: cd {} && cargo test (the unit tests, on the in-memory cluster)\n\
             then: cargo test --features cluster (the end-to-end test, on a local cluster)\n",
            self.name,
            dir.display(),
            dir.display()
        ))
    }
}

impl NewCommand {
    /// Runs the command.
    pub(crate) fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<()> {
        let NewCommand::Esl(args) = self;
        let said = args.write()?;
        ctx.out.write_all(said.as_bytes())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("my-esl").is_ok());
        assert!(check_name("cap_2").is_ok());
        for bad in [
            "",
            "2cap",
            "my esl",
            "a/b",
            "escher-esl",
            "escher_client",
            "tokio",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_manifest_inherits_nothing_from_a_workspace() {
        let text = manifest("my-esl", &Source::Path(PathBuf::from("/src/escher")));
        assert!(!text.contains(".workspace"), "{text}");
        assert!(!text.contains("workspace = true"), "{text}");
        assert!(
            text.contains(r#"escher-esl = { path = "/src/escher/esl", default-features = false }"#)
        );
        assert!(text.contains(r#"escher = { path = "/src/escher", optional = true }"#));
        let parsed: toml::Table = toml::from_str(&text).expect("the manifest is TOML");
        assert_eq!(parsed["package"]["name"].as_str(), Some("my-esl"));
        // The facade and the end-to-end test only with `--features cluster`.
        let cluster = parsed["features"]["cluster"]
            .as_array()
            .expect("a cluster feature");
        assert!(cluster.iter().any(|f| f.as_str() == Some("dep:escher")));
        let e2e = &parsed["test"].as_array().expect("[[test]]")[0];
        assert_eq!(e2e["name"].as_str(), Some("e2e"));
        assert_eq!(
            e2e["required-features"].as_array().map(Vec::as_slice),
            Some(&[toml::Value::from("cluster")][..])
        );
        let text = manifest("my-esl", &Source::Version("0.1".into()));
        assert!(text.contains(r#"escher-proto = { version = "0.1", default-features = false }"#));
    }
}
