//! [`Credentials`]: the token a client sends with every call, and where it came from
//! (docs/DESIGN.md §10).
//!
//! A client finds its token without any flag, in this order:
//! 1. one given explicitly ([`Client::with_token`](crate::Client::with_token), `--token`);
//! 2. `ESCHER_TASK_TOKEN`: inside a running task, the credential the worker gave it (the task
//!    then acts in its own namespace, and `NodeSpec::Local` means its node);
//! 3. `ESCHER_TOKEN`;
//! 4. a head started in the same process (`LocalCluster`, tests) at the URL connected to;
//! 5. the access file the head wrote on this machine (`ESCHER_ACCESS_FILE`, else
//!    `$ESCHER_HOME/access.json`, `ESCHER_HOME` defaulting to `~/.escher`): its admin token.
//!
//! Without any of them calls go out with no token, and the head's refusal says where tokens
//! come from; the client adds which sources it looked at.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use escher_proto::access::{self, AccessFile, Bearer, ENV_TASK_TOKEN, ENV_TOKEN};

/// The environment variable in which a worker gives its tasks the head's certificate (PEM).
pub const ENV_TLS_CA: &str = "ESCHER_TLS_CA";
/// The environment variable with the name that certificate is checked against.
pub const ENV_TLS_NAME: &str = "ESCHER_TLS_NAME";

/// A token and where it was found.
#[derive(Clone)]
pub struct Credentials {
    /// The certificate (or CA) to trust for `https://` heads, and the name to check it
    /// against (the URL's host when `None`).
    trust: Option<(Arc<str>, Option<Arc<str>>)>,
    token: Option<Arc<str>>,
    source: Arc<str>,
    task: bool,
    /// Without a token: the URLs to look up again at each call, for a head of this process
    /// that registers its tokens only once it serves.
    urls: Arc<[String]>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("source", &self.source)
            .finish()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

impl Credentials {
    /// `token`, found at `source` (for messages: "--token", "ESCHER_TOKEN" ...).
    pub fn token(token: impl Into<String>, source: impl Into<String>) -> Credentials {
        let token: String = token.into();
        Credentials {
            task: token.starts_with("escher-task-"),
            trust: None,
            token: Some(Arc::from(token.trim())),
            source: Arc::from(source.into().as_str()),
            urls: Arc::new([]),
        }
    }

    /// The admin token of the access file at `path`, trusting its certificate.
    pub fn from_access_file(path: &Path) -> Result<Credentials, access::AccessError> {
        let file = AccessFile::read(path)?;
        Ok(Credentials::of_access(
            &file,
            format!("the access file {}", path.display()),
        ))
    }

    fn of_access(file: &AccessFile, source: String) -> Credentials {
        let credentials = Credentials::token(file.admin_token.clone(), source);
        match &file.ca_cert {
            Some(ca) => credentials.trusting(ca, file.tls_name.as_deref()),
            None => credentials,
        }
    }

    /// `token` from `source`, trusting what these credentials trust.
    pub fn with_token(&self, token: impl Into<String>, source: impl Into<String>) -> Credentials {
        Credentials {
            trust: self.trust.clone(),
            ..Credentials::token(token, source)
        }
    }

    /// The same token, trusting `ca_pem` for `https://` heads, checked against `name` (the
    /// URL's host when `None`).
    pub fn trusting(mut self, ca_pem: &str, name: Option<&str>) -> Credentials {
        self.trust = Some((Arc::from(ca_pem), name.map(Arc::from)));
        self
    }

    /// The TLS settings for `https://` heads: the trusted certificate, if any.
    pub fn tls(&self) -> Option<tonic::transport::ClientTlsConfig> {
        let (ca, name) = self.trust.as_ref()?;
        Some(access::client_tls(ca, name.as_deref()))
    }

    /// The certificate trusted for `https://` heads (PEM) and the name it is checked against.
    pub fn trust(&self) -> Option<(&str, Option<&str>)> {
        self.trust
            .as_ref()
            .map(|(ca, name)| (&**ca, name.as_deref()))
    }

    /// No token (every call will be refused by a head; the source says where one was looked
    /// for).
    pub fn none(looked_at: impl Into<String>) -> Credentials {
        Credentials {
            token: None,
            trust: None,
            source: Arc::from(looked_at.into().as_str()),
            task: false,
            urls: Arc::new([]),
        }
    }

    /// The credentials for a client of the heads at `urls`, found as the module says.
    pub fn discover(urls: &[String]) -> Credentials {
        let found = Credentials::discover_token(urls);
        if found.trust.is_some() {
            return found;
        }
        // The certificate to trust comes with the access file, or from a worker for its tasks.
        match env(ENV_TLS_CA) {
            Some(ca) => found.trusting(&ca, env(ENV_TLS_NAME).as_deref()),
            None => match access::location(None)
                .ok()
                .and_then(|p| AccessFile::read(&p).ok())
            {
                Some(AccessFile {
                    ca_cert: Some(ca),
                    tls_name,
                    ..
                }) => found.trusting(&ca, tls_name.as_deref()),
                _ => found,
            },
        }
    }

    fn discover_token(urls: &[String]) -> Credentials {
        if let Some(token) = env(ENV_TASK_TOKEN) {
            return Credentials::token(token, ENV_TASK_TOKEN);
        }
        if let Some(token) = env(ENV_TOKEN) {
            return Credentials::token(token, ENV_TOKEN);
        }
        if let Some(file) = urls.iter().find_map(|u| access::registered(u)) {
            return Credentials::of_access(&file, "the head started in this process".into());
        }
        match access::location(None) {
            Ok(path) if path.exists() => match Credentials::from_access_file(&path) {
                Ok(credentials) => credentials,
                Err(e) => Credentials::none(format!("{ENV_TOKEN} is unset, and {e}")),
            },
            Ok(path) => Credentials {
                urls: urls.into(),
                ..Credentials::none(format!(
                    "no token: {ENV_TOKEN} is unset and there is no access file at {} (the head \
                     writes one at its first start on its own machine; copy it here and set \
                     ESCHER_ACCESS_FILE, or pass --token)",
                    path.display()
                ))
            },
            Err(e) => Credentials::none(format!("no token: {ENV_TOKEN} is unset, and {e}")),
        }
    }

    /// Where the token came from (or where none was found), for messages.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is a running task's credential.
    pub fn is_task(&self) -> bool {
        self.task
    }

    /// Whether there is a token at all.
    pub fn is_some(&self) -> bool {
        self.token.is_some()
    }

    /// The token itself (for `escher dashboard`, which hands it to a browser), if there is
    /// one.
    pub fn secret(&self) -> Option<String> {
        match &self.token {
            Some(token) => Some(token.to_string()),
            None => self
                .urls
                .iter()
                .find_map(|u| access::registered(u))
                .map(|file| file.admin_token.clone()),
        }
    }

    /// The interceptor that sends it.
    pub fn bearer(&self) -> Bearer {
        match &self.token {
            Some(token) => Bearer::new(token),
            None => match self.urls.iter().find_map(|u| access::registered(u)) {
                Some(file) => Bearer::new(&file.admin_token),
                None => Bearer::none(),
            },
        }
    }
}
