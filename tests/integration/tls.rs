//! HTTPS upstreams (the `tls` feature): operator HTTP tools and an upstream MCP server on
//! loopback with certificates made at test time, trusted through `tools.ca_file`; a server
//! whose certificate is not in it is refused. Without the feature, start-up refuses an
//! https:// URL and a `ca_file` with a message that names the feature.

/// Starts the service with `config` as its configuration file and `env` added to its
/// environment; it must refuse to start.
fn refused_start_up(config: &str, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(crate::harness::repo_root().join(".venv"))
        .env("SNAKECAGE_CONFIG", &path)
        .env("SNAKECAGE_WORKER__STATE_DIR", dir.path())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {config}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[cfg(feature = "tls")]
mod with_tls {
    use std::path::Path;

    use crate::harness::{Options, Server};
    use crate::tools::tool_routes;
    use crate::tools_mcp::http_upstream;

    /// A self-signed certificate for `localhost`, written as `<name>.pem` and
    /// `<name>.key.pem` into `dir`.
    fn certificate(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key.pem"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    /// The HTTP tools' service over HTTPS with `cert`; returns its port.
    async fn https_tool_service(cert: &Path, key: &Path) -> u16 {
        let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
            .await
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = axum_server::from_tcp_rustls(listener, config).unwrap();
        let app = tool_routes().with_state(port);
        tokio::spawn(async move { server.serve(app.into_make_service()).await.unwrap() });
        port
    }

    #[tokio::test]
    async fn https_tools_and_mcp_servers_are_trusted_through_tools_ca_file_and_no_other() {
        // Servers with certificates of their own: two in the CA file, one not.
        let dir = tempfile::tempdir().unwrap();
        let (tool_cert, tool_key) = certificate(dir.path(), "tools");
        let (mcp_cert, mcp_key) = certificate(dir.path(), "mcp");
        let (stranger_cert, stranger_key) = certificate(dir.path(), "stranger");
        let ca_file = dir.path().join("ca bundle é.pem");
        let bundle = [&tool_cert, &mcp_cert].map(|p| std::fs::read_to_string(p).unwrap());
        std::fs::write(&ca_file, bundle.concat()).unwrap();
        let trusted = https_tool_service(&tool_cert, &tool_key).await;
        let stranger = https_tool_service(&stranger_cert, &stranger_key).await;
        let (_upstream, mcp_port) = http_upstream(Some((&mcp_cert, &mcp_key)));

        let config = format!(
            r#"
[tools]
ca_file = {ca_file:?}

[[tools.http]]
name = "get_weather"
description = "Current temperature for a city"
url = "https://localhost:{trusted}/weather"
method = "GET"

[[tools.http]]
name = "stranger_weather"
description = "The same, from a server whose certificate is not trusted"
url = "https://localhost:{stranger}/weather"
method = "GET"

[[tools.mcp]]
name = "web"
url = "https://localhost:{mcp_port}/mcp"
"#,
            ca_file = ca_file.display().to_string(),
        );
        let path = dir.path().join("snakecage.toml");
        std::fs::write(&path, config).unwrap();
        let s =
            Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;

        let code = "from snakecage import tools
print(tools.get_weather(city='Zürich'))
print(tools.web_add(a=2, b=40)['sum'])
try:\n    tools.stranger_weather(city='Bern')\nexcept tools.ToolError as e:\n    print(e.kind, e.message)\n";
        let r = s.run(code).await;
        let stdout = r["stdout"].as_str().unwrap();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines[..2], ["{'city': 'Zürich', 'temp': 6}", "42"], "{r}");
        assert!(
            lines[2].starts_with("unavailable tool 'stranger_weather': the request failed")
                && lines[2].contains("certificate"),
            "an untrusted certificate must be refused: {r}"
        );
    }
}

#[cfg(not(feature = "tls"))]
mod without_tls {
    use super::refused_start_up;

    #[test]
    fn https_urls_and_a_ca_file_need_the_tls_feature_and_start_up_says_so() {
        let cases = [
            (
                "[[tools.http]]\nname = \"weather\"\ndescription = \"d\"\nurl = \"https://localhost:1/w\"\n",
                "tools.http 'weather': https:// needs a build with the `tls` feature (cargo build --features tls)",
            ),
            (
                "[[tools.mcp]]\nname = \"web\"\nurl = \"https://localhost:1/mcp\"\n",
                "tools.mcp 'web': https:// needs a build with the `tls` feature",
            ),
            (
                "[tools]\nca_file = \"/etc/ssl/certs/ca-certificates.crt\"\n",
                "tools.ca_file needs a build with the `tls` feature",
            ),
        ];
        for (config, says) in cases {
            let stderr = refused_start_up(config, &[]);
            assert!(stderr.contains(says), "{config}: {stderr}");
        }
    }
}

#[cfg(feature = "tls")]
#[test]
fn a_ca_file_that_is_missing_or_holds_no_certificate_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    for (file, says) in [
        (missing, "No such file or directory"),
        (garbage, "no PEM certificate in it"),
    ] {
        let config = format!("[tools]\nca_file = {:?}\n", file.display().to_string());
        // Said before any zygote starts: with no worker binary at all, the CA file is
        // still what start-up names.
        let no_worker = dir.path().join("no such worker");
        let stderr = refused_start_up(
            &config,
            &[("SNAKECAGE_WORKER__BINARY", no_worker.to_str().unwrap())],
        );
        let expected = format!("tools.ca_file {}: {says}", file.display());
        assert!(stderr.contains(&expected), "{stderr}");
        assert!(!stderr.contains("no such worker"), "{stderr}");
    }
}
