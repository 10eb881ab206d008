//! The access file (docs/DESIGN.md §10): how the CLI, the client library and workers on the head's
//! machine find the head and its credentials with no flag.
//!
//! At its first start a head writes `access.json` (mode 0600): the URLs it serves on, an
//! `admin` token, a worker join token, and the certificate clients verify when the head speaks
//! TLS. Later starts read the same file, so tokens survive restarts. Where it lives:
//!
//! 1. `--access-file PATH` (head, worker, CLI) or `ESCHER_ACCESS_FILE`;
//! 2. else `$ESCHER_HOME/access.json`, `ESCHER_HOME` defaulting to `~/.escher`.
//!
//! The file sits in `ESCHER_HOME` rather than in the head's data directory because that is
//! where everything else on the machine looks: a head started with `--data-dir` and the CLI
//! run next to it find the same file without a flag. The replicas of one group share one file:
//! on one machine they share `ESCHER_HOME` (or one `--access-file`), across machines an
//! operator copies the first replica's file to the others before starting them. Creating the
//! file is exclusive (three replicas starting at once agree on one set of tokens), and adding
//! a head URL to it happens under a lock.
//!
//! Heads started in a process (`LocalCluster`, tests) also [`register`] their access in that
//! process, so that a client of the same process finds it by URL without any file.

use std::collections::HashMap;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The environment variable naming the access file.
pub const ENV_ACCESS_FILE: &str = "ESCHER_ACCESS_FILE";
/// The environment variable holding a bearer token (it wins over the access file).
pub const ENV_TOKEN: &str = "ESCHER_TOKEN";
/// The environment variable in which a running task gets its task-scoped credential.
pub const ENV_TASK_TOKEN: &str = "ESCHER_TASK_TOKEN";
/// The environment variable naming escher's per-user directory (default `~/.escher`).
pub const ENV_HOME: &str = "ESCHER_HOME";
/// The access file's name inside `ESCHER_HOME`.
pub const FILE_NAME: &str = "access.json";

/// The version of the file's format this build writes and reads.
pub const VERSION: u32 = 1;

/// What a head publishes to the machine it runs on.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessFile {
    /// The format's version.
    pub version: u32,
    /// The URLs of the head's replicas (`http://HOST:PORT` or `https://HOST:PORT`).
    pub heads: Vec<String>,
    /// A token with the `admin` role.
    pub admin_token: String,
    /// The worker join token (`worker` role).
    pub worker_token: String,
    /// The token the head's replicas present to each other (and accept only from each other:
    /// the `Raft` service refuses every other token, the admin's included). Only a head's own
    /// access file holds it; `None` in a credential file, and in an access file written before
    /// this field existed (then [`AccessFile::peer_token`] derives one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_token: Option<String>,
    /// The PEM certificate a client trusts for the head's TLS, when the head speaks TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<String>,
    /// The name the head's certificate is checked against instead of the URL's host
    /// ([`TLS_NAME`] for a certificate the head generated); `None` checks the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_name: Option<String>,
    /// The cluster whose head wrote this file (its id, once its first leader named it): a
    /// backup of another cluster is refused by a head given this file
    /// ([`AccessFile::record_cluster`]). `None` in an access file written before the cluster
    /// was named, or before this field existed, and in a credential file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// The name in every certificate a head generates for itself: clients of its access file
/// check the certificate against it, whatever address they reach the head at.
pub const TLS_NAME: &str = "escher-head";

/// The TLS settings of a client of a head whose certificate (or its CA) is `ca_pem`, checked
/// against `name` (the URL's host when `None`).
#[cfg(feature = "grpc")]
pub fn client_tls(ca_pem: &str, name: Option<&str>) -> tonic::transport::ClientTlsConfig {
    let config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem));
    match name {
        Some(name) => config.domain_name(name),
        None => config,
    }
}

impl fmt::Debug for AccessFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessFile")
            .field("heads", &self.heads)
            .field("admin_token", &"<redacted>")
            .field("worker_token", &"<redacted>")
            .field("tls", &self.ca_cert.is_some())
            .finish()
    }
}

/// Why an access file could not be used.
#[derive(Debug, Error)]
pub enum AccessError {
    /// The file could not be read or written.
    #[error("cannot use the access file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not an access file of this version.
    #[error(
        "the access file {path} is not valid: {why}; remove it and restart the head to write a \
         new one (its tokens stop working), or point --access-file at the right file"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// No home directory to look in.
    #[error(
        "no access file location: neither {ENV_ACCESS_FILE} nor {ENV_HOME} nor HOME is set; \
         pass --access-file PATH"
    )]
    NoHome,
}

/// A random token for `role` (`escher-<role>-` and 64 hex digits: 256 random bits).
pub fn new_token(role: &str) -> String {
    let mut bytes = [0u8; 32];
    // As `rand::random` would: a machine whose random number generator fails cannot make a
    // secret, and has nothing else to do.
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    format!("escher-{role}-{}", hex::encode(bytes))
}

impl AccessFile {
    /// A new access file for heads at `heads`, with fresh tokens.
    pub fn generate(heads: Vec<String>) -> AccessFile {
        AccessFile {
            version: VERSION,
            heads,
            admin_token: new_token("admin"),
            worker_token: new_token("worker"),
            peer_token: Some(new_token("peer")),
            ca_cert: None,
            tls_name: None,
            cluster: None,
        }
    }

    /// Records in the head's access file at `path` that it is cluster `cluster`'s (under the
    /// same lock as [`AccessFile::open_or_create`]). `Ok(None)` once recorded (or when it
    /// already was); `Ok(Some(other))` leaves a file that names another cluster as it is.
    pub fn record_cluster(path: &Path, cluster: &str) -> Result<Option<String>, AccessError> {
        let io = |source| AccessError::Io {
            path: path.to_path_buf(),
            source,
        };
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("lock"))
            .map_err(io)?;
        lock.lock().map_err(io)?;
        let mut file = AccessFile::read(path)?;
        match file.cluster.as_deref() {
            Some(named) if named == cluster => Ok(None),
            Some(other) => Ok(Some(other.to_string())),
            None => {
                file.cluster = Some(cluster.to_string());
                file.replace(path)?;
                Ok(None)
            }
        }
    }

    /// Reads and checks the file at `path`.
    pub fn read(path: &Path) -> Result<AccessFile, AccessError> {
        let text = std::fs::read_to_string(path).map_err(|source| AccessError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |why: String| AccessError::Invalid {
            path: path.to_path_buf(),
            why,
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(path)
                .map_err(|source| AccessError::Io {
                    path: path.to_path_buf(),
                    source,
                })?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(invalid(format!(
                    "it is open to its group or others (mode {:o}) and it holds a token: anyone \
                     on this machine could act with it; run `chmod 600 {}`",
                    mode & 0o777,
                    path.display()
                )));
            }
        }
        let file: AccessFile = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if file.version != VERSION {
            return Err(invalid(format!(
                "format version {} (this build reads version {VERSION})",
                file.version
            )));
        }
        // A credential file (`escher token create --out`) holds one of the two.
        if file.admin_token.is_empty() && file.worker_token.is_empty() {
            return Err(invalid("it holds no token".into()));
        }
        for (field, token) in [
            ("admin_token", &file.admin_token),
            ("worker_token", &file.worker_token),
            (
                "peer_token",
                file.peer_token.as_ref().unwrap_or(&String::new()),
            ),
        ] {
            if !token.is_empty() {
                check_strength(token).map_err(|why| invalid(format!("{field}: {why}")))?;
            }
        }
        Ok(file)
    }

    /// Opens the access file at `path`, creating it with fresh tokens if there is none, and
    /// makes sure `url` is among its heads. Returns the file and whether it was created now.
    /// Safe against other heads doing the same at the same time (an exclusive create, then a
    /// lock for the update).
    pub fn open_or_create(
        path: &Path,
        url: &str,
        tls: Option<(&str, Option<&str>)>,
    ) -> Result<(AccessFile, bool), AccessError> {
        let ca_cert = tls.map(|(cert, _)| cert);
        let tls_name = tls.and_then(|(_, name)| name);
        let io = |source| AccessError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut fresh = AccessFile::generate(vec![url.to_string()]);
        fresh.ca_cert = ca_cert.map(str::to_string);
        fresh.tls_name = tls_name.map(str::to_string);
        if create_exclusive(path, &fresh)? {
            return Ok((fresh, true));
        }
        let lock_path = path.with_extension("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io)?;
        lock.lock().map_err(io)?;
        let mut file = AccessFile::read(path)?;
        if file.admin_token.is_empty() || file.worker_token.is_empty() {
            return Err(AccessError::Invalid {
                path: path.to_path_buf(),
                why: "it is a credential file for one token (escher token create --out), not a \
                      head's access file, which holds the admin and the worker join tokens"
                    .into(),
            });
        }
        let mut changed = false;
        if !file.heads.iter().any(|h| h == url) {
            file.heads.push(url.to_string());
            changed = true;
        }
        if file.ca_cert.as_deref() != ca_cert || file.tls_name.as_deref() != tls_name {
            file.ca_cert = ca_cert.map(str::to_string);
            file.tls_name = tls_name.map(str::to_string);
            changed = true;
        }
        if changed {
            file.replace(path)?;
        }
        drop(lock);
        Ok((file, false))
    }

    /// The token this group's replicas present to each other, and whether it was derived: an
    /// access file written before peer tokens existed has none, and every replica of its
    /// group derives the same one from the admin token (so that a group upgraded one replica
    /// at a time keeps talking; anyone with the admin token could derive it too, so such a
    /// group should be given a fresh access file).
    pub fn peer_token(&self) -> (String, bool) {
        if let Some(token) = self.peer_token.as_ref().filter(|t| !t.is_empty()) {
            return (token.clone(), false);
        }
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(self.admin_token.as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(b"escher peer token\0");
        (
            format!("escher-peer-{}", hex::encode(mac.finalize().into_bytes())),
            true,
        )
    }

    /// Replaces the file at `path` with this one (written aside, then renamed over it).
    pub fn replace(&self, path: &Path) -> Result<(), AccessError> {
        let tmp = aside(path, "tmp");
        write_private(&tmp, self)?;
        std::fs::rename(&tmp, path).map_err(|source| AccessError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// A name beside `path` for one write of this process's own: the pid and 64 random bits.
/// The pid alone is not enough: heads in containers that share the directory on a volume all
/// run as pid 1, and one's write would remove or take another's.
fn aside(path: &Path, what: &str) -> PathBuf {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the operating system's random number generator failed");
    path.with_extension(format!(
        "{what}.{}.{}",
        std::process::id(),
        hex::encode(bytes)
    ))
}

/// Writes `file` to `path` if nothing is there yet; `false` if something is.
fn create_exclusive(path: &Path, file: &AccessFile) -> Result<bool, AccessError> {
    let tmp = aside(path, "new");
    write_private(&tmp, file)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(AccessError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The fewest characters a token may have.
pub const MIN_TOKEN_CHARS: usize = 32;

/// Refuses a token too short or too uniform to be a secret: at least [`MIN_TOKEN_CHARS`]
/// characters, at least 12 of them distinct (a generated token has 64 random hex digits; `openssl
/// rand -hex 32` makes a good one by hand).
pub fn check_strength(token: &str) -> Result<(), String> {
    let distinct = token
        .chars()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if token.chars().count() < MIN_TOKEN_CHARS || distinct < 12 {
        return Err(format!(
            "a token of {} characters ({distinct} distinct) is too easy to guess; use at least \
             {MIN_TOKEN_CHARS} random characters (the head generates them; `openssl rand -hex \
             32` makes one)",
            token.chars().count()
        ));
    }
    Ok(())
}

/// Writes `file` to a new file at `path`, readable by its owner only, and syncs it: a
/// credential file for one token (`escher token create --out`). Anything already at `path` is
/// refused, a symbolic link included (dangling or not): see `write_private`.
pub fn write_credential_file(path: &Path, file: &AccessFile) -> Result<(), AccessError> {
    write_private(path, file)
}

/// Refuses `path` for a new credential file if anything is there, a symbolic link included:
/// a caller checks before it creates the token the file would hold (the write itself refuses
/// too, atomically).
pub fn ensure_free(path: &Path) -> Result<(), AccessError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(AccessError::Io {
            path: path.to_path_buf(),
            source,
        }),
        Ok(_) => Err(taken(path)),
    }
}

/// What is said of a path where a credential file was to be created and something is.
fn taken(path: &Path) -> AccessError {
    AccessError::Invalid {
        path: path.to_path_buf(),
        why: "something is there already (a file, or a symbolic link, dangling ones included: a \
              credential file is never written through one); give a path where nothing is, or \
              remove what is there first"
            .into(),
    }
}

/// Writes `file` to a new file at `path`, readable by its owner only, and syncs it.
///
/// The file is created with `O_CREAT | O_EXCL` (`create_new`): the open fails if anything is at
/// `path`, and POSIX has it fail for a symbolic link too, whatever the link points to, so no
/// link another user planted (in a shared directory, or where a temporary name will be) gets a
/// token written through it. `O_NOFOLLOW` is implied by `O_EXCL` there, so it is not passed
/// (the flag's value differs between architectures, and this crate has no `libc`).
fn write_private(path: &Path, file: &AccessFile) -> Result<(), AccessError> {
    let io = |source| AccessError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut text = serde_json::to_string_pretty(file).expect("an access file serializes");
    text.push('\n');
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut out = options.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => taken(path),
        _ => io(e),
    })?;
    out.write_all(text.as_bytes()).map_err(io)?;
    out.sync_all().map_err(io)
}

/// `ESCHER_HOME`, defaulting to `~/.escher`.
pub fn home() -> Option<PathBuf> {
    match std::env::var_os(ENV_HOME) {
        Some(h) if !h.is_empty() => Some(PathBuf::from(h)),
        _ => Some(PathBuf::from(std::env::var_os("HOME")?).join(".escher")),
    }
}

/// Where the access file is: `explicit` if given, else `ESCHER_ACCESS_FILE`, else
/// `$ESCHER_HOME/access.json`.
pub fn location(explicit: Option<&Path>) -> Result<PathBuf, AccessError> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    match std::env::var_os(ENV_ACCESS_FILE) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => home().map(|h| h.join(FILE_NAME)).ok_or(AccessError::NoHome),
    }
}

/// Adds `authorization: Bearer <token>` to every call of a tonic client
/// (`ClusterClient::with_interceptor(channel, Bearer::new(token))`).
#[derive(Clone)]
#[cfg(feature = "grpc")]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

#[cfg(feature = "grpc")]
impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Bearer(<redacted>)"
        } else {
            "Bearer(none)"
        })
    }
}

#[cfg(feature = "grpc")]
impl Bearer {
    /// Sends `token`; a token that cannot be a header value (it holds a control character) is
    /// sent as no token, which the head refuses saying so.
    pub fn new(token: &str) -> Bearer {
        let value = format!("Bearer {token}").parse().ok().map(
            |mut v: tonic::metadata::MetadataValue<_>| {
                v.set_sensitive(true);
                v
            },
        );
        Bearer(value)
    }

    /// Sends no token.
    pub fn none() -> Bearer {
        Bearer(None)
    }
}

#[cfg(feature = "grpc")]
impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

fn registry() -> &'static Mutex<HashMap<String, AccessFile>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, AccessFile>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// The key a URL is registered under: scheme-less, without a trailing slash.
fn url_key(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    url.split_once("://")
        .map_or(url, |(_, rest)| rest)
        .to_string()
}

/// Makes `access` known to clients of this process that connect to `url` (a head started in
/// this process).
pub fn register(url: &str, access: &AccessFile) {
    let mut known = registry().lock().unwrap_or_else(|e| e.into_inner());
    known.insert(url_key(url), access.clone());
}

/// Forgets what [`register`] made known for `url`.
pub fn unregister(url: &str) {
    let mut known = registry().lock().unwrap_or_else(|e| e.into_inner());
    known.remove(&url_key(url));
}

/// The access of a head started in this process at `url`, if one registered.
pub fn registered(url: &str) -> Option<AccessFile> {
    let known = registry().lock().unwrap_or_else(|e| e.into_inner());
    known.get(&url_key(url)).cloned()
}

/// The hash of `token` the head keeps (SHA-256, hex): tokens themselves are never stored.
pub fn token_hash(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The proof a head's dashboard gives that it knows the token whose hash is `token_hash`:
/// HMAC-SHA256 keyed with the hash, over `nonce`. `escher dashboard` asks for it (with the
/// token's id and a fresh nonce) before it prints an address carrying the token, so that a
/// page served by someone else at that address never receives it.
pub fn dashboard_proof(token_hash: &str, nonce: &str) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(token_hash.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(b"escher dashboard proof\0");
    mac.update(nonce.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_credential_file_is_never_written_over_a_file_or_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let file = AccessFile::generate(vec!["http://127.0.0.1:7600".into()]);
        // A dangling link: following it would create the file where it points.
        let target = dir.path().join("elsewhere");
        let dangling = dir.path().join("dangling.json");
        std::os::unix::fs::symlink(&target, &dangling).unwrap();
        // A link to a file that exists: following it would overwrite that file.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let linked = dir.path().join("linked.json");
        std::os::unix::fs::symlink(&victim, &linked).unwrap();
        let existing = dir.path().join("existing.json");
        std::fs::write(&existing, "keep").unwrap();
        for path in [&dangling, &linked, &existing] {
            let err = write_credential_file(path, &file).unwrap_err().to_string();
            assert!(
                err.contains("symbolic link") && err.contains("remove"),
                "{err}"
            );
            let err = ensure_free(path).unwrap_err().to_string();
            assert!(err.contains("something is there already"), "{err}");
        }
        assert!(
            !target.exists(),
            "a token was written through the dangling link"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep");
        // A free path is written, 0600, and read back.
        let fresh = dir.path().join("fresh.json");
        ensure_free(&fresh).unwrap();
        write_credential_file(&fresh, &file).unwrap();
        assert_eq!(AccessFile::read(&fresh).unwrap(), file);
        // Replacing the access file (its URLs grew) goes on beside a link planted where a
        // temporary file once went (names are now random as well): nothing is written through it.
        let leftover = fresh.with_extension(format!("tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&target, &leftover).unwrap();
        file.replace(&fresh).unwrap();
        assert!(!target.exists());
    }

    #[test]
    fn a_file_is_created_once_private_and_gains_urls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("home").join(FILE_NAME);
        let (first, created) =
            AccessFile::open_or_create(&path, "http://127.0.0.1:7600", None).unwrap();
        assert!(created);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (second, created) =
            AccessFile::open_or_create(&path, "http://127.0.0.1:7601", None).unwrap();
        assert!(!created);
        assert_eq!(second.admin_token, first.admin_token);
        assert_eq!(second.heads.len(), 2);
        assert_eq!(AccessFile::read(&path).unwrap(), second);
        assert!(!format!("{second:?}").contains(&second.admin_token));
        assert_eq!(
            second.peer_token, first.peer_token,
            "one peer token per group"
        );
    }

    #[test]
    fn the_peer_token_is_the_files_own_or_derived_the_same_by_every_replica() {
        let fresh = AccessFile::generate(vec!["http://127.0.0.1:7600".into()]);
        let (token, derived) = fresh.peer_token();
        assert!(!derived && token.starts_with("escher-peer-"));
        assert_ne!(token, fresh.admin_token);
        // A file written before peer tokens: every replica derives the same one, not the
        // admin token itself.
        let text = serde_json::to_string(&fresh).unwrap();
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("peer_token");
        let old: AccessFile = serde_json::from_value(old).unwrap();
        let (a, derived) = old.peer_token();
        assert!(derived);
        assert_eq!(a, old.clone().peer_token().0);
        assert_ne!(a, old.admin_token);
        check_strength(&a).unwrap();
    }

    #[test]
    fn a_broken_file_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{not json").unwrap();
        let err = AccessFile::read(&path).unwrap_err().to_string();
        assert!(err.contains("remove it and restart the head"), "{err}");
    }

    #[test]
    fn the_registry_ignores_the_scheme() {
        let access = AccessFile::generate(vec![]);
        register("http://127.0.0.1:9/", &access);
        assert_eq!(registered("127.0.0.1:9"), Some(access));
        unregister("127.0.0.1:9");
        assert_eq!(registered("http://127.0.0.1:9"), None);
    }

    #[test]
    fn tokens_are_random_and_name_their_role() {
        let a = new_token("admin");
        assert!(a.starts_with("escher-admin-") && a.len() == "escher-admin-".len() + 64);
        assert_ne!(a, new_token("admin"));
    }
}
