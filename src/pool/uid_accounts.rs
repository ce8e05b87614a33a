//! The host's accounts among worker uids: an id the system names (`/etc/passwd` or any
//! NSS source) is never a worker's, or the worker would act as that account on whatever
//! files Landlock still lets it reach, and its threads would count against that
//! account's RLIMIT_NPROC. [`super::uids::UidRange::claim`] asks [`account_of`] about
//! every id of a range it would take.

use std::fmt;

/// An id the system names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    /// The account's name, or why the lookup failed (an id no one can vouch for is not
    /// taken either).
    pub name: String,
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.uid, self.name)
    }
}

/// Tells whether the system names `uid`: the account's name, if any.
pub type Lookup<'a> = &'a dyn Fn(u32) -> Option<String>;

/// The account that owns `uid` (`getpwuid_r`, so every NSS source counts); a failed
/// lookup counts as an account, saying so.
pub fn account_of(uid: u32) -> Option<String> {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => Some(user.name),
        Ok(None) => None,
        Err(e) => Some(format!("the account lookup failed: {e}")),
    }
}

/// The named ids of `first..=last`, lowest first.
pub fn named_in(first: u32, last: u32, lookup: Lookup<'_>) -> Vec<Account> {
    (first..=last)
        .filter_map(|uid| lookup(uid).map(|name| Account { uid, name }))
        .collect()
}

/// A few of `accounts` for a log line or an error (`40010 (alice), 40011 (bob) and 3 more`).
pub fn describe(accounts: &[Account]) -> String {
    const SHOWN: usize = 5;
    let listed: Vec<String> = accounts.iter().take(SHOWN).map(|a| a.to_string()).collect();
    match accounts.len().saturating_sub(SHOWN) {
        0 => listed.join(", "),
        more => format!("{} and {more} more", listed.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_ids_are_listed_lowest_first_and_described_a_few_at_a_time() {
        let lookup = |uid: u32| uid.is_multiple_of(3).then(|| format!("ü{uid}"));
        let named = named_in(10, 30, &lookup);
        assert_eq!(named.len(), 7);
        assert_eq!(
            named[0],
            Account {
                uid: 12,
                name: "ü12".into()
            }
        );
        assert_eq!(
            describe(&named),
            "12 (ü12), 15 (ü15), 18 (ü18), 21 (ü21), 24 (ü24) and 2 more"
        );
        assert_eq!(describe(&named[..2]), "12 (ü12), 15 (ü15)");
        assert!(named_in(13, 14, &lookup).is_empty());
    }

    #[test]
    fn the_system_names_root_and_not_an_id_far_above_every_account() {
        assert_eq!(account_of(0).as_deref(), Some("root"));
        assert_eq!(account_of(3_999_999_999), None);
    }
}
