//! HTTPS trust for operator tools and upstream MCP servers: the system's roots, plus the CA
//! certificates of `tools.ca_file` (an internal CA, a self-signed upstream), read once at
//! start-up. Without the `tls` feature only `http://` URLs are accepted (see
//! `config::tools`), and there is nothing to trust.

use std::path::Path;

/// The CA certificates trusted on top of the system's roots.
#[derive(Clone, Default)]
pub struct TrustRoots {
    #[cfg(feature = "tls")]
    extra: Vec<reqwest::Certificate>,
}

impl TrustRoots {
    /// Reads `ca_file` (PEM, one or more certificates); `None`: the system's roots only.
    #[cfg(feature = "tls")]
    pub fn load(ca_file: Option<&Path>) -> Result<Self, String> {
        let Some(path) = ca_file else {
            return Ok(Self::default());
        };
        let at = format!("tools.ca_file {}", path.display());
        let pem = std::fs::read(path).map_err(|e| format!("{at}: {e}"))?;
        let extra = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("{at}: not a PEM file of certificates: {e}"))?;
        if extra.is_empty() {
            return Err(format!("{at}: no PEM certificate in it"));
        }
        Ok(Self { extra })
    }

    /// Without the `tls` feature there is no HTTPS; the configuration refuses a `ca_file`.
    #[cfg(not(feature = "tls"))]
    pub fn load(ca_file: Option<&Path>) -> Result<Self, String> {
        match ca_file {
            None => Ok(Self::default()),
            Some(_) => Err(crate::config::needs_tls("tools.ca_file")),
        }
    }

    /// `builder`, trusting these roots as well as the system's.
    #[cfg(feature = "tls")]
    pub fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        builder.tls_certs_merge(self.extra.iter().cloned())
    }

    /// `builder` as it is: a build without the `tls` feature makes no HTTPS connection.
    #[cfg(not(feature = "tls"))]
    pub fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        builder
    }
}
