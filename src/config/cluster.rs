//! `[cluster]`: this replica's id and how to reach its peers, so a call on a session or a
//! run that lands on the wrong replica is forwarded to the one whose worker holds it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Several replicas behind one load balancer. Without a `replica_id` the service is a
/// single replica and never forwards.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This replica's id, written into every session and run id it creates: letters, digits and
    /// `-`, at most 63 (a DNS label, so a StatefulSet pod name such as `snakecage-2`
    /// works as it is).
    pub replica_id: Option<String>,
    /// Base URLs of the replicas by id, e.g. `{ "a" = "http://10.0.0.5:8000" }`.
    pub peers: BTreeMap<String, String>,
    /// For ids not in `peers`: a URL with `{replica}` in it, e.g.
    /// `http://{replica}.snakecage-headless.default.svc.cluster.local:8000` (the DNS
    /// names a headless Service gives a StatefulSet's pods).
    pub peer_url_template: Option<String>,
    /// Connecting to the owner of a session or run gives up after this long; it is then
    /// reported gone (410).
    pub forward_connect_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            replica_id: None,
            peers: BTreeMap::new(),
            peer_url_template: None,
            forward_connect_timeout_ms: 1000,
        }
    }
}

/// A valid replica id: a DNS label.
pub fn valid_replica_id(id: &str) -> bool {
    (1..=63).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-')
}

impl ClusterConfig {
    /// What is wrong with these settings, if anything.
    pub fn problem(&self) -> Option<String> {
        if let Some(id) = &self.replica_id
            && !valid_replica_id(id)
        {
            return Some(format!(
                "cluster.replica_id {id:?} must be 1-63 letters, digits or '-' (a DNS label)"
            ));
        }
        if let Some(bad) = self.peers.keys().find(|id| !valid_replica_id(id)) {
            return Some(format!(
                "cluster.peers: {bad:?} is not a valid replica id (1-63 letters, digits or '-')"
            ));
        }
        let urls = self.peers.values().chain(self.peer_url_template.as_ref());
        if let Some(bad) = urls.into_iter().find(|u| !u.starts_with("http://")) {
            return Some(format!(
                "cluster peer URL {bad:?} must start with http:// (replicas talk plain HTTP inside the cluster network)"
            ));
        }
        if let Some(t) = &self.peer_url_template
            && !t.contains("{replica}")
        {
            return Some(format!(
                "cluster.peer_url_template {t:?} must contain {{replica}}"
            ));
        }
        None
    }
}
