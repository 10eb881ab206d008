//! The head's TLS identity (docs/DESIGN.md §10): a certificate and key given by the operator
//! (`--tls-cert/--tls-key`), or generated at the first start (rcgen) and kept beside the access
//! file, so that restarts, and the replicas of a group that share the file, present the same
//! certificate that the access file tells clients to trust.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use escher_proto::access::TLS_NAME;
use thiserror::Error;

/// What a head presents, and what clients (its peers included) check it against.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsIdentity {
    /// The certificate chain, PEM.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
    /// What clients trust: the certificate itself (self-signed) or its CA, PEM.
    pub ca_pem: String,
    /// The name clients check the certificate against instead of the URL's host
    /// ([`TLS_NAME`] for a generated certificate).
    pub server_name: Option<String>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("server_name", &self.server_name)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Why the head has no TLS identity.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("cannot use {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The certificate could not be generated.
    #[error("cannot generate the head's TLS certificate: {0}")]
    Generate(String),
    /// A file given is not PEM.
    #[error("{path} holds no PEM {what}; give a PEM file (-----BEGIN ...)")]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What was expected.
        what: &'static str,
    },
}

fn read(path: &Path, what: &'static str) -> Result<String, TlsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if !text.contains("-----BEGIN") {
        return Err(TlsError::NotPem {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(text)
}

impl TlsIdentity {
    /// The operator's certificate and key; `ca` is what clients trust (the certificate itself
    /// when `None`), and clients check the URL's host against the certificate.
    pub fn from_files(cert: &Path, key: &Path, ca: Option<&Path>) -> Result<TlsIdentity, TlsError> {
        let cert_pem = read(cert, "certificate")?;
        let key_pem = read(key, "private key")?;
        let ca_pem = match ca {
            Some(path) => read(path, "certificate")?,
            None => cert_pem.clone(),
        };
        Ok(TlsIdentity {
            cert_pem,
            key_pem,
            ca_pem,
            server_name: None,
        })
    }

    /// The generated identity kept in `dir` (`tls-cert.pem`, `tls-key.pem`, the key readable
    /// by its owner only), created on first use: a self-signed certificate for [`TLS_NAME`],
    /// `localhost`, 127.0.0.1, ::1 and `ip`. Creating it is exclusive: heads starting together
    /// agree on one.
    pub fn generated(dir: &Path, ip: IpAddr) -> Result<TlsIdentity, TlsError> {
        let cert_path = dir.join("tls-cert.pem");
        let key_path = dir.join("tls-key.pem");
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TlsError::Io { path, source }
        };
        if !cert_path.exists() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            let mut names = vec![
                TLS_NAME.to_string(),
                "localhost".to_string(),
                "127.0.0.1".to_string(),
                "::1".to_string(),
            ];
            if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
                names.push(ip.to_string());
            }
            let generated = rcgen::generate_simple_self_signed(names)
                .map_err(|e| TlsError::Generate(e.to_string()))?;
            // The key first (a head that finds the certificate finds its key), each written
            // aside and linked into place only if nothing is there yet.
            let key_won = create_new(&key_path, &generated.signing_key.serialize_pem(), 0o600)?;
            if key_won {
                create_new(&cert_path, &generated.cert.pem(), 0o644)?;
            } else {
                // Another head is writing the pair: wait for its certificate.
                for _ in 0..100 {
                    if cert_path.exists() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
        let cert_pem = read(&cert_path, "certificate")?;
        Ok(TlsIdentity {
            key_pem: read(&key_path, "private key")?,
            ca_pem: cert_pem.clone(),
            cert_pem,
            server_name: Some(TLS_NAME.to_string()),
        })
    }

    /// The server side for tonic.
    pub(crate) fn server_config(&self) -> tonic::transport::ServerTlsConfig {
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        tonic::transport::ServerTlsConfig::new().identity(identity)
    }

    /// The client side for peers and clients of this head.
    pub fn client_config(&self) -> tonic::transport::ClientTlsConfig {
        escher_proto::access::client_tls(&self.ca_pem, self.server_name.as_deref())
    }
}

/// Writes `text` to `path` only if nothing is there; `false` if something was.
fn create_new(path: &Path, text: &str, mode: u32) -> Result<bool, TlsError> {
    let io = |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    };
    // A name of this write's own: heads in containers sharing the directory on a volume all
    // run as pid 1, so a pid alone once named one file for three heads, and one head linked
    // another's key beside its own certificate (rustls then refused the pair: "keys may not
    // be consistent"). The file is created new (`O_EXCL`, which refuses a symbolic link too):
    // a key is never written through a link.
    let tmp = path.with_extension(format!(
        "new.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(mode);
        }
        let mut file = options.open(&tmp).map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(TlsError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heads that start together on one directory agree on one certificate, and it is the
    /// key's. Threads of one process share its pid, as heads in containers (each pid 1) on one
    /// volume do: with a scratch file named by the pid, one head linked another's key beside
    /// its own certificate.
    #[test]
    fn heads_generating_together_agree_on_one_certificate_for_the_key() {
        use base64::Engine as _;
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let identities: Vec<TlsIdentity> = std::thread::scope(|s| {
                let heads: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| TlsIdentity::generated(dir.path(), ip).unwrap()))
                    .collect();
                heads.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for identity in &identities {
                assert_eq!(identity, &identities[0]);
            }
            let key = rcgen::KeyPair::from_pem(&identities[0].key_pem).unwrap();
            let spki = rcgen::PublicKeyData::der_bytes(&key).to_vec();
            let body: String = identities[0]
                .cert_pem
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .collect();
            let der = base64::engine::general_purpose::STANDARD
                .decode(body)
                .unwrap();
            assert!(
                der.windows(spki.len()).any(|w| w == spki.as_slice()),
                "the certificate is not the key's"
            );
        }
    }

    #[test]
    fn a_generated_identity_is_kept_and_its_key_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let first = TlsIdentity::generated(dir.path(), ip).unwrap();
        assert!(first.cert_pem.contains("BEGIN CERTIFICATE"));
        assert_eq!(first.server_name.as_deref(), Some(TLS_NAME));
        let again = TlsIdentity::generated(dir.path(), ip).unwrap();
        assert_eq!(again, first, "a restart presents the same certificate");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join("tls-key.pem"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let err = TlsIdentity::from_files(
            &dir.path().join("tls-key.pem"),
            &dir.path().join("missing.pem"),
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");
    }
}
