//! Session ids that name their replica: `sess_<replica>_<incarnation>_<random>`.
//!
//! The replica is the configured `cluster.replica_id`; the incarnation is drawn at each
//! start of the process, so a session id of a replica that restarted since (and lost its
//! sessions with its workers) is recognised as gone rather than unknown. Without a replica
//! id, ids stay `sess_<random>` and never name a replica.

/// One start of this process, as 8 hex digits.
pub fn new_incarnation() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// The part of a new session id after `sess_` and before its random part.
pub fn prefix(replica: &str, incarnation: &str) -> String {
    format!("{replica}_{incarnation}_")
}

/// Who owns a session, as its id says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    pub replica: &'a str,
    pub incarnation: &'a str,
}

/// The owner a session id names, or `None` for an id that names none (a single replica's
/// id, or no session id at all).
pub fn owner(session_id: &str) -> Option<Owner<'_>> {
    let rest = session_id.strip_prefix("sess_")?;
    let mut parts = rest.split('_');
    let (replica, incarnation, random) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = parts.next().is_none()
        && crate::config::valid_replica_id(replica)
        && incarnation.len() == 8
        && incarnation.bytes().all(|b| b.is_ascii_hexdigit())
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
        let id = format!("sess_{}{}", prefix("snakecage-2", &inc), "0123abcd");
        assert_eq!(
            owner(&id),
            Some(Owner {
                replica: "snakecage-2",
                incarnation: &inc
            })
        );
        for other in [
            "sess_0123456789abcdef0123456789abcdef",
            "sess_a_b_c",
            "sess_-x_0123abcd_ff",
            "sess_a_0123abcd_",
            "sess_a_0123abcd_ff_gg",
            "nope_a_0123abcd_ff",
            "sess_r/../x_0123abcd_ff",
        ] {
            assert_eq!(owner(other), None, "{other}");
        }
    }
}
