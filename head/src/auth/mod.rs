//! Who is calling, and may they (docs/DESIGN.md §10).
//!
//! Every call carries a bearer token (`authorization: Bearer <token>`). One tower layer in
//! front of every service ([`AuthLayer`], `layer.rs`) turns it into a [`Caller`] and checks
//! that the caller's role may call the method at all, by the method's path, before any
//! handler runs: a handler cannot forget the check, and a method missing from the table is
//! refused. Handlers then scope what a caller sees and touches by its namespace
//! ([`Caller::namespace`], [`Caller::sees`], [`Caller::may_change`]).
//!
//! Where a caller's identity comes from ([`Keys`]):
//! - the bootstrap `admin` and worker join tokens of the group's access file (every replica
//!   reads the same file, so they work on every replica, leader or not);
//! - tokens created with `escher token create`, replicated as hashes (`state/tokens.rs`) and
//!   published here by the owner whenever the table changes;
//! - task credentials: `escher-task-<task>-<attempt>-<mac>[-<namespace>]`, where the mac is an
//!   HMAC-SHA256 over the rest under the cluster's replicated task key. The leader signs one
//!   for every assignment; any replica verifies it without a lookup. A task acts in its
//!   namespace, and `NodeSpec::Local` means the node that runs it, and only while the attempt
//!   it was signed for runs: the layer asks the state at every call, through the
//!   [`RunningAttempts`] the runtime gives it (`attempts.rs`).
//!
//! Tokens are compared by their SHA-256 (a hash map lookup; the time it takes says nothing
//! about how much of a guess was right), task credentials with the constant-time comparison
//! of the `hmac` crate.

mod attempts;
mod layer;
mod revoke;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use escher_proto::access::AccessFile;
use escher_proto::types::{Grant, Namespace, ResourceName, Role, TaskId, TokenInfo};
use hmac::{Hmac, Mac as _};
use sha2::Sha256;
use tonic::Status;

use crate::state::{ClusterState, TokenHash};
pub use attempts::{Running, RunningAttempts, check_attempt};
pub(crate) use layer::authorize;
pub(crate) use layer::bearer;
pub use layer::{AuthLayer, CallObserver, Need, need};
pub use revoke::{GuardedStream, RECHECK, Revalidation};

/// The prefix of a task credential.
const TASK_PREFIX: &str = "escher-task-";

/// Who is calling, as the token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Everything.
    Admin,
    /// One namespace's tasks and resources.
    App(Namespace),
    /// Read-only status.
    Reader,
    /// A worker joining (the join token).
    Worker,
    /// Another replica of this head's group (the peer token): the `Raft` service, and nothing
    /// else.
    Peer,
    /// A running task, by its credential.
    Task {
        /// The task.
        task: TaskId,
        /// Its attempt.
        attempt: u32,
        /// The namespace it was submitted in; `None` for a task submitted without one (by an
        /// admin), which acts with its submitter's reach.
        namespace: Option<Namespace>,
    },
}

impl Caller {
    fn from_grant(grant: &Grant) -> Caller {
        match (grant.role, &grant.namespace) {
            (Role::Admin, _) => Caller::Admin,
            (Role::App, Some(ns)) => Caller::App(ns.clone()),
            (Role::App, None) => Caller::Reader,
            (Role::Reader, _) => Caller::Reader,
            (Role::Worker, _) => Caller::Worker,
        }
    }

    /// What the role is called in messages.
    pub fn describe(&self) -> String {
        match self {
            Caller::Admin => "an admin token".into(),
            Caller::App(ns) => format!("an app token of namespace {ns}"),
            Caller::Reader => "a reader token".into(),
            Caller::Worker => "a worker join token".into(),
            Caller::Peer => "the replicas' peer token".into(),
            Caller::Task { task, .. } => format!("the credential of task {task}"),
        }
    }

    /// The namespace a request of this caller acts in: an app's (or a namespaced task's) own,
    /// whatever the request says (a different one is refused); an admin's as requested.
    pub fn namespace(&self, requested: Option<Namespace>) -> Result<Option<Namespace>, Status> {
        let own = match self {
            Caller::Admin
            | Caller::Task {
                namespace: None, ..
            } => return Ok(requested),
            Caller::App(ns)
            | Caller::Task {
                namespace: Some(ns),
                ..
            } => ns,
            Caller::Reader | Caller::Worker | Caller::Peer => {
                return Err(Status::permission_denied(format!(
                    "{} cannot act in a namespace",
                    self.describe()
                )));
            }
        };
        match requested {
            Some(other) if other != *own => Err(Status::permission_denied(format!(
                "{} acts in namespace {own} only, not in {other}",
                self.describe()
            ))),
            _ => Ok(Some(own.clone())),
        }
    }

    /// Whether this caller may see (wait on, read, cancel) a task of namespace `task_ns`.
    pub fn sees(&self, task_ns: Option<&str>) -> bool {
        match self {
            Caller::Admin
            | Caller::Task {
                namespace: None, ..
            } => true,
            Caller::App(ns)
            | Caller::Task {
                namespace: Some(ns),
                ..
            } => task_ns == Some(ns.as_str()),
            Caller::Reader | Caller::Worker | Caller::Peer => false,
        }
    }

    /// Whether this caller may create, resize or delete resource `name` (as named in the
    /// request: an unqualified name is qualified with the caller's namespace). Physical names
    /// are refused later, for everyone, by the state.
    pub fn may_change(&self, name: &ResourceName) -> bool {
        match self {
            Caller::Admin => true,
            Caller::App(ns) => name.writable_in(Some(ns)),
            Caller::Task { namespace, .. } => name.writable_in(namespace.as_ref()),
            Caller::Reader | Caller::Worker | Caller::Peer => false,
        }
    }

    /// The namespace whose resources a cluster status shows this caller; `None` shows all.
    pub fn status_scope(&self) -> Option<&Namespace> {
        match self {
            Caller::App(ns)
            | Caller::Task {
                namespace: Some(ns),
                ..
            } => Some(ns),
            _ => None,
        }
    }

    /// Whether this caller sees every namespace's tasks.
    pub fn sees_everything(&self) -> bool {
        matches!(
            self,
            Caller::Admin
                | Caller::Task {
                    namespace: None,
                    ..
                }
        )
    }

    /// The running task this caller speaks for.
    pub fn task(&self) -> Option<(TaskId, u32)> {
        match self {
            Caller::Task { task, attempt, .. } => Some((*task, *attempt)),
            _ => None,
        }
    }
}

/// Whose idempotency keys a call's are: a digest of the credential it carries. A request key
/// names a client chosen by the caller; the head scopes it to the credential, so that a key
/// another caller sends (guessed, or copied) is another key, never that caller's reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyScope([u8; 16]);

impl KeyScope {
    /// The scope of calls carrying `token`.
    pub fn of(token: &str) -> KeyScope {
        use sha2::Digest as _;
        let digest = Sha256::new()
            .chain_update(b"escher idempotency scope\0")
            .chain_update(token.as_bytes())
            .finalize();
        let mut scope = [0; 16];
        scope.copy_from_slice(&digest[..16]);
        KeyScope(scope)
    }

    /// The client id of `client`'s keys within this scope (the same for the same credential
    /// and client on every replica).
    pub fn client(&self, client: u64) -> u64 {
        use sha2::Digest as _;
        let digest = Sha256::new()
            .chain_update(self.0)
            .chain_update(client.to_le_bytes())
            .finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("eight bytes"))
    }
}

/// The key scope of a request, as the auth layer put it there (the default scope for a head
/// that checks no tokens).
pub fn key_scope<T>(request: &tonic::Request<T>) -> KeyScope {
    request
        .extensions()
        .get::<KeyScope>()
        .copied()
        .unwrap_or_default()
}

/// The caller of a request, as the auth layer put it there.
pub fn caller<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::internal("the request passed no authentication layer"))
}

/// The replicated part of what identifies callers, as last published.
#[derive(Debug, Default)]
struct Published {
    /// Tokens by hash: what they grant and, if revoked, when.
    tokens: HashMap<TokenHash, (Grant, Option<u64>)>,
    task_key: Option<Vec<u8>>,
    /// An HMAC keyed with `task_key` once, cloned for each credential.
    task_mac: Option<Hmac<Sha256>>,
    version: Option<u64>,
}

/// Everything that turns a token into a [`Caller`]: shared by the auth layer (every call) and
/// the owner (which publishes the replicated tokens and signs task credentials).
#[derive(Debug)]
pub struct Keys {
    bootstrap: HashMap<TokenHash, Grant>,
    /// The peer token replicas present to each other, and its hash.
    peer: (String, TokenHash),
    published: RwLock<Published>,
}

impl Keys {
    /// The keys of a head whose group shares `access`.
    pub fn new(access: &AccessFile) -> Arc<Keys> {
        let mut bootstrap = HashMap::new();
        bootstrap.insert(TokenHash::of(&access.admin_token), Grant::admin());
        let worker = Grant::new(Role::Worker, None).expect("a worker grant");
        bootstrap.insert(TokenHash::of(&access.worker_token), worker);
        let (peer, derived) = access.peer_token();
        if derived {
            tracing::warn!(
                "the access file has no peer token (it was written by an earlier release): the \
                 replicas derive theirs from the admin token; give the group a fresh access file \
                 so that holding the admin token does not make one a replica"
            );
        }
        let peer_hash = TokenHash::of(&peer);
        Arc::new(Keys {
            bootstrap,
            peer: (peer, peer_hash),
            published: RwLock::default(),
        })
    }

    /// The token replicas present to each other: the group's peer token, which no other call
    /// accepts.
    pub fn peer_token(&self) -> &str {
        &self.peer.0
    }

    /// Takes the replicated tokens and the task key from `state` if they changed.
    pub fn publish(&self, state: &ClusterState) {
        let version = state.tokens().version();
        let key = state.task_key().map(str::as_bytes);
        {
            let current = self.published.read().unwrap_or_else(|e| e.into_inner());
            if current.version == Some(version) && current.task_key.as_deref() == key {
                return;
            }
        }
        let tokens = state
            .tokens()
            .iter()
            .map(|r| (r.hash.clone(), (r.grant.clone(), r.revoked_at)))
            .collect();
        let mut current = self.published.write().unwrap_or_else(|e| e.into_inner());
        *current = Published {
            tokens,
            task_key: key.map(<[u8]>::to_vec),
            task_mac: key.map(|k| Hmac::new_from_slice(k).expect("HMAC takes any key length")),
            version: Some(version),
        };
    }

    /// The dashboard's proof ([`escher_proto::access::dashboard_proof`]) that this head knows
    /// the live (not revoked) token with id `id`; `None` for a token it does not know.
    pub fn dashboard_proof(&self, id: &str, nonce: &str) -> Option<String> {
        let known = |hash: &TokenHash| hash.id() == id;
        let hash = self
            .bootstrap
            .keys()
            .find(|h| known(h))
            .cloned()
            .or_else(|| {
                let published = self.published.read().unwrap_or_else(|e| e.into_inner());
                published
                    .tokens
                    .iter()
                    .find(|(h, (_, revoked))| known(h) && revoked.is_none())
                    .map(|(h, _)| h.clone())
            })?;
        Some(escher_proto::access::dashboard_proof(&hash.0, nonce))
    }

    /// The version of the replicated tokens last published: it changes whenever a token is
    /// created or revoked, so that a stream re-checks its token only then.
    pub fn tokens_version(&self) -> Option<u64> {
        let published = self.published.read().unwrap_or_else(|e| e.into_inner());
        published.version
    }

    /// The bootstrap tokens, as `token list` shows them.
    pub fn bootstrap_infos(&self) -> Vec<TokenInfo> {
        let mut infos: Vec<TokenInfo> = self
            .bootstrap
            .iter()
            .map(|(hash, grant)| TokenInfo {
                id: hash.id(),
                grant: grant.clone(),
                description: format!("the access file's {} token", grant.role),
                created_at_ms: 0,
                revoked_at_ms: None,
                bootstrap: true,
            })
            .collect();
        infos.sort_by_key(|i| i.grant.role);
        infos
    }

    /// Who `token` is.
    pub fn authenticate(&self, token: &str) -> Result<Caller, Status> {
        if let Some(rest) = token.strip_prefix(TASK_PREFIX) {
            return self.task_caller(rest);
        }
        let hash = TokenHash::of(token);
        if hash == self.peer.1 {
            return Ok(Caller::Peer);
        }
        if let Some(grant) = self.bootstrap.get(&hash) {
            return Ok(Caller::from_grant(grant));
        }
        let published = self.published.read().unwrap_or_else(|e| e.into_inner());
        match published.tokens.get(&hash) {
            Some((grant, None)) => Ok(Caller::from_grant(grant)),
            Some((_, Some(at))) => Err(Status::unauthenticated(format!(
                "token {} was revoked at {}; ask an admin for a new one (escher token create)",
                hash.id(),
                escher_proto::types::utc_seconds(*at)
            ))),
            None => Err(Status::unauthenticated(format!(
                "this head does not know the token with id {} (it may belong to another \
                 cluster, or come from an old access file); use the access file the head wrote \
                 ($ESCHER_HOME/access.json on its machine) or a token from `escher token create`",
                hash.id()
            ))),
        }
    }

    fn mac(&self) -> Option<Hmac<Sha256>> {
        let published = self.published.read().unwrap_or_else(|e| e.into_inner());
        published.task_mac.clone()
    }

    /// The credential of `task`'s attempt `attempt`, in namespace `ns`; `None` until the
    /// cluster's task key is known.
    pub fn sign_task(&self, task: TaskId, attempt: u32, ns: Option<&str>) -> Option<String> {
        let mut mac = self.mac()?;
        sign_text(&mut mac, task.0, attempt, ns);
        let mut code = [0u8; 64];
        // 32 bytes of MAC are 64 hex digits: the buffer is exactly large enough.
        let _ = hex::encode_to_slice(mac.finalize().into_bytes(), &mut code);
        let code = std::str::from_utf8(&code).unwrap_or_default();
        // This runs for every assignment: pieces pushed into one string, no formatting.
        let (mut task_digits, mut attempt_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
        let (task_text, attempt_text) =
            (task_digits.format(task.0), attempt_digits.format(attempt));
        let ns_len = ns.map_or(0, |ns| ns.len() + 1);
        let mut token = String::with_capacity(
            TASK_PREFIX.len() + task_text.len() + attempt_text.len() + code.len() + 2 + ns_len,
        );
        for piece in [TASK_PREFIX, task_text, "-", attempt_text, "-", code] {
            token.push_str(piece);
        }
        if let Some(ns) = ns {
            token.push('-');
            token.push_str(ns);
        }
        Some(token)
    }

    fn task_caller(&self, rest: &str) -> Result<Caller, Status> {
        let bad = || {
            Status::unauthenticated(
                "this task credential is not valid for this cluster (ESCHER_TASK_TOKEN is set \
                 by the worker for the task it runs; outside a task, unset it)",
            )
        };
        let mut parts = rest.splitn(4, '-');
        let task: u64 = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let attempt: u32 = parts.next().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
        let code = parts.next().and_then(from_hex).ok_or_else(bad)?;
        let ns = parts.next();
        let namespace = ns.map(Namespace::new).transpose().map_err(|_| bad())?;
        let mut mac = self.mac().ok_or_else(bad)?;
        sign_text(&mut mac, task, attempt, ns);
        mac.verify_slice(&code).map_err(|_| bad())?;
        Ok(Caller::Task {
            task: TaskId(task),
            attempt,
            namespace,
        })
    }
}

/// Feeds what a task credential signs, `task:<task>:<attempt>:<namespace>`, to `mac`.
fn sign_text(mac: &mut Hmac<Sha256>, task: u64, attempt: u32, ns: Option<&str>) {
    let (mut task_digits, mut attempt_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (task, attempt) = (task_digits.format(task), attempt_digits.format(attempt));
    for piece in ["task:", task, ":", attempt, ":", ns.unwrap_or("")] {
        mac.update(piece.as_bytes());
    }
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    hex::decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Entry, StateConfig};

    fn keys_with_state() -> (Arc<Keys>, AccessFile, ClusterState) {
        let access = AccessFile::generate(vec![]);
        let keys = Keys::new(&access);
        let mut state = ClusterState::new(StateConfig::default());
        let init = Command::Init {
            cluster_id: "c".into(),
            task_key: "k".repeat(64),
        };
        state.apply(Entry::new(1, init)).unwrap();
        keys.publish(&state);
        (keys, access, state)
    }

    #[test]
    fn bootstrap_tokens_created_and_revoked_ones() {
        let (keys, access, mut state) = keys_with_state();
        assert_eq!(
            keys.authenticate(&access.admin_token).unwrap(),
            Caller::Admin
        );
        assert_eq!(
            keys.authenticate(&access.worker_token).unwrap(),
            Caller::Worker
        );
        let err = keys.authenticate("escher-admin-nope").unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);

        let token = escher_proto::access::new_token("app");
        let ns: Namespace = "team".parse().unwrap();
        let grant = Grant::new(Role::App, Some(ns.clone())).unwrap();
        let create = Command::CreateToken {
            hash: TokenHash::of(&token),
            grant,
            description: String::new(),
        };
        state.apply(Entry::new(2, create)).unwrap();
        keys.publish(&state);
        assert_eq!(keys.authenticate(&token).unwrap(), Caller::App(ns));
        let id = TokenHash::of(&token).id();
        state
            .apply(Entry::new(3, Command::RevokeToken { id }))
            .unwrap();
        keys.publish(&state);
        let err = keys.authenticate(&token).unwrap_err();
        assert!(err.message().contains("revoked"), "{}", err.message());
    }

    #[test]
    fn task_credentials_verify_and_cannot_be_altered() {
        let (keys, _, _) = keys_with_state();
        let token = keys.sign_task(TaskId(7), 2, Some("team-a")).unwrap();
        let caller = keys.authenticate(&token).unwrap();
        assert_eq!(caller.task(), Some((TaskId(7), 2)));
        assert_eq!(caller.status_scope().map(Namespace::as_str), Some("team-a"));
        // Another namespace, task or attempt with the same mac is refused.
        for forged in [
            token.replace("-team-a", "-team-b"),
            token.replacen("-7-", "-8-", 1),
            token.replacen("-2-", "-3-", 1),
            token.trim_end_matches("-team-a").to_string(),
        ] {
            assert!(keys.authenticate(&forged).is_err(), "{forged}");
        }
        // The signed text and the token's form are fixed: heads of different versions in one
        // group, and tasks running across a failover, must agree on them.
        let mut mac = Hmac::<Sha256>::new_from_slice("k".repeat(64).as_bytes()).unwrap();
        mac.update(b"task:7:2:team-a");
        let code = hex::encode(mac.finalize().into_bytes());
        assert_eq!(token, format!("escher-task-7-2-{code}-team-a"));
        let plain = keys.sign_task(TaskId(9), 1, None).unwrap();
        assert!(matches!(
            keys.authenticate(&plain).unwrap(),
            Caller::Task {
                namespace: None,
                ..
            }
        ));
    }

    #[test]
    fn namespaces_come_from_the_token() {
        let a = Caller::App("a".parse().unwrap());
        assert_eq!(
            a.namespace(None).unwrap().unwrap().as_str(),
            "a",
            "an app's requests act in its namespace"
        );
        assert!(a.namespace(Some("b".parse().unwrap())).is_err());
        assert!(a.sees(Some("a")) && !a.sees(Some("b")) && !a.sees(None));
        assert!(a.may_change(&"x".parse().unwrap()));
        assert!(a.may_change(&"a/x".parse().unwrap()));
        assert!(!a.may_change(&"b/x".parse().unwrap()));
        assert!(Caller::Admin.sees(Some("b")) && Caller::Admin.sees(None));
        assert!(Caller::Reader.namespace(None).is_err());
    }
}
