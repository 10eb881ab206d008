//! Who may do what (docs/DESIGN.md §10): the roles a token carries and what the token API says
//! about them.
//!
//! A *token* is a bearer secret sent with every call (`authorization: Bearer <token>`). The head
//! keeps only its SHA-256 hash; a token is shown once, when it is created. Four roles:
//!
//! - `admin`: everything: workers, draining, MIG, heads, tokens, every namespace;
//! - `app`: bound to one namespace: submits, sees, waits on, reads the logs of and cancels only
//!   its own tasks; creates, resizes and deletes only resources of its namespace; *requests*
//!   any resource (by its qualified name); sees physical resources, shared ones (unqualified,
//!   or in the [`SHARED_NAMESPACE`] an admin fills for every app) and its own namespace's;
//! - `reader`: read-only cluster status, GPUs and heads;
//! - `worker`: joins workers to the cluster (the join token), nothing else.
//!
//! A running task acts with a fifth, internal identity: a task-scoped credential the head
//! signs and the worker hands to the task (`ESCHER_TASK_TOKEN`); it acts in its task's
//! namespace, and `NodeSpec::Local` means that task's node.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Namespace, TypeError};
use crate::types::retention::utc_seconds;

/// The namespace whose resources every app sees and may request, and only admins change (a
/// licence pool, an ESL's shared slots): `shared/NAME`. No app token is bound to it.
pub const SHARED_NAMESPACE: &str = "shared";

/// A token's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    /// Everything.
    Admin,
    /// One namespace's tasks and resources.
    App,
    /// Read-only status.
    Reader,
    /// Joins workers.
    Worker,
}

impl Role {
    /// Every role, in the order the CLI lists them.
    pub const ALL: [Role; 4] = [Role::Admin, Role::App, Role::Reader, Role::Worker];

    /// The role's name as the CLI and the API spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::App => "app",
            Role::Reader => "reader",
            Role::Worker => "worker",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = TypeError;
    fn from_str(s: &str) -> Result<Role, TypeError> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| TypeError::Invalid {
                what: "role",
                value: s.to_string(),
                why: "expected one of admin, app, reader, worker",
            })
    }
}

/// What a token allows: a role, and for `app` its namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grant {
    /// The role.
    pub role: Role,
    /// The namespace of an `app` token; `None` for every other role.
    pub namespace: Option<Namespace>,
}

impl Grant {
    /// A grant, checked: an `app` grant needs a namespace and no other role takes one.
    pub fn new(role: Role, namespace: Option<Namespace>) -> Result<Grant, TypeError> {
        match (role, &namespace) {
            (Role::App, None) => Err(TypeError::Invalid {
                what: "token",
                value: "app".into(),
                why: "an app token is bound to a namespace: give one (--namespace NAME)",
            }),
            (Role::App, Some(ns)) if ns.as_str() == SHARED_NAMESPACE => Err(TypeError::Invalid {
                what: "token",
                value: ns.to_string(),
                why: "the `shared` namespace belongs to admins: every app reads it, none owns it",
            }),
            (Role::App, Some(_)) | (_, None) => Ok(Grant { role, namespace }),
            (_, Some(ns)) => Err(TypeError::Invalid {
                what: "token",
                value: ns.to_string(),
                why: "only app tokens are bound to a namespace",
            }),
        }
    }

    /// The admin grant.
    pub fn admin() -> Grant {
        Grant {
            role: Role::Admin,
            namespace: None,
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} (namespace {ns})", self.role),
            None => write!(f, "{}", self.role),
        }
    }
}

/// What the head says about one token (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// The token's id: the first 12 hex digits of its hash; `escher token revoke ID` takes it.
    pub id: String,
    /// What it allows.
    pub grant: Grant,
    /// What its creator wrote about it.
    pub description: String,
    /// When it was created (ms since the epoch).
    pub created_at_ms: u64,
    /// When it was revoked, if it was.
    pub revoked_at_ms: Option<u64>,
    /// Whether it comes from the head's access file (the bootstrap admin and join tokens),
    /// rather than from `escher token create`.
    pub bootstrap: bool,
}

impl fmt::Display for TokenInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.id, self.grant)?;
        if let Some(at) = self.revoked_at_ms {
            write!(f, ", revoked {}", utc_seconds(at))?;
        }
        Ok(())
    }
}

/// `escher token create`: a new token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTokenRequest {
    /// What it allows.
    pub grant: Grant,
    /// A note for `token list` (who it is for).
    pub description: String,
}

/// A token just created: the secret, shown this once, and what the head keeps about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedToken {
    /// The bearer token.
    pub token: String,
    /// What `token list` will show.
    pub info: TokenInfo,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_and_grants_check_their_namespace() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!("root".parse::<Role>().is_err());
        let ns = Namespace::new("team-a").unwrap();
        assert!(Grant::new(Role::App, None).is_err());
        assert!(Grant::new(Role::Admin, Some(ns.clone())).is_err());
        let app = Grant::new(Role::App, Some(ns)).unwrap();
        assert_eq!(app.to_string(), "app (namespace team-a)");
    }
}
