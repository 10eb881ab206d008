//! Tokens in the replicated state (docs/DESIGN.md §10): what `escher token create` made, as hashes.
//!
//! The head never stores a token, only its SHA-256 hash; the token's id (what `token list`
//! shows and `token revoke` takes) is the hash's first 12 hex digits. A revoked token stays in
//! the table, marked, so a call with it is told "revoked" rather than "unknown", and so an id
//! is never reused. The bootstrap tokens of the access file are not here: every replica reads
//! them from the access file it shares with the group.
//!
//! Also here: the key that signs task credentials, named once by the first leader (with the
//! cluster id) so that every replica verifies the same credentials after a failover.

use std::collections::BTreeMap;

use escher_proto::types::{Grant, TokenInfo};
use serde::{Deserialize, Serialize};

use super::ClusterState;
use super::error::ApplyError;
use crate::scheduler::Millis;

/// The most tokens one cluster keeps (revoked ones included).
pub const MAX_TOKENS: usize = 10_000;

/// The SHA-256 of a token, as hex.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TokenHash(pub String);

impl TokenHash {
    /// The hash of `token`.
    pub fn of(token: &str) -> TokenHash {
        TokenHash(escher_proto::access::token_hash(token))
    }

    /// The token's id: the hash's first 12 hex digits.
    pub fn id(&self) -> String {
        self.0[..12.min(self.0.len())].to_string()
    }
}

/// One token the state knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Its hash.
    pub hash: TokenHash,
    /// What it allows.
    pub grant: Grant,
    /// Its creator's note.
    pub description: String,
    /// When it was created.
    pub created_at: Millis,
    /// When it was revoked.
    pub revoked_at: Option<Millis>,
}

impl TokenRecord {
    /// What `token list` shows.
    pub fn info(&self) -> TokenInfo {
        TokenInfo {
            id: self.hash.id(),
            grant: self.grant.clone(),
            description: self.description.clone(),
            created_at_ms: self.created_at,
            revoked_at_ms: self.revoked_at,
            bootstrap: false,
        }
    }
}

/// The token table, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    by_id: BTreeMap<String, TokenRecord>,
    /// Bumped by every change, so readers know when to look again.
    version: u64,
}

impl Tokens {
    /// Every token, by id.
    pub fn iter(&self) -> impl Iterator<Item = &TokenRecord> {
        self.by_id.values()
    }

    /// Changes with every create and revoke.
    pub fn version(&self) -> u64 {
        self.version
    }
}

impl ClusterState {
    /// The tokens created through the API.
    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    /// The key that signs task credentials, once the first leader named it.
    pub fn task_key(&self) -> Option<&str> {
        self.task_key.as_deref()
    }

    pub(crate) fn create_token(
        &mut self,
        hash: TokenHash,
        grant: Grant,
        description: String,
        now: Millis,
    ) -> Result<TokenInfo, ApplyError> {
        let id = hash.id();
        if self.tokens.by_id.contains_key(&id) {
            // 48 random bits colliding: the leader draws again on a refusal.
            return Err(ApplyError::TokenExists(id));
        }
        if self.tokens.by_id.len() >= MAX_TOKENS {
            return Err(ApplyError::TooManyTokens(MAX_TOKENS));
        }
        let record = TokenRecord {
            hash,
            grant,
            description,
            created_at: now,
            revoked_at: None,
        };
        let info = record.info();
        self.tokens.by_id.insert(id, record);
        self.tokens.version += 1;
        Ok(info)
    }

    pub(crate) fn revoke_token(&mut self, id: &str, now: Millis) -> Result<TokenInfo, ApplyError> {
        let record = self
            .tokens
            .by_id
            .get_mut(id)
            .ok_or_else(|| ApplyError::UnknownToken(id.to_string()))?;
        if record.revoked_at.is_none() {
            record.revoked_at = Some(now);
            self.tokens.version += 1;
        }
        Ok(record.info())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_is_hex_and_its_id_a_prefix() {
        let h = TokenHash::of("escher-admin-00");
        assert_eq!(h.0.len(), 64);
        assert!(h.0.starts_with(&h.id()));
        assert_ne!(h, TokenHash::of("escher-admin-01"));
    }
}
