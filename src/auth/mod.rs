//! API keys: who is calling (the tenant), what they may use, and the middleware that checks
//! `Authorization: Bearer <key>` on every route but the public ones.
//!
//! Keys are `sc_` and 64 hex digits (32 bytes from the OS's CSPRNG). Only their SHA-256 is
//! ever stored: a key has 256 bits of entropy, so a fast hash is enough (there is nothing
//! to brute-force) and checking one costs a microsecond, not an argon2 run per request.
//! A presented key is hashed and compared with every configured hash in constant time.

mod admin;
mod keys_file;
mod ring;
mod running;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::AuthConfig;
use crate::error::{ApiError, KeyProblem};
use crate::files::FileOwner;

pub use self::admin::AdminCaller;
pub use self::keys_file::{
    ADMIN_SCOPE, KEY_PREFIX, KeyEntry, KeysError, KeysFile, SCOPES, check_entries, generate_key,
    sha256_hex,
};
pub use self::ring::{KeyRing, KeysChange};
pub use self::running::{ExecutionSlot, Running};

/// One tenant (a configured key): its name, limits and the executions it has running.
/// The tenant is its name: a reload that changes the key's entry makes a new `Tenant`
/// sharing the old one's [`Running`] count.
#[derive(Debug)]
pub struct Tenant {
    pub name: String,
    pub max_concurrent: Option<usize>,
    pub max_sessions: Option<usize>,
    pub max_stored_bytes: Option<u64>,
    /// What the key may do beyond running code (see [`SCOPES`]).
    pub scopes: Vec<String>,
    digest: [u8; 32],
    /// Shared with every `Tenant` of the same name (see [`running`]).
    running: Arc<Running>,
}

impl Tenant {
    /// Whether this key may use the admin routes.
    pub fn is_admin(&self) -> bool {
        self.scopes.iter().any(|s| s == ADMIN_SCOPE)
    }

    /// A slot for one execution, held until the run ends; 429 when the key has its
    /// `max_concurrent` executions running (or more, after a reload lowered it).
    pub fn execution_slot(&self) -> Result<ExecutionSlot, ApiError> {
        self.running.start(self.max_concurrent).map_err(|running| {
            let limit = self.max_concurrent.unwrap_or_default();
            let detail = if running > limit {
                format!(
                    "API key '{}' already has {running} executions running, more than its \
                     max_concurrent limit of {limit} (lowered while they ran); retry when \
                     {} of them have finished",
                    self.name,
                    running - limit + 1
                )
            } else {
                format!(
                    "API key '{}' already has {running} executions running, its \
                     max_concurrent limit; retry when one has finished",
                    self.name
                )
            };
            ApiError::TenantLimit {
                detail,
                retry_after_secs: 1,
            }
        })
    }
}

/// The configured keys. Empty: the service runs without authentication (local use).
#[derive(Debug, Default)]
pub struct Keys {
    tenants: Vec<Arc<Tenant>>,
    public_metrics: bool,
    public_status: bool,
    /// Whether the service listens on loopback only: without keys, the admin routes are
    /// open only then.
    loopback: bool,
    /// Whether some keys are given inline (`[[auth.keys]]`), for saying where a reload
    /// re-read them from.
    inline: bool,
}

impl Keys {
    /// The keys of `config` (inline) and of its keys file, checked: valid hashes, unique
    /// names and unique keys; a keys file that is set must exist and hold a key.
    pub fn load(config: &AuthConfig) -> Result<Self, KeysError> {
        Self::load_counting(config, |_| Arc::default())
    }

    /// [`Self::load`], each tenant counting its executions in `running(name)`.
    fn load_counting(
        config: &AuthConfig,
        running: impl Fn(&str) -> Arc<Running>,
    ) -> Result<Self, KeysError> {
        let mut entries = config.keys.clone();
        if let Some(path) = &config.keys_file {
            if !path.is_file() {
                return Err(KeysError::Missing { path: path.clone() });
            }
            let from_file = KeysFile::read(path)?.keys;
            // An empty file would turn authentication off without a word.
            if from_file.is_empty() {
                return Err(KeysError::Empty { path: path.clone() });
            }
            entries.extend(from_file);
        }
        let digests = check_entries(&entries)?;
        let mut tenants = Vec::with_capacity(entries.len());
        for (entry, digest) in entries.into_iter().zip(digests) {
            tenants.push(Arc::new(Tenant {
                running: running(&entry.name),
                max_concurrent: entry.max_concurrent,
                max_sessions: entry.max_sessions,
                max_stored_bytes: entry.max_stored_mb.map(|mb| mb << 20),
                scopes: entry.scopes,
                name: entry.name,
                digest,
            }));
        }
        Ok(Self {
            tenants,
            public_metrics: config.public_metrics,
            public_status: config.public_status,
            loopback: false,
            inline: !config.keys.is_empty(),
        })
    }

    /// Records where the service listens (the admin routes without keys need loopback).
    pub fn listening_on(mut self, addr: std::net::SocketAddr) -> Self {
        self.loopback = addr.ip().is_loopback();
        self
    }

    /// Whether keys are configured (and so required).
    pub fn enabled(&self) -> bool {
        !self.tenants.is_empty()
    }

    /// One warning for each key whose `max_sessions` is above `global`, the service's
    /// `sessions.max_sessions`, which wins over it (see [`sessions_above_global`]).
    pub fn sessions_above_global(&self, global: usize) -> Vec<String> {
        self.tenants
            .iter()
            .filter_map(|t| sessions_above_global(&t.name, t.max_sessions, global))
            .collect()
    }

    /// The tenant names (a closed set, usable as a metric label).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tenants.iter().map(|t| t.name.as_str())
    }

    /// The tenant whose key is `key`. Every configured hash is compared, in constant
    /// time, whatever matches: the time taken says nothing about which key was close.
    pub fn tenant(&self, key: &str) -> Option<Arc<Tenant>> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut found = None;
        for tenant in &self.tenants {
            if bool::from(tenant.digest.ct_eq(&digest)) {
                found = Some(tenant.clone());
            }
        }
        found
    }

    /// Routes answered without a key: probes, and the metrics and status page when
    /// configured public.
    fn is_public(&self, path: &str) -> bool {
        match path {
            "/health" | "/ready" => true,
            "/metrics" => self.public_metrics,
            "/" | "/v1/status" => self.public_status,
            _ => false,
        }
    }
}

/// What an operator should be told about key `name` when its `max_sessions` is above the
/// service's `sessions.max_sessions` (`global`): the key is accepted, but every session
/// counts against both limits, so it can never hold more than `global`.
pub fn sessions_above_global(
    name: &str,
    max_sessions: Option<usize>,
    global: usize,
) -> Option<String> {
    let max = max_sessions.filter(|&max| max > global)?;
    Some(format!(
        "API key '{name}' has max_sessions = {max}, above the service's sessions.max_sessions \
         = {global}: it can hold at most {global} sessions (fewer while other keys hold some); \
         lower its max_sessions or raise sessions.max_sessions"
    ))
}

/// The caller of a request: its tenant, or `None` when the service runs without keys.
#[derive(Debug, Clone, Default)]
pub struct Caller(pub Option<Arc<Tenant>>);

impl Caller {
    /// The owner name files and sessions are stored under.
    pub fn owner(&self) -> Option<&str> {
        self.0.as_deref().map(|t| t.name.as_str())
    }

    /// The owner and its storage quota, for storing files.
    pub fn file_owner(&self) -> FileOwner<'_> {
        FileOwner {
            name: self.owner(),
            quota_bytes: self.0.as_deref().and_then(|t| t.max_stored_bytes),
        }
    }

    pub fn max_sessions(&self) -> Option<usize> {
        self.0.as_deref().and_then(|t| t.max_sessions)
    }

    /// See [`Tenant::execution_slot`]; always granted (and not counted) without keys.
    pub fn execution_slot(&self) -> Result<Option<ExecutionSlot>, ApiError> {
        match &self.0 {
            Some(tenant) => tenant.execution_slot().map(Some),
            None => Ok(None),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_default())
    }
}

/// The middleware: with keys configured, a request to a non-public route must carry a
/// valid `Authorization: Bearer <key>` (else 401); its tenant goes into the request's
/// extensions as a [`Caller`].
pub async fn require_key(
    State(ring): State<Arc<KeyRing>>,
    mut request: Request,
    next: Next,
) -> Response {
    // The keys in force now: a reload that changes them applies to the next request.
    let keys = ring.load();
    // The admin routes' extractor decides with the same keys (see `AdminCaller`).
    request.extensions_mut().insert(keys.clone());
    if !keys.enabled() {
        return next.run(request).await;
    }
    // One key per request: which of two a proxy in front, a replica this one forwards to,
    // or this check would read is not for the client to leave open.
    let headers = request
        .headers()
        .get_all(header::AUTHORIZATION)
        .iter()
        .count();
    if headers > 1 {
        return ApiError::BadRequest(format!(
            "the request has {headers} Authorization headers; send one, `Authorization: \
             Bearer <key>`"
        ))
        .into_response();
    }
    let presented = bearer_token(request.headers().get(header::AUTHORIZATION));
    let tenant = presented.ok().and_then(|key| keys.tenant(key));
    match tenant {
        Some(tenant) => {
            request.extensions_mut().insert(Caller(Some(tenant)));
            next.run(request).await
        }
        None if keys.is_public(request.uri().path()) => next.run(request).await,
        None => {
            ApiError::Unauthorized(presented.err().unwrap_or(KeyProblem::Invalid)).into_response()
        }
    }
}

/// The key of an `Authorization: Bearer <key>` header (the scheme in any case), or why
/// there is none.
fn bearer_token(header: Option<&HeaderValue>) -> Result<&str, KeyProblem> {
    let value = header.ok_or(KeyProblem::Missing)?;
    let value = value.to_str().map_err(|_| KeyProblem::NotAscii)?;
    let (scheme, token) = value.split_once(' ').ok_or(KeyProblem::NotBearer)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(KeyProblem::NotBearer);
    }
    // A header value may hold a tab (`HeaderValue::to_str` passes it); no key does.
    if token.bytes().any(|b| b.is_ascii_control()) {
        return Err(KeyProblem::NotAscii);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_that_holds_no_bearer_key_says_why() {
        let header = |v: &[u8]| HeaderValue::from_bytes(v).unwrap();
        assert_eq!(bearer_token(None), Err(KeyProblem::Missing));
        assert_eq!(bearer_token(Some(&header(b"Bearer sk-1"))), Ok("sk-1"));
        assert_eq!(bearer_token(Some(&header(b"bearer  sk-1 "))), Ok("sk-1"));
        for not_bearer in [&b"Basic YWxpY2U6"[..], b"sk-1", b"Bearer ", b"Bearer"] {
            assert_eq!(
                bearer_token(Some(&header(not_bearer))),
                Err(KeyProblem::NotBearer),
                "{not_bearer:?}"
            );
        }
        for not_ascii in ["Bearer clé".as_bytes(), b"Bearer sc_ab\tcd"] {
            assert_eq!(
                bearer_token(Some(&header(not_ascii))),
                Err(KeyProblem::NotAscii),
                "{not_ascii:?}"
            );
        }
    }

    fn config(keys: Vec<KeyEntry>) -> AuthConfig {
        AuthConfig {
            keys,
            ..AuthConfig::default()
        }
    }

    #[test]
    fn a_new_key_is_found_by_its_hash_and_nothing_else_is() {
        let mut file = KeysFile::default();
        let key = file.add("alice", KeyEntry::default()).unwrap();
        assert!(key.starts_with(KEY_PREFIX) && key.len() == 3 + 64, "{key}");
        assert!(!file.keys[0].sha256.contains(&key[3..]));
        let keys = Keys::load(&config(file.keys)).unwrap();
        assert_eq!(keys.tenant(&key).unwrap().name, "alice");
        assert!(keys.tenant(&key[..key.len() - 1]).is_none());
        assert!(keys.tenant("").is_none());
        assert!(matches!(
            KeysFile::default().add("bad name", KeyEntry::default()),
            Err(KeysError::Invalid { .. })
        ));
    }

    #[test]
    fn duplicate_names_and_malformed_hashes_are_refused() {
        let mut file = KeysFile::default();
        file.add("alice", KeyEntry::default()).unwrap();
        assert!(matches!(
            file.add("alice", KeyEntry::default()),
            Err(KeysError::Duplicate(_))
        ));
        let mut twice = file.keys.clone();
        twice.push(KeyEntry {
            sha256: sha256_hex("other"),
            ..file.keys[0].clone()
        });
        assert!(matches!(
            Keys::load(&config(twice)),
            Err(KeysError::Duplicate(_))
        ));
        let short = KeyEntry {
            sha256: "abc".into(),
            ..file.keys[0].clone()
        };
        assert!(matches!(
            Keys::load(&config(vec![short])),
            Err(KeysError::Invalid { .. })
        ));
    }

    #[test]
    fn the_keys_file_round_trips_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        let mut file = KeysFile::read(&path).unwrap();
        let key = file
            .add(
                "alice",
                KeyEntry {
                    max_concurrent: Some(2),
                    ..KeyEntry::default()
                },
            )
            .unwrap();
        file.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&key), "{text}");
        assert!(text.contains(&sha256_hex(&key)), "{text}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(KeysFile::read(&path).unwrap().keys, file.keys);
    }
}
