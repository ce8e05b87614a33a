//! `null` for an optional field of a request body means the field was not given: its
//! default. Clients that write every unset optional field as `null` (a pydantic model's
//! dump, a generated client) must not be refused on some fields and not others.

use serde::{Deserialize, Deserializer};

/// For `#[serde(default, deserialize_with = "nullable::or_default")]`: `null` is the
/// type's default (an empty list, `false`).
pub fn or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// For `#[serde(default = "default_true", deserialize_with = "nullable::or_true")]`.
pub fn or_true<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(deserializer)?.unwrap_or(true))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "super::or_default")]
        list: Vec<String>,
        #[serde(default = "yes", deserialize_with = "super::or_true")]
        flag: bool,
    }

    fn yes() -> bool {
        true
    }

    #[test]
    fn null_is_the_default_and_values_are_kept() {
        let b: Body = serde_json::from_str(r#"{"list": null, "flag": null}"#).unwrap();
        assert!(b.list.is_empty() && b.flag);
        let b: Body = serde_json::from_str("{}").unwrap();
        assert!(b.list.is_empty() && b.flag);
        let b: Body = serde_json::from_str(r#"{"list": ["é"], "flag": false}"#).unwrap();
        assert_eq!(b.list, ["é"]);
        assert!(!b.flag);
        let err = serde_json::from_str::<Body>(r#"{"list": 5}"#).unwrap_err();
        assert!(err.is_data(), "{err}");
        assert!(err.to_string().contains("expected a sequence"), "{err}");
    }
}
