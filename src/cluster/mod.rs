//! Running as one replica of several: which replica owns a session or a run, and
//! forwarding calls on one to its owner.
//!
//! - [`ids`]: session and run ids that name their replica and its incarnation.
//! - [`forward`]: the middleware that sends `/v1/sessions/{id}…` and `/v1/runs/{id}…`
//!   calls to the owner over HTTP (streaming both ways, with the caller's
//!   `Authorization`), or answers 410.
//!
//! Replicas share nothing but the file store; there is no membership protocol. A replica
//! knows its own id from configuration (a StatefulSet pod name) and finds a peer by the
//! address configuration gives for its id (`cluster.peers`, or the per-pod DNS name of a
//! headless Service through `cluster.peer_url_template`). Stateless requests never forward.

pub mod forward;
pub mod ids;

pub use ids::Kind;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::ClusterConfig;

/// This replica's place in the cluster.
pub struct Cluster {
    /// `None`: a single replica, which never forwards.
    replica: Option<String>,
    incarnation: String,
    peers: BTreeMap<String, String>,
    peer_url_template: Option<String>,
    client: reqwest::Client,
}

/// Where a call on a session or a run goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Here (a session or run of this replica, or an id that names no replica).
    Local,
    /// To the owner, at this base URL.
    Forward { replica: String, base: String },
    /// Nowhere: the session or run cannot exist any more; the reason says why.
    Gone(String),
}

#[derive(Debug, thiserror::Error)]
#[error("building the HTTP client for forwarding: {0}")]
pub struct ClusterError(#[from] reqwest::Error);

impl Cluster {
    pub fn new(config: &ClusterConfig) -> Result<Self, ClusterError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.forward_connect_timeout_ms))
            .tcp_nodelay(true)
            .build()?;
        let cluster = Self {
            replica: config.replica_id.clone(),
            incarnation: ids::new_incarnation(),
            peers: config.peers.clone(),
            peer_url_template: config.peer_url_template.clone(),
            client,
        };
        if let Some(replica) = &cluster.replica {
            tracing::info!(
                replica,
                incarnation = %cluster.incarnation,
                peers = cluster.peers.len(),
                "cluster replica"
            );
        }
        Ok(cluster)
    }

    /// [`Cluster::new`] on a blocking thread: building the client reads the platform's CA
    /// certificates.
    pub async fn new_off_thread(config: &ClusterConfig) -> Result<Self, ClusterError> {
        let config = config.clone();
        tokio::task::spawn_blocking(move || Self::new(&config))
            .await
            .expect("building the cluster's client does not panic")
    }

    /// This replica's id, if it is one of a cluster.
    pub fn replica(&self) -> Option<&str> {
        self.replica.as_deref()
    }

    /// What goes between `sess_` (or `run_`) and the random part of the ids made here.
    pub fn id_prefix(&self) -> String {
        match &self.replica {
            Some(replica) => ids::prefix(replica, &self.incarnation),
            None => format!("{}_", self.incarnation),
        }
    }

    /// Where a call on `id`, a session's or a run's, should be served.
    pub fn route(&self, kind: Kind, id: &str) -> Route {
        let Some(me) = &self.replica else {
            // A single instance: its sessions and runs live in its memory and workers,
            // gone with a restart; an id of an earlier start names that start.
            return match ids::single_incarnation(kind, id) {
                Some(incarnation) if incarnation != self.incarnation => {
                    Route::Gone("the service restarted since it was created".into())
                }
                _ => Route::Local,
            };
        };
        let Some(owner) = ids::owner(kind, id) else {
            return Route::Local;
        };
        if owner.replica == me {
            if owner.incarnation == self.incarnation {
                return Route::Local;
            }
            return Route::Gone(format!(
                "replica '{me}', which owned it, restarted since it was created"
            ));
        }
        let base = self.peers.get(owner.replica).cloned().or_else(|| {
            self.peer_url_template
                .as_ref()
                .map(|t| t.replace("{replica}", owner.replica))
        });
        match base {
            Some(base) => Route::Forward {
                replica: owner.replica.to_owned(),
                base: base.trim_end_matches('/').to_owned(),
            },
            None => Route::Gone(format!(
                "replica '{}', which owned it, is not a known peer of this one",
                owner.replica
            )),
        }
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(replica: Option<&str>) -> Cluster {
        Cluster::new(&ClusterConfig {
            replica_id: replica.map(str::to_owned),
            peers: [("b".to_owned(), "http://10.0.0.2:8000/".to_owned())].into(),
            peer_url_template: Some("http://{replica}.headless:8000".into()),
            forward_connect_timeout_ms: 100,
        })
        .unwrap()
    }

    #[test]
    fn a_session_is_served_by_its_owner_and_forwarded_by_the_others() {
        let a = cluster(Some("a"));
        let mine = format!("sess_{}ff", a.id_prefix());
        assert_eq!(a.route(Kind::Session, &mine), Route::Local);
        let b = cluster(Some("b"));
        let theirs = format!("sess_{}ff", b.id_prefix());
        assert_eq!(
            a.route(Kind::Session, &theirs),
            Route::Forward {
                replica: "b".into(),
                base: "http://10.0.0.2:8000".into()
            }
        );
        assert_eq!(
            b.route(Kind::Session, &mine),
            Route::Forward {
                replica: "a".into(),
                base: "http://a.headless:8000".into()
            }
        );
        // The same replica id after a restart: that session's worker is gone.
        let a_again = cluster(Some("a"));
        assert!(
            matches!(a_again.route(Kind::Session, &mine), Route::Gone(r) if r.contains("restarted"))
        );
        // Ids that name no replica are served (or not found) here.
        assert_eq!(a.route(Kind::Session, "sess_0123abcd"), Route::Local);
        // A single replica never forwards, and knows its ids from before a restart.
        let single = cluster(None);
        assert_eq!(single.route(Kind::Session, &theirs), Route::Local);
        let before = format!("sess_{}0123abcd", single.id_prefix());
        assert_eq!(single.route(Kind::Session, &before), Route::Local);
        let after = cluster(None);
        assert!(
            matches!(after.route(Kind::Session, &before), Route::Gone(r) if r.contains("restarted"))
        );
        assert_eq!(after.route(Kind::Session, "sess_0123abcd"), Route::Local);
    }

    #[test]
    fn a_run_is_served_by_its_owner_and_forwarded_by_the_others() {
        let a = cluster(Some("a"));
        let b = cluster(Some("b"));
        let runs_of_b = crate::runs::Runs::with_id_prefix(b.id_prefix());
        let run = runs_of_b.register(Some("алиса"));
        let id = run.entry.id.clone();
        assert!(id.starts_with(&format!("run_b_{}", b.incarnation)), "{id}");
        assert_eq!(b.route(Kind::Run, &id), Route::Local);
        assert_eq!(
            a.route(Kind::Run, &id),
            Route::Forward {
                replica: "b".into(),
                base: "http://10.0.0.2:8000".into()
            }
        );
        // A restarted owner lost its runs with its workers.
        let b_again = cluster(Some("b"));
        assert!(matches!(b_again.route(Kind::Run, &id), Route::Gone(r) if r.contains("restarted")));
        // A single replica's run ids name its incarnation, never a replica.
        let one = cluster(None);
        let single = crate::runs::Runs::with_id_prefix(one.id_prefix());
        let plain = single.register(None).entry.id.clone();
        assert!(
            plain.starts_with(&format!("run_{}_", one.incarnation)) && plain.len() == 4 + 9 + 32,
            "{plain}"
        );
        assert_eq!(a.route(Kind::Run, &plain), Route::Local);
        assert_eq!(one.route(Kind::Run, &plain), Route::Local);
        assert!(
            matches!(cluster(None).route(Kind::Run, &plain), Route::Gone(r) if r.contains("restarted"))
        );
    }

    #[test]
    fn an_owner_with_no_address_is_gone() {
        let c = Cluster::new(&ClusterConfig {
            replica_id: Some("a".into()),
            ..ClusterConfig::default()
        })
        .unwrap();
        let id = format!("sess_{}ff", ids::prefix("zz", "0123abcd"));
        assert!(
            matches!(c.route(Kind::Session, &id), Route::Gone(r) if r.contains("not a known peer"))
        );
    }
}
