//! Dashboard sign-in without the token in the browser: login tickets and the sessions they
//! become.
//!
//! `escher dashboard` asks the head (gRPC `DashboardTicket`, authenticated with the CLI's own
//! token) for a ticket; the head answers with a random ticket, valid for [`TICKET_TTL`] and
//! once, and with the address it serves its dashboard on, which is where the CLI points the
//! browser. The page trades the ticket (`POST /api/login`) for a session: a random
//! `escher-dash-...` secret that the page sends as its bearer and that acts as the token that
//! asked for the ticket, for at most [`SESSION_TTL`] and never longer than that token lives
//! (each call is authenticated with it again). The token itself stays in the head: a program
//! that squats the port the user names, or relays to the dashboard, never receives it, and a
//! ticket redeemed through a relay (a `Host` that is not the dashboard's address) is refused.
//!
//! Pure bookkeeping with `now` passed in; the routes in `mod.rs` call it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a ticket may be redeemed.
pub(crate) const TICKET_TTL: Duration = Duration::from_secs(60);
/// How long a session lasts at most.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// What every session secret starts with, so that the dashboard tells it from a token.
pub(crate) const SESSION_PREFIX: &str = "escher-dash-";
/// The most unredeemed tickets (and live sessions) kept: past it the oldest go.
const MAX_KEPT: usize = 4096;

/// A secret handed out, and the token it stands for.
#[derive(Debug)]
struct Grant {
    token: String,
    expires: Instant,
}

/// The tickets and sessions of one dashboard.
#[derive(Debug)]
pub(crate) struct Logins {
    /// Where the dashboard is served: the only `Host` a ticket is redeemed under.
    address: SocketAddr,
    tickets: Mutex<HashMap<String, Grant>>,
    sessions: Mutex<HashMap<String, Grant>>,
}

/// 32 random bytes from the operating system's generator, as hex.
fn secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn keep(map: &mut HashMap<String, Grant>, now: Instant) {
    map.retain(|_, g| g.expires > now);
    while map.len() >= MAX_KEPT {
        let oldest = map
            .iter()
            .min_by_key(|(_, g)| g.expires)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(key) => map.remove(&key),
            None => break,
        };
    }
}

impl Logins {
    /// The logins of the dashboard served on `address`.
    pub(crate) fn new(address: SocketAddr) -> Logins {
        Logins {
            address,
            tickets: Mutex::default(),
            sessions: Mutex::default(),
        }
    }

    /// The address the dashboard is served on, as the CLI should give it to a browser (a
    /// wildcard bind is reached on loopback).
    pub(crate) fn address(&self) -> SocketAddr {
        let mut address = self.address;
        if address.ip().is_unspecified() {
            address.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        address
    }

    /// A new ticket for `token` (already authenticated), and how long it is valid.
    pub(crate) fn issue(&self, token: &str, now: Instant) -> (String, Duration) {
        let ticket = secret();
        let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        keep(&mut tickets, now);
        tickets.insert(
            ticket.clone(),
            Grant {
                token: token.to_string(),
                expires: now + TICKET_TTL,
            },
        );
        (ticket, TICKET_TTL)
    }

    /// Trades `ticket`, presented with `host` (the request's `Host` header), for a session
    /// secret. A ticket works once, before it expires, and only at the dashboard's address.
    pub(crate) fn redeem(
        &self,
        ticket: &str,
        host: Option<&str>,
        now: Instant,
    ) -> Result<(String, Duration), &'static str> {
        let address = self.address();
        let at_home =
            host.is_some_and(|h| h == address.to_string() || h == self.address.to_string());
        let grant = {
            let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
            // Taken whatever happens next: a ticket presented once is spent.
            tickets.remove(ticket)
        };
        let Some(grant) = grant else {
            return Err(
                "this login ticket is unknown or was already used: run `escher \
                        dashboard` again for a new one",
            );
        };
        if grant.expires <= now {
            return Err(
                "this login ticket expired (a ticket is valid for a minute): run \
                        `escher dashboard` again for a new one",
            );
        }
        if !at_home {
            return Err(
                "this login ticket is for the dashboard's own address, not the one \
                        it was presented at: open the address `escher dashboard` printed",
            );
        }
        let session = format!("{SESSION_PREFIX}{}", secret());
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        keep(&mut sessions, now);
        sessions.insert(
            session.clone(),
            Grant {
                token: grant.token,
                expires: now + SESSION_TTL,
            },
        );
        Ok((session, SESSION_TTL))
    }

    /// The token a live session acts as.
    pub(crate) fn token_of(&self, session: &str, now: Instant) -> Option<String> {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions
            .get(session)
            .filter(|g| g.expires > now)
            .map(|g| g.token.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logins() -> Logins {
        Logins::new("127.0.0.1:8265".parse().unwrap())
    }

    #[test]
    fn a_ticket_works_once_at_the_dashboards_address() {
        let l = logins();
        let now = Instant::now();
        let (ticket, ttl) = l.issue("admin-token", now);
        assert_eq!(ttl, TICKET_TTL);
        let (session, _) = l.redeem(&ticket, Some("127.0.0.1:8265"), now).unwrap();
        assert!(session.starts_with(SESSION_PREFIX));
        assert!(!session.contains("admin-token"));
        assert_eq!(l.token_of(&session, now).as_deref(), Some("admin-token"));
        let again = l.redeem(&ticket, Some("127.0.0.1:8265"), now).unwrap_err();
        assert!(again.contains("already used"), "{again}");
    }

    #[test]
    fn a_ticket_expires_and_a_relay_spends_it_for_nothing() {
        let l = logins();
        let now = Instant::now();
        let (ticket, _) = l.issue("t", now);
        let late = l.redeem(&ticket, Some("127.0.0.1:8265"), now + TICKET_TTL);
        assert!(late.unwrap_err().contains("expired"));
        let (ticket, _) = l.issue("t", now);
        let relayed = l.redeem(&ticket, Some("127.0.0.1:9999"), now).unwrap_err();
        assert!(relayed.contains("own address"), "{relayed}");
        // Spent: not even the real page may use it after a relay presented it.
        assert!(l.redeem(&ticket, Some("127.0.0.1:8265"), now).is_err());
    }

    #[test]
    fn a_session_ends() {
        let l = logins();
        let now = Instant::now();
        let (ticket, _) = l.issue("t", now);
        let (session, _) = l.redeem(&ticket, Some("127.0.0.1:8265"), now).unwrap();
        assert!(l.token_of(&session, now + SESSION_TTL).is_none());
        assert!(l.token_of("escher-dash-nope", now).is_none());
    }

    #[test]
    fn a_wildcard_bind_is_reached_on_loopback() {
        let l = Logins::new("0.0.0.0:8265".parse().unwrap());
        assert_eq!(l.address().to_string(), "127.0.0.1:8265");
        let (ticket, _) = l.issue("t", Instant::now());
        assert!(
            l.redeem(&ticket, Some("127.0.0.1:8265"), Instant::now())
                .is_ok()
        );
    }
}
