//! [`IdentityStore`]: where a worker keeps the identity its first registration gave it (node
//! id, secret, and the cluster that issued them), so that it comes back as the same node after
//! a head failover, a head restart, or its own restart.
//!
//! `escher-worker` keeps it in a state directory (`--state-dir`, by default
//! `$ESCHER_HOME/workers/NAME` for a worker with a `--name`, else `$ESCHER_HOME/worker`, with
//! `ESCHER_HOME` defaulting to `~/.escher`): `identity.json`
//! (mode 0600: the secret is a credential), written whole and renamed into place. The
//! directory is locked while the worker runs, so two workers never share an identity; a second
//! worker on the machine needs a name or a `--state-dir` of its own. A library worker (and every worker
//! of a `LocalCluster`) keeps it in memory, for the life of the process.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use escher_proto::NodeId;
use escher_proto::types::NodeIdentity;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The file that holds the identity, inside the state directory.
const IDENTITY_FILE: &str = "identity.json";
/// The file locked while a worker uses the state directory.
const LOCK_FILE: &str = "lock";

/// Why the state directory cannot be used.
#[derive(Debug, Error)]
pub enum StateDirError {
    /// It cannot be created, read or written.
    #[error("worker state directory {path}: {source}; check --state-dir and its permissions")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Another worker runs with it.
    #[error(
        "worker state directory {0} is in use by another escher-worker on this machine; give \
         each worker a --name of its own (its state goes to $ESCHER_HOME/workers/NAME) or its \
         own --state-dir"
    )]
    InUse(PathBuf),
    /// The identity file is damaged.
    #[error("{path} is not a worker identity ({why}); remove it to join the cluster as a new node")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The format of `identity.json` this build writes and the newest it reads (a file without a
/// `version`, as earlier releases wrote it, is version 1).
const IDENTITY_VERSION: u32 = 1;

/// The identity as written to disk.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(default = "first_version")]
    version: u32,
    node_id: u64,
    secret: String,
    cluster: String,
}

/// Where the identity lives.
#[derive(Debug)]
pub(crate) enum IdentityStore {
    /// In memory only.
    Memory(Option<NodeIdentity>),
    /// In a locked state directory.
    Dir {
        dir: PathBuf,
        identity: Option<NodeIdentity>,
        /// Held for the worker's life: the lock goes with it.
        _lock: Flock<File>,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateDirError + '_ {
    move |source| StateDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl IdentityStore {
    /// Opens (creating) and locks `dir`, reading the identity it holds.
    pub(crate) fn open(dir: &Path) -> Result<IdentityStore, StateDirError> {
        use std::os::unix::fs::PermissionsExt;
        // The worker's own: tasks that run as other users reach nothing in it.
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(io(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(StateDirError::InUse(dir.to_path_buf()));
            }
            Err((_, errno)) => return Err(io(&lock_path)(errno.into())),
        };
        let path = dir.join(IDENTITY_FILE);
        let identity = match std::fs::read(&path) {
            Ok(bytes) => Some(parse(&path, &bytes)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&path)(e)),
        };
        Ok(IdentityStore::Dir {
            dir: dir.to_path_buf(),
            identity,
            _lock: lock,
        })
    }

    /// The identity, if the worker has one.
    pub(crate) fn get(&self) -> Option<&NodeIdentity> {
        match self {
            IdentityStore::Memory(identity) | IdentityStore::Dir { identity, .. } => {
                identity.as_ref()
            }
        }
    }

    /// Keeps `identity` (or forgets the one kept, with `None`).
    pub(crate) fn set(&mut self, new: Option<NodeIdentity>) -> Result<(), StateDirError> {
        match self {
            IdentityStore::Memory(identity) => *identity = new,
            IdentityStore::Dir { dir, identity, .. } => {
                let path = dir.join(IDENTITY_FILE);
                match &new {
                    Some(id) => write(&path, id)?,
                    None => match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io(&path)(e)),
                    },
                }
                *identity = new;
            }
        }
        Ok(())
    }
}

fn first_version() -> u32 {
    1
}

fn parse(path: &Path, bytes: &[u8]) -> Result<NodeIdentity, StateDirError> {
    let corrupt = |why: String| StateDirError::Corrupt {
        path: path.to_path_buf(),
        why,
    };
    // The version first, so that a newer file is refused for what it is, whatever it holds.
    #[derive(Deserialize)]
    struct Version {
        #[serde(default = "first_version")]
        version: u32,
    }
    if let Ok(Version { version }) = serde_json::from_slice(bytes)
        && version > IDENTITY_VERSION
    {
        return Err(corrupt(format!(
            "it is in format {version}, newer than this escher-worker reads (format \
             {IDENTITY_VERSION}): run the release that wrote it, or a later one"
        )));
    }
    let stored: Stored = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if stored.node_id == 0 || stored.secret.is_empty() || stored.cluster.is_empty() {
        return Err(corrupt("a field is empty".into()));
    }
    Ok(NodeIdentity {
        node_id: NodeId(stored.node_id),
        secret: stored.secret,
        group: stored.cluster,
    })
}

/// Writes the identity to a temporary file (mode 0600), syncs it, and renames it into place.
fn write(path: &Path, id: &NodeIdentity) -> Result<(), StateDirError> {
    let stored = Stored {
        version: IDENTITY_VERSION,
        node_id: id.node_id.0,
        secret: id.secret.clone(),
        cluster: id.group.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&stored).map_err(|e| StateDirError::Corrupt {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let tmp = path.with_extension("json.tmp");
    // A leftover of an interrupted write goes (a link is removed, not followed), and the file
    // is created new (`O_EXCL`, which refuses a symbolic link too): the node's secret is never
    // written through a link.
    let _ = std::fs::remove_file(&tmp);
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        File::options()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?
    };
    file.write_all(&bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    Ok(())
}

/// The default state directory of a worker named `name` (`--name`):
/// `$ESCHER_HOME/workers/NAME`, so that workers with names of their own share a machine with no
/// further flag; `$ESCHER_HOME/worker` for an unnamed one. `ESCHER_HOME` defaults to
/// `$HOME/.escher`. Characters other than letters, digits, `.`, `-` and `_` in the name become
/// `_`.
pub fn default_state_dir(name: Option<&str>) -> Option<PathBuf> {
    let home = match std::env::var_os("ESCHER_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".escher"),
    };
    Some(match name {
        Some(name) if !name.is_empty() => {
            let safe: String = name
                .chars()
                .map(|c| match c {
                    'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
                    _ => '_',
                })
                .collect();
            // `.` and `..` would leave the directory.
            let safe = if safe.chars().all(|c| c == '.') {
                safe.replace('.', "_")
            } else {
                safe
            };
            home.join("workers").join(safe)
        }
        _ => home.join("worker"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> NodeIdentity {
        NodeIdentity {
            node_id: NodeId(4),
            secret: "abc".into(),
            group: "c1".into(),
        }
    }

    #[test]
    fn an_identity_survives_a_restart_and_the_directory_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = IdentityStore::open(dir.path()).unwrap();
        assert!(store.get().is_none());
        store.set(Some(identity())).unwrap();
        let err = IdentityStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, StateDirError::InUse(_)), "{err}");
        drop(store);
        let mut store = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(store.get(), Some(&identity()));
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join(IDENTITY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        store.set(None).unwrap();
        drop(store);
        assert!(IdentityStore::open(dir.path()).unwrap().get().is_none());
    }

    #[test]
    fn a_damaged_identity_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(IDENTITY_FILE), b"{not json").unwrap();
        let err = IdentityStore::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("remove it to join the cluster as a new node"),
            "{err}"
        );
    }

    #[test]
    fn an_identity_of_an_earlier_release_is_read_and_a_newer_one_refused() {
        // As releases before the version field wrote it.
        let dir = tempfile::tempdir().unwrap();
        let old = br#"{"node_id": 7, "secret": "s3cret", "cluster": "c1"}"#;
        std::fs::write(dir.path().join(IDENTITY_FILE), old).unwrap();
        let store = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(store.get().unwrap().node_id, NodeId(7));
        drop(store);

        let dir = tempfile::tempdir().unwrap();
        let newer =
            br#"{"version": 2, "node_id": 7, "secret": "s3cret", "cluster": "c1", "more": 1}"#;
        std::fs::write(dir.path().join(IDENTITY_FILE), newer).unwrap();
        let err = IdentityStore::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("format 2") && err.contains("format 1"),
            "{err}"
        );
    }
}
