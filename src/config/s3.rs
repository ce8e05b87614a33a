//! Where stored files live (`files.backend`) and the S3-compatible object store settings
//! (`[s3]`). Credentials are never configuration: they come from the usual AWS environment
//! (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, web identity for IRSA,
//! the instance metadata service).

use serde::{Deserialize, Serialize};

/// The file store backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FilesBackend {
    /// A directory on local disk (`files.dir`): one replica.
    #[default]
    Local,
    /// An S3-compatible object store (`[s3]`): shared by every replica.
    S3,
}

/// An S3-compatible object store: AWS S3, MinIO, SeaweedFS, Ceph RGW, GCS's S3 API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// The bucket (it must exist).
    pub bucket: String,
    /// Every key snakecage writes starts with this (several deployments can share a
    /// bucket).
    pub prefix: String,
    /// The service's URL for anything but AWS itself, e.g. `http://minio:9000`; default:
    /// AWS's endpoint for the region (or `AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
    /// Default: `AWS_REGION`/`AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// `http://bucket-less-host/bucket/key` addressing, which MinIO, SeaweedFS and Ceph want;
    /// false for virtual-hosted style (`http://bucket.host/key`, AWS's default).
    pub path_style: bool,
    /// Allow a plain-HTTP endpoint (in-cluster MinIO, tests).
    pub allow_http: bool,
    /// Connecting to the store gives up after this long (then 503).
    pub connect_timeout_ms: u64,
    /// One request (a whole download included) gives up after this long.
    pub request_timeout_ms: u64,
    /// Retries of a failed request (with backoff) before the error is answered with 503.
    pub max_retries: usize,
    /// How long the usage read for quota checks (a listing of the prefix) is reused. Quotas
    /// are eventually consistent across replicas: within this window, uploads through
    /// different replicas can overshoot the quota by what they add.
    pub usage_cache_ms: u64,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            bucket: String::new(),
            prefix: "snakecage".into(),
            endpoint: None,
            region: None,
            path_style: false,
            allow_http: false,
            connect_timeout_ms: 2000,
            request_timeout_ms: 300_000,
            max_retries: 2,
            usage_cache_ms: 2000,
        }
    }
}

impl S3Config {
    /// What is wrong with these settings for `files.backend = "s3"`, if anything.
    pub fn problem(&self) -> Option<String> {
        if self.bucket.trim().is_empty() {
            return Some("files.backend = \"s3\" needs s3.bucket".into());
        }
        if self.prefix.split('/').any(|p| p == "." || p == "..")
            || self.prefix.chars().any(|c| c.is_control())
        {
            return Some(format!(
                "s3.prefix {:?} must be a plain key prefix (no control characters, no '.' or '..' parts)",
                self.prefix
            ));
        }
        if let Some(endpoint) = &self.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Some(format!(
                "s3.endpoint {endpoint:?} must be an http:// or https:// URL"
            ));
        }
        // The S3 client refuses plain HTTP unless told otherwise, but only when it sends
        // its first request: say so now rather than answer every file request with 503.
        if let Some(endpoint) = &self.endpoint
            && endpoint.starts_with("http://")
            && !self.allow_http
        {
            return Some(format!(
                "s3.endpoint {endpoint:?} is plain HTTP, which s3.allow_http = false (the \
                 default) refuses: set s3.allow_http = true (SNAKECAGE_S3__ALLOW_HTTP=true) \
                 for a store reached over plain HTTP, or give an https:// endpoint"
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_http_endpoint_needs_allow_http() {
        let mut c = S3Config {
            bucket: "fichiers-é".into(),
            endpoint: Some("http://minio.storage:9000".into()),
            ..S3Config::default()
        };
        let problem = c.problem().expect("http:// without allow_http accepted");
        assert!(
            problem.contains("s3.allow_http") && problem.contains("http://minio.storage:9000"),
            "{problem}"
        );
        c.allow_http = true;
        assert_eq!(c.problem(), None);
        c.allow_http = false;
        c.endpoint = Some("https://minio.storage:9000".into());
        assert_eq!(c.problem(), None);
        c.endpoint = None;
        assert_eq!(c.problem(), None);
    }
}
