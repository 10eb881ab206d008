//! The CLI's defaults file: `$ESCHER_HOME/config.toml` (`ESCHER_HOME` defaulting to
//! `~/.escher`), or the file `ESCHER_CONFIG` names.
//!
//! ```toml
//! head = "https://head.example:7600"   # the head (or every replica, comma-separated)
//! namespace = "team-a"                 # the namespace of unqualified names
//! output = "json"                      # "table" (the default) or "json"
//! ```
//!
//! A flag wins over its environment variable, which wins over the file, which wins over the
//! access file's heads and the built-in defaults. A missing file is no file; a file that does
//! not parse, or names a key escher does not know, is an error that names the file.

use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;

/// The environment variable naming another defaults file.
pub const ENV_CONFIG: &str = "ESCHER_CONFIG";
/// The defaults file's name in `ESCHER_HOME`.
pub const FILE_NAME: &str = "config.toml";

/// What the defaults file may set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliConfig {
    /// The head's URL (or every replica's, comma-separated).
    pub head: Option<String>,
    /// The namespace that qualifies unqualified names.
    pub namespace: Option<String>,
    /// How results print.
    pub output: Option<Output>,
}

/// How results print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    /// Tables for people.
    Table,
    /// JSON for scripts.
    Json,
}

impl CliConfig {
    /// Parses the text of a defaults file.
    pub fn parse(text: &str) -> Result<CliConfig, toml::de::Error> {
        toml::from_str(text)
    }

    /// The defaults file: `ESCHER_CONFIG`'s, else `$ESCHER_HOME/config.toml`; empty when there
    /// is none.
    pub fn load() -> anyhow::Result<CliConfig> {
        let path = match std::env::var_os(ENV_CONFIG).filter(|p| !p.is_empty()) {
            Some(path) => PathBuf::from(path),
            None => match escher_proto::access::home() {
                Some(home) => home.join(FILE_NAME),
                None => return Ok(CliConfig::default()),
            },
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(CliConfig::default());
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", path.display()));
            }
        };
        CliConfig::parse(&text).with_context(|| {
            format!(
                "{} is not a valid escher CLI defaults file (keys: head, namespace, output = \
                 \"table\" or \"json\")",
                path.display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_parses_and_an_unknown_one_is_refused() {
        let config = CliConfig::parse(
            "head = \"http://10.0.0.1:7600\"\nnamespace = \"team-a\"\noutput = \"json\"\n",
        )
        .unwrap();
        assert_eq!(config.head.as_deref(), Some("http://10.0.0.1:7600"));
        assert_eq!(config.namespace.as_deref(), Some("team-a"));
        assert_eq!(config.output, Some(Output::Json));
        assert_eq!(CliConfig::parse("").unwrap(), CliConfig::default());
        let err = CliConfig::parse("hed = \"x\"").unwrap_err().to_string();
        assert!(err.contains("hed"), "{err}");
        let err = CliConfig::parse("output = \"yaml\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("yaml"), "{err}");
    }
}
