//! How much the S3 store holds, for quota checks shared by replicas: the sum of a listing
//! (of the whole prefix, or of one owner's segment) reused for a short while, plus what this
//! replica is uploading right now. Eventually consistent across replicas by design: two
//! replicas uploading within one cache window each count only their own uploads in flight,
//! so together they can overshoot a quota by what they add in that window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a quota is about: the whole store, or one owner (`None`: no API key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    All,
    Owner(Option<String>),
}

#[derive(Default)]
struct State {
    /// A listing's sum and when it was taken.
    listed: HashMap<Scope, (Instant, u64)>,
    /// Bytes received by uploads in progress on this replica.
    inflight: HashMap<Scope, u64>,
}

#[derive(Clone)]
pub struct Usage {
    ttl: Duration,
    state: Arc<Mutex<State>>,
}

impl Usage {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            state: Arc::default(),
        }
    }

    /// The listed bytes of `scope`, if a fresh enough listing is at hand.
    pub fn cached(&self, scope: &Scope) -> Option<u64> {
        let state = self.state.lock().expect("usage lock");
        let (at, bytes) = state.listed.get(scope)?;
        (at.elapsed() < self.ttl).then_some(*bytes)
    }

    /// Records a fresh listing of `scope`.
    pub fn listed(&self, scope: Scope, bytes: u64) {
        let mut state = self.state.lock().expect("usage lock");
        state.listed.insert(scope, (Instant::now(), bytes));
    }

    /// Listed bytes plus uploads in flight here, of `scope` (listed must be fresh).
    pub fn total(&self, scope: &Scope, listed: u64) -> u64 {
        let state = self.state.lock().expect("usage lock");
        listed.saturating_add(state.inflight.get(scope).copied().unwrap_or(0))
    }

    /// Starts counting an upload into `scopes`; the counts go when the guard drops.
    pub fn upload(&self, scopes: Vec<Scope>) -> Upload {
        Upload {
            usage: self.clone(),
            scopes,
            bytes: 0,
        }
    }

    /// A file of `bytes` appeared or went (`grow` false): listings at hand follow at once,
    /// so this replica sees its own writes before the next listing.
    pub fn adjust(&self, scopes: &[Scope], bytes: u64, grow: bool) {
        let mut state = self.state.lock().expect("usage lock");
        for scope in scopes {
            if let Some((_, listed)) = state.listed.get_mut(scope) {
                *listed = if grow {
                    listed.saturating_add(bytes)
                } else {
                    listed.saturating_sub(bytes)
                };
            }
        }
    }
}

/// An upload in progress, counted in its scopes until dropped.
pub struct Upload {
    usage: Usage,
    scopes: Vec<Scope>,
    bytes: u64,
}

impl Upload {
    pub fn add(&mut self, n: u64) {
        self.bytes += n;
        let mut state = self.usage.state.lock().expect("usage lock");
        for scope in &self.scopes {
            *state.inflight.entry(scope.clone()).or_default() += n;
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        let mut state = self.usage.state.lock().expect("usage lock");
        for scope in &self.scopes {
            if let Some(n) = state.inflight.get_mut(scope) {
                *n = n.saturating_sub(self.bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_in_flight_count_until_they_end_and_listings_expire() {
        let usage = Usage::new(Duration::from_millis(50));
        let alice = Scope::Owner(Some("alice".into()));
        usage.listed(Scope::All, 100);
        usage.listed(alice.clone(), 10);
        let mut up = usage.upload(vec![Scope::All, alice.clone()]);
        up.add(5);
        assert_eq!(usage.total(&Scope::All, 100), 105);
        assert_eq!(usage.total(&alice, 10), 15);
        assert_eq!(usage.total(&Scope::Owner(None), 0), 0);
        drop(up);
        usage.adjust(&[Scope::All, alice.clone()], 5, true);
        assert_eq!(usage.cached(&Scope::All), Some(105));
        assert_eq!(usage.total(&alice, usage.cached(&alice).unwrap()), 15);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(usage.cached(&Scope::All), None);
    }
}
