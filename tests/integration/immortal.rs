//! The zygote's immortal heap (`immortal = true`, the default): preloaded objects carry
//! CPython's immortal reference count in every worker, user code may still mutate, rebind
//! and delete them, the next request sees them fresh, and a session's own objects are
//! freed as before. With `immortal = false` the heap is mortal.

use crate::harness::{Options, Server};

/// CPython 3.12's immortal reference count on 64-bit builds, as `sys.getrefcount` shows it.
const IMMORTAL: &str = "4294967295";

const REFCOUNTS: &str = "import sys, numpy as np\nprint(sys.getrefcount(np), sys.getrefcount(np.ndarray), sys.getrefcount(object()))";

#[tokio::test]
async fn preloaded_objects_are_immortal_in_workers_and_the_jobs_own_objects_are_not() {
    let s = Server::start().await;
    let r = s.run(REFCOUNTS).await;
    assert_eq!(r["stdout"], format!("{IMMORTAL} {IMMORTAL} 1\n"), "{r}");
}

#[tokio::test]
async fn a_tier_with_immortal_off_keeps_a_mortal_heap() {
    let s = Server::start_with(Options::default().env(
        "SNAKECAGE_TIERS__PROFILE",
        r#"[{name = "mortal", preload = ["numpy"], immortal = false}]"#,
    ))
    .await;
    let r = s.run(REFCOUNTS).await;
    let counts: Vec<u64> = r["stdout"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        counts.len() == 3 && counts[..2].iter().all(|&n| n > 1 && n < 1 << 20),
        "{r}"
    );
}

#[tokio::test]
async fn a_job_that_mutates_rebinds_and_deletes_preloaded_objects_leaves_the_next_one_a_fresh_heap()
{
    let s = Server::start().await;
    let vandal = "import sys, json, numpy as np, pandas as pd\n\
                  np.pi = 3\n\
                  del np.e\n\
                  pd.DataFrame.extra = 'é'\n\
                  json.dumps = None\n\
                  del sys.modules['json']\n\
                  many = [np, np.ndarray, pd.DataFrame] * 1_000_000\n\
                  del many\n\
                  print(np.pi, hasattr(np, 'e'), pd.DataFrame.extra, sys.getrefcount(np) > 1)";
    let fresh = "import json, numpy as np, pandas as pd\n\
                 print(np.pi, np.e, hasattr(pd.DataFrame, 'extra'), json.dumps(['ü']))";
    for _ in 0..3 {
        let r = s.run(vandal).await;
        assert_eq!(r["stdout"], "3 False é True\n", "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        let r = s.run(fresh).await;
        assert_eq!(
            r["stdout"], "3.141592653589793 2.718281828459045 False [\"\\u00fc\"]\n",
            "{r}"
        );
    }
}

#[tokio::test]
async fn a_session_that_rebinds_a_preloaded_object_run_after_run_frees_what_it_replaced() {
    // 64 MiB bound to a preloaded module, replaced by the next run: twenty runs hold 1.25 GiB
    // if the replaced buffers were never freed, far above the 256 MiB limit.
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_LIMITS__MEMORY_LIMIT_MB", 256)).await;
    let id = s.new_session().await;
    let code = "import json, numpy as np\njson.blob = bytearray(64 << 20)\nnp.blob = np.ones(1 << 20)\nprint(len(json.blob) >> 20, int(np.blob.sum()))";
    for run in 0..20 {
        let r = s.session_run(&id, code).await;
        assert_eq!(r["stdout"], "64 1048576\n", "run {run}: {r}");
    }
}
