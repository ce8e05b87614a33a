//! The package scan: what `/v1/packages` and the tool descriptions say of each allowed
//! package is what the files on the zygote's path say (installed when an import would
//! find it, the version its distribution's METADATA declares), read again by every new
//! generation; a broken or hostile `.dist-info` makes a version unknown, never the service
//! fail to start.

use std::path::Path;

use serde_json::Value;

use crate::harness::{Options, repo_root, site_packages};
use crate::rollover::{generation, listed_packages, reload, start, write_config};

/// Writes `site/<dir_name>.dist-info` with this METADATA and a RECORD listing `record`.
fn dist_info(site: &Path, dir_name: &str, metadata: &[u8], record: &str) {
    let info = site.join(format!("{dir_name}.dist-info"));
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(info.join("METADATA"), metadata).unwrap();
    std::fs::write(info.join("RECORD"), record).unwrap();
}

/// The version of numpy in the repository's venv, as its `.dist-info` directory names it.
fn venv_numpy_version() -> String {
    let site = repo_root().join(".venv/lib/python3.12/site-packages");
    std::fs::read_dir(&site)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|name| {
            let version = name.strip_prefix("numpy-")?.strip_suffix(".dist-info")?;
            Some(version.to_owned())
        })
        .unwrap_or_else(|| panic!("no numpy in {}", site.display()))
}

fn entry(name: &str, installed: bool, version: Option<&str>) -> (String, bool, Option<String>) {
    (name.to_owned(), installed, version.map(str::to_owned))
}

fn site_packages_table(sites: &[&Path]) -> String {
    let sites: Vec<String> = sites
        .iter()
        .map(|s| format!("{:?}", s.display().to_string()))
        .collect();
    format!("\n[python]\nsite_packages = [{}]\n", sites.join(", "))
}

#[tokio::test]
async fn the_listed_packages_are_what_the_files_on_the_path_say_and_each_generation_reads_them_again()
 {
    let dir = tempfile::tempdir().unwrap();
    let site = site_packages(
        dir.path(),
        &[
            ("scanprobe_loose", ""),
            ("scanprobe_plain", ""),
            ("scanprobe_badutf8", ""),
            ("scanprobe_noname", ""),
            ("scanprobe_noversion", ""),
        ],
    );
    // A namespace package (no `__init__.py`), attributed to its distribution by RECORD.
    std::fs::create_dir_all(site.join("scanprobe_ns/sub")).unwrap();
    std::fs::write(site.join("scanprobe_ns/sub/mod.py"), "").unwrap();
    dist_info(
        &site,
        "scanprobe_ns-2.5",
        b"Metadata-Version: 2.1\nName: scanprobe-ns\nVersion: 2.5\n\nA description.\n",
        "scanprobe_ns/sub/mod.py,sha256=x,0\nscanprobe_ns-2.5.dist-info/RECORD,,\n",
    );
    dist_info(
        &site,
        "scanprobe_plain-1.0",
        b"Name: scanprobe-plain\nVersion: 1.0\n",
        "scanprobe_plain.py,,\n",
    );
    // Its distribution is installed, the module is not: not importable, yet a version.
    dist_info(
        &site,
        "scanprobe_ghost-3.0",
        b"Name: scanprobe-ghost\nVersion: 3.0\n",
        "scanprobe_ghost/__init__.py,,\n",
    );
    // Broken METADATA: a version that is not UTF-8, no name, no version.
    dist_info(
        &site,
        "scanprobe_badutf8-1.0",
        b"Name: scanprobe-badutf8\nVersion: 1.\xff\n",
        "scanprobe_badutf8.py,,\n",
    );
    dist_info(
        &site,
        "scanprobe_noname-4.0",
        b"Version: 4.0\n",
        "scanprobe_noname.py,,\n",
    );
    dist_info(
        &site,
        "scanprobe_noversion-0",
        b"Name: scanprobe-noversion\n",
        "scanprobe_noversion.py,,\n",
    );
    let mut allowed = vec![
        "numpy",
        "json",
        "scanprobe_loose",
        "scanprobe_plain",
        "scanprobe_ns",
        "scanprobe_ghost",
        "scanprobe_badutf8",
        "scanprobe_noname",
        "scanprobe_noversion",
        "scanprobe_absent",
    ];
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &allowed, &site_packages_table(&[&site]));
    let s = start(&config, Options::default()).await;
    let numpy = venv_numpy_version();
    assert_eq!(
        listed_packages(&s).await,
        [
            entry("numpy", true, Some(&numpy)),
            // A standard-library module: importable, no distribution.
            entry("json", true, None),
            // A module no distribution names.
            entry("scanprobe_loose", true, None),
            entry("scanprobe_plain", true, Some("1.0")),
            entry("scanprobe_ns", true, Some("2.5")),
            entry("scanprobe_ghost", false, Some("3.0")),
            entry("scanprobe_badutf8", true, None),
            entry("scanprobe_noname", true, Some("4.0")),
            entry("scanprobe_noversion", true, None),
            entry("scanprobe_absent", false, None),
        ]
    );

    // A new generation on a changed path: a site in front with a newer scanprobe_plain and
    // an added package. Nothing changes under the running zygotes: the site is new.
    let other = tempfile::tempdir().unwrap();
    let front = site_packages(other.path(), &[("scanprobe_plain", "")]);
    std::fs::create_dir_all(front.join("scanprobe_added")).unwrap();
    std::fs::write(front.join("scanprobe_added/__init__.py"), "").unwrap();
    dist_info(
        &front,
        "scanprobe_plain-1.1",
        b"Name: scanprobe-plain\nVersion: 1.1\n",
        "scanprobe_plain.py,,\n",
    );
    dist_info(
        &front,
        "scanprobe_added-0.1",
        b"Name: scanprobe-added\nVersion: 0.1\n",
        "scanprobe_added/__init__.py,,\n",
    );
    allowed.push("scanprobe_added");
    write_config(&config, &allowed, &site_packages_table(&[&front, &site]));
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(generation(&s).await, 2);
    let now = listed_packages(&s).await;
    let find = |name: &str| now.iter().find(|p| p.0 == name).cloned();
    assert_eq!(
        find("scanprobe_plain"),
        Some(entry("scanprobe_plain", true, Some("1.1")))
    );
    assert_eq!(
        find("scanprobe_added"),
        Some(entry("scanprobe_added", true, Some("0.1")))
    );
    assert_eq!(
        find("scanprobe_ns"),
        Some(entry("scanprobe_ns", true, Some("2.5")))
    );
    // The tool descriptions say the same.
    let (status, tools) = s.get_json("/v1/tools").await;
    assert_eq!(status, 200, "{tools}");
    let text = tools.to_string();
    for named in [
        "scanprobe_added 0.1",
        "scanprobe_plain 1.1",
        &format!("numpy {numpy}"),
    ] {
        assert!(text.contains(named), "{named} not in {tools}");
    }
    let r: Value = s.run("import scanprobe_added\nprint('ok')").await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
}
