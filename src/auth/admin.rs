//! Who may call the admin routes (`/v1/admin/*`: reload, packages): the [`AdminCaller`]
//! extractor. With keys configured, only a key with the `admin` scope (403 for the others);
//! without keys, only when the service listens on loopback (403 beyond it, saying why).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::{ADMIN_SCOPE, Caller, Keys};
use crate::error::{ApiError, KeyProblem};

/// An admin route's caller, once allowed: the key's name, `None` without keys (loopback).
/// Take it as a handler argument; the handler runs only for an allowed caller.
#[derive(Debug, Clone)]
pub struct AdminCaller {
    pub name: Option<String>,
}

impl AdminCaller {
    /// Who did it, for the logs: the key's name, or `loopback` without keys.
    pub fn who(&self) -> &str {
        self.name.as_deref().unwrap_or("loopback")
    }
}

/// Reads the keys [`super::require_key`] puts in every request's extensions: a route
/// mounted without that middleware is refused.
impl<S: Send + Sync> FromRequestParts<S> for AdminCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let Some(keys) = parts.extensions.get::<Arc<Keys>>().cloned() else {
            return Err(ApiError::Forbidden(
                "the admin routes are not behind the API key check".into(),
            ));
        };
        let caller = parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_default();
        admit(&keys, &caller)
    }
}

/// The decision, apart from the request: see the module docs.
pub(super) fn admit(keys: &Keys, caller: &Caller) -> Result<AdminCaller, ApiError> {
    if !keys.enabled() {
        return if keys.loopback {
            Ok(AdminCaller { name: None })
        } else {
            Err(ApiError::Forbidden(
                "the admin routes are disabled: the service runs without API keys and listens beyond loopback. Configure keys and create one with the admin scope (`snakecage keys add NAME --admin`)".into(),
            ))
        };
    }
    match caller.0.as_deref() {
        Some(tenant) if tenant.is_admin() => Ok(AdminCaller {
            name: Some(tenant.name.clone()),
        }),
        Some(tenant) => Err(ApiError::Forbidden(format!(
            "API key '{}' does not have the `{ADMIN_SCOPE}` scope the admin routes need; use a key created with `snakecage keys add NAME --admin`",
            tenant.name
        ))),
        // The key middleware answers 401 before this; kept for a route mounted without it.
        None => Err(ApiError::Unauthorized(KeyProblem::Missing)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{KeyEntry, KeysFile};
    use super::*;
    use crate::config::AuthConfig;

    fn keys_with(scopes: &[&str]) -> (Keys, String) {
        let mut file = KeysFile::default();
        let entry = KeyEntry {
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            ..KeyEntry::default()
        };
        let key = file.add("ops", entry).unwrap();
        let config = AuthConfig {
            keys: file.keys,
            ..AuthConfig::default()
        };
        (Keys::load(&config).unwrap(), key)
    }

    #[test]
    fn only_an_admin_key_is_admitted() {
        let (keys, key) = keys_with(&["admin"]);
        let caller = Caller(keys.tenant(&key));
        assert_eq!(admit(&keys, &caller).unwrap().who(), "ops");
        let (keys, key) = keys_with(&[]);
        let caller = Caller(keys.tenant(&key));
        let err = admit(&keys, &caller).unwrap_err();
        assert!(
            matches!(&err, ApiError::Forbidden(d) if d.contains("'ops'") && d.contains("admin")),
            "{err:?}"
        );
    }

    #[test]
    fn without_keys_only_loopback_is_admitted() {
        let local = Keys::default().listening_on("127.0.0.1:8000".parse().unwrap());
        assert_eq!(admit(&local, &Caller::default()).unwrap().who(), "loopback");
        let open = Keys::default().listening_on("0.0.0.0:8000".parse().unwrap());
        let err = admit(&open, &Caller::default()).unwrap_err();
        assert!(
            matches!(&err, ApiError::Forbidden(d) if d.contains("beyond loopback")),
            "{err:?}"
        );
    }

    #[test]
    fn an_unknown_scope_is_refused() {
        let err = KeysFile::default()
            .add(
                "ops",
                KeyEntry {
                    scopes: vec!["root".into()],
                    ..KeyEntry::default()
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("unknown scope \"root\""), "{err}");
    }
}
