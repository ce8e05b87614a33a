//! The tool calls in flight on this replica, by client and request id, so that a client's
//! `notifications/cancelled` (a POST of its own, answered apart from the call) can stop the
//! call it names.
//!
//! `/mcp` keeps no session: a client is known by the `Mcp-Session-Id` it was given at
//! `initialize` (a random token that names nothing stored) and the `Authorization` it sends.
//! Request ids are only unique within one client, so both are part of the key: a client can
//! cancel only its own calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use tokio_util::sync::CancellationToken;

/// The header a client echoes on every request after `initialize`.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// Who sent a request: its `Mcp-Session-Id` and its `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    session: String,
    authorization: Vec<u8>,
}

impl Client {
    /// The client of a request, if it names itself (no `Mcp-Session-Id`: it cannot cancel).
    pub fn of(headers: &HeaderMap) -> Option<Self> {
        let session = headers.get(SESSION_HEADER)?.to_str().ok()?;
        if session.is_empty() {
            return None;
        }
        Some(Self {
            session: session.to_owned(),
            authorization: headers
                .get(AUTHORIZATION)
                .map(|v| v.as_bytes().to_vec())
                .unwrap_or_default(),
        })
    }
}

type Key = (Client, String);

/// The calls in flight: each one's cancellation token.
#[derive(Default)]
pub struct InFlight {
    calls: Mutex<HashMap<Key, (u64, CancellationToken)>>,
    next: AtomicU64,
}

impl InFlight {
    /// Records a call; it is forgotten when the returned guard is dropped. `request_id` is the
    /// JSON text of the id (`7` and `"7"` are different ids).
    pub fn register(
        self: &Arc<Self>,
        client: Client,
        request_id: String,
        token: CancellationToken,
    ) -> Registration {
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        let key = (client, request_id);
        self.lock().insert(key.clone(), (serial, token));
        Registration {
            calls: self.clone(),
            key,
            serial,
        }
    }

    /// Cancels the call `request_id` of `client`; whether there was one.
    pub fn cancel(&self, client: Client, request_id: String) -> bool {
        match self.lock().get(&(client, request_id)) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (u64, CancellationToken)>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A call's entry in [`InFlight`], removed on drop (unless a later call of the same client
/// reused its id and replaced it).
pub struct Registration {
    calls: Arc<InFlight>,
    key: Key,
    serial: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut calls = self.calls.lock();
        if calls.get(&self.key).is_some_and(|(s, _)| *s == self.serial) {
            calls.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn client(session: &str, key: &str) -> Client {
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, HeaderValue::from_str(session).unwrap());
        headers.insert(AUTHORIZATION, HeaderValue::from_str(key).unwrap());
        Client::of(&headers).unwrap()
    }

    #[test]
    fn a_client_cancels_only_its_own_call_with_that_id() {
        let calls = Arc::new(InFlight::default());
        let mine = CancellationToken::new();
        let other_session = CancellationToken::new();
        let other_key = CancellationToken::new();
        let _a = calls.register(client("s1", "Bearer a"), "7".into(), mine.clone());
        let _b = calls.register(client("s2", "Bearer a"), "7".into(), other_session.clone());
        let _c = calls.register(client("s1", "Bearer b"), "7".into(), other_key.clone());
        // The id's JSON text: the string "7" is not the number 7.
        assert!(!calls.cancel(client("s1", "Bearer a"), "\"7\"".into()));
        assert!(calls.cancel(client("s1", "Bearer a"), "7".into()));
        assert!(mine.is_cancelled());
        assert!(!other_session.is_cancelled());
        assert!(!other_key.is_cancelled());
    }

    #[test]
    fn a_finished_call_is_forgotten_but_not_a_later_one_with_its_id() {
        let calls = Arc::new(InFlight::default());
        let first = calls.register(client("s", "k"), "1".into(), CancellationToken::new());
        let second_token = CancellationToken::new();
        let second = calls.register(client("s", "k"), "1".into(), second_token.clone());
        drop(first);
        assert!(calls.cancel(client("s", "k"), "1".into()));
        assert!(second_token.is_cancelled());
        drop(second);
        assert!(!calls.cancel(client("s", "k"), "1".into()));
    }

    #[test]
    fn a_request_without_a_session_id_names_no_client() {
        assert_eq!(Client::of(&HeaderMap::new()), None);
    }
}
