//! [`Ctx`]: what every command gets: the global options, a way to connect, and where to
//! write its output.
//!
//! Output goes through the context rather than straight to stdout so that [`super::run_with`]
//! can capture it (tests assert on exactly what a person or a script would read). A closed
//! pipe (`escher tasks | head`) ends output quietly instead of failing the command.

use std::io::{self, Write};

use escher_proto::Namespace;
use serde::Serialize;

use escher_client::{Client, ClientError, Credentials};

/// The global options every command shares, and its output.
pub(crate) struct Ctx<'a> {
    /// The head URL.
    pub head: String,
    /// The namespace, if any.
    pub namespace: Option<Namespace>,
    /// Whether to print JSON.
    pub json: bool,
    /// `--token`.
    pub token: Option<String>,
    /// `--access-file`.
    pub access_file: Option<std::path::PathBuf>,
    /// `--ca`.
    pub ca: Option<std::path::PathBuf>,
    /// Where results go (stdout in the binary).
    pub out: &'a mut (dyn Write + Send),
}

impl Ctx<'_> {
    /// Connects to the head.
    pub async fn client(&self) -> Result<Client, ClientError> {
        let credentials = self.credentials()?;
        let client = Client::connect_with(&self.head, credentials).await?;
        Ok(match &self.namespace {
            Some(ns) => client.with_namespace(ns.clone()),
            None => client,
        })
    }

    /// The token and trust the options and the environment give (see [`Credentials`]).
    pub fn credentials(&self) -> Result<Credentials, ClientError> {
        let urls: Vec<String> = self.head.split(',').map(|u| u.trim().to_string()).collect();
        let mut credentials = match &self.access_file {
            Some(path) => Credentials::from_access_file(path)
                .map_err(|e| ClientError::Usage(e.to_string()))?,
            None => Credentials::discover(&urls),
        };
        if let Some(token) = &self.token {
            credentials = credentials.with_token(token, "--token");
        }
        if let Some(path) = &self.ca {
            let pem = std::fs::read_to_string(path).map_err(|e| {
                ClientError::Usage(format!("cannot read --ca {}: {e}", path.display()))
            })?;
            credentials = credentials.trusting(&pem, None);
        }
        Ok(credentials)
    }

    /// Writes raw bytes.
    pub fn emit_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.out.write_all(bytes).and_then(|()| self.out.flush()) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            other => other,
        }
    }

    /// Writes text.
    pub fn emit(&mut self, text: &str) -> io::Result<()> {
        self.emit_bytes(text.as_bytes())
    }

    /// Writes `value` as pretty JSON, one document followed by a newline.
    pub fn emit_json<T: Serialize + ?Sized>(&mut self, value: &T) -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(value)?;
        text.push('\n');
        Ok(self.emit(&text)?)
    }
}
