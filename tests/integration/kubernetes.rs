//! `deploy/kubernetes`: every manifest validates offline against the Kubernetes schemas
//! (and the ServiceMonitor against its CRD's), a broken manifest is caught, and the
//! ConfigMap's `snakecage.toml` is a configuration the service accepts.

use std::path::Path;
use std::process::Command;

use snakecage::config::{Config, FilesBackend, Overrides};

use crate::harness::repo_root;

/// Runs scripts/validate_kubernetes.py on `dir`: whether it passed, and what it printed.
fn validate(args: &[&str]) -> (bool, String) {
    let python = repo_root().join(".venv-cluster/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test (or `source scripts/env.sh; ensure_cluster_venv`)",
        python.display()
    );
    let out = Command::new(python)
        .arg(repo_root().join("scripts/validate_kubernetes.py"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn every_manifest_validates_offline_and_broken_ones_do_not() {
    let base = repo_root().join("deploy/kubernetes");
    let (ok, out) = validate(&[base.to_str().unwrap()]);
    assert!(ok, "{out}");

    let breakages: [(&str, &str, &str, &str); 4] = [
        (
            "statefulset.yaml",
            "podManagementPolicy:",
            "podManagementPolicyy:",
            "podManagementPolicyy",
        ),
        (
            "servicemonitor.yaml",
            "interval: 15s",
            "intervall: 15s",
            "intervall",
        ),
        (
            "pdb.yaml",
            "maxUnavailable: 1",
            "maxUnavailable: {}",
            "maxUnavailable",
        ),
        (
            "statefulset.yaml",
            "terminationGracePeriodSeconds: 35",
            "terminationGracePeriodSeconds: 10",
            "terminationGracePeriodSeconds 10",
        ),
    ];
    for (file, from, to, expect) in breakages {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&base, dir.path());
        let path = dir.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} has no {from:?}");
        std::fs::write(&path, text.replace(from, to)).unwrap();
        let (ok, out) = validate(&[dir.path().to_str().unwrap()]);
        assert!(!ok && out.contains(expect), "{file}: {out}");
    }
    // A custom resource without a schema is an error, not a silent pass.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&base, dir.path());
    std::fs::write(
        dir.path().join("extra.yaml"),
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n",
    )
    .unwrap();
    let (ok, out) = validate(&[dir.path().to_str().unwrap()]);
    assert!(!ok && out.contains("no schema"), "{out}");
}

#[test]
fn the_configmap_is_a_configuration_the_service_accepts() {
    let base = repo_root().join("deploy/kubernetes");
    let (ok, toml) = validate(&["--config", base.to_str().unwrap()]);
    assert!(ok, "{toml}");
    // The bucket comes from the Secret (environment) in the pod.
    let toml = toml.replace("[s3]\n", "[s3]\nbucket = \"from-the-secret\"\n");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snakecage.toml");
    std::fs::write(&file, toml).unwrap();
    let config = Config::load(Some(&file), &Overrides::default()).unwrap();
    assert_eq!(config.files.backend, FilesBackend::S3);
    assert!(config.listen.ip().is_unspecified());
    assert!(
        config.auth.keys_file.is_some(),
        "beyond loopback, keys are required"
    );
    // /mcp answers through the Service (its name, bare and fully qualified) and loopback.
    let service = std::fs::read_to_string(base.join("service.yaml")).unwrap();
    let name = service
        .lines()
        .find_map(|l| l.trim().strip_prefix("name: "))
        .expect("service.yaml names the Service");
    for host in [
        name.to_owned(),
        format!("{name}.default.svc.cluster.local"),
        "localhost".to_owned(),
    ] {
        assert!(
            config.mcp.allowed_hosts.contains(&host),
            "{host} missing from mcp.allowed_hosts {:?}",
            config.mcp.allowed_hosts
        );
    }
    let template = config.cluster.peer_url_template.unwrap();
    assert!(
        template.contains("{replica}.snakecage-headless"),
        "{template}"
    );
}
