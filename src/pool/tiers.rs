//! The tier table: which tier a job goes to (the lightest whose preloads cover the modules
//! its code imports), which fuller tiers may serve it instead, and how many idle workers
//! each tier keeps (a floor each, the rest split by an EWMA of recent demand).

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::imports::{scan, top_level};

/// Weight of the newest request in each tier's demand share: the shares follow a change
/// of traffic mix within a few dozen requests.
const DEMAND_WEIGHT: f64 = 0.05;

pub(super) struct TierTable {
    /// The top-level packages each tier preloads.
    covers: Vec<BTreeSet<String>>,
    /// Every top-level package some tier preloads: only these can change the choice.
    known: BTreeSet<String>,
    /// For each tier: itself, then the fuller tiers (preloading at least as much) that
    /// may serve its jobs when it has no idle worker, lightest first.
    candidates: Vec<Vec<usize>>,
    pub(super) session: usize,
    min_idle: usize,
    size: usize,
    /// Each tier's share of recent demand; the shares sum to 1.
    demand: Mutex<Vec<f64>>,
}

impl TierTable {
    /// `preloads[i]` is tier `i`'s preload list, lightest tier first.
    pub(super) fn new(
        preloads: &[Vec<String>],
        session: usize,
        min_idle: usize,
        size: usize,
    ) -> Self {
        let covers: Vec<BTreeSet<String>> = preloads
            .iter()
            .map(|list| list.iter().map(|m| top_level(m).to_owned()).collect())
            .collect();
        let known = covers.iter().flatten().cloned().collect();
        let candidates = (0..covers.len())
            .map(|i| {
                let fuller =
                    (0..covers.len()).filter(|&j| j != i && covers[j].is_superset(&covers[i]));
                std::iter::once(i).chain(fuller).collect()
            })
            .collect();
        let n = covers.len().max(1);
        Self {
            covers,
            known,
            candidates,
            session,
            min_idle,
            size,
            demand: Mutex::new(vec![1.0 / n as f64; n]),
        }
    }

    /// The tier for a job: from the modules `code` imports; the fullest tier when the code
    /// is not known (an entrypoint file) or imports in ways a scan cannot read
    /// (`__import__`, `importlib`, `exec`). Plotting methods (`df.plot()`) and
    /// `pandas.plotting` count as an import of matplotlib, which pandas imports for them;
    /// `async` and `await` as one of asyncio, whose event loop runs them.
    pub(super) fn route(&self, code: Option<&str>) -> usize {
        let fullest = self.covers.len() - 1;
        let Some(code) = code else {
            return fullest;
        };
        let mut found = scan(code);
        if found.dynamic {
            return fullest;
        }
        let pandas_plotting = |m: &String| {
            m.strip_prefix("pandas.plotting")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        };
        if found.plots || found.modules.iter().any(pandas_plotting) {
            found.modules.push("matplotlib".to_owned());
        }
        if found.asynchronous {
            found.modules.push("asyncio".to_owned());
        }
        self.route_imports(&found.modules)
    }

    /// The first tier that preloads every imported package some tier preloads; failing
    /// that, the first that preloads most of them. Packages no tier preloads do not count.
    pub(super) fn route_imports(&self, imports: &[String]) -> usize {
        let needed: BTreeSet<&str> = imports
            .iter()
            .map(|m| top_level(m))
            .filter(|m| self.known.contains(*m))
            .collect();
        let covered = |i: usize| {
            needed
                .iter()
                .filter(|m| self.covers[i].contains(**m))
                .count()
        };
        if let Some(i) = (0..self.covers.len()).find(|&i| covered(i) == needed.len()) {
            return i;
        }
        // max_by_key keeps the last maximum: walk from the fullest to keep the lightest.
        (0..self.covers.len())
            .rev()
            .max_by_key(|&i| covered(i))
            .unwrap_or(0)
    }

    /// The tiers that may serve a job routed to `tier`, in the order to try them.
    pub(super) fn candidates(&self, tier: usize) -> &[usize] {
        &self.candidates[tier]
    }

    /// Counts one request for `tier`; returns the idle targets when they changed.
    pub(super) fn record(&self, tier: usize) -> Option<Vec<usize>> {
        let mut demand = self.demand.lock().expect("demand lock");
        let before = targets(&demand, self.size, self.min_idle);
        for (i, share) in demand.iter_mut().enumerate() {
            let hit = if i == tier { 1.0 } else { 0.0 };
            *share += DEMAND_WEIGHT * (hit - *share);
        }
        let after = targets(&demand, self.size, self.min_idle);
        (after != before).then_some(after)
    }

    /// The idle targets for the current demand.
    pub(super) fn targets(&self) -> Vec<usize> {
        targets(
            &self.demand.lock().expect("demand lock"),
            self.size,
            self.min_idle,
        )
    }
}

/// `min_idle` per tier, plus `size` idle workers split in proportion to `shares` (largest
/// remainders first, ties to the lighter tier), so the targets sum to
/// `size + min_idle × tiers` whatever the mix.
pub(super) fn targets(shares: &[f64], size: usize, min_idle: usize) -> Vec<usize> {
    let total: f64 = shares.iter().sum();
    let exact: Vec<f64> = shares
        .iter()
        .map(|s| {
            if total > 0.0 {
                s / total * size as f64
            } else {
                0.0
            }
        })
        .collect();
    let mut out: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let left = size.saturating_sub(out.iter().sum());
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    // One pass gives every tier at most one more; more passes only with no demand at all.
    for &i in order.iter().cycle().take(left) {
        out[i] += 1;
    }
    out.iter().map(|t| t + min_idle).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn default_table() -> TierTable {
        TierTable::new(
            &[
                vec![],
                strings(&["numpy", "pandas"]),
                strings(&["numpy", "pandas", "matplotlib", "matplotlib.pyplot"]),
            ],
            2,
            1,
            4,
        )
    }

    #[test]
    fn the_lightest_tier_covering_the_imports_is_chosen() {
        let t = default_table();
        assert_eq!(t.route(Some("print(1+1)")), 0);
        assert_eq!(
            t.route(Some("import json, re\nfrom collections import deque")),
            0
        );
        assert_eq!(t.route(Some("import pandas as pd")), 1);
        assert_eq!(
            t.route(Some("def f():\n    from numpy.linalg import inv")),
            1
        );
        assert_eq!(t.route(Some("import matplotlib.pyplot as plt")), 2);
        assert_eq!(t.route(Some("import numpy\nimport matplotlib")), 2);
        // Packages no tier preloads do not pull a job up; dynamic imports cannot be seen.
        assert_eq!(t.route(Some("import scipy, openpyxl")), 0);
        assert_eq!(t.route(Some("import scipy\nimport numpy")), 1);
        assert_eq!(
            t.route(Some("import pandas as pd\npd.Series([1]).plot()")),
            2
        );
        assert_eq!(
            t.route(Some("from pandas.plotting import scatter_matrix")),
            2
        );
        assert_eq!(t.route(Some("import pandas.plottingx")), 1);
        // Imports a scan can notice but not read go to the fullest tier.
        assert_eq!(t.route(Some("__import__('pandas')")), 2);
        assert_eq!(t.route(Some("exec('import json')")), 2);
        // Hidden better than that, they run where they land.
        assert_eq!(
            t.route(Some("getattr(__builtins__, '__imp' + 'ort__')('pandas')")),
            0
        );
        assert_eq!(t.route(Some("s = 'import matplotlib'  # import pandas")), 0);
        // An entrypoint's code is not known here: the fullest tier.
        assert_eq!(t.route(None), 2);
    }

    #[test]
    fn the_default_tiers_send_async_code_to_the_lightest_tier_with_asyncio() {
        let defaults = crate::config::TiersConfig::default();
        let names: Vec<&str> = defaults.profile.iter().map(|p| p.name.as_str()).collect();
        let preloads: Vec<Vec<String>> =
            defaults.profile.iter().map(|p| p.preload.clone()).collect();
        let t = TierTable::new(&preloads, 2, 1, 4);
        let tier = |code: &str| names[t.route(Some(code))];
        assert_eq!(tier("print(1+1)"), "bare");
        // async and await run on asyncio's loop, whether or not asyncio is imported.
        assert_eq!(tier("await tools.acall('recherche', q='é')"), "async");
        assert_eq!(tier("async def f():\n    return 1"), "async");
        assert_eq!(tier("import asyncio\nasyncio.run(main())"), "async");
        assert_eq!(tier("awaiting = 'await'  # async"), "bare");
        // With numpy or pandas, the scientific tier, which preloads asyncio too.
        assert_eq!(
            tier("import pandas as pd\nawait asyncio.sleep(0)"),
            "scientific"
        );
        assert_eq!(tier("import pandas as pd"), "scientific");
        assert_eq!(tier("import matplotlib.pyplot as plt\nawait x"), "plotting");
        // A bare job may be served by any fuller tier, the async one first.
        assert_eq!(
            t.candidates(0)
                .iter()
                .map(|&i| names[i])
                .collect::<Vec<_>>(),
            ["bare", "async", "scientific", "plotting"]
        );
        assert_eq!(
            t.candidates(1)
                .iter()
                .map(|&i| names[i])
                .collect::<Vec<_>>(),
            ["async", "scientific", "plotting"]
        );
    }

    #[test]
    fn tiers_that_do_not_nest_pick_the_one_covering_most() {
        let t = TierTable::new(&[strings(&["numpy"]), strings(&["pandas", "PIL"])], 0, 0, 2);
        assert_eq!(t.route(Some("import numpy")), 0);
        assert_eq!(t.route(Some("import pandas")), 1);
        assert_eq!(t.route(Some("import numpy, pandas, PIL")), 1);
        assert_eq!(t.route(Some("import numpy, pandas")), 0);
        assert_eq!(t.candidates(0), [0]);
        assert_eq!(t.candidates(1), [1]);
    }

    #[test]
    fn fuller_tiers_may_serve_a_lighter_tiers_jobs() {
        let t = default_table();
        assert_eq!(t.candidates(0), [0, 1, 2]);
        assert_eq!(t.candidates(1), [1, 2]);
        assert_eq!(t.candidates(2), [2]);
    }

    #[test]
    fn targets_keep_the_floor_and_split_the_pool_size_by_demand() {
        assert_eq!(targets(&[1.0 / 3.0; 3], 4, 1), [3, 2, 2]);
        assert_eq!(targets(&[1.0, 0.0, 0.0], 4, 1), [5, 1, 1]);
        assert_eq!(targets(&[0.5, 0.5, 0.0], 4, 0), [2, 2, 0]);
        assert_eq!(targets(&[0.1, 0.3, 0.6], 10, 0), [1, 3, 6]);
        assert_eq!(targets(&[0.0, 0.0], 3, 2), [4, 3]);
        for shares in [[0.2, 0.35, 0.45], [0.9, 0.05, 0.05], [0.0, 0.0, 1.0]] {
            let t = targets(&shares, 7, 1);
            assert_eq!(t.iter().sum::<usize>(), 7 + 3, "{shares:?} → {t:?}");
        }
    }

    #[test]
    fn demand_moves_the_targets_toward_the_traffic_mix() {
        let t = default_table();
        assert_eq!(t.targets(), [3, 2, 2]);
        for _ in 0..200 {
            t.record(0);
        }
        assert_eq!(t.targets(), [5, 1, 1]);
        let mut changed = false;
        for _ in 0..200 {
            changed |= t.record(1).is_some();
        }
        assert!(changed);
        assert_eq!(t.targets(), [1, 5, 1]);
        // Half and half, over time.
        for i in 0..400 {
            t.record(if i % 2 == 0 { 0 } else { 2 });
        }
        let targets = t.targets();
        assert_eq!(targets[1], 1, "{targets:?}");
        assert_eq!(targets.iter().sum::<usize>(), 7);
    }
}
