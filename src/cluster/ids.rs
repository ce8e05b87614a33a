//! Ids that name their replica: `sess_<replica>_<incarnation>_<random>` for a session,
//! `run_<replica>_<incarnation>_<random>` for a run (`/v1/runs/{id}`).
//!
//! The replica is the configured `cluster.replica_id`; the incarnation is drawn at each
//! start of the process, so an id of a replica that restarted since (and lost its sessions
//! and runs with its workers) is recognised as gone rather than unknown. The random part
//! is a v4 UUID (122 random bits): an id is never guessed. Without a replica id, ids are
//! `sess_<incarnation>_<random>` and `run_<incarnation>_<random>`: they name no replica,
//! but a single instance that restarted still knows an id of its previous run for one.

/// What an id names: its kind decides its prefix and how the API speaks of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A session: `/v1/sessions/{id}` and below.
    Session,
    /// A run in progress: `/v1/runs/{id}` and below.
    Run,
}

impl Kind {
    /// What every id of this kind starts with.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Session => "sess_",
            Kind::Run => "run_",
        }
    }

    /// The id in `path` if it is a route on one id of a kind that has an owner
    /// (`/v1/sessions/{id}…`, `/v1/runs/{id}…`), with its kind.
    pub fn id_in(path: &str) -> Option<(Kind, &str)> {
        let (kind, rest) = if let Some(rest) = path.strip_prefix("/v1/sessions/") {
            (Kind::Session, rest)
        } else {
            (Kind::Run, path.strip_prefix("/v1/runs/")?)
        };
        let id = rest.split('/').next()?;
        (!id.is_empty()).then_some((kind, id))
    }
}

/// One start of this process, as 8 hex digits.
pub fn new_incarnation() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// The part of a new id after its kind's prefix and before its random part.
pub fn prefix(replica: &str, incarnation: &str) -> String {
    format!("{replica}_{incarnation}_")
}

/// The incarnation a single instance's id of `kind` names (`sess_<incarnation>_<random>`),
/// or `None` for any other id (a replica's names three parts).
pub fn single_incarnation(kind: Kind, id: &str) -> Option<&str> {
    let (incarnation, random) = id.strip_prefix(kind.prefix())?.split_once('_')?;
    let ok = is_incarnation(incarnation)
        && !random.is_empty()
        && random.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then_some(incarnation)
}

fn is_incarnation(s: &str) -> bool {
    s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Who owns a session or a run, as its id says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    pub replica: &'a str,
    pub incarnation: &'a str,
}

/// The owner an id of `kind` names, or `None` for an id that names none (a single
/// replica's id, an id of another kind, or no id at all).
pub fn owner(kind: Kind, id: &str) -> Option<Owner<'_>> {
    let rest = id.strip_prefix(kind.prefix())?;
    let mut parts = rest.split('_');
    let (replica, incarnation, random) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = parts.next().is_none()
        && crate::config::valid_replica_id(replica)
        && is_incarnation(incarnation)
        && !random.is_empty();
    ok.then_some(Owner {
        replica,
        incarnation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_replica_and_incarnation() {
        let inc = new_incarnation();
        assert_eq!(inc.len(), 8);
        for kind in [Kind::Session, Kind::Run] {
            let id = format!(
                "{}{}{}",
                kind.prefix(),
                prefix("snakecage-2", &inc),
                "0123abcd"
            );
            assert_eq!(
                owner(kind, &id),
                Some(Owner {
                    replica: "snakecage-2",
                    incarnation: &inc
                })
            );
        }
        for other in [
            "sess_0123456789abcdef0123456789abcdef",
            "sess_a_b_c",
            "sess_-x_0123abcd_ff",
            "sess_a_0123abcd_",
            "sess_a_0123abcd_ff_gg",
            "nope_a_0123abcd_ff",
            "sess_r/../x_0123abcd_ff",
            "sess_é_0123abcd_ff",
        ] {
            assert_eq!(owner(Kind::Session, other), None, "{other}");
            let as_run = other.replacen("sess_", "run_", 1);
            assert_eq!(owner(Kind::Run, &as_run), None, "{as_run}");
        }
        // A single replica's run id names no replica; an id of one kind is not the other.
        assert_eq!(
            owner(Kind::Run, "run_0123456789abcdef0123456789abcdef"),
            None
        );
        assert_eq!(owner(Kind::Run, "sess_a_0123abcd_ff"), None);
        assert_eq!(owner(Kind::Session, "run_a_0123abcd_ff"), None);
    }

    #[test]
    fn a_single_instances_ids_name_its_incarnation_and_no_replica() {
        let inc = new_incarnation();
        for kind in [Kind::Session, Kind::Run] {
            let id = format!("{}{inc}_0123456789abcdef0123456789abcdef", kind.prefix());
            assert_eq!(single_incarnation(kind, &id), Some(inc.as_str()));
            assert_eq!(owner(kind, &id), None);
        }
        for other in [
            // Made before incarnations: no incarnation to judge by.
            "sess_0123456789abcdef0123456789abcdef",
            // A replica's.
            "sess_a_0123abcd_ff",
            "sess_0123abcd_",
            "sess_0123abc_ff",
            "sess_0123abcx_ff",
            "sess_0123abcd_ff_gg",
            "run_0123abcd_ff",
        ] {
            assert_eq!(single_incarnation(Kind::Session, other), None, "{other}");
        }
    }

    #[test]
    fn only_calls_on_one_session_or_run_carry_an_id() {
        let id_in = Kind::id_in;
        assert_eq!(
            id_in("/v1/sessions/sess_a_1_2"),
            Some((Kind::Session, "sess_a_1_2"))
        );
        assert_eq!(
            id_in("/v1/sessions/sess_a_1_2/execute/stream"),
            Some((Kind::Session, "sess_a_1_2"))
        );
        assert_eq!(id_in("/v1/runs/run_a_1_2"), Some((Kind::Run, "run_a_1_2")));
        assert_eq!(
            id_in("/v1/runs/run_a_1_2/tool_calls/call_ü"),
            Some((Kind::Run, "run_a_1_2"))
        );
        for none in [
            "/v1/sessions",
            "/v1/sessions/",
            "/v1/runs",
            "/v1/runs/",
            "/v1/execute",
            "/v1/files/x",
        ] {
            assert_eq!(id_in(none), None, "{none}");
        }
    }
}
