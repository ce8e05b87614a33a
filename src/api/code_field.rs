//! The `code` field of every execute request: a string, or an array of strings (lines, as
//! some chat apps' native tool mode sends them) joined with `"\n"`.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, SeqAccess, Visitor};
use serde_json::Value;

/// For `#[serde(default, deserialize_with = "code_field::deserialize")]` on an
/// `Option<String>`: `null` is no code; anything else but a string or an array of strings
/// is an error that names what was sent.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    deserializer.deserialize_any(CodeVisitor)
}

struct CodeVisitor;

impl<'de> Visitor<'de> for CodeVisitor {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("`code` as a string, or an array of strings (lines joined with \"\\n\")")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut lines: Vec<String> = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(element) = seq.next_element::<Value>()? {
            match element {
                Value::String(line) => lines.push(line),
                other => {
                    return Err(de::Error::custom(format!(
                        "`code` is an array, so each element must be a string (one line of \
                         code), but element {} is {}",
                        lines.len(),
                        super::json::json_kind(&other)
                    )));
                }
            }
        }
        Ok(Some(lines.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "super::deserialize")]
        code: Option<String>,
    }

    fn code(v: serde_json::Value) -> Result<Option<String>, String> {
        serde_json::from_value::<Body>(v)
            .map(|b| b.code)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_string_an_array_of_lines_null_and_nothing() {
        assert_eq!(code(json!({"code": "x = 1"})).unwrap().unwrap(), "x = 1");
        assert_eq!(
            code(json!({"code": ["x = 1", "print(x)"]}))
                .unwrap()
                .unwrap(),
            "x = 1\nprint(x)"
        );
        assert_eq!(code(json!({"code": []})).unwrap().unwrap(), "");
        assert_eq!(code(json!({"code": null})).unwrap(), None);
        assert_eq!(code(json!({})).unwrap(), None);
    }

    #[test]
    fn other_shapes_are_refused_with_what_was_wrong() {
        let e = code(json!({"code": ["x = 1", 2]})).unwrap_err();
        assert!(e.contains("element 1 is a number"), "{e}");
        let e = code(json!({"code": 42})).unwrap_err();
        assert!(e.contains("an array of strings"), "{e}");
        let e = code(json!({"code": [["nested"]]})).unwrap_err();
        assert!(e.contains("element 0 is an array"), "{e}");
    }
}
