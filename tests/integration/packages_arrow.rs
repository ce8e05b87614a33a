//! pyarrow, added through `/v1/admin/packages`: pandas imports it in the zygotes that
//! preload pandas, which must stay single-threaded (its jemalloc's purging thread is off),
//! and its memory counts against a worker's limit like Python's (Arrow allocates with the
//! system allocator, not a mimalloc arena reserved in the zygote).

use serde_json::{Value, json};

use crate::harness::{Options, Server};
use crate::packages::{admin, managed};

/// The paths of the files a run left in its workspace.
fn file_names(r: &Value) -> Vec<&str> {
    r["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn pyarrow_can_be_added_and_serves_pandas_and_parquet_within_the_memory_limit() {
    let s = Server::start_with(managed(Options::default())).await;
    let (status, added) = admin(
        &s,
        reqwest::Method::POST,
        "/v1/admin/packages",
        None,
        Some(json!({ "add": ["pyarrow"] })),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    assert_eq!(added["rolled_over"], true, "{added}");
    assert_eq!(added["changed"][0]["name"], "pyarrow", "{added}");

    // On its own (a tier that did not preload pandas imports it in the worker).
    let r = s
        .run("import pyarrow as pa\nprint(pa.array([1, 2]).sum())")
        .await;
    assert_eq!(r["stdout"], "3\n", "{r}");

    // Through pandas, on the tier that preloads it: Arrow-backed dtypes and Parquet files
    // written to and read back from the workspace.
    let code = r#"
import io
import pandas as pd
df = pd.read_csv(io.StringIO("n,name\n1,ä\n2,b\n"), dtype_backend="pyarrow")
print(df.dtypes.astype(str).tolist())
df.to_parquet("table.parquet")
back = pd.read_parquet("table.parquet", dtype_backend="pyarrow")
print(back["n"].sum(), back["name"].tolist())
"#;
    let r = s.run(code).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        r["stdout"], "['int64[pyarrow]', 'string[pyarrow]']\n3 ['ä', 'b']\n",
        "{r}"
    );
    assert_eq!(file_names(&r), ["table.parquet"], "{r}");

    // Arrow's allocations count against the worker's memory limit (256 MiB by default):
    // a buffer larger than the limit is refused, also in a worker of a zygote where
    // pandas imported pyarrow and Arrow allocated before the fork.
    let code = "import pandas, pyarrow as pa\nprint(pa.default_memory_pool().backend_name)\n\
                buf = pa.allocate_buffer(600 << 20)\nprint('allocated', buf.size)";
    let r = s.run(code).await;
    assert_eq!(r["verdict"], "memory_limit", "{r}");
    assert_eq!(r["stdout"], "system\n", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("pyarrow.lib.ArrowMemoryError"),
        "{r}"
    );
}
