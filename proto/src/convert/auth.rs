//! Conversions of the token calls: `CreateToken`, `ListTokens`, `RevokeToken`.

use super::cluster::{namespace, namespace_to_wire};
use super::{At as _, ConvertError, Problem, check_len, check_printable, convert_required};
use crate::types::{CreateTokenRequest, CreatedToken, Grant, Role, TokenInfo};
use crate::wire;

/// The longest token description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

impl From<Role> for wire::Role {
    fn from(r: Role) -> Self {
        match r {
            Role::Admin => wire::Role::Admin,
            Role::App => wire::Role::App,
            Role::Reader => wire::Role::Reader,
            Role::Worker => wire::Role::Worker,
        }
    }
}

fn role(raw: i32) -> Result<Role, ConvertError> {
    let unknown = || {
        ConvertError::new(
            "role",
            Problem::UnknownEnum {
                value: raw,
                expected: "ROLE_ADMIN, ROLE_APP, ROLE_READER, ROLE_WORKER",
            },
        )
    };
    match wire::Role::try_from(raw).map_err(|_| unknown())? {
        wire::Role::Admin => Ok(Role::Admin),
        wire::Role::App => Ok(Role::App),
        wire::Role::Reader => Ok(Role::Reader),
        wire::Role::Worker => Ok(Role::Worker),
        wire::Role::Unspecified => Err(unknown()),
    }
}

fn grant(raw_role: i32, ns: String) -> Result<Grant, ConvertError> {
    let role = role(raw_role)?;
    let namespace = namespace(ns)?;
    Grant::new(role, namespace).map_err(|e| ConvertError::new("namespace", Problem::Invalid(e)))
}

impl From<CreateTokenRequest> for wire::CreateTokenRequest {
    fn from(r: CreateTokenRequest) -> Self {
        wire::CreateTokenRequest {
            role: wire::Role::from(r.grant.role).into(),
            namespace: namespace_to_wire(r.grant.namespace),
            description: r.description,
            key: None,
        }
    }
}

impl TryFrom<wire::CreateTokenRequest> for CreateTokenRequest {
    type Error = ConvertError;
    fn try_from(w: wire::CreateTokenRequest) -> Result<Self, ConvertError> {
        check_len("description", &w.description, MAX_DESCRIPTION_BYTES)?;
        check_printable("description", &w.description)?;
        super::check_no_nul("description", &w.description)?;
        Ok(CreateTokenRequest {
            grant: grant(w.role, w.namespace)?,
            description: w.description,
        })
    }
}

impl From<TokenInfo> for wire::TokenInfo {
    fn from(t: TokenInfo) -> Self {
        wire::TokenInfo {
            id: t.id,
            role: wire::Role::from(t.grant.role).into(),
            namespace: namespace_to_wire(t.grant.namespace),
            description: t.description,
            created_at_ms: t.created_at_ms,
            revoked_at_ms: t.revoked_at_ms,
            bootstrap: t.bootstrap,
        }
    }
}

impl TryFrom<wire::TokenInfo> for TokenInfo {
    type Error = ConvertError;
    fn try_from(w: wire::TokenInfo) -> Result<Self, ConvertError> {
        Ok(TokenInfo {
            id: w.id,
            grant: grant(w.role, w.namespace)?,
            description: w.description,
            created_at_ms: w.created_at_ms,
            revoked_at_ms: w.revoked_at_ms,
            bootstrap: w.bootstrap,
        })
    }
}

impl From<CreatedToken> for wire::CreatedToken {
    fn from(t: CreatedToken) -> Self {
        wire::CreatedToken {
            token: t.token,
            info: Some(t.info.into()),
        }
    }
}

impl TryFrom<wire::CreatedToken> for CreatedToken {
    type Error = ConvertError;
    fn try_from(w: wire::CreatedToken) -> Result<Self, ConvertError> {
        Ok(CreatedToken {
            token: w.token,
            info: convert_required(w.info, "info")?,
        })
    }
}

/// The tokens of a `ListTokens` reply.
pub fn tokens_from_wire(w: wire::ListTokensReply) -> Result<Vec<TokenInfo>, ConvertError> {
    w.tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| TokenInfo::try_from(t).at(&format!("tokens[{i}]")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testutil::round_trip;

    #[test]
    fn token_messages_round_trip_and_unspecified_roles_are_refused() {
        let grant = Grant::new(Role::App, Some("team".parse().unwrap())).unwrap();
        let req = CreateTokenRequest {
            grant: grant.clone(),
            description: "ci".into(),
        };
        round_trip::<_, wire::CreateTokenRequest>(req);
        let info = TokenInfo {
            id: "0123456789ab".into(),
            grant,
            description: String::new(),
            created_at_ms: 5,
            revoked_at_ms: Some(6),
            bootstrap: false,
        };
        round_trip::<_, wire::TokenInfo>(info);
        let bad = wire::CreateTokenRequest {
            role: 0,
            ..Default::default()
        };
        let err = CreateTokenRequest::try_from(bad).unwrap_err().to_string();
        assert!(err.starts_with("role: unknown value 0"), "{err}");
        let app_without_ns = wire::CreateTokenRequest {
            role: wire::Role::App.into(),
            ..Default::default()
        };
        let err = CreateTokenRequest::try_from(app_without_ns)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bound to a namespace"), "{err}");
    }
}
