//! Whole numbers in request bodies (`timeout_ms`, `ttl_seconds`): `5000` and `5000.0`
//! alike, since a client whose numbers are all floats, or a model's tool call passed on
//! as it came, sends the second; never `1.5`, `-1` or `"5000"`. One too large for any
//! limit (`1e20`) is read as `u64::MAX`, so the field's own check says what its limit is.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// For `#[serde(default, deserialize_with = "whole_number::optional")]` on an
/// `Option<u64>`: `null` is none.
pub fn optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    deserializer.deserialize_any(WholeVisitor)
}

struct WholeVisitor;

/// 2^64: the first float above every `u64`.
const TWO_TO_64: f64 = 18_446_744_073_709_551_616.0;

impl<'de> Visitor<'de> for WholeVisitor {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a whole number, like 5000")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v).map(Some).map_err(|_| {
            E::custom(format!(
                "{v} is negative: give a positive whole number, like 5000"
            ))
        })
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        if v.fract() == 0.0 && (0.0..TWO_TO_64).contains(&v) {
            // In range and whole: the cast is exact.
            Ok(Some(v as u64))
        } else if v >= TWO_TO_64 {
            // Whole, and beyond every limit (integers past u64 arrive as floats).
            Ok(Some(u64::MAX))
        } else if v < 0.0 {
            Err(E::custom(format!(
                "{v} is negative: give a positive whole number, like 5000"
            )))
        } else {
            Err(E::custom(format!(
                "{v} is not a whole number: give one like 5000"
            )))
        }
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "super::optional")]
        n: Option<u64>,
    }

    fn parse(json: &str) -> Result<Option<u64>, String> {
        serde_json::from_str::<Body>(json)
            .map(|b| b.n)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn whole_numbers_are_taken_as_integers_or_floats_and_nothing_else_is() {
        assert_eq!(parse(r#"{"n": 5000}"#), Ok(Some(5000)));
        assert_eq!(parse(r#"{"n": 5000.0}"#), Ok(Some(5000)));
        assert_eq!(parse(r#"{"n": 1e3}"#), Ok(Some(1000)));
        assert_eq!(parse(r#"{"n": 0}"#), Ok(Some(0)));
        assert_eq!(parse(r#"{"n": null}"#), Ok(None));
        assert_eq!(parse("{}"), Ok(None));
        assert_eq!(parse(r#"{"n": 18446744073709551615}"#), Ok(Some(u64::MAX)));
        assert_eq!(parse(r#"{"n": 18446744073709551616}"#), Ok(Some(u64::MAX)));
        assert_eq!(parse(r#"{"n": 1e20}"#), Ok(Some(u64::MAX)));
        assert!(
            parse(r#"{"n": -1}"#)
                .unwrap_err()
                .contains("-1 is negative")
        );
        for bad in ["1.5", "-1", "-1.0", "-1e20", r#""5000""#, "true"] {
            let err = parse(&format!(r#"{{"n": {bad}}}"#)).unwrap_err();
            assert!(err.contains("whole number"), "{bad}: {err}");
        }
    }
}
