//! `[tiers]`: the zygote tiers, each a preload profile with its own pool of idle workers,
//! and how requests and sessions are spread over them (see `pool/mod.rs`).

use serde::{Deserialize, Serialize};
use snakecage_worker::protocol::WarmUp;

use super::ConfigError;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TiersConfig {
    /// Idle workers every tier keeps ready however little traffic it gets, on top of the
    /// `pool.size` idle workers spread over the tiers by recent demand.
    pub min_idle: usize,
    /// The tier new sessions start on; `None`: the last (fullest) profile, since a
    /// session's later runs may import anything.
    pub session: Option<String>,
    /// The tiers, lightest first: a job runs on the first one whose preloads cover the
    /// modules its code imports.
    pub profile: Vec<TierProfile>,
}

/// One tier: a zygote that preloads `preload` and whose children run `warm_up`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TierProfile {
    /// Its name in `/health`, the status page and the `tier` label of the metrics.
    pub name: String,
    /// Imported once in this tier's zygote; those that are not installed are skipped and
    /// reported.
    #[serde(default)]
    pub preload: Vec<String>,
    /// What each child runs before it says Ready; `None`: every warm-up whose module is
    /// preloaded (`python` always).
    #[serde(default)]
    pub warm_up: Option<Vec<WarmUp>>,
    /// Map the zygote's heap back from a memfd snapshot after its preloads: fork and exit
    /// of a big interpreter get cheaper, each page a worker first reads faults once.
    #[serde(default)]
    pub snapshot: bool,
    /// Give the zygote's whole heap CPython's immortal reference count before it forks:
    /// workers copy fewer of its pages.
    #[serde(default = "yes")]
    pub immortal: bool,
}

fn yes() -> bool {
    true
}

impl TierProfile {
    fn new(name: &str, preload: &[&str], warm_up: &[WarmUp]) -> Self {
        Self {
            name: name.to_owned(),
            preload: preload.iter().map(|s| (*s).to_owned()).collect(),
            warm_up: Some(warm_up.to_vec()),
            snapshot: false,
            immortal: true,
        }
    }

    /// The configured warm-up, or every one whose module this tier preloads.
    pub fn warm_up(&self) -> Vec<WarmUp> {
        match &self.warm_up {
            Some(warm_up) => warm_up.clone(),
            None => WarmUp::ALL
                .into_iter()
                .filter(|w| {
                    w.needs()
                        .is_none_or(|m| self.preload.iter().any(|p| p == m))
                })
                .collect(),
        }
    }
}

impl Default for TiersConfig {
    fn default() -> Self {
        use WarmUp::{Asyncio, Matplotlib, Numpy, Pandas, Python};
        Self {
            min_idle: 1,
            session: None,
            profile: vec![
                TierProfile::new("bare", &[], &[Python]),
                TierProfile::new("async", &["asyncio"], &[Python, Asyncio]),
                TierProfile::new(
                    "scientific",
                    &["numpy", "pandas", "asyncio"],
                    &[Python, Numpy, Pandas],
                ),
                TierProfile::new(
                    "plotting",
                    &[
                        "numpy",
                        "pandas",
                        "matplotlib",
                        "matplotlib.pyplot",
                        "asyncio",
                    ],
                    &[Python, Numpy, Pandas, Matplotlib],
                ),
            ],
        }
    }
}

impl TiersConfig {
    /// The index of the tier sessions start on.
    pub fn session_tier(&self) -> usize {
        self.session
            .as_ref()
            .and_then(|name| self.profile.iter().position(|p| &p.name == name))
            .unwrap_or(self.profile.len().saturating_sub(1))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |msg: String| Err(ConfigError::Invalid(msg));
        if self.profile.is_empty() {
            return bad("tiers.profile must name at least one tier".to_owned());
        }
        for (i, profile) in self.profile.iter().enumerate() {
            let name = &profile.name;
            let valid = !name.is_empty()
                && name.len() <= 32
                && name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !valid {
                return bad(format!(
                    "tiers.profile name {name:?} must be 1-32 characters of a-z, 0-9, _ and -"
                ));
            }
            if self.profile[..i].iter().any(|p| &p.name == name) {
                return bad(format!("tiers.profile name {name:?} is used twice"));
            }
            if let Some(m) = profile.preload.iter().find(|m| m.trim().is_empty()) {
                return bad(format!(
                    "tiers.profile {name:?} preloads an empty name {m:?}"
                ));
            }
        }
        if let Some(session) = &self.session
            && !self.profile.iter().any(|p| &p.name == session)
        {
            let names: Vec<&str> = self.profile.iter().map(|p| p.name.as_str()).collect();
            return bad(format!(
                "tiers.session names {session:?}, which is not a tier (the tiers are: {})",
                names.join(", ")
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_default_to_the_fullest_tier_or_the_named_one() {
        let mut tiers = TiersConfig::default();
        assert_eq!(tiers.session_tier(), 3);
        tiers.session = Some("bare".into());
        assert_eq!(tiers.session_tier(), 0);
        assert!(tiers.validate().is_ok());
        tiers.session = Some("huge".into());
        let err = tiers.validate().unwrap_err().to_string();
        assert!(
            err.contains(
                "\"huge\", which is not a tier (the tiers are: bare, async, scientific, plotting)"
            ),
            "{err}"
        );
    }

    #[test]
    fn bad_tier_names_and_empty_lists_are_refused_with_what_to_fix() {
        let mut tiers = TiersConfig::default();
        tiers.profile[1].name = "bare".into();
        assert!(
            tiers
                .validate()
                .unwrap_err()
                .to_string()
                .contains("used twice")
        );
        tiers.profile[1].name = "Sci ence".into();
        assert!(
            tiers
                .validate()
                .unwrap_err()
                .to_string()
                .contains("a-z, 0-9")
        );
        tiers.profile.clear();
        assert!(
            tiers
                .validate()
                .unwrap_err()
                .to_string()
                .contains("at least one tier")
        );
    }

    #[test]
    fn an_unset_warm_up_follows_the_preloads() {
        let profile = TierProfile {
            name: "x".into(),
            preload: vec!["numpy".into(), "matplotlib.pyplot".into()],
            warm_up: None,
            snapshot: false,
            immortal: true,
        };
        assert_eq!(
            profile.warm_up(),
            [WarmUp::Python, WarmUp::Numpy, WarmUp::Matplotlib]
        );
    }
}
