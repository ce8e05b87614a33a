//! How much the S3 store holds, for quota checks shared by replicas: the files and charges
//! of a listing (of the whole prefix, or of one owner's segment) reused for a short while,
//! plus what this replica is uploading right now (each upload one file, charged as much as
//! it has received). Eventually consistent across replicas by design: two
//! replicas uploading within one cache window each count only their own uploads in flight,
//! so together they can overshoot a quota by what they add in that window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::files::{Charge, Held};

/// What a quota is about: the whole store, or one owner (`None`: no API key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    All,
    Owner(Option<String>),
}

#[derive(Default)]
struct State {
    /// A listing's count and when it was taken.
    listed: HashMap<Scope, (Instant, Held)>,
    /// Every owner's charge in the last listing of the whole store (who holds most).
    holders: HashMap<Option<String>, u64>,
    /// Uploads in progress on this replica.
    inflight: HashMap<Scope, Held>,
}

#[derive(Clone)]
pub struct Usage {
    ttl: Duration,
    charge: Charge,
    state: Arc<Mutex<State>>,
}

fn grow(held: &mut Held, files: u64, charged: u64) {
    held.files = held.files.saturating_add(files);
    held.charged = held.charged.saturating_add(charged);
}

fn shrink(held: &mut Held, files: u64, charged: u64) {
    held.files = held.files.saturating_sub(files);
    held.charged = held.charged.saturating_sub(charged);
}

impl Usage {
    pub fn new(ttl: Duration, charge: Charge) -> Self {
        Self {
            ttl,
            charge,
            state: Arc::default(),
        }
    }

    /// What `scope` held at a fresh enough listing, if one is at hand.
    pub fn cached(&self, scope: &Scope) -> Option<Held> {
        let state = self.state.lock().expect("usage lock");
        let (at, held) = state.listed.get(scope)?;
        (at.elapsed() < self.ttl).then_some(*held)
    }

    /// Records a fresh listing of `scope`.
    pub fn listed(&self, scope: Scope, held: Held) {
        let mut state = self.state.lock().expect("usage lock");
        state.listed.insert(scope, (Instant::now(), held));
    }

    /// Records every owner's charge, from a listing of the whole store.
    pub fn listed_holders(&self, holders: HashMap<Option<String>, u64>) {
        self.state.lock().expect("usage lock").holders = holders;
    }

    /// Every owner's charge at the last listing of the whole store.
    pub fn holders(&self) -> Vec<(Option<String>, u64)> {
        let state = self.state.lock().expect("usage lock");
        state.holders.iter().map(|(o, c)| (o.clone(), *c)).collect()
    }

    /// Listed plus uploads in flight here, of `scope` (listed must be fresh).
    pub fn total(&self, scope: &Scope, listed: Held) -> Held {
        let state = self.state.lock().expect("usage lock");
        let inflight = state.inflight.get(scope).copied().unwrap_or_default();
        let mut total = listed;
        grow(&mut total, inflight.files, inflight.charged);
        total
    }

    /// Starts counting an upload into `scopes` (one file, charged for nothing received
    /// yet); the counts go when the guard drops.
    pub fn upload(&self, scopes: Vec<Scope>) -> Upload {
        let charged = self.charge.of(0);
        {
            let mut state = self.state.lock().expect("usage lock");
            for scope in &scopes {
                grow(state.inflight.entry(scope.clone()).or_default(), 1, charged);
            }
        }
        Upload {
            usage: self.clone(),
            scopes,
            bytes: 0,
            charged,
        }
    }

    /// A file of `bytes` appeared or went (`grow` false): listings at hand follow at once,
    /// so this replica sees its own writes before the next listing.
    pub fn adjust(&self, scopes: &[Scope], bytes: u64, grows: bool) {
        let charged = self.charge.of(bytes);
        let mut state = self.state.lock().expect("usage lock");
        for scope in scopes {
            if let Some((_, listed)) = state.listed.get_mut(scope) {
                if grows {
                    grow(listed, 1, charged);
                } else {
                    shrink(listed, 1, charged);
                }
            }
            if let Scope::Owner(owner) = scope {
                let held = state.holders.entry(owner.clone()).or_default();
                *held = if grows {
                    held.saturating_add(charged)
                } else {
                    held.saturating_sub(charged)
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
    /// What the upload is charged now (for `bytes`).
    charged: u64,
}

impl Upload {
    pub fn add(&mut self, n: u64) {
        self.bytes += n;
        let charged = self.usage.charge.of(self.bytes);
        let more = charged.saturating_sub(self.charged);
        self.charged = charged;
        let mut state = self.usage.state.lock().expect("usage lock");
        for scope in &self.scopes {
            grow(state.inflight.entry(scope.clone()).or_default(), 0, more);
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        let mut state = self.usage.state.lock().expect("usage lock");
        for scope in &self.scopes {
            if let Some(held) = state.inflight.get_mut(scope) {
                shrink(held, 1, self.charged);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(files: u64, charged: u64) -> Held {
        Held { files, charged }
    }

    #[test]
    fn uploads_in_flight_count_until_they_end_and_listings_expire() {
        let usage = Usage::new(Duration::from_millis(50), Charge::BYTES);
        let alice = Scope::Owner(Some("alice".into()));
        usage.listed(Scope::All, held(3, 100));
        usage.listed(alice.clone(), held(1, 10));
        let mut up = usage.upload(vec![Scope::All, alice.clone()]);
        up.add(5);
        assert_eq!(usage.total(&Scope::All, held(3, 100)), held(4, 105));
        assert_eq!(usage.total(&alice, held(1, 10)), held(2, 15));
        assert_eq!(
            usage.total(&Scope::Owner(None), Held::default()),
            Held::default()
        );
        drop(up);
        usage.adjust(&[Scope::All, alice.clone()], 5, true);
        assert_eq!(usage.cached(&Scope::All), Some(held(4, 105)));
        assert_eq!(
            usage.total(&alice, usage.cached(&alice).unwrap()),
            held(2, 15)
        );
        assert_eq!(usage.holders(), vec![(Some("alice".to_owned()), 5)]);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(usage.cached(&Scope::All), None);
    }

    #[test]
    fn an_upload_in_flight_is_charged_its_blocks_and_one_more() {
        let usage = Usage::new(Duration::from_secs(60), Charge::default());
        let mut up = usage.upload(vec![Scope::All]);
        assert_eq!(usage.total(&Scope::All, Held::default()), held(1, 4096));
        up.add(1);
        assert_eq!(usage.total(&Scope::All, Held::default()), held(1, 8192));
        up.add(4095);
        assert_eq!(usage.total(&Scope::All, Held::default()), held(1, 8192));
        up.add(1);
        assert_eq!(usage.total(&Scope::All, Held::default()), held(1, 12288));
        drop(up);
        assert_eq!(usage.total(&Scope::All, Held::default()), Held::default());
    }
}
